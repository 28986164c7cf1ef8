#!/bin/sh
# nullgpu.sh: the GPU engine's host side on a GPU that runs nothing
# (tests/nullgpu/nullgpu.c through MOEJIT_LIBCUDA: memory is host memory,
# launches do nothing, so every drawn token is 0).  What it holds:
# - a warmed cache serves every step: after `moejit warmup` (which captures
#   the graphs here, the device being the target), generate and serve with
#   --backend cuda run under MOEJIT_CACHE=assert-warm, concurrent requests,
#   streamed and whole, a prompt longer than the largest graph, and compile
#   nothing (/metrics says 0); the same run on a cold cache fails on its
#   first kernel with one line, so the check can fail;
# - steps replay graphs (the driver's counts, NULLGPU_STATS);
# - bench decode runs to its tables (its host side, checked before a GPU
#   session would find a crash in it); bench moe's check of the layer
#   against the CPU reference fails it (exit 8) after its tables;
# - the tuner's correctness guard: on a device that computes nothing the
#   built-in plan's outputs stay poisoned, so `warmup --tune` stops with one
#   line and stores no record (before the poisoning, stale outputs of the
#   previous run passed every candidate).
. "$srcdir/tests/lib.sh"
# A test that stops early (a failed check, a timeout) takes its server with it.
trap 'for p in ${pids:-}; do kill -9 "$p" 2> /dev/null; done; rm -rf "$tmp"' EXIT
trap 'exit 1' HUP INT PIPE TERM
command -v curl > /dev/null || { echo "SKIP: curl not found"; exit 77; }
MOEJIT_LIBCUDA="$builddir/tests/nullgpu/libcuda.so.1"
export MOEJIT_LIBCUDA
[ -f "$MOEJIT_LIBCUDA" ] || { echo "FAIL: no $MOEJIT_LIBCUDA (make check builds it)"; exit 1; }
$MOEJIT mkmodel --preset medium --nvfp4 --seed 3 --out "$tmp/m" -q || { echo "FAIL mkmodel"; exit 1; }
export MOEJIT_CACHE_DIR="$tmp/cache"
$MOEJIT version | grep -q "^driver    CUDA 13.0, moejit null GPU (sm_90a, 132 SMs)" &&
  ok "the null GPU: $($MOEJIT version | grep '^driver')" || bad "version: $($MOEJIT version)"

# ---- a cold cache fails assert-warm (the check below can fail) ------------------------
printf 'Hello there\n' > "$tmp/p1"
MOEJIT_CACHE=assert-warm $MOEJIT generate -m "$tmp/m" --backend cuda --prompts "$tmp/p1" -n 4 > /dev/null 2> "$tmp/e0"
st=$?
if [ $st -ne 0 ] && grep -q "MOEJIT_CACHE=assert-warm: cache miss for key" "$tmp/e0"; then
  ok "cold cache: generate --backend cuda fails assert-warm (status $st)"
else
  bad "cold cache under assert-warm: status $st: $(cat "$tmp/e0")"
fi

# ---- warm-up: every kernel, and the graphs captured on the device --------------------
MOEJIT_CACHE=on $MOEJIT warmup -m "$tmp/m" --ctx 1024 -j 2 > "$tmp/w" 2> "$tmp/we"
st=$?
if [ $st -eq 0 ] && grep -q "for sm_90a, batch sizes 1,2,4,8,16,32,64: [0-9]* kernels, .* 0 failed" "$tmp/w" &&
  grep -q "graphs captured" "$tmp/w" && ! grep -q "no graphs captured" "$tmp/w"; then
  ok "warmup on the null GPU: $(head -1 "$tmp/w" | sed 's/.*batch sizes //')"
else
  bad "warmup: status $st: $(cat "$tmp/w" "$tmp/we")"
fi

# ---- generate: warm, graphs replayed, every prompt its tokens ------------------------
long=$(i=0; while [ $i -lt 90 ]; do printf 'word%d ' $i; i=$((i + 1)); done)
{ printf 'Hello there\n'; printf 'Write a story about the sea.\n'; printf '%s\n' "$long"; printf 'a\n'; printf 'b c\n'; } > "$tmp/p5"
NULLGPU_STATS=1 MOEJIT_CACHE=assert-warm $MOEJIT generate -m "$tmp/m" --backend cuda --ctx 1024 --prompts "$tmp/p5" \
  --parallel 3 -n 12 --json > "$tmp/g.jsonl" 2> "$tmp/ge"
st=$?
recs=$(grep -c '"generated_tokens": *12' "$tmp/g.jsonl")
replays=$(sed -n 's/^nullgpu: .* \([0-9]*\) graph replays.*/\1/p' "$tmp/ge")
if [ $st -eq 0 ] && [ "$recs" -eq 5 ] && [ "${replays:-0}" -gt 0 ]; then
  ok "generate --backend cuda, warm: 5 prompts (one of $(echo "$long" | wc -w) words) x 12 tokens, $replays graph replays, 0 compiles"
else
  bad "generate warm: status $st, $recs records, replays '${replays:-}': $(head -c 600 "$tmp/g.jsonl") $(cat "$tmp/ge")"
fi

! grep -q "gop_dsa_select: " "$tmp/ge" && ok "batch 1's DSA top-k over a cluster: no fallback warning" ||
  bad "a fallback warning on a part that places clusters: $(grep gop_dsa_select "$tmp/ge")"

# ---- a part that places no cluster: batch 1's DSA top-k on one block, warned once, warm ----
NULLGPU_CLUSTERS=0 MOEJIT_CACHE=assert-warm $MOEJIT generate -m "$tmp/m" --backend cuda --ctx 1024 --prompts "$tmp/p1" \
  -n 4 > /dev/null 2> "$tmp/gc"
st=$?
if [ $st -eq 0 ] && [ "$(grep -c 'gop_dsa_select: this GPU places no cluster of 8 blocks' "$tmp/gc")" -eq 1 ]; then
  ok "no cluster placed: one warning, the one-block top-k from the warm cache: $(grep -o 'batch 1.s top-k runs on one block' "$tmp/gc")"
else
  bad "no cluster placed: status $st: $(cat "$tmp/gc")"
fi

# ---- serve: concurrent clients, warm ------------------------------------------------
serve_bg srv env MOEJIT_CACHE=assert-warm $MOEJIT serve -m "$tmp/m" --backend cuda --ctx 1024 --parallel 8 --port 0
body() { # body STREAM PROMPT: a completion of 10 tokens
  printf '{"prompt": "%s", "max_tokens": 10, "stream": %s, "stream_options": {"include_usage": true}}' "$2" "$1"
}
i=0
for p in "Hello" "Write a story about trains." "$long" "x" "the sea at night" "one two three" "$long$long" "rain"; do
  s=false
  [ $((i % 2)) -eq 0 ] && s=true
  body $s "$p" > "$tmp/b$i"
  curl -s -N -m 120 -o "$tmp/r$i" -w '%{http_code}' -H 'Content-Type: application/json' --data-binary "@$tmp/b$i" \
    "http://127.0.0.1:$port/v1/completions" > "$tmp/s$i" &
  i=$((i + 1))
done
wait_clients() { # the 8 curls (not the server)
  for j in 0 1 2 3 4 5 6 7; do
    n=0
    while [ ! -s "$tmp/s$j" ] && [ $n -lt 600 ]; do sleep 0.1; n=$((n + 1)); done
  done
}
wait_clients
good=0
for j in 0 1 2 3 4 5 6 7; do
  [ "$(cat "$tmp/s$j")" = 200 ] && grep -q '"completion_tokens": *10' "$tmp/r$j" && good=$((good + 1))
done
[ $good -eq 8 ] && ok "serve --backend cuda: 8 concurrent completions (4 streamed), 10 tokens each" ||
  bad "serve: $good of 8 answered: $(for j in 0 1 2 3 4 5 6 7; do printf '[%s] %s ' "$(cat "$tmp/s$j")" "$(head -c 200 "$tmp/r$j")"; done) $(cat "$tmp/srv.err")"
curl -s -m 30 "http://127.0.0.1:$port/metrics" > "$tmp/metrics"
c=$(sed -n 's/^moejit_kernel_compiles_total \([0-9]*\)$/\1/p' "$tmp/metrics")
r=$(sed -n 's/^moejit_decode_rows_total \([0-9]*\)$/\1/p' "$tmp/metrics")
[ "$c" = 0 ] && [ "${r:-0}" -gt 0 ] && ok "serve compiled nothing: $r decode rows, moejit_kernel_compiles_total 0" ||
  bad "serve metrics: compiles '${c:-}', rows '${r:-}'"
kill -TERM $pid
i=0
while kill -0 $pid 2> /dev/null && [ $i -lt 600 ]; do sleep 0.1; i=$((i + 1)); done
if kill -0 $pid 2> /dev/null; then
  kill -9 $pid
  wait $pid
  bad "serve on the null GPU: still there 60 s after SIGTERM: $(tail -3 "$tmp/srv.err")"
else
  wait $pid
  st=$?
  [ $st -eq 0 ] && ok "serve on the null GPU: SIGTERM, exit 0" || bad "serve exit $st: $(tail -3 "$tmp/srv.err")"
fi

# ---- bench decode's host side: its tables, before a GPU session spends device time on it ----
$MOEJIT bench decode -m "$tmp/m" --batch 1,8 --ctx 1024 --steps 2 --reps 1 > "$tmp/bd" 2>&1
st=$?
if [ $st -eq 0 ] && grep -q "on moejit null GPU (sm_90a, 132 SMs)" "$tmp/bd" && grep -q "^| 1 | " "$tmp/bd" &&
  grep -q "^| 8 | " "$tmp/bd" && grep -q "^### batch 1: one profiled eager step, per op" "$tmp/bd" &&
  grep -q "^| moe.router | 2 | " "$tmp/bd"; then
  ok "bench decode on the null GPU: batches 1 and 8, the per-op table"
else
  bad "bench decode: status $st: $(head -c 1500 "$tmp/bd")"
fi

# --max-ctx: a server's cache (the attention's grid sized for it), rows of --ctx
$MOEJIT bench decode -m "$tmp/m" --batch 1 --ctx 64 --max-ctx 2048 --steps 1 --reps 1 > "$tmp/bdm" 2>&1
st=$?
if [ $st -eq 0 ] && grep -q "context 64 (each row attends to 65 tokens; caches of 2048; indexer keys f32)" "$tmp/bdm" &&
  grep -q "^| 1 | " "$tmp/bdm"; then
  ok "bench decode --max-ctx 2048 on the null GPU"
else
  bad "bench decode --max-ctx: status $st: $(head -c 1500 "$tmp/bdm")"
fi

# bench moe checks the layer against the CPU reference before its times count:
# on a device that computes nothing it prints its tables, then fails with one line.
$MOEJIT bench moe --batches 1 --experts 32 --hidden 1024 --inter 1024 --sets 1 --copies 1 --check-tokens 1 \
  --plan builtin > "$tmp/bm" 2> "$tmp/bme"
st=$?
if [ $st -eq 8 ] && grep -q "^correctness: rel err .* FAIL" "$tmp/bm" && [ "$(wc -l < "$tmp/bme")" -eq 1 ] &&
  grep -q "^moejit: bench moe: the layer differs from the CPU reference at batch 1 (rel err .*): the times above are of wrong output$" "$tmp/bme"; then
  ok "bench moe on a device that computes nothing: exit 8, $(cut -c1-60 "$tmp/bme")..."
else
  bad "bench moe's correctness gate: status $st: $(cat "$tmp/bme") $(head -c 600 "$tmp/bm")"
fi

# ---- the tuner's guard: nothing computed, nothing stored -----------------------------
MOEJIT_CACHE=on expect 8 "moejit: tune: bucket 1 gate_up: the built-in plan left outputs unwritten or not finite" \
  $MOEJIT warmup -m "$tmp/m" --tune --batches 1 -q
$MOEJIT cache list > "$tmp/list" 2>&1
if grep -q "^moe_expert\|^gemv" "$tmp/list"; then bad "tuning records stored: $(grep '^moe_expert\|^gemv' "$tmp/list")"; else ok "no tuning record stored"; fi
exit $fail
