#!/bin/sh
# fidelity_bf16.sh: MOEJIT_INDEXER_KEYS.  test_fidelity under =bf16 (what
# rounding the indexer's keys to bf16 changes against transformers' f32
# keys: test_fidelity.c holds every fixture whose selection is inactive and
# counts the differences where it is active), then a bad value: one
# warning naming the variable, and the f32 keys' tokens.
. "$srcdir/tests/lib.sh"
MOEJIT_INDEXER_KEYS=bf16 "$builddir/tests/test_fidelity" > "$tmp/fid.out" 2>&1
rc=$?
[ $rc = 77 ] && { echo "no fidelity fixtures (skipped)"; exit 77; }
grep "bf16 indexer keys against" "$tmp/fid.out"
[ $rc = 0 ] && ok "test_fidelity with bf16 indexer keys" || { grep -i "failed" "$tmp/fid.out" | head -5; bad "test_fidelity with bf16 indexer keys (status $rc)"; }

$MOEJIT mkmodel --preset tiny --layers 2 --index-topk 4 --seed 3 --out "$tmp/m" -q || { echo "FAIL mkmodel"; exit 1; }
$MOEJIT forward -m "$tmp/m" --tokens 5,6,7,8,9,10,11,12 --steps 6 > "$tmp/f32.out" 2> "$tmp/f32.err" || bad "forward"
MOEJIT_INDEXER_KEYS=fp8 $MOEJIT forward -m "$tmp/m" --tokens 5,6,7,8,9,10,11,12 --steps 6 > "$tmp/fp8.out" \
  2> "$tmp/fp8.err" || bad "forward with a bad MOEJIT_INDEXER_KEYS"
MOEJIT_INDEXER_KEYS=bf16 $MOEJIT forward -m "$tmp/m" --tokens 5,6,7,8,9,10,11,12 --steps 6 > "$tmp/bf16.out" \
  2> "$tmp/bf16.err" || bad "forward with MOEJIT_INDEXER_KEYS=bf16"
[ "$(grep -c 'MOEJIT_INDEXER_KEYS=fp8 ignored: it takes f32 or bf16' "$tmp/fp8.err")" = 1 ] &&
  ok "a bad MOEJIT_INDEXER_KEYS: one warning" || { cat "$tmp/fp8.err"; bad "no warning for MOEJIT_INDEXER_KEYS=fp8"; }
[ "$(grep "^token" "$tmp/f32.out")" = "$(grep "^token" "$tmp/fp8.out")" ] && grep -q "^token" "$tmp/f32.out" && ok "... and the f32 keys' output" || bad "a bad value changed the output"
[ -s "$tmp/bf16.err" ] && { cat "$tmp/bf16.err"; bad "MOEJIT_INDEXER_KEYS=bf16 says something"; } ||
  { grep -q "^token" "$tmp/bf16.out" && ok "bf16: tokens, no warning" || bad "bf16: no tokens"; }
# (that the rounding reaches the forward pass is test_fidelity's: selections differ under bf16)
exit $fail
