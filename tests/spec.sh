#!/bin/sh
# spec.sh: specialisation constants change the generated code: a loop bound
# by a constant is fully unrolled (R loads in the PTX for R = 4 and for
# R = 16), and a branch on a constant leaves only the side taken.
set -u
k=${TMPDIR:-/tmp}/spec.$$.k
trap 'rm -f "$k"' EXIT
cat > "$k" <<'K'
const i32 R;
const i32 MODE = 0;
kernel void spec(global const f32* restrict p, global f32* restrict out) {
  f32 acc = 0.0;
  unroll for (i32 i = 0; i < R; i++) acc += load_nc(p + i * 64);
  if (MODE == 1) acc = exp(acc);
  out[threadIdx.x] = acc;
}
K
fail=0
for r in 4 16; do
  got=$($MOEJIT compile "$k" -D R=$r --emit ptx -q | grep -c 'ld.global.nc.f32')
  if [ "$got" -ne "$r" ]; then echo "FAIL R=$r: $got loads in the PTX, expected $r"; fail=1; else echo "ok   R=$r: $r loads"; fi
done
ex0=$($MOEJIT compile "$k" -D R=2 -D MODE=0 --emit ptx -q | grep -c 'ex2.approx')
ex1=$($MOEJIT compile "$k" -D R=2 -D MODE=1 --emit ptx -q | grep -c 'ex2.approx')
if [ "$ex0" -ne 0 ] || [ "$ex1" -ne 1 ]; then
  echo "FAIL dead branch: ex2.approx appears $ex0 (MODE=0) and $ex1 (MODE=1) times, expected 0 and 1"; fail=1
else
  echo "ok   MODE=0 drops the exp branch, MODE=1 keeps it"
fi
exit $fail
