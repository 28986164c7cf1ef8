#!/bin/sh
# warmup.sh: `moejit warmup` without a GPU.  For a named target it compiles
# every kernel of the decode steps of the given batch sizes into the cache
# (split over two processes with -j 2); a second run under
# MOEJIT_CACHE=assert-warm compiles nothing and succeeds, which is the proof
# that a warmed cache serves those steps with zero compiles; a size that was
# not warmed fails assert-warm with one line.  Bad flags: one line, status 1.
. "$srcdir/tests/lib.sh"
$MOEJIT mkmodel --preset medium --nvfp4 --seed 2 --out "$tmp/m" -q || { echo "FAIL mkmodel"; exit 1; }
export MOEJIT_CACHE_DIR="$tmp/cache"
$MOEJIT info -m "$tmp/m" | grep -q "^gpu        the GPU decode engine takes this model" &&
  ok "info: the GPU engine takes the medium model" || bad "info: $($MOEJIT info -m "$tmp/m" | tail -1)"

MOEJIT_CACHE=on $MOEJIT warmup -m "$tmp/m" --arch sm_90a --batches 1,2 -j 2 > "$tmp/w1" 2> "$tmp/e1"
st=$?
n=$(sed -n 's/.*: \([0-9]*\) kernels, \([0-9]*\) compiled, \([0-9]*\) already cached, \([0-9]*\) failed.*/\1 \2 \3 \4/p' "$tmp/w1")
set -- $n
if [ $st -eq 0 ] && [ "${1:-0}" -gt 20 ] && [ "$2" = "$1" ] && [ "$3" = 0 ] && [ "$4" = 0 ]; then
  ok "cold warm-up: $1 kernels compiled with -j 2"
else
  bad "cold warm-up: status $st: $(cat "$tmp/w1" "$tmp/e1")"
fi
kernels=${1:-0}
# The dry step obtains what a real step does: add_rmsnorm with no residual
# (the first layer) and an f32 one (attention, the MLP, the MoE layer's f32
# output): two kernels.  A dry step whose placeholders were null compiled
# only the first.
grep -q "^warmup: kernels by family: .*add_rmsnorm 2,.* mla_attend [0-9]*, dsa_select [0-9]*, moe_router" "$tmp/w1" &&
  ok "kernels by family: $(grep "by family" "$tmp/w1" | cut -d: -f3)" || bad "kernels by family: $(cat "$tmp/w1")"

MOEJIT_CACHE=assert-warm $MOEJIT warmup -m "$tmp/m" --arch sm_90a --batches 1,2 > "$tmp/w2" 2> "$tmp/e2"
st=$?
if [ $st -eq 0 ] && grep -q ": $kernels kernels, 0 compiled, $kernels already cached, 0 failed" "$tmp/w2"; then
  ok "warm: assert-warm finds all $kernels kernels, 0 compiles"
else
  bad "warm: status $st: $(cat "$tmp/w2" "$tmp/e2")"
fi

MOEJIT_CACHE=assert-warm $MOEJIT warmup -m "$tmp/m" --arch sm_90a --batches 8 > /dev/null 2> "$tmp/e3"
st=$?
if [ $st -eq 7 ] && [ "$(wc -l < "$tmp/e3")" -eq 1 ]; then ok "a cold size fails assert-warm: $(cat "$tmp/e3")"; else bad "assert-warm on a cold size: status $st: $(cat "$tmp/e3")"; fi

# Batch 1's DSA top-k runs over a cluster of 8 blocks on sm_90 on
# (dsa_topk_cl<1024, 8>): MOEJIT_DSA_CLUSTER=0 takes the one-block top-k
# batch 2 has already (one kernel fewer, none compiled); 4 compiles exactly
# its own cluster kernel; a value the launcher does not take warns once and
# changes nothing (assert-warm passes).
MOEJIT_DSA_CLUSTER=0 MOEJIT_CACHE=assert-warm $MOEJIT warmup -m "$tmp/m" --arch sm_90a --batches 1,2 > "$tmp/w6" 2> "$tmp/e6" &&
  grep -q ": $((kernels - 1)) kernels, 0 compiled, $((kernels - 1)) already cached, 0 failed" "$tmp/w6" &&
  ok "MOEJIT_DSA_CLUSTER=0: one kernel fewer (the one-block top-k of batch 2)" || bad "MOEJIT_DSA_CLUSTER=0: $(cat "$tmp/w6" "$tmp/e6")"
MOEJIT_DSA_CLUSTER=4 MOEJIT_CACHE=on $MOEJIT warmup -m "$tmp/m" --arch sm_90a --batches 1,2 > "$tmp/w7" 2> "$tmp/e7" &&
  grep -q ": $kernels kernels, 1 compiled, $((kernels - 1)) already cached, 0 failed" "$tmp/w7" &&
  ok "MOEJIT_DSA_CLUSTER=4: its own cluster kernel compiled" || bad "MOEJIT_DSA_CLUSTER=4: $(cat "$tmp/w7" "$tmp/e7")"
MOEJIT_DSA_CLUSTER=3 MOEJIT_CACHE=assert-warm $MOEJIT warmup -m "$tmp/m" --arch sm_90a --batches 1,2 > "$tmp/w8" 2> "$tmp/e8" &&
  grep -q "MOEJIT_DSA_CLUSTER=3 ignored: it takes 0, 2, 4 or 8" "$tmp/e8" && grep -q " 0 compiled, " "$tmp/w8" &&
  ok "MOEJIT_DSA_CLUSTER=3: $(head -1 "$tmp/e8")" || bad "MOEJIT_DSA_CLUSTER=3: $(cat "$tmp/w8" "$tmp/e8")"

# --tp 2 --ep 2: every rank's kernels.  The ranks' route kernels differ (each
# gives slots to its own experts: E0/EL), one per rank and size: 4; the one
# combine adds to the bf16 shared expert's part in f32, as on one GPU; then
# every rank's step is warm under assert-warm.
MOEJIT_CACHE=on $MOEJIT warmup -m "$tmp/m" --arch sm_90a --batches 1,2 --tp 2 --ep 2 > "$tmp/w4" 2> "$tmp/e4"
st=$?
if [ $st -eq 0 ] && grep -q "^warmup: $tmp/m for sm_90a, 2 ranks (--tp 2 --ep 2), batch sizes 1,2: .* 0 failed.*each rank captures its own" "$tmp/w4" &&
  grep -q "^warmup: kernels by family: .*add_rmsnorm 2,.*moe_route 4, moe_expert [0-9]*, moe_combine 1$" "$tmp/w4"; then
  ok "--tp 2 --ep 2: $(grep "by family" "$tmp/w4" | cut -d: -f3)"
else
  bad "--tp 2 --ep 2: status $st: $(cat "$tmp/w4" "$tmp/e4")"
fi
MOEJIT_CACHE=assert-warm $MOEJIT warmup -m "$tmp/m" --arch sm_90a --batches 1,2 --tp 2 --ep 2 > "$tmp/w5" 2> "$tmp/e5" &&
  grep -q " 0 compiled, " "$tmp/w5" && ok "--tp 2 --ep 2: warm, 0 compiles" || bad "--tp 2 --ep 2 assert-warm: $(cat "$tmp/w5" "$tmp/e5")"
expect 1 "moejit: --tp 3 does not divide num_attention_heads (8)" $MOEJIT warmup -m "$tmp/m" --arch sm_90a --tp 3

# No model named: the built-in one, where generate and serve find it (the
# data folder; seeded here with the test's model, which has its widths, so
# the warm cache above holds every kernel it needs: assert-warm passes).
mkdir -p "$tmp/data" && ln -s "$tmp/m" "$tmp/data/default-medium-nvfp4-s1"
MOEJIT_DATA_DIR="$tmp/data" MOEJIT_CACHE=assert-warm $MOEJIT warmup --arch sm_90a --batches 1,2 > "$tmp/w6" 2> "$tmp/e6" &&
  grep -q "^warmup: $tmp/data/default-medium-nvfp4-s1 for sm_90a, batch sizes 1,2: $kernels kernels, 0 compiled" "$tmp/w6" &&
  ok "no -m: the built-in model, warm" || bad "warmup without -m: $(cat "$tmp/w6" "$tmp/e6")"
expect 1 "moejit: moejit warmup: -m DIR or --synthetic glm5, not both" $MOEJIT warmup -m "$tmp/m" --synthetic glm5 --arch sm_90a
expect 1 "moejit: moejit warmup: --batches sizes must be 1..1024 (got 0)" $MOEJIT warmup -m "$tmp/m" --arch sm_90a --batches 0
expect 1 "moejit: moejit warmup: --arch h200: unknown target (use sm_80, sm_86, sm_87, sm_89, sm_90, sm_90a, sm_100, sm_100a, sm_120 or sm_120a)" $MOEJIT warmup -m "$tmp/m" --arch h200
expect 1 "moejit: moejit warmup: -j must be 1..256" $MOEJIT warmup -m "$tmp/m" --arch sm_90a -j 0
# --tune times tiles on the GPU at hand: without one it is one line, status 3,
# whatever else is named, and the tuning records already in the cache are
# left as they were (the folder is seeded with a good one of each kind, the
# MoE's and the GEMV's, and a bad one first, so a run that stored, replaced or
# removed any would show; `cache list` proves the records are where this
# cache keeps them).
expect 3 "moejit: moejit warmup --tune: needs a GPU" $MOEJIT warmup --synthetic glm5 --tune
"$(dirname "$MOEJIT")/tests/test_tune" --populate "$tmp/cache" || bad "seed tuning records"
records() { find "$tmp/cache/tune" -type f | sort | xargs cksum 2>&1; }
before=$(records)
n=$(MOEJIT_CACHE=on $MOEJIT cache list | grep -c "winner\|bad tuning record")
[ "$n" = 3 ] && ok "the seeded tuning records are this cache's" || bad "cache list shows $n tuning lines, want 3"
MOEJIT_CACHE=on $MOEJIT cache list | grep -q "^gemv_mma  N=2784 K=6144 B=8  winner 256:1:4:8:2 " &&
  ok "cache list shows the GEMV's record" || bad "cache list: $(MOEJIT_CACHE=on $MOEJIT cache list | tail -4)"
MOEJIT_CACHE=on expect 3 "moejit: moejit warmup --tune: needs a GPU" $MOEJIT warmup --synthetic glm5 --arch sm_90a --tune
[ "$(records)" = "$before" ] && ok "--tune without a GPU left the tuning records as they were" ||
  bad "--tune without a GPU changed $tmp/cache/tune: $(records)"
exit $fail
