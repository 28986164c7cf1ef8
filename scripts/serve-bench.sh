#!/bin/sh
# serve-bench.sh [-m DIR] [--moejit PATH] [--streams "1 8 32"] [--requests R] [-n TOKENS] [--backend cuda] [--no-stream]
#                [--ctx N] [--server-cpus LIST] [--client-cpus LIST]
#
# The serving benchmark, for the GPU host: starts `moejit serve --backend cuda`
# on a model (default: the built-in one), and at each concurrency C of
# --streams (default 1, 8 and 32) runs C client streams at once, each sending
# R requests one after another (POST /v1/completions, stream true, -n tokens
# each, default 128; R default 4, or more so that a concurrency sends 32 in
# all: one stream's 4 requests were 80 ms of wall time, and its figure moved
# by 8% between runs); then the same prompts through
# `moejit generate --prompts FILE --parallel C` (the engine without HTTP).
# Both sides ignore end-of-sequence ids (ignore_eos, generate --ignore-eos),
# so every request is -n tokens on both and the rates compare the same work.
# It prints a markdown table: requests/s, generated tokens/s, time to first
# token (p50, p90) and the whole request's time (p50), and generate's
# tokens/s beside the server's; the server's rates count the span from the
# first request sent to the last response read, as generate's count its
# first prompt submitted to its last token.  --no-stream asks for whole responses
# (stream false: one JSON body a request, no time to first token), which
# takes the client's per-token work out of the measurement.  --server-cpus and
# --client-cpus (taskset lists, as 0-7) keep the server (and generate) and
# the clients on cores of their own.  Each stream is
# a process of its own, so the client's parsing is not serialised by one
# interpreter lock (the first GPU run, bench/results/2026-12-03-serve.md,
# used threads).
#
# The client is Python's standard library only (http.client, multiprocessing), so an
# Ubuntu 24.04 host with python3 and no node runs it.  On the GPU host:
#   . scripts/gpu-env.sh && scripts/serve-bench.sh [-m /models/GLM-5-NVFP4]  Sampling is the
# server's default (temperature 1, no filters), which the GPU draws on the
# device, and generate gets the same (--temp 1 --top-p 1 --top-k 0
# --min-p 0).  Each concurrency starts after a warm-up request, so kernel
# compiles and graph captures are not timed (warm the cache first with
# `moejit warmup -m DIR` to keep the warm-up short).  The token counts are
# what was generated (-n a request, ignore_eos).  --ctx N (default 1024)
# bounds each sequence's cache, so the largest concurrency's slots fit
# beside a full-size model.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
# MOEJIT, else the in-tree build, else moejit on PATH (gpu-env.sh puts the
# portable build there on the GPU host).
moejit=${MOEJIT:-$here/../moejit}
[ -x "$moejit" ] || moejit=$(command -v moejit || echo "$here/../moejit")
model=
streams="1 8 32"
requests=
ntok=128
backend=cuda
ctx=1024
stream=1
spin=
cpin=
while [ $# -gt 0 ]; do
  case $1 in
    -m) model=$2; shift 2 ;;
    --moejit) moejit=$2; shift 2 ;;
    --streams) streams=$2; shift 2 ;;
    --requests) requests=$2; shift 2 ;;
    -n) ntok=$2; shift 2 ;;
    --backend) backend=$2; shift 2 ;;
    --ctx) ctx=$2; shift 2 ;;
    --no-stream) stream=0; shift ;;
    --server-cpus) spin="taskset -c $2"; shift 2 ;;
    --client-cpus) cpin="taskset -c $2"; shift 2 ;;
    -h|--help) sed -n '2,36p' "$0"; exit 0 ;;
    *) echo "serve-bench.sh: unknown argument '$1' (see --help)" >&2; exit 1 ;;
  esac
done
command -v python3 > /dev/null || { echo "serve-bench.sh: python3 is needed (the client)" >&2; exit 1; }
# say MSG: a progress line on stderr with the seconds since the start (a run
# cut by a time limit shows where its time went: a large model's loads)
t0=$(date +%s)
say() { echo "serve-bench.sh: [$(($(date +%s) - t0)) s] $*" >&2; }
[ -x "$moejit" ] || { echo "serve-bench.sh: no moejit at $moejit (--moejit PATH)" >&2; exit 1; }
# reqs C: the requests a stream sends at concurrency C
reqs() {
  if [ -n "$requests" ]; then echo "$requests"; elif [ "$1" -ge 8 ]; then echo 4; else echo $(((32 + $1 - 1) / $1)); fi
}
max=0 total=0
for c in $streams; do
  if [ "$c" -gt $max ]; then max=$c; fi
  if [ $((c * $(reqs "$c"))) -gt $total ]; then total=$((c * $(reqs "$c"))); fi
done
tmp=$(mktemp -d)
spid=
trap 'if [ -n "$spid" ]; then kill -TERM $spid 2>/dev/null; fi; wait 2>/dev/null; rm -rf "$tmp"' EXIT
margs=
[ -n "$model" ] && margs="-m $model"

# The prompts: the most any concurrency sends (C x R), different so no cache
# of any kind could answer twice.
python3 -c '
import sys
topics = ["the sea", "a city at night", "mountains", "an old library", "trains", "rain", "a market", "the moon"]
n = int(sys.argv[1])
for i in range(n):
    print("Write a short story about %s, part %d." % (topics[i % len(topics)], i))
' $total > "$tmp/prompts.txt"

: > "$tmp/serve.err"
# shellcheck disable=SC2086
$spin "$moejit" serve $margs --backend "$backend" --port 0 --parallel "$max" --max-queue 4096 --ctx "$ctx" -q 2> "$tmp/serve.err" &
spid=$!
port=
for _ in $(seq 3000); do
  port=$(sed -n 's/^moejit: listening on http:\/\/127\.0\.0\.1:\([0-9][0-9]*\) .*/\1/p' "$tmp/serve.err")
  if [ -n "$port" ]; then break; fi
  kill -0 $spid 2> /dev/null || { echo "serve-bench.sh: moejit serve failed: $(cat "$tmp/serve.err")" >&2; exit 1; }
  sleep 0.2
done
[ -n "$port" ] || { echo "serve-bench.sh: moejit serve did not start in 10 minutes" >&2; exit 1; }

cat > "$tmp/client.py" << 'EOF'
# client.py PORT STREAMS REQUESTS NTOK PROMPTS STREAM: STREAMS processes
# (not threads: one interpreter lock would serialise their parsing of the
# events), each sending REQUESTS completions in turn; one JSON line of the
# results.
import http.client, json, multiprocessing, sys, time
# Request times are CLOCK_MONOTONIC, one clock for every process, so the
# span from the first request sent to the last response read compares across
# the streams (perf_counter's reference point is per process).
now = lambda: time.clock_gettime(time.CLOCK_MONOTONIC)
port, C, R, N, path = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
STREAM = sys.argv[6] == "1"
prompts = open(path, encoding="utf-8").read().splitlines()

def one(conn, prompt):
    body = {"prompt": prompt, "max_tokens": N, "stream": STREAM, "ignore_eos": True}
    if STREAM:
        body["stream_options"] = {"include_usage": True}
    t0 = now()
    conn.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
    r = conn.getresponse()
    if r.status != 200:
        raise RuntimeError("status %d: %s" % (r.status, r.read()[:200]))
    if not STREAM:
        tokens = json.loads(r.read())["usage"]["completion_tokens"]
        t1 = now()
        return {"ttft": float("nan"), "total": t1 - t0, "tokens": tokens, "t0": t0, "t1": t1}
    first, tokens = None, 0
    while True:
        line = r.readline()
        if not line:
            break
        if not line.startswith(b"data: "):
            continue
        data = line[6:].strip()
        if data == b"[DONE]":
            break
        d = json.loads(data)
        if d.get("usage"):
            tokens = d["usage"]["completion_tokens"]
        elif first is None:
            first = now()
    r.read()
    t1 = now()
    return {"ttft": (first or t1) - t0, "total": t1 - t0, "tokens": tokens, "t0": t0, "t1": t1}

def stream(k, go, out):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=3600)
    res, err = [], []
    go.wait()
    for j in range(R):
        try:
            res.append(one(conn, prompts[(k * R + j) % len(prompts)]))
        except Exception as e:
            err.append(str(e))
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=3600)
    out.put((res, err))

if C == 0:  # the warm-up
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=3600)
    one(conn, "warm up")
    sys.exit(0)
go, out = multiprocessing.Event(), multiprocessing.Queue()
procs = [multiprocessing.Process(target=stream, args=(k, go, out)) for k in range(C)]
for p in procs: p.start()
t0 = time.perf_counter()
go.set()  # every process started: all streams begin together
results, errors = [], []
for _ in procs:
    res, err = out.get()
    results += res
    errors += err
wall = time.perf_counter() - t0
for p in procs: p.join()
def pct(v, p):
    v = sorted(v)
    return v[min(len(v) - 1, int(p * len(v)))] if v else float("nan")
toks = sum(r["tokens"] for r in results)
# The rates count the span of the requests themselves (as generate counts
# from its first prompt submitted to its last token out), not the harness's
# process wake-up and result hand-back around them (wall_s): those were
# 12-15 ms a run, ~2% of one stream's 32 requests (2026-12-05, null GPU).
span = max(r["t1"] for r in results) - min(r["t0"] for r in results) if results else wall
print(json.dumps({"streams": C, "requests": len(results), "errors": len(errors), "first_error": errors[0] if errors else None,
                  "wall_s": wall, "span_s": span, "req_s": len(results) / span, "tok_s": toks / span, "tokens": toks,
                  "ttft_p50_ms": 1000 * pct([r["ttft"] for r in results], 0.5),
                  "ttft_p90_ms": 1000 * pct([r["ttft"] for r in results], 0.9),
                  "total_p50_ms": 1000 * pct([r["total"] for r in results], 0.5)}))
EOF

say "moejit serve on port $port ($backend); warming up"
python3 "$tmp/client.py" "$port" 0 1 "$ntok" "$tmp/prompts.txt" "$stream"
# The metrics after the warm-up and after each concurrency: their change over
# a run is its engine's step and gap times.
curl -s "http://127.0.0.1:$port/metrics" > "$tmp/metrics.warm" 2> /dev/null || true
for c in $streams; do
  say "$c streams x $(reqs "$c") requests of $ntok tokens"
  $cpin python3 "$tmp/client.py" "$port" "$c" "$(reqs "$c")" "$ntok" "$tmp/prompts.txt" "$stream" > "$tmp/serve.$c.json"
  say "serve, $c streams: $(cat "$tmp/serve.$c.json")" # kept should the run be cut before its table
  curl -s "http://127.0.0.1:$port/metrics" > "$tmp/metrics.$c" 2> /dev/null || true
done
curl -s "http://127.0.0.1:$port/metrics" > "$tmp/metrics" 2> /dev/null || true
kill -TERM $spid
wait $spid || echo "serve-bench.sh: warning: moejit serve exited with $?" >&2
spid=
# kernels the server compiled while serving (named under MOEJIT_LOG=2)
grep 'jit: compiled' "$tmp/serve.err" | sed 's/^/serve-bench.sh: serve: /' >&2

for c in $streams; do
  head -n $((c * $(reqs "$c"))) "$tmp/prompts.txt" > "$tmp/p.$c.txt"
  say "moejit generate --prompts ($((c * $(reqs "$c"))) prompts) --parallel $c"
  # shellcheck disable=SC2086
  $spin "$moejit" generate $margs --backend "$backend" --prompts "$tmp/p.$c.txt" --parallel "$c" -n "$ntok" --ctx "$ctx" \
    --temp 1 --top-p 1 --top-k 0 --min-p 0 --ignore-eos --json > "$tmp/gen.$c.jsonl" 2> "$tmp/gen.$c.err" ||
    { echo "serve-bench.sh: generate failed: $(tail -2 "$tmp/gen.$c.err")" >&2; }
done

python3 - "$tmp" "$streams" "${requests:-4 (32 in all below 8 streams)}" "$ntok" "$backend" "$model" "$stream" << 'EOF'
import json, re, sys
tmp, streams, R, N, backend, model = sys.argv[1], sys.argv[2].split(), sys.argv[3], sys.argv[4], sys.argv[5], sys.argv[6]
kind = "streamed" if sys.argv[7] == "1" else "whole (stream false)"
print("moejit serve, %s, model %s: %s completions of %s tokens, %s requests a stream\n" % (backend, model or "(built-in)", kind, N, R))
def metrics(path):
    out = {}
    try:
        for l in open(path).read().splitlines():
            m = re.match(r"(moejit_[a-z_]+) ([0-9.e+-]+)$", l)
            if m: out[m.group(1)] = float(m.group(2))
    except OSError:
        pass
    return out
def per_step(c, before):
    # serve's decode step and the engine's gap between steps, us: the
    # metrics' change over this concurrency's run
    a, b = metrics("%s/metrics.%s" % (tmp, before)), metrics("%s/metrics.%s" % (tmp, c))
    d = lambda k: b.get(k, 0) - a.get(k, 0)
    steps, gaps = d("moejit_decode_step_seconds_count"), d("moejit_engine_gaps_total")
    if steps <= 0 or gaps <= 0: return "n/a"
    return "%.1f / %.1f / %.1f" % (1e6 * d("moejit_decode_step_seconds_sum") / steps, 1e6 * d("moejit_engine_gap_seconds_total") / gaps,
                                   d("moejit_decode_rows_total") / steps)
print("| streams | requests | req/s | tok/s (serve) | TTFT p50 ms | TTFT p90 ms | request p50 ms | tok/s (generate --parallel) | step / gap us / rows (serve) | step / gap us / rows (generate) | span / harness s | errors |")
print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
before = "warm"
for c in streams:
    s = json.load(open("%s/serve.%s.json" % (tmp, c)))
    g, gs = "n/a", "n/a"
    try:
        err = open("%s/gen.%s.err" % (tmp, c)).read()
        m = re.search(r"tokens in [0-9.]+ ms \(([0-9.]+) tok/s\)", err)
        if m: g = m.group(1)
        m = re.search(r"steps of ([0-9.]+) rows on average \(([0-9.]+) us each, ([0-9.]+) us of the engine's between them\)", err)
        if m: gs = "%s / %s / %s" % (m.group(2), m.group(3), m.group(1))
    except OSError:
        pass
    print("| %s | %d | %.2f | %.1f | %.1f | %.1f | %.1f | %s | %s | %s | %.3f / %.3f | %d |" % (c, s["requests"], s["req_s"], s["tok_s"],
          s["ttft_p50_ms"], s["ttft_p90_ms"], s["total_p50_ms"], g, per_step(c, before), gs, s.get("span_s", s["wall_s"]),
          s["wall_s"], s["errors"]))
    before = c
    if s["first_error"]: print("\nfirst error at %s streams: %s\n" % (c, s["first_error"]))
print("\nreq/s and tok/s count the span from the first request sent to the last response read (span); the"
      " harness's wall time around it adds the client processes' start and hand-back.")
print("\nstep / gap / rows: the mean decode step and the engine thread's own time between two steps in a row"
      " (tokens out, wake-ups, lock waits), in us, and the mean rows a step (the batch the clients kept full).")
try:
    met = open(tmp + "/metrics").read()
    keep = [l for l in met.splitlines() if re.match(r"moejit_(kernel_compiles_total|kernel_cache_hits_total|decode_step_seconds_(sum|count)|decode_rows_total) ", l)]
    print("\nserver metrics at the end:\n\n    " + "\n    ".join(keep))
except OSError:
    pass
EOF
