#!/bin/sh
# generate.sh: `moejit generate` on the CPU backend with a tiny synthetic
# model: it streams text and ends with the speed line; --seed makes runs
# identical; --json is one record; greedy ignores the seed; the built-in
# model is written to the data folder on first use; bad flags and a broken
# tokenizer.json give one line and status 1.
. "$srcdir/tests/lib.sh"
$MOEJIT mkmodel --preset tiny --seed 5 --out "$tmp/m" -q || { echo "FAIL mkmodel"; exit 1; }
$MOEJIT info -m "$tmp/m" | grep -q "^gpu        the GPU decode engine does not take it: the GPU MoE kernels need hidden_size" &&
  ok "info: the tiny model is too narrow for the GPU engine" || bad "info: $($MOEJIT info -m "$tmp/m" | tail -1)"

$MOEJIT generate -m "$tmp/m" -p "hello world" -n 12 --seed 3 > "$tmp/a.out" 2> "$tmp/a.err" || bad "generate exit status"
grep -q "^moejit: prompt [0-9]* tokens in .* tok/s), generated [0-9]* tokens in .* tok/s), stop: " "$tmp/a.err" && ok "speed line" || bad "speed line: $(cat "$tmp/a.err")"
$MOEJIT generate -m "$tmp/m" -p "hello world" -n 12 --seed 3 > "$tmp/b.out" 2>/dev/null
cmp -s "$tmp/a.out" "$tmp/b.out" && ok "same seed, same text" || bad "same seed gave different text"

$MOEJIT generate -m "$tmp/m" -p "hello world" -n 12 --seed 3 --json > "$tmp/j1" 2>/dev/null || bad "--json status"
$MOEJIT generate -m "$tmp/m" -p "hello world" -n 12 --seed 4 --json > "$tmp/j2" 2>/dev/null
tokens1=$(sed 's/.*"tokens":\[\([^]]*\)\].*/\1/' "$tmp/j1")
tokens2=$(sed 's/.*"tokens":\[\([^]]*\)\].*/\1/' "$tmp/j2")
[ "$(wc -l < "$tmp/j1")" -eq 1 ] && grep -q '"generated_tokens":' "$tmp/j1" && grep -q '"decode_tokens_per_s":' "$tmp/j1" && ok "--json record" || bad "--json record: $(cat "$tmp/j1")"
[ "$tokens1" != "$tokens2" ] && ok "another seed, other tokens" || bad "seeds 3 and 4 gave the same tokens"
# greedy: the seed does not matter
g1=$($MOEJIT generate -m "$tmp/m" -p "abc" -n 8 --temp 0 --seed 1 --json 2>/dev/null | sed 's/.*"tokens":\[\([^]]*\)\].*/\1/')
g2=$($MOEJIT generate -m "$tmp/m" -p "abc" -n 8 --temp 0 --seed 2 --json 2>/dev/null | sed 's/.*"tokens":\[\([^]]*\)\].*/\1/')
[ -n "$g1" ] && [ "$g1" = "$g2" ] && ok "greedy ignores the seed" || bad "greedy differs: $g1 / $g2"
# chat prompt and stdin
printf 'from stdin' | $MOEJIT generate -m "$tmp/m" -p - --chat --system "be brief" --no-think -n 4 --json > "$tmp/c" 2>/dev/null || bad "chat from stdin"
grep -q '"prompt_tokens":' "$tmp/c" && ok "chat prompt from stdin" || bad "chat: $(cat "$tmp/c")"
# the built-in model, written on first use
MOEJIT_DATA_DIR="$tmp/data" $MOEJIT generate -p "hi" -n 3 --seed 1 -q > /dev/null 2>&1 && [ -f "$tmp/data/default-medium-nvfp4-s1/config.json" ] && ok "built-in model" || bad "built-in model"

# many prompts, continuously batched (2 live at a time, 5 prompts, a blank
# line skipped): each prompt's greedy tokens equal its single-prompt run
printf 'hello world\nthe quick brown fox\n\nabc\nlonger prompt with several words in it\nx\n' > "$tmp/prompts.txt"
$MOEJIT generate -m "$tmp/m" --prompts "$tmp/prompts.txt" --parallel 2 --temp 0 -n 6 --json > "$tmp/many" 2> "$tmp/many.err" ||
  bad "--prompts: $(cat "$tmp/many.err")"
k=0
allsame=1
while IFS= read -r line; do
  [ -n "$line" ] || continue
  single=$($MOEJIT generate -m "$tmp/m" -p "$line" --temp 0 -n 6 --json 2>/dev/null | sed 's/.*"tokens":\(\[[^]]*\]\).*/\1/')
  batched=$(grep "^{\"index\":$k," "$tmp/many" | sed 's/.*"tokens":\(\[[^]]*\]\).*/\1/')
  [ -n "$single" ] && [ "$single" = "$batched" ] || { allsame=0; echo "  prompt $k: single $single, batched $batched"; }
  k=$((k + 1))
done < "$tmp/prompts.txt"
[ $k -eq 5 ] && [ "$(wc -l < "$tmp/many")" -eq 5 ] && [ $allsame = 1 ] &&
  ok "--prompts --parallel 2: 5 prompts, each as its single run" || bad "--prompts: $(cat "$tmp/many")"
# chunked prefill: prompts fed 2 tokens a step beside the decoding rows,
# or each whole as a step of its own: the same tokens
for c in 2 -1; do
  $MOEJIT generate -m "$tmp/m" --prompts "$tmp/prompts.txt" --parallel 2 --temp 0 -n 6 --json --prefill-chunk $c \
    > "$tmp/many$c" 2> "$tmp/many$c.err" || bad "--prefill-chunk $c: $(cat "$tmp/many$c.err")"
  [ "$(grep -o '"tokens":\[[^]]*\]' "$tmp/many")" = "$(grep -o '"tokens":\[[^]]*\]' "$tmp/many$c")" ] &&
    [ "$(wc -l < "$tmp/many$c")" -eq 5 ] && ok "--prefill-chunk $c: the same tokens" || bad "--prefill-chunk $c: $(cat "$tmp/many$c")"
done
expect 1 "moejit: moejit generate: --prefill-chunk must be -1 (each prompt whole) to 65536, not -2" \
  $MOEJIT generate -m "$tmp/m" -p x --prefill-chunk -2
printf '\n\n' > "$tmp/empty.txt"

# errors: one line, status 1
expect 1 "moejit: moejit generate: -p TEXT is required (-p - reads stdin; --prompts FILE for many)" $MOEJIT generate -m "$tmp/m"
expect 1 "moejit: moejit generate: --temp expects a number, not 'hot'" $MOEJIT generate -m "$tmp/m" -p x --temp hot
expect 1 "moejit: moejit generate: --backend must be auto, cpu or cuda, not 'tpu'" $MOEJIT generate -m "$tmp/m" -p x --backend tpu
expect 1 "moejit: moejit generate: --graph-batches wants ascending sizes in 1..1024, not '4,2'" $MOEJIT generate -m "$tmp/m" -p x --graph-batches 4,2
# the tiny model is narrower than the GPU MoE kernels: cuda refuses it with the reason, on any machine
expect 1 "moejit: $tmp/m: the GPU MoE kernels need hidden_size and moe_intermediate_size multiples of 1024 (this model: 64, 32); use --backend cpu" $MOEJIT generate -m "$tmp/m" -p x --backend cuda
expect 1 "moejit: moejit generate: give -p or --prompts, not both" $MOEJIT generate -m "$tmp/m" -p x --prompts "$tmp/prompts.txt"
expect 1 "moejit: moejit generate: --parallel must be 1..64" $MOEJIT generate -m "$tmp/m" --prompts "$tmp/prompts.txt" --parallel 0
expect 1 "moejit: $tmp/empty.txt: no prompts (one per line)" $MOEJIT generate -m "$tmp/m" --prompts "$tmp/empty.txt"
expect 1 "moejit: moejit generate: --system and --no-think go with --chat" $MOEJIT generate -m "$tmp/m" -p x --system y
# --tp/--ep (docs/multigpu.md): checked before anything runs; one rank runs in-process as before
expect 1 "moejit: moejit generate: --tp must be 1 to 1024, not 0" $MOEJIT generate -m "$tmp/m" -p x --tp 0
expect 1 "moejit: moejit generate: --ep must be 1 to 1024, not 2000" $MOEJIT generate -m "$tmp/m" -p x --ep 2000
expect 1 "moejit: moejit generate: --tp 2 --ep 4: each must be 1 or the number of ranks (the larger, 4)" \
  $MOEJIT generate -m "$tmp/m" -p x --tp 2 --ep 4
expect 1 "moejit: moejit generate: --tp expects an integer, not 'two'" $MOEJIT generate -m "$tmp/m" -p x --tp two
expect 1 "moejit: moejit generate: with --tp/--ep every rank reads the prompt: give it as text or a file, not stdin" \
  $MOEJIT generate -m "$tmp/m" -p - --ep 2
$MOEJIT generate -m "$tmp/m" -p "hello world" -n 12 --seed 3 --tp 1 --ep 1 > "$tmp/tp1.out" 2>/dev/null
cmp -s "$tmp/a.out" "$tmp/tp1.out" && ok "--tp 1 --ep 1 runs in-process, same text" || bad "--tp 1 --ep 1 changed the text"
# info --tp/--ep: the bytes a rank would hold, or why the model does not split so
$MOEJIT info -m "$tmp/m" --tp 2 --ep 2 | grep -qx "ranks      2 (--tp 2 --ep 2): [0-9.]* KiB of weights a rank ([0-9.]* KiB its shards, [0-9.]* KiB on every rank)" &&
  ok "info --tp 2 --ep 2" || bad "info --tp 2 --ep 2: $($MOEJIT info -m "$tmp/m" --tp 2 --ep 2 2>&1 | tail -1)"
# --read: a rank reads its share (the bytes counted above), from the page cache or storage
$MOEJIT info -m "$tmp/m" --tp 2 --ep 2 --rank 1 --read | grep -qx "read       rank 1 of 2: [0-9.]* KiB of the checkpoint's [0-9.]* KiB ([0-9.]*%; its share [0-9.]* KiB) in [0-9.]* s, .* from storage (/proc/self/io; checksum [0-9a-f]*)" &&
  ok "info --read: rank 1 of 2" || bad "info --read: $($MOEJIT info -m "$tmp/m" --tp 2 --ep 2 --rank 1 --read 2>&1 | tail -1)"
expect 1 "moejit: moejit info: --rank 2 is not one of the 2 ranks of --tp 2 --ep 2" $MOEJIT info -m "$tmp/m" --tp 2 --ep 2 --rank 2
expect 1 "moejit: moejit info: --read reports in text; drop --json" $MOEJIT info -m "$tmp/m" --read --json
expect 1 "moejit: moejit info: $tmp/m: --tp 4: each rank's share of the shared experts' width (moe_intermediate_size * n_shared_experts) (32 / 4 = 8) is not a whole number of 16-column NVFP4 scale blocks" \
  $MOEJIT info -m "$tmp/m" --tp 4
# info --preset: will GLM-5 fit, from the config alone (the engine's layout of a rank's share)
$MOEJIT info --preset glm5 --tp 8 --ep 8 > "$tmp/fit8" && $MOEJIT info --preset glm5 --tp 4 --ep 4 > "$tmp/fit4" &&
  $MOEJIT info --preset glm5 > "$tmp/fit1" || bad "info --preset glm5"
w8=$(sed -n 's/^weights    \([0-9.]*\) GB a GPU.*/\1/p' "$tmp/fit8"); w4=$(sed -n 's/^weights    \([0-9.]*\) GB a GPU.*/\1/p' "$tmp/fit4")
w1=$(sed -n 's/^weights    \([0-9.]*\) GB a GPU.*/\1/p' "$tmp/fit1")
# 8 ranks hold more than an eighth of the whole (what every rank holds whole) and less than half of 4 ranks' share
awk -v a="$w8" -v b="$w4" -v c="$w1" 'BEGIN { exit !(a > c / 8 && a < b && b > c / 4 && b < c / 2 && c > 400) }' &&
  ok "info --preset: weights a GPU $w1 GB (1), $w4 GB (4), $w8 GB (8)" || bad "info --preset weights: $w1, $w4, $w8"
grep -qx "kv cache   129792 bytes a token a GPU: the MLA latent and rope key (576 x bf16) in 78 layers, the indexer key (128 x f32) in 78; whole on every rank" "$tmp/fit8" &&
  ok "info --preset: KV bytes a token" || bad "info --preset KV: $(grep kv "$tmp/fit8")"
grep -q "^context    [0-9]* tokens fit a GPU" "$tmp/fit8" && grep -q "^context    does not fit" "$tmp/fit1" &&
  ok "info --preset: context that fits" || bad "info --preset context: $(grep context "$tmp/fit8" "$tmp/fit1")"
expect 1 "moejit: moejit info: --preset knows only glm5 (give -m DIR for another model)" $MOEJIT info --preset tiny
expect 1 "moejit: moejit info: give -m DIR or --preset glm5, not both" $MOEJIT info -m "$tmp/m" --preset glm5
expect 1 "moejit: moejit info: --layers, --dense and --gpu-mem go with --preset glm5" $MOEJIT info -m "$tmp/m" --gpu-mem 80
expect 1 "moejit: moejit info: --gpu-mem wants GB, more than 0" $MOEJIT info --preset glm5 --gpu-mem 0
# a rank started by a launcher that disagrees with the flags, or gives no unique id
expect 1 "moejit: moejit generate: MOEJIT_RANK=1 of 4 ranks, but --tp/--ep ask for 2 ranks" \
  env MOEJIT_RANK=1 MOEJIT_WORLD_SIZE=4 MOEJIT_NCCL_ID_FILE="$tmp/id" $MOEJIT generate -m "$tmp/m" -p x --tp 2
expect 1 "moejit: OMPI_COMM_WORLD_RANK=1 of 2 ranks, but no NCCL unique id: set MOEJIT_NCCL_ID (256 hex digits) or MOEJIT_NCCL_ID_FILE (rank 0 writes it)" \
  env OMPI_COMM_WORLD_RANK=1 OMPI_COMM_WORLD_SIZE=2 $MOEJIT generate -m "$tmp/m" -p x --ep 2
expect 1 "moejit: MOEJIT_WORLD_SIZE='2x': expected a whole number from 1 to 1024" \
  env MOEJIT_RANK=0 MOEJIT_WORLD_SIZE=2x $MOEJIT generate -m "$tmp/m" -p x --tp 2
# more ranks than GPUs: one line before any rank starts
$MOEJIT generate -m "$tmp/m" -p x --ep 1024 > /dev/null 2> "$tmp/err"
st=$?
if [ $st -eq 3 ] && grep -qx "moejit: moejit generate: --ep 1024 needs 1024 GPUs, [0-9]* found\|moejit: no GPU: .*" "$tmp/err" &&
  [ "$(wc -l < "$tmp/err")" -eq 1 ]; then ok "--ep 1024: $(cat "$tmp/err")"; else bad "--ep 1024: status $st: $(cat "$tmp/err")"; fi
expect 1 "moejit: moejit generate: unknown option '--temperature' (see moejit generate --help)" $MOEJIT generate -m "$tmp/m" -p x --temperature 1
# --ignore-eos: seed 3 draws an eos id at its 8th token; with the flag the
# sequence goes on to -n (the server's ignore_eos; serve-bench.sh gives both)
for f in "" --ignore-eos; do
  $MOEJIT generate -m "$tmp/m" --backend cpu -p Hi -n 40 --temp 1.5 --top-p 1 --min-p 0 --seed 3 --json $f 2> /dev/null |
    grep -o '"generated_tokens": *[0-9]*\|"stop": *"[a-z]*"' | tr -d ' \n' > "$tmp/eos${f:-0}"
done
[ "$(cat "$tmp/eos0")" = '"generated_tokens":8"stop":"eos"' ] && [ "$(cat "$tmp/eos--ignore-eos")" = '"generated_tokens":40"stop":"length"' ] &&
  ok "--ignore-eos: an eos at token 8 ends the sequence, with the flag 40 tokens" ||
  bad "--ignore-eos: $(cat "$tmp/eos0") / $(cat "$tmp/eos--ignore-eos")"
cp -r "$tmp/m" "$tmp/broken"
printf '{"model": {"type": "BPE", ' > "$tmp/broken/tokenizer.json"
"$MOEJIT" generate -m "$tmp/broken" -p x > /dev/null 2> "$tmp/err"
st=$?
if [ "$st" -eq 1 ] && [ "$(wc -l < "$tmp/err")" -eq 1 ] && grep -q "broken/tokenizer.json:1:" "$tmp/err"; then ok "malformed tokenizer.json"; else bad "malformed tokenizer.json: status $st: $(cat "$tmp/err")"; fi
rm "$tmp/broken/tokenizer.json"
"$MOEJIT" generate -m "$tmp/broken" -p x > /dev/null 2> "$tmp/err"
st=$?
if [ "$st" -eq 1 ] && [ "$(wc -l < "$tmp/err")" -eq 1 ] && grep -q "tokenizer.json" "$tmp/err"; then ok "missing tokenizer.json"; else bad "missing tokenizer.json: status $st: $(cat "$tmp/err")"; fi
exit $fail
