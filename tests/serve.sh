#!/bin/sh
# serve.sh: `moejit serve` on the CPU backend with the built-in model, spoken
# to by real clients.  curl (always) and the official `openai` npm client
# (when npm can install it: tests/serve/package-lock.json) get the same text
# as `moejit generate` for the same prompt, seed and sampling, whole and
# streamed, completion and chat; 32 concurrent clients of 4 requests each
# get each its own request's text and token count (the references: one
# `generate --prompts` run, prompt k seeded 1000 + k); hostile clients
# (a truncated body, 10 MB bodies, invalid UTF-8, wrong fields, one byte a
# second, a stream dropped midway) each get their status while a
# well-behaved client keeps being served and the RSS stays bounded; a
# kept-alive connection silent between requests is the idle timeout's, not
# the request timeout's; a full queue is 503 with Retry-After; SIGTERM drains, cancels and exits 0; a
# model folder that does not load is generate's message and exit status;
# log probabilities on both routes, whole and streamed, by curl and the
# openai client, are well-formed (probe.py logprobs: each <= 0, the top
# lists of the size asked, in order, the tokens joined the text, greedy
# tokens the most likely); the penalties are taken and a bad one is a 400;
# the API keys come from --api-key, --api-key-file (one a line, each
# whole) or MOEJIT_API_KEY, and a bad one is one line naming where it was.
# Every server listens on 127.0.0.1 at --port 0 and says its port on stderr.
. "$srcdir/tests/lib.sh"
for p in curl python3; do
  command -v $p > /dev/null 2>&1 || { echo "FAIL: $p not found (scripts/deps.sh installs it)"; exit 1; }
done
probe="python3 $srcdir/tests/serve/probe.py"
export MOEJIT_DATA_DIR="$tmp/data"
KEY=sekrit
GEN_S="--temp 0.8 --top-p 0.9 --top-k 40 --min-p 0.05"
REQ_S='"temperature":0.8,"top_p":0.9,"top_k":40,"min_p":0.05'
pids=
cleanup() {
  for p in $pids; do kill -9 "$p" 2> /dev/null; done
  rm -rf "$tmp"
}
trap cleanup EXIT

# start NAME ARGS...: a server; sets pid and port (60 s for the line).
start() {
  name=$1
  shift
  # Under ASan (.ci/run's second build) freed memory waits in a quarantine
  # of 256 MB before reuse, which the RSS check below would read as growth:
  # a small one keeps the check meaningful there (other builds ignore it).
  serve_bg "$name" env ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}quarantine_size_mb=16" \
    $MOEJIT serve --port 0 --backend cpu "$@"
}
# post PATH BODY OUT [curl args]: the status code; the body in OUT.
post() {
  path=$1 body=$2 out=$3
  shift 3
  curl -s -o "$out" -w '%{http_code}' -H "Authorization: Bearer $KEY" -H 'Content-Type: application/json' \
    --data-binary "$body" "$@" "http://127.0.0.1:$port$path"
}
# stop PID: SIGTERM, the exit status.
stop() {
  kill -TERM "$1"
  wait "$1"
}

# ---- references: moejit generate (which also writes the built-in model) --------
$MOEJIT generate -p "hello world" -n 12 --seed 7 $GEN_S --json --backend cpu > "$tmp/ref_c.json" 2> "$tmp/gen.err" ||
  { echo "FAIL: generate: $(cat "$tmp/gen.err")"; exit 1; }
$MOEJIT generate --chat --no-think -p "hello world" -n 12 --seed 7 $GEN_S --json --backend cpu > "$tmp/ref_chat.json"
for i in $(seq 0 15); do echo "fox $((i * 7))"; done > "$tmp/prompts.txt"
$MOEJIT generate --prompts "$tmp/prompts.txt" --parallel 8 -n 6 --seed 1000 $GEN_S --json --backend cpu > "$tmp/refs.jsonl" 2> /dev/null
[ "$(wc -l < "$tmp/refs.jsonl")" -eq 16 ] || { echo "FAIL: generate --prompts: $(cat "$tmp/refs.jsonl")"; exit 1; }
# The comparisons below mean something only if seeds change the text.
python3 - "$tmp/refs.jsonl" << 'EOF' && ok "references: 16 prompts, texts differ" || bad "references are alike"
import json, sys
texts = [json.loads(l)["text"] for l in open(sys.argv[1], encoding="utf-8")]
sys.exit(0 if len(set(texts)) >= 10 and sum(1 for t in texts if t) >= 12 else 1)
EOF
model=$(basename "$(sed -n 's/.*"model":"\([^"]*\)".*/\1/p' "$tmp/ref_c.json")")

start main --parallel 8 --api-key $KEY --max-body 65536 --request-timeout 3
main_pid=$pid

# ---- curl: routes, keys, and generate's text -------------------------------------
[ "$(curl -s "http://127.0.0.1:$port/health")" = '{"status":"ok"}' ] && ok "GET /health" || bad "GET /health"
st=$(curl -s -o "$tmp/models" -w '%{http_code}' -H "Authorization: Bearer $KEY" "http://127.0.0.1:$port/v1/models")
[ "$st" = 200 ] && [ "$($probe field "$tmp/models" data.0.id)" = "\"$model\"" ] && ok "GET /v1/models: $model" || bad "models: $st $(cat "$tmp/models")"
# OpenAI's retrieve (GET /v1/models/ID) and vLLM's /version (open, as /health)
st1=$(curl -s -o "$tmp/m1" -w '%{http_code}' -H "Authorization: Bearer $KEY" "http://127.0.0.1:$port/v1/models/$model")
st2=$(curl -s -o "$tmp/m2" -w '%{http_code}' -H "Authorization: Bearer $KEY" "http://127.0.0.1:$port/v1/models/org/other")
st3=$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$port/v1/models/$model")
st4=$(curl -s -o "$tmp/ver" -w '%{http_code}' "http://127.0.0.1:$port/version")
[ "$st1$st2$st3$st4" = 200404401200 ] && [ "$($probe field "$tmp/m1" id)" = "\"$model\"" ] &&
  [ "$($probe field "$tmp/m1" object)" = '"model"' ] && [ "$($probe field "$tmp/m2" error.code)" = '"model_not_found"' ] &&
  [ "$($probe field "$tmp/ver" version)" = "\"$($MOEJIT version | sed -n '1s/^moejit *\([^ ]*\).*/\1/p')\"" ] &&
  ok "GET /v1/models/$model: the model; /v1/models/org/other: 404; no key: 401; /version: $(cat "$tmp/ver")" ||
  bad "models/ID, version: $st1 $st2 $st3 $st4 $(cat "$tmp/m1" "$tmp/m2" "$tmp/ver")"
st=$(curl -s -o "$tmp/o" -w '%{http_code}' "http://127.0.0.1:$port/v1/models")
[ "$st" = 401 ] && [ "$($probe field "$tmp/o" error.code)" = '"invalid_api_key"' ] && ok "no key: 401" || bad "no key: $st $(cat "$tmp/o")"
st=$(curl -s -o "$tmp/o" -w '%{http_code}' -H "Authorization: Bearer wrong" "http://127.0.0.1:$port/v1/models")
[ "$st" = 401 ] && ok "wrong key: 401" || bad "wrong key: $st"
st=$(curl -s -o "$tmp/o" -w '%{http_code}' -H "Authorization: Bearer ${KEY}x" "http://127.0.0.1:$port/v1/models")
st2=$(curl -s -o "$tmp/o" -w '%{http_code}' -H "Authorization: Bearer $(head -c 600 /dev/zero | tr '\0' k)" "http://127.0.0.1:$port/v1/models")
[ "$st" = 401 ] && [ "$st2" = 401 ] && ok "the key and a character more: 401; 600 characters: 401" || bad "longer keys: $st $st2"
st=$(curl -s -o "$tmp/o" -w '%{http_code}' -H "Authorization: Bearer $KEY" "http://127.0.0.1:$port/v1/nothing")
[ "$st" = 404 ] && ok "unknown route: 404" || bad "unknown route: $st"
st=$(curl -s -o "$tmp/o" -D "$tmp/h" -w '%{http_code}' -H "Authorization: Bearer $KEY" "http://127.0.0.1:$port/v1/completions")
[ "$st" = 405 ] && grep -qi '^Allow: POST' "$tmp/h" && ok "GET /v1/completions: 405, Allow: POST" || bad "wrong method: $st"
st=$(post /v1/completions "{\"model\":\"other\",\"prompt\":\"x\"}" "$tmp/o")
[ "$st" = 404 ] && [ "$($probe field "$tmp/o" error.param)" = '"model"' ] && ok "another model: 404" || bad "another model: $st"

ref_text=$($probe field "$tmp/ref_c.json" text)
ref_n=$($probe field "$tmp/ref_c.json" generated_tokens)
st=$(post /v1/completions "{\"model\":\"$model\",\"prompt\":\"hello world\",\"max_tokens\":12,\"seed\":7,$REQ_S}" "$tmp/c.json")
[ "$st" = 200 ] && [ "$($probe field "$tmp/c.json" choices.0.text)" = "$ref_text" ] &&
  [ "$($probe field "$tmp/c.json" usage.completion_tokens)" = "$ref_n" ] && [ "$($probe field "$tmp/c.json" object)" = '"text_completion"' ] &&
  ok "curl completion = generate: $ref_text, $ref_n tokens" || bad "curl completion: $st $(cat "$tmp/c.json") / $ref_text"
# "\u0000" in a stop string is a character of it (a 400 once): the text's first character and a
# NUL, which the text does not hold, leave generate's text whole; cut at its NUL, the stop string
# would end the text at once.
nulstop=$(python3 -c 'import json, sys; print(json.dumps([json.loads(sys.argv[1])[:1] + "\u0000"]))' "$ref_text")
st=$(post /v1/completions "{\"prompt\":\"hello world\",\"max_tokens\":12,\"seed\":7,\"stop\":$nulstop,$REQ_S}" "$tmp/cn.json")
[ "$st" = 200 ] && [ "$($probe field "$tmp/cn.json" choices.0.text)" = "$ref_text" ] &&
  ok "stop $nulstop (NUL inside): accepted, no match, generate's text" || bad "stop $nulstop: $st $(cat "$tmp/cn.json") / $ref_text"
post /v1/completions "{\"prompt\":\"hello world\",\"max_tokens\":12,\"seed\":7,\"stream\":true,$REQ_S}" "$tmp/cs.sse" -N > /dev/null
$probe sse "$tmp/cs.sse" > "$tmp/cs.json"
[ "$($probe field "$tmp/cs.json" text)" = "$ref_text" ] && [ "$($probe field "$tmp/cs.json" done)" = true ] &&
  [ "$($probe field "$tmp/cs.json" chunks)" = "$ref_n" ] && [ "$($probe field "$tmp/cs.json" finish)" = '"length"' ] &&
  ok "curl completion stream = generate, one chunk a token, [DONE]" || bad "curl stream: $(cat "$tmp/cs.json")"
# The prompt as token ids (moejit tokenize's, which a text prompt is encoded to), alone or as a
# batch of one, and the text as a batch of one: generate's text again.
ids=$($MOEJIT tokenize -m "$MOEJIT_DATA_DIR/$model" "hello world" | paste -sd, -)
for p in "[$ids]" "[[$ids]]" '["hello world"]'; do
  st=$(post /v1/completions "{\"prompt\":$p,\"max_tokens\":12,\"seed\":7,$REQ_S}" "$tmp/ci.json")
  [ "$st" = 200 ] && [ "$($probe field "$tmp/ci.json" choices.0.text)" = "$ref_text" ] &&
    [ "$($probe field "$tmp/ci.json" usage.prompt_tokens)" = "$($probe field "$tmp/c.json" usage.prompt_tokens)" ] || break
done
[ "$st" = 200 ] && [ "$($probe field "$tmp/ci.json" choices.0.text)" = "$ref_text" ] &&
  ok "prompt [$ids], as [[ids]] and [\"hello world\"]: generate's text" || bad "prompt $p: $st $(cat "$tmp/ci.json")"
# n and a batch of prompts: choice p x n + j is prompt p drawn with seed + j, so each is generate's
# text for that prompt and seed; whole and streamed (chunks of the choices interleaved, each with
# its index); usage counts each prompt once and every choice's tokens.
$MOEJIT generate -p "hello world" -n 12 --seed 8 $GEN_S --json --backend cpu > "$tmp/ref_c8.json" 2> /dev/null
$MOEJIT generate -p "fox 0" -n 12 --seed 7 $GEN_S --json --backend cpu > "$tmp/ref_f7.json" 2> /dev/null
$MOEJIT generate -p "fox 0" -n 12 --seed 8 $GEN_S --json --backend cpu > "$tmp/ref_f8.json" 2> /dev/null
st=$(post /v1/completions "{\"prompt\":[\"hello world\",\"fox 0\"],\"n\":2,\"max_tokens\":12,\"seed\":7,$REQ_S}" "$tmp/cb.json")
post /v1/completions "{\"prompt\":[\"hello world\",\"fox 0\"],\"n\":2,\"max_tokens\":12,\"seed\":7,\"stream\":true,\"stream_options\":{\"include_usage\":true},$REQ_S}" "$tmp/cb.sse" -N > /dev/null
$probe sse "$tmp/cb.sse" > "$tmp/cb.sse.json"
st2=$(post /v1/chat/completions "{\"messages\":[{\"role\":\"user\",\"content\":\"hello world\"}],\"n\":3,\"max_tokens\":12,\"seed\":7,\"stream\":true,$REQ_S}" "$tmp/chn.sse" -N)
$probe sse "$tmp/chn.sse" > "$tmp/chn.json"
st3=$(post /v1/completions "{\"prompt\":\"hello world\",\"echo\":true,\"n\":2,\"max_tokens\":12,\"seed\":7,$REQ_S}" "$tmp/cbe.json")
[ "$st$st2$st3" = 200200200 ] && python3 - "$tmp" << 'EOF' && ok "n 2 x 2 prompts: generate's text for each prompt and seed + draw, whole and streamed; usage; chat n 3; echo n 2" || bad "n / batch: $st $st2 $st3 $(cat "$tmp/cb.json" "$tmp/cb.sse.json" "$tmp/chn.json")"
import json, sys
t = sys.argv[1]
refs = [json.load(open("%s/%s" % (t, f), encoding="utf-8")) for f in ("ref_c.json", "ref_c8.json", "ref_f7.json", "ref_f8.json")]
whole = json.load(open(t + "/cb.json", encoding="utf-8"))
assert [c["index"] for c in whole["choices"]] == [0, 1, 2, 3], whole["choices"]
assert [c["text"] for c in whole["choices"]] == [r["text"] for r in refs]
assert len(set(c["text"] for c in whole["choices"])) == 4  # seeds and prompts change the text
assert [c["finish_reason"] for c in whole["choices"]] == ["length"] * 4
u = whole["usage"]
assert u["prompt_tokens"] == refs[0]["prompt_tokens"] + refs[2]["prompt_tokens"], u
assert u["completion_tokens"] == sum(r["generated_tokens"] for r in refs), u
s = json.load(open(t + "/cb.sse.json", encoding="utf-8"))
assert s["done"] and s["indices"] == [0, 1, 2, 3] and s["error"] is None, s
assert [c["text"] for c in s["choices"]] == [r["text"] for r in refs], s
assert all(c["finish"] == "length" and c["chunks"] == 12 and "after_finish" not in c for c in s["choices"]), s
assert s["usage"] == u, (s["usage"], u)
ch = json.load(open(t + "/chn.json", encoding="utf-8"))
assert ch["done"] and ch["indices"] == [0, 1, 2] and all(c["first_role"] for c in ch["choices"]), ch
assert len(set(c["text"] for c in ch["choices"])) == 3, ch
echo = json.load(open(t + "/cbe.json", encoding="utf-8"))
assert [c["text"] for c in echo["choices"]] == ["hello world" + r["text"] for r in refs[:2]], echo
EOF
# vLLM's /tokenize (a prompt; chat messages) and /detokenize: moejit tokenize's ids, and back
chat_ids=$($MOEJIT tokenize -m "$MOEJIT_DATA_DIR/$model" --chat --no-think "hello world" | paste -sd, -)
st1=$(post /tokenize '{"prompt":"hello world"}' "$tmp/t1.json")
st2=$(post /tokenize '{"messages":[{"role":"user","content":"hello world"}]}' "$tmp/t2.json")
st3=$(post /detokenize "{\"tokens\":[$ids]}" "$tmp/t3.json")
st4=$(post /detokenize '{"tokens":[1,99999999]}' "$tmp/t4.json")
st5=$(curl -s -o /dev/null -w '%{http_code}' --data-binary '{"prompt":"x"}' "http://127.0.0.1:$port/tokenize")
[ "$st1$st2$st3$st4$st5" = 200200200400401 ] && [ "$($probe field "$tmp/t1.json" tokens)" = "[$(echo "$ids" | sed 's/,/, /g')]" ] &&
  [ "$($probe field "$tmp/t1.json" count)" = "$(echo "$ids" | tr , '\n' | wc -l)" ] &&
  [ "$($probe field "$tmp/t2.json" tokens)" = "[$(echo "$chat_ids" | sed 's/,/, /g')]" ] &&
  [ "$($probe field "$tmp/t3.json" prompt)" = '"hello world"' ] && [ "$($probe field "$tmp/t4.json" error.param)" = '"tokens"' ] &&
  ok "/tokenize (prompt, messages) = moejit tokenize, /detokenize its inverse; an id outside 400; no key 401" ||
  bad "/tokenize: $st1 $st2 $st3 $st4 $st5 $(cat "$tmp/t1.json" "$tmp/t2.json" "$tmp/t3.json" "$tmp/t4.json")"
# echo: the prompt's text first; the ids' decoded (a stream's first chunk)
echo_ref=$(python3 -c 'import json, sys; print(json.dumps("hello world" + json.loads(sys.argv[1])))' "$ref_text")
st=$(post /v1/completions "{\"prompt\":\"hello world\",\"echo\":true,\"max_tokens\":12,\"seed\":7,$REQ_S}" "$tmp/ce.json")
post /v1/completions "{\"prompt\":[$ids],\"echo\":true,\"stream\":true,\"max_tokens\":12,\"seed\":7,$REQ_S}" "$tmp/ce.sse" -N > /dev/null
$probe sse "$tmp/ce.sse" > "$tmp/ce.sse.json"
[ "$st" = 200 ] && [ "$($probe field "$tmp/ce.json" choices.0.text)" = "$echo_ref" ] &&
  [ "$($probe field "$tmp/ce.json" usage.completion_tokens)" = "$ref_n" ] &&
  [ "$($probe field "$tmp/ce.sse.json" text)" = "$echo_ref" ] && [ "$($probe field "$tmp/ce.sse.json" chunks)" = $((ref_n + 1)) ] &&
  ok "echo: the prompt, then generate's text (whole; streamed from ids, one chunk more)" ||
  bad "echo: $st $(cat "$tmp/ce.json") / $(cat "$tmp/ce.sse.json") / $echo_ref"
ref_chat=$($probe field "$tmp/ref_chat.json" text)
post /v1/chat/completions "{\"messages\":[{\"role\":\"user\",\"content\":\"hello world\"}],\"max_tokens\":12,\"seed\":7,$REQ_S}" "$tmp/ch.json" > /dev/null
[ "$($probe field "$tmp/ch.json" choices.0.message.content)" = "$ref_chat" ] && [ "$($probe field "$tmp/ch.json" object)" = '"chat.completion"' ] &&
  ok "curl chat = generate --chat --no-think: $ref_chat" || bad "curl chat: $(cat "$tmp/ch.json") / $ref_chat"
post /v1/chat/completions "{\"messages\":[{\"role\":\"user\",\"content\":\"hello world\"}],\"max_tokens\":12,\"seed\":7,\"stream\":true,\"stream_options\":{\"include_usage\":true},$REQ_S}" "$tmp/chs.sse" -N > /dev/null
$probe sse "$tmp/chs.sse" > "$tmp/chs.json"
grep -q '"object":"chat.completion.chunk"' "$tmp/chs.sse" && [ "$($probe field "$tmp/chs.json" text)" = "$ref_chat" ] &&
  [ "$($probe field "$tmp/chs.json" usage.completion_tokens)" = "$($probe field "$tmp/ref_chat.json" generated_tokens)" ] &&
  ok "curl chat stream = generate, usage chunk" || bad "curl chat stream: $(cat "$tmp/chs.json")"
# "\u0000" inside a message is a character of its text, not its end
post /v1/chat/completions '{"messages":[{"role":"user","content":"hello"}],"max_tokens":1}' "$tmp/nul0.json" > /dev/null
st=$(post /v1/chat/completions '{"messages":[{"role":"user","content":"hello\u0000world"}],"max_tokens":1}' "$tmp/nul1.json")
n0=$($probe field "$tmp/nul0.json" usage.prompt_tokens)
n1=$($probe field "$tmp/nul1.json" usage.prompt_tokens)
[ "$st" = 200 ] && [ "$n1" -gt "$n0" ] && ok "chat content \"hello\\u0000world\": $n1 prompt tokens (\"hello\": $n0)" ||
  bad "NUL in chat content: $st $(cat "$tmp/nul1.json"), $n1 prompt tokens vs $n0"

# ---- log probabilities and penalties --------------------------------------------------
HELLO='"messages":[{"role":"user","content":"hello world"}]'
post /v1/completions '{"prompt":"hello world","max_tokens":8,"logprobs":3,"temperature":0}' "$tmp/lp1.json" > /dev/null
post /v1/completions "{\"prompt\":\"hello world\",\"max_tokens\":12,\"logprobs\":2,\"stream\":true,\"seed\":7,$REQ_S}" "$tmp/lp2.sse" -N > /dev/null
post /v1/chat/completions "{$HELLO,\"max_tokens\":8,\"logprobs\":true,\"top_logprobs\":4,\"temperature\":0}" "$tmp/lp3.json" > /dev/null
post /v1/chat/completions "{$HELLO,\"max_tokens\":8,\"logprobs\":true,\"top_logprobs\":2,\"stream\":true,\"seed\":7,$REQ_S}" "$tmp/lp4.sse" -N > /dev/null
for c in "lp1.json 3 1 completion, greedy, logprobs 3" "lp2.sse 2 0 completion stream, logprobs 2" \
  "lp3.json 4 1 chat, greedy, top_logprobs 4" "lp4.sse 2 0 chat stream, top_logprobs 2"; do
  set -- $c
  f=$1 n=$2 g=$3
  shift 3
  $probe logprobs "$tmp/$f" $n $g > "$tmp/lp.out" && ok "curl logprobs, $*: $(cat "$tmp/lp.out")" || bad "curl logprobs, $*: $(cat "$tmp/lp.out") $(head -c 600 "$tmp/$f")"
done
# the same request without logprobs: the same text (seeded, drawn on the host either way on the CPU)
[ "$($probe sse "$tmp/lp2.sse" | python3 -c 'import json,sys; print(json.dumps(json.load(sys.stdin)["text"]))')" = "$ref_text" ] &&
  ok "a streamed completion with logprobs: generate's text" || bad "logprobs changed the text: $(head -c 400 "$tmp/lp2.sse")"
# (ignore_eos: unseeded, the draw may end at an end-of-sequence id before 8 tokens, as it once did)
st=$(post /v1/completions '{"prompt":"hello world","max_tokens":8,"ignore_eos":true,"presence_penalty":1.5,"frequency_penalty":-0.5,"repetition_penalty":1.2}' "$tmp/pen.json")
[ "$st" = 200 ] && [ "$($probe field "$tmp/pen.json" usage.completion_tokens)" = 8 ] && ok "presence, frequency and repetition penalties taken" ||
  bad "penalties: $st $(cat "$tmp/pen.json")"
st=$(post /v1/chat/completions "{$HELLO,\"top_logprobs\":3}" "$tmp/o")
[ "$st" = 400 ] && [ "$($probe field "$tmp/o" error.param)" = '"top_logprobs"' ] && ok "chat top_logprobs without logprobs: 400 $($probe field "$tmp/o" error.message)" ||
  bad "chat top_logprobs alone: $st $(cat "$tmp/o")"

# ---- the openai npm client ----------------------------------------------------------
cdir=$srcdir/tests/serve
if ! command -v npm > /dev/null 2>&1 || ! command -v node > /dev/null 2>&1; then
  echo "SKIP openai client: npm or node not found (the curl checks above ran)"
elif [ ! -f "$cdir/node_modules/.package-lock.json" ] && ! (cd "$cdir" && npm ci --no-audit --no-fund --loglevel=error > "$tmp/npm.log" 2>&1); then
  echo "SKIP openai client: npm ci in $cdir failed (no registry?): $(tail -1 "$tmp/npm.log")"
else
  node "$cdir/client.mjs" "http://127.0.0.1:$port/v1" $KEY "$model" "hello world" 12 7 > "$tmp/js.json" 2> "$tmp/js.err" ||
    bad "openai client: $(cat "$tmp/js.err")"
  [ "$($probe field "$tmp/js.json" models)" = "[\"$model\"]" ] && [ "$($probe field "$tmp/js.json" model)" = "\"$model\"" ] &&
    ok "openai client: models.list and models.retrieve: $model" || bad "openai client models: $(cat "$tmp/js.json")"
  for way in completion completion_stream; do
    [ "$($probe field "$tmp/js.json" $way.text)" = "$ref_text" ] && [ "$($probe field "$tmp/js.json" $way.finish)" = '"length"' ] &&
      ok "openai client: $way = generate" || bad "openai client $way: $(cat "$tmp/js.json")"
  done
  for way in chat chat_stream; do
    [ "$($probe field "$tmp/js.json" $way.text)" = "$ref_chat" ] && [ "$($probe field "$tmp/js.json" $way.tokens)" = 12 ] &&
      ok "openai client: $way = generate --chat" || bad "openai client $way: $(cat "$tmp/js.json")"
  done
  [ "$($probe field "$tmp/js.json" bad.status)" = 400 ] && [ "$($probe field "$tmp/js.json" bad.param)" = '"max_tokens"' ] &&
    ok "openai client: max_tokens -1 is its BadRequestError, param max_tokens" || bad "openai client bad: $(cat "$tmp/js.json")"
  for way in "lp_completion 2 completion, logprobs 2" "lp_completion_stream 1 completion stream, logprobs 1" \
    "lp_chat 3 chat, top_logprobs 3" "lp_chat_stream 5 chat stream, top_logprobs 5"; do
    set -- $way
    f=$1 n=$2
    shift 2
    $probe field "$tmp/js.json" "$f" > "$tmp/$f.json"
    $probe logprobs "$tmp/$f.json" $n 0 > "$tmp/lp.out" && ok "openai client logprobs, $*: $(cat "$tmp/lp.out")" ||
      bad "openai client logprobs, $*: $(cat "$tmp/lp.out") $(head -c 600 "$tmp/$f.json")"
  done
  # n 2: choice 0 is the request alone (seed 7), choice 1 generate's text for seed 8; the chat's differ
  [ "$($probe field "$tmp/js.json" n2.texts.0)" = "$ref_text" ] &&
    [ "$($probe field "$tmp/js.json" n2.texts.1)" = "$($probe field "$tmp/ref_c8.json" text)" ] &&
    [ "$($probe field "$tmp/js.json" n2.index)" = "[0, 1]" ] && [ "$($probe field "$tmp/js.json" n2.tokens)" = 24 ] &&
    [ "$($probe field "$tmp/js.json" n2_chat_stream.texts.0)" = "$ref_chat" ] &&
    [ "$($probe field "$tmp/js.json" n2_chat_stream.texts.0)" != "$($probe field "$tmp/js.json" n2_chat_stream.texts.1)" ] &&
    ok "openai client: n 2, completion whole and chat streamed: seed + draw, generate's texts" || bad "openai client n 2: $(cat "$tmp/js.json")"
  [ "$($probe field "$tmp/js.json" bad_penalty.status)" = 400 ] && [ "$($probe field "$tmp/js.json" bad_penalty.param)" = '"presence_penalty"' ] &&
    ok "openai client: presence_penalty 3 is its BadRequestError, param presence_penalty" || bad "openai client bad penalty: $(cat "$tmp/js.json")"
fi

# ---- load: 32 clients x 4 requests, streamed and whole, all at once ----------------
rss0=$($probe rss $main_pid)
t0=$(date +%s)
for c in $(seq 0 31); do
  (
    for j in 0 1 2 3; do
      k=$(((c * 4 + j) % 16))
      prompt=$(sed -n "$((k + 1))p" "$tmp/prompts.txt")
      stream=false
      [ $((j % 2)) = 1 ] && stream=true
      post /v1/completions "{\"prompt\":\"$prompt\",\"max_tokens\":6,\"seed\":$((1000 + k)),\"stream\":$stream,$REQ_S}" \
        "$tmp/load.$c.$j" -N > "$tmp/load.$c.$j.status"
    done
  ) &
  clients="${clients:-} $!"
done
wait $clients
python3 - "$tmp" << 'EOF' && ok "load: 128 requests of 32 clients, each its own text and token count ($(($(date +%s) - t0)) s)" || bad "load"
import json, sys
tmp = sys.argv[1]
refs = [json.loads(l) for l in open(tmp + "/refs.jsonl", encoding="utf-8")]
bad = 0
for c in range(32):
    for j in range(4):
        k = (c * 4 + j) % 16
        f = "%s/load.%d.%d" % (tmp, c, j)
        st = open(f + ".status").read().strip()
        if j % 2:
            text, finish, chunks, usage = "", None, 0, None
            for line in open(f, encoding="utf-8"):
                if line.startswith("data: ") and line[6:].strip() != "[DONE]":
                    d = json.loads(line[6:])
                    for ch in d["choices"]:
                        chunks += 1
                        text += ch["text"]
                        finish = ch["finish_reason"] or finish
            n = chunks if finish == "length" else chunks - 1
            done = open(f, encoding="utf-8").read().endswith("data: [DONE]\n\n")
        else:
            d = json.load(open(f, encoding="utf-8"))
            text, finish, n, done = d["choices"][0]["text"], d["choices"][0]["finish_reason"], d["usage"]["completion_tokens"], True
        want_finish = "length" if refs[k]["stop"] == "length" else "stop"
        if st != "200" or text != refs[k]["text"] or n != refs[k]["generated_tokens"] or finish != want_finish or not done or \
           (finish == "length" and n != 6):
            bad += 1
            print("  client %d request %d (prompt %d): status %s, %r %d tokens %s; want %r %d tokens" %
                  (c, j, k, st, text, n, finish, refs[k]["text"], refs[k]["generated_tokens"]))
sys.exit(1 if bad else 0)
EOF
[ "$($probe metric "$port" moejit_requests_total)" -ge 128 ] && [ "$($probe metric "$port" moejit_running_sequences)" = 0 ] &&
  ok "metrics after the load: $($probe metric "$port" moejit_requests_total) requests, $($probe metric "$port" moejit_generation_tokens_total) tokens out, 0 running" ||
  bad "metrics after the load: $(curl -s "http://127.0.0.1:$port/metrics" | grep -v '^#' | head -20)"
curl -s "http://127.0.0.1:$port/metrics" > "$tmp/m"
grep -q '^moejit_decode_step_seconds_bucket{le="+Inf"} [1-9]' "$tmp/m" && grep -q '^# TYPE moejit_decode_step_seconds histogram' "$tmp/m" &&
  grep -q '^moejit_kernel_compiles_total ' "$tmp/m" && grep -q '^moejit_queue_depth 0' "$tmp/m" &&
  grep -q '^moejit_engine_gaps_total [1-9]' "$tmp/m" && grep -q '^moejit_engine_gap_seconds_total [0-9.e-]*[1-9]' "$tmp/m" &&
  grep -q '^# TYPE moejit_engine_events_seconds_total counter' "$tmp/m" &&
  ok "metrics: step-time histogram, the engine's gaps, kernel cache, queue depth" || bad "metrics: $(cat "$tmp/m")"
rss1=$($probe rss $main_pid)

# ---- hostile clients, while a well-behaved one is served ------------------------------
(
  for j in 0 1 2 3 4 5; do
    post /v1/completions "{\"prompt\":\"$(sed -n 1p "$tmp/prompts.txt")\",\"max_tokens\":6,\"seed\":1000,$REQ_S}" "$tmp/good.$j" > "$tmp/good.$j.status"
  done
) &
good=$!
$probe slow "$port" > "$tmp/slow" &
slow=$!
$probe keepalive "$port" 5 > "$tmp/keepalive" &
keepalive=$!
$probe truncated "$port" > /dev/null && ok "a truncated body, then close" || bad "truncated body"
head -c 10485760 /dev/zero | tr '\0' 'a' > "$tmp/10mb"
st=$(curl -s -o "$tmp/o" -w '%{http_code}' -H "Authorization: Bearer $KEY" --data-binary @"$tmp/10mb" "http://127.0.0.1:$port/v1/completions")
[ "$st" = 413 ] && [ "$($probe field "$tmp/o" error.code)" = '"body_too_large"' ] && ok "10 MB body: 413" || bad "10 MB body: $st $(head -c 300 "$tmp/o")"
st=$(curl -s -o "$tmp/o" -w '%{http_code}' -H "Authorization: Bearer $KEY" -H 'Transfer-Encoding: chunked' --data-binary @"$tmp/10mb" "http://127.0.0.1:$port/v1/completions")
[ "$st" = 413 ] && ok "10 MB chunked body (no Content-Length): 413" || bad "10 MB chunked body: $st"
printf '{"prompt":"bad \377\376 bytes","max_tokens":2}' > "$tmp/badutf8"
st=$(curl -s -o "$tmp/o" -w '%{http_code}' -H "Authorization: Bearer $KEY" --data-binary @"$tmp/badutf8" "http://127.0.0.1:$port/v1/completions")
[ "$st" = 400 ] && grep -q 'invalid UTF-8' "$tmp/o" && [ "$($probe field "$tmp/o" error.type)" = '"invalid_request_error"' ] &&
  ok "invalid UTF-8: 400, $($probe field "$tmp/o" error.message)" || bad "invalid UTF-8: $st $(cat "$tmp/o")"
# expect400 BODY PARAM: 400 naming PARAM
expect400() {
  st=$(post /v1/completions "$1" "$tmp/o")
  if [ "$st" = 400 ] && [ "$($probe field "$tmp/o" error.param)" = "$2" ]; then ok "400 $2: $($probe field "$tmp/o" error.message)"
  else bad "$1: $st $(cat "$tmp/o")"; fi
}
expect400 '{"prompt":"x","max_tokens":-5}' '"max_tokens"'
expect400 '{"prompt":"x","temperature":"hot"}' '"temperature"'
expect400 '{"prompt":{"a":1}}' '"prompt"'
expect400 '{"prompt":["a",""]}' '"prompt"'
expect400 '{"prompt":"x","n":65}' '"n"'
expect400 '{"prompt":"x","stop":[1,2]}' '"stop"'
expect400 '{"prompt":"x"' 'null'
expect400 '{"prompt":""}' '"prompt"'
expect400 '{"prompt":"x","logprobs":9}' '"logprobs"'
expect400 '{"prompt":"x","frequency_penalty":-3}' '"frequency_penalty"'
expect400 '{"prompt":"x","repetition_penalty":0}' '"repetition_penalty"'
$probe disconnect "$port" $KEY > "$tmp/disc" && ok "a stream dropped after its first event: $(cat "$tmp/disc")" || bad "disconnect: $(cat "$tmp/disc")"
running=1
for _ in $(seq 50); do
  running=$($probe metric "$port" moejit_running_sequences)
  [ "$running" = 0 ] && break
  sleep 0.1
done
[ "$running" = 0 ] && [ "$($probe metric "$port" moejit_http_client_disconnects_total)" -ge 1 ] &&
  [ "$($probe metric "$port" moejit_requests_cancelled_total)" -ge 1 ] &&
  ok "the dropped stream's slot is freed: running sequences 0, its request cancelled" || bad "after the disconnect: running $running"
# The same with 3 choices, streamed and whole: every choice's slot comes back.
d0=$($probe metric "$port" moejit_http_client_disconnects_total)
for mode in 1 0; do
  $probe disconnect "$port" $KEY 3 $mode > "$tmp/disc3" || bad "disconnect n 3: $(cat "$tmp/disc3")"
  for _ in $(seq 50); do
    running=$($probe metric "$port" moejit_running_sequences)
    [ "$running" = 0 ] && break
    sleep 0.1
  done
  [ "$running" = 0 ] || break
done
[ "$running" = 0 ] && [ "$($probe metric "$port" moejit_http_client_disconnects_total)" -ge $((d0 + 2)) ] &&
  ok "a request of 3 choices dropped, streamed and whole: running sequences 0" || bad "after the n 3 disconnect ($mode): running $running"
wait $slow
grep -q "^closed after [3-6] s" "$tmp/slow" && [ "$($probe metric "$port" moejit_http_request_timeouts_total)" -ge 1 ] &&
  ok "one byte a second: $(cat "$tmp/slow") (--request-timeout 3)" || bad "slow client: $(cat "$tmp/slow")"
# The request timeout runs while a request arrives, not while a kept-alive
# connection waits silent for the next (that is --idle-timeout's, 60 s here).
wait $keepalive
grep -q "^answered again after 5 s silent: HTTP/1.1 200" "$tmp/keepalive" &&
  ok "a keep-alive connection silent 5 s (> --request-timeout 3), then a request: $(cat "$tmp/keepalive")" ||
  bad "keep-alive: $(cat "$tmp/keepalive")"
wait $good
want=$(sed -n 1p "$tmp/refs.jsonl" | python3 -c 'import json,sys; print(json.dumps(json.load(sys.stdin)["text"]))')
goods=0
for j in 0 1 2 3 4 5; do
  [ "$(cat "$tmp/good.$j.status")" = 200 ] && [ "$($probe field "$tmp/good.$j" choices.0.text)" = "$want" ] && goods=$((goods + 1))
done
[ $goods = 6 ] && ok "meanwhile a well-behaved client: 6 of 6 answered, each the right text" || bad "well-behaved client: $goods of 6"
rss2=$($probe rss $main_pid)
[ $((rss2 - rss1)) -lt 65536 ] && [ $((rss1 - rss0)) -lt 131072 ] &&
  ok "RSS: $rss0 KiB, $rss1 after the load, $rss2 after the hostile clients" || bad "RSS grew: $rss0, $rss1, $rss2 KiB"
stop $main_pid
st=$?
[ $st = 0 ] && grep -q "^moejit: stopped" "$tmp/main.err" && ok "SIGTERM, idle: exit 0" || bad "SIGTERM: status $st: $(tail -3 "$tmp/main.err")"

# ---- a full queue, and SIGTERM with requests running ------------------------------------
printf '# the ops team\n\n  %s \r\n  # retired: old-key\nsecond,key' "$KEY" > "$tmp/keys"
start queue --parallel 1 --max-queue 1 --shutdown-timeout 2 --api-key-file "$tmp/keys" --api-key third-key
qpid=$pid
for k in second,key:200 third-key:200 second:401 key:401 old-key:401 the:401 second,keys:401; do
  st=$(curl -s -o /dev/null -w '%{http_code}' -H "Authorization: Bearer ${k%:*}" "http://127.0.0.1:$port/v1/models")
  [ "$st" = "${k##*:}" ] || break
done
[ "$st" = "${k##*:}" ] && ok "--api-key-file (CRLF, comments, no last newline) and --api-key: each key whole, nothing else" ||
  bad "key files: '${k%:*}' got $st, not ${k##*:}"
post /v1/completions "{\"prompt\":\"a\",\"max_tokens\":3000,\"stream\":true,\"ignore_eos\":true}" "$tmp/q1.sse" -N > /dev/null &
for _ in $(seq 100); do [ "$($probe metric "$port" moejit_running_sequences)" = 1 ] && break; sleep 0.1; done
post /v1/completions "{\"prompt\":\"b\",\"max_tokens\":3000,\"ignore_eos\":true}" "$tmp/q2" > "$tmp/q2.status" &
for _ in $(seq 100); do [ "$($probe metric "$port" moejit_queue_depth)" = 1 ] && break; sleep 0.1; done
st=$(post /v1/completions '{"prompt":"c","max_tokens":2,"n":2}' "$tmp/o")
[ "$st" = 400 ] && [ "$($probe field "$tmp/o" error.param)" = '"n"' ] &&
  ok "2 choices past a queue of 1: 400, $($probe field "$tmp/o" error.message)" || bad "n past the queue: $st $(cat "$tmp/o")"
st=$(post /v1/completions '{"prompt":"c","max_tokens":2}' "$tmp/o" -D "$tmp/h")
[ "$st" = 503 ] && grep -qi '^Retry-After: 1' "$tmp/h" && [ "$($probe field "$tmp/o" error.code)" = '"queue_full"' ] &&
  ok "queue full (--parallel 1 --max-queue 1): 503, Retry-After" || bad "queue full: $st $(cat "$tmp/o")"
t0=$(date +%s)
kill -TERM $qpid
sleep 0.5
st=$(post /v1/completions '{"prompt":"d","max_tokens":2}' "$tmp/o")
[ "$st" = 503 ] && [ "$($probe field "$tmp/o" error.code)" = '"shutting_down"' ] && ok "draining: a new request is 503" || bad "draining: $st $(cat "$tmp/o")"
wait $qpid
st=$?
took=$(($(date +%s) - t0))
[ $st = 0 ] && [ $took -le 6 ] && ok "SIGTERM with 2 requests: exit 0 in $took s (--shutdown-timeout 2)" || bad "SIGTERM busy: status $st in $took s: $(cat "$tmp/queue.err")"
wait
$probe sse "$tmp/q1.sse" > "$tmp/q1.json"
[ "$($probe field "$tmp/q1.json" error.code)" = '"shutting_down"' ] && [ "$($probe field "$tmp/q1.json" done)" = true ] &&
  ok "the running stream ends with an error event and [DONE]" || bad "running stream at shutdown: $(tail -c 400 "$tmp/q1.sse")"
[ "$(cat "$tmp/q2.status")" = 503 ] && ok "the queued request is answered 503" || bad "queued request at shutdown: $(cat "$tmp/q2.status") $(cat "$tmp/q2")"
grep -q "^moejit: cancelling 2 requests" "$tmp/queue.err" && ok "shutdown cancelled the 2 left" || bad "shutdown: $(cat "$tmp/queue.err")"

# ---- the command line ------------------------------------------------------------------
expect 1 "moejit: moejit serve: --port must be 0..65535, not 70000" $MOEJIT serve --port 70000
expect 1 "moejit: moejit serve: --prefill-chunk must be -1 (each prompt whole) to 65536, not 70000" \
  $MOEJIT serve --prefill-chunk 70000
expect 1 "moejit: moejit serve: --backend must be auto, cpu or cuda, not 'tpu'" $MOEJIT serve --backend tpu
expect 1 "moejit: moejit serve: --max-body must be 1..1073741824 bytes, not 0" $MOEJIT serve --max-body 0
expect 1 "moejit: moejit serve: --api-key-file $tmp: not a regular file" $MOEJIT serve --api-key-file "$tmp"
head -c 1048577 /dev/zero | tr '\0' k > "$tmp/bigkeys"
expect 1 "moejit: moejit serve: --api-key-file $tmp/bigkeys: 1048577 bytes; a key file is at most 1048576" $MOEJIT serve --api-key-file "$tmp/bigkeys"
expect 1 "moejit: moejit serve: --api-key: a key is 1 to 512 visible ASCII characters (no spaces)" $MOEJIT serve --api-key "a b"
expect 1 "moejit: moejit serve: --api-key-file $tmp/nokeys: cannot open: No such file or directory" $MOEJIT serve --api-key-file "$tmp/nokeys"
printf '# none\n\n' > "$tmp/nokeys"
expect 1 "moejit: moejit serve: --api-key-file $tmp/nokeys: no key in it (one a line; blank lines and # comments skipped)" \
  $MOEJIT serve --api-key-file "$tmp/nokeys"
printf 'good\nbad\tkey\n' > "$tmp/badkeys"
expect 1 "moejit: moejit serve: --api-key-file $tmp/badkeys: line 2: a key is 1 to 512 visible ASCII characters (no spaces)" \
  $MOEJIT serve --api-key-file "$tmp/badkeys"
expect 1 "moejit: moejit serve: MOEJIT_API_KEY: a key is 1 to 512 visible ASCII characters (no spaces)" env MOEJIT_API_KEY="x y" $MOEJIT serve
# MOEJIT_API_KEY, when no flag names a key: the key is asked, and is the variable's
export MOEJIT_API_KEY=env-key
start envkey --parallel 1 --served-model-name zai-org/GLM-5
unset MOEJIT_API_KEY
st1=$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$port/v1/models")
st2=$(curl -s -o "$tmp/o" -w '%{http_code}' -H "Authorization: Bearer env-key" "http://127.0.0.1:$port/v1/models")
[ "$st1" = 401 ] && [ "$st2" = 200 ] && ok "MOEJIT_API_KEY: no key 401, its key 200" || bad "MOEJIT_API_KEY: $st1 $st2"
# --served-model-name (vLLM's): the id listed, retrieved, asked for and answered; the folder's no more
st3=$(curl -s -o "$tmp/o3" -w '%{http_code}' -H "Authorization: Bearer env-key" "http://127.0.0.1:$port/v1/models/zai-org/GLM-5")
st4=$(curl -s -o "$tmp/o4" -w '%{http_code}' -H "Authorization: Bearer env-key" -H 'Content-Type: application/json' \
  --data-binary '{"model":"zai-org/GLM-5","prompt":"hi","max_tokens":2}' "http://127.0.0.1:$port/v1/completions")
st5=$(curl -s -o /dev/null -w '%{http_code}' -H "Authorization: Bearer env-key" -H 'Content-Type: application/json' \
  --data-binary "{\"model\":\"$model\",\"prompt\":\"hi\",\"max_tokens\":2}" "http://127.0.0.1:$port/v1/completions")
[ "$st3$st4$st5" = 200200404 ] && [ "$($probe field "$tmp/o" data.0.id)" = '"zai-org/GLM-5"' ] &&
  [ "$($probe field "$tmp/o4" model)" = '"zai-org/GLM-5"' ] &&
  ok "--served-model-name zai-org/GLM-5: listed, retrieved, asked for and answered; the folder's name 404" ||
  bad "--served-model-name: $st3 $st4 $st5 $(cat "$tmp/o" "$tmp/o3" "$tmp/o4")"
stop $pid
expect 1 "moejit: moejit serve: --served-model-name must be 1 to 256 visible ASCII characters, no spaces" \
  $MOEJIT serve --served-model-name "GLM 5"
# a host that does not resolve is refused before the model loads (no data folder is written)
MOEJIT_DATA_DIR="$tmp/none" $MOEJIT serve --host 300.1.1.1 2> "$tmp/err"
st=$?
[ $st = 1 ] && [ "$(wc -l < "$tmp/err")" = 1 ] && grep -q "^moejit: moejit serve: --host 300.1.1.1: " "$tmp/err" && [ ! -e "$tmp/none" ] &&
  ok "--host checked before the model loads: $(cat "$tmp/err")" || bad "bad --host: status $st: $(cat "$tmp/err")"
# A model folder that does not load: serve says what generate says, in one
# line naming the file, and exits with generate's status (a config.json that
# is a folder cannot be read: 2, an I/O error; a folder without one: 1).
mkdir -p "$tmp/unreadable/config.json" "$tmp/empty"
for case in unreadable:2 empty:1; do
  m=${case%:*} want=${case#*:}
  $MOEJIT generate -m "$tmp/$m" -p hi > /dev/null 2> "$tmp/gen_$m.err"
  gst=$?
  $MOEJIT serve -m "$tmp/$m" --port 0 --backend cpu 2> "$tmp/serve_$m.err"
  sst=$?
  [ $sst = "$want" ] && [ $gst = "$want" ] && [ "$(wc -l < "$tmp/serve_$m.err")" = 1 ] && grep -q "$tmp/$m" "$tmp/serve_$m.err" &&
    cmp -s "$tmp/gen_$m.err" "$tmp/serve_$m.err" && ok "-m a folder that does not load ($m): exit $sst, as generate: $(cat "$tmp/serve_$m.err")" ||
    bad "-m $m folder: serve $sst: $(cat "$tmp/serve_$m.err"); generate $gst: $(cat "$tmp/gen_$m.err") (want $want)"
done
# Between requests: a connection silent past --idle-timeout is libmicrohttpd's
# to close (no request timeout counted); the next request's line trickled in
# is cut by --idle-timeout + --request-timeout after the last answer.
start busy --parallel 1 --idle-timeout 3 --request-timeout 2
$probe keepalive "$port" 6 > "$tmp/idle" &
idle=$!
$probe slow_next "$port" > "$tmp/slow_next"
wait $idle
grep -q "^closed by the server after [3-4] s silent" "$tmp/idle" &&
  ok "a keep-alive connection silent past --idle-timeout 3: $(cat "$tmp/idle")" || bad "idle keep-alive: $(cat "$tmp/idle")"
grep -q "^closed after [5-7] s" "$tmp/slow_next" && [ "$($probe metric "$port" moejit_http_request_timeouts_total)" = 1 ] &&
  ok "the next request one byte a second: $(cat "$tmp/slow_next") (3 + 2 s), the one request timeout counted" ||
  bad "slow next request: $(cat "$tmp/slow_next"), $($probe metric "$port" moejit_http_request_timeouts_total) timeouts"
expect 2 "moejit: moejit serve: cannot listen on 127.0.0.1 port $port: Address already in use" $MOEJIT serve --port "$port" --backend cpu -q
stop $pid > /dev/null
exit $fail
