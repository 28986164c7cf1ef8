#!/bin/sh
# blackwell.sh: the decode step's kernels for Blackwell, compiled without a
# GPU (docs/trace.md, "Blackwell targets").  `moejit warmup --arch sm_120`
# and `--arch sm_100a` compile every kernel of a small GLM-5 (4 layers,
# batch sizes 1 and 8) into the cache: none fails, `moejit cache verify`
# holds each cubin's ELF to its key's target, `cache list` shows the
# target, a second run under assert-warm compiles nothing, and the other
# target's entries do not serve (keys name the target).  One cubin per
# target is also checked here by its own bytes (the ELF header's SM in
# e_flags bits 8..15, ptxas's "-arch" note), not through moejit's reader.
# A bad --arch is one line, status 1.
. "$srcdir/tests/lib.sh"
export MOEJIT_CACHE_DIR="$tmp/cache"
known="sm_80, sm_86, sm_87, sm_89, sm_90, sm_90a, sm_100, sm_100a, sm_120 or sm_120a"
for arch in sm_120 sm_100a; do
  sm=$(echo "$arch" | tr -dc 0-9)
  MOEJIT_CACHE=on $MOEJIT warmup --synthetic glm5 --layers 4 --arch $arch --batches 1,8 -j 2 > "$tmp/w" 2> "$tmp/e"
  st=$?
  set -- $(sed -n 's/.*: \([0-9]*\) kernels, \([0-9]*\) compiled, \([0-9]*\) already cached, \([0-9]*\) failed.*/\1 \2 \3 \4/p' "$tmp/w")
  if [ $st -eq 0 ] && [ "${1:-0}" -gt 20 ] && [ "$2" = "$1" ] && [ "$4" = 0 ] && [ ! -s "$tmp/e" ]; then
    ok "$arch: warm-up compiled $1 kernels, none failed"
  else
    bad "$arch: warm-up: status $st: $(cat "$tmp/w" "$tmp/e")"
  fi
  n=$1
  MOEJIT_CACHE=on $MOEJIT cache verify > "$tmp/v" 2>&1 &&
    grep -q "^[0-9]* entries checked, 0 bad$" "$tmp/v" && ok "$arch: cache verify: every cubin's ELF is for $arch" ||
    bad "$arch: cache verify: $(cat "$tmp/v")"
  rows=$($MOEJIT cache list | awk -v a=$arch 'NR > 1 && $(NF - 1) == a' | wc -l)
  [ "$rows" -eq "$n" ] && ok "$arch: cache list shows $rows entries for $arch" || bad "$arch: cache list: $rows of $n rows say $arch"
  MOEJIT_CACHE=assert-warm $MOEJIT warmup --synthetic glm5 --layers 4 --arch $arch --batches 1,8 > "$tmp/w" 2>&1 &&
    grep -q ": $n kernels, 0 compiled, $n already cached, 0 failed" "$tmp/w" && ok "$arch: assert-warm, 0 compiles" ||
    bad "$arch: assert-warm: $(cat "$tmp/w")"
  # The bytes themselves: e_flags (offset 48, little-endian) holds the SM in
  # its second byte; the tool note names the exact target.
  MOEJIT_CACHE=off $MOEJIT compile "$srcdir/templates/moe_expert.k" -D MODE=0 -D K=6144 -D N=2048 -D MT=2 \
    -D ROWS=16 -D MMA=1 --arch $arch -o "$tmp/k.cubin" -q > /dev/null 2>&1
  got=$(od -An -tu1 -j49 -N1 "$tmp/k.cubin" 2>/dev/null | tr -d ' ')
  if [ "$got" = "$sm" ] && grep -aq -- "-arch $arch " "$tmp/k.cubin"; then
    ok "$arch: moe_expert.k's cubin: e_flags SM $got, ptxas -arch $arch"
  else
    bad "$arch: moe_expert.k's cubin: e_flags SM '$got', want $sm"
  fi
done
# Both targets' entries live side by side; neither serves the other, nor sm_90a.
MOEJIT_CACHE=assert-warm $MOEJIT warmup --synthetic glm5 --layers 4 --arch sm_90a --batches 1 > /dev/null 2> "$tmp/e"
st=$?
[ $st -eq 7 ] && [ "$(wc -l < "$tmp/e")" -eq 1 ] && ok "sm_90a is not served by the Blackwell entries: $(cut -c1-60 "$tmp/e")..." ||
  bad "sm_90a under assert-warm: status $st: $(cat "$tmp/e")"
expect 1 "moejit: moejit warmup: --arch sm_121: unknown target (use $known)" $MOEJIT warmup --synthetic glm5 --arch sm_121
expect 1 "moejit: moejit warmup: --arch 120: unknown target (use $known)" $MOEJIT warmup --synthetic glm5 --arch 120
expect 1 "moejit: --arch sm_101a: unknown target (use $known)" $MOEJIT compile "$srcdir/templates/embed.k" --arch sm_101a
exit $fail
