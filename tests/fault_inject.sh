#!/bin/sh
# fault_inject.sh: faults from outside the process (docs/robustness.md).
#  1. A model file truncated by another process after moejit validated and
#     mapped it: the next touch of a lost page raises SIGBUS, which the CLI
#     turns into one line naming the file and status 1, never a crash.
#  2. Four `moejit generate` first runs at once on one empty MOEJIT_DATA_DIR:
#     all succeed, and the folder ends with one valid built-in model and no
#     temporary copies.
#  3. Four `moejit compile -o` at once on one cache folder: all succeed,
#     every entry verifies, the counters add up, no temporary file is left.
#  4. Four `moejit warmup` of one model at once on one cache folder: all
#     succeed, the entries verify, and assert-warm then finds every kernel.
# The cache's own faults (full disk, unwritable folder, SIGKILL mid-store)
# are in tests/test_cache.c.
. "$srcdir/tests/lib.sh"

# ---- 1. truncated while in use --------------------------------------------------------
$MOEJIT mkmodel --preset tiny --seed 2 --out "$tmp/m" -q || { echo "FAIL mkmodel"; exit 1; }
$MOEJIT forward -m "$tmp/m" --tokens 1,2,3 --steps 100000 > "$tmp/fwd.out" 2> "$tmp/fwd.err" &
pid=$!
# Wait until it is decoding (the weights were validated and are in use).
i=0
while ! grep -q '^decode' "$tmp/fwd.out" 2>/dev/null && [ $i -lt 300 ]; do sleep 0.1; i=$((i + 1)); done
size=$(wc -c < "$tmp/m/model.safetensors")
truncate -s $((size / 2)) "$tmp/m/model.safetensors"
# It must stop on its own within a few steps; give it 30 s.
i=0
while kill -0 $pid 2>/dev/null && [ $i -lt 300 ]; do sleep 0.1; i=$((i + 1)); done
if kill -0 $pid 2>/dev/null; then kill $pid; bad "truncated model: still running 30 s later"; fi
wait $pid
status=$?
if [ "$status" -eq 1 ] && [ "$(wc -l < "$tmp/fwd.err")" -eq 1 ] &&
   grep -q "^moejit: $tmp/m/model.safetensors: truncated while in use" "$tmp/fwd.err"; then
  ok "model truncated while in use: status 1, one line naming the file"
else
  bad "model truncated while in use: status $status, stderr: $(cat "$tmp/fwd.err")"
fi
# Loading it again is the ordinary validation error.
$MOEJIT info -m "$tmp/m" > /dev/null 2> "$tmp/info.err"
status=$?
[ "$status" -eq 1 ] && [ "$(wc -l < "$tmp/info.err")" -eq 1 ] && grep -q "model.safetensors" "$tmp/info.err" &&
  ok "the truncated model is refused at load" || bad "reload: status $status, $(cat "$tmp/info.err")"

# ---- 2. concurrent first runs of generate -------------------------------------------------
mkdir "$tmp/data"
for k in 1 2 3 4; do
  MOEJIT_DATA_DIR="$tmp/data" $MOEJIT generate -p "hello" -n 3 --seed $k --json -q > "$tmp/gen$k.out" 2> "$tmp/gen$k.err" &
  eval "gpid$k=$!"
done
allok=1
for k in 1 2 3 4; do
  eval "wait \$gpid$k" || { allok=0; echo "  generate $k: $(cat "$tmp/gen$k.err")"; }
  grep -q '"generated_tokens":' "$tmp/gen$k.out" || allok=0
done
[ $allok = 1 ] && ok "4 concurrent first runs of generate succeed" || bad "concurrent generate"
left=$(ls "$tmp/data")
[ "$left" = "default-medium-nvfp4-s1" ] && ok "the data folder holds one model, no temporary copies" ||
  bad "data folder holds: $left"
$MOEJIT info -m "$tmp/data/default-medium-nvfp4-s1" > /dev/null 2>&1 && ok "the written model is valid" ||
  bad "the written model does not load"

# ---- 3. concurrent compiles into one cache folder --------------------------------------------
mkdir "$tmp/cache"
gemv="$srcdir/tests/kernels/gemv_bf16.k" # the DSL test fixture, named by path
for k in 1 2 3 4; do
  # One kernel all four share and one of its own each.
  (MOEJIT_CACHE=on MOEJIT_CACHE_DIR="$tmp/cache" $MOEJIT compile "$gemv" -D N=64 -D K=128 -o "$tmp/s$k.cubin" -q &&
   MOEJIT_CACHE=on MOEJIT_CACHE_DIR="$tmp/cache" $MOEJIT compile "$gemv" -D N=64 -D K=$((k * 64 + 128)) -o "$tmp/p$k.cubin" -q) \
    2> "$tmp/cc$k.err" &
  eval "cpid$k=$!"
done
allok=1
for k in 1 2 3 4; do eval "wait \$cpid$k" || { allok=0; echo "  compile $k: $(cat "$tmp/cc$k.err")"; }; done
[ $allok = 1 ] && ok "4 concurrent compile -o on one cache succeed" || bad "concurrent compile"
cmp -s "$tmp/s1.cubin" "$tmp/s4.cubin" && ok "the shared kernel's cubins agree" || bad "shared cubins differ"
$MOEJIT cache verify --dir "$tmp/cache" > "$tmp/verify" 2>&1 && grep -q "^5 entries checked, 0 bad" "$tmp/verify" &&
  ok "cache verifies: 5 entries" || bad "cache verify: $(cat "$tmp/verify")"
$MOEJIT cache stats --dir "$tmp/cache" > "$tmp/stats" 2>&1
hits=$(awk '/^disk hits/ {print $3}' "$tmp/stats")
misses=$(awk '/^misses/ {print $2}' "$tmp/stats")
[ $((hits + misses)) -eq 8 ] && ok "counters add up: $hits disk hits + $misses misses = 8 requests" ||
  bad "counters: $(cat "$tmp/stats")"
stray=$(find "$tmp/cache" -name '*.tmp.*' | wc -l)
[ "$stray" -eq 0 ] && ok "no temporary files left" || bad "$stray temporary files left"

# ---- 4. concurrent warm-ups of one cache folder ------------------------------------------------
# Four `moejit warmup` of the same model and sizes at once (the built-in
# model section 2 wrote): every run succeeds, the entries verify, and a
# fifth run under assert-warm finds every kernel (0 compiles).
m="$tmp/data/default-medium-nvfp4-s1"
for k in 1 2 3 4; do
  MOEJIT_CACHE=on MOEJIT_CACHE_DIR="$tmp/wcache" $MOEJIT warmup -m "$m" --arch sm_90a --batches 1 > "$tmp/w$k.out" 2> "$tmp/w$k.err" &
  eval "wpid$k=$!"
done
allok=1
for k in 1 2 3 4; do eval "wait \$wpid$k" || { allok=0; echo "  warmup $k: $(cat "$tmp/w$k.err")"; }; done
[ $allok = 1 ] && ok "4 concurrent warm-ups of one cache succeed" || bad "concurrent warmup"
$MOEJIT cache verify --dir "$tmp/wcache" > "$tmp/wverify" 2>&1 && grep -q "^[0-9]* entries checked, 0 bad" "$tmp/wverify" &&
  ok "the warmed cache verifies: $(head -1 "$tmp/wverify")" || bad "warmed cache verify: $(cat "$tmp/wverify")"
MOEJIT_CACHE=assert-warm MOEJIT_CACHE_DIR="$tmp/wcache" $MOEJIT warmup -m "$m" --arch sm_90a --batches 1 > "$tmp/w5.out" 2>&1 &&
  grep -q " 0 compiled, " "$tmp/w5.out" && ok "then assert-warm: $(sed 's/.*batch sizes 1: //' "$tmp/w5.out")" ||
  bad "assert-warm after concurrent warm-ups: $(cat "$tmp/w5.out")"
stray=$(find "$tmp/wcache" -name '*.tmp.*' | wc -l)
[ "$stray" -eq 0 ] && ok "no temporary files left" || bad "$stray temporary files left"
exit $fail
