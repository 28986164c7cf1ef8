#!/bin/sh
# fuzz_regress.sh: every input a fuzzer once crashed on (tests/fuzz/regress/)
# is now answered with success or a clean error (status 0 or 1), never a
# crash, an abort or an internal error.
set -u
fail=0
n=0
for f in "$srcdir"/tests/fuzz/regress/dsl-*; do
  [ -e "$f" ] || continue
  n=$((n + 1))
  $MOEJIT compile "$f" --emit ptx -o /dev/null -q 2>/dev/null
  status=$?
  if [ "$status" -gt 1 ]; then echo "FAIL $(basename "$f"): status $status"; fail=1; else echo "ok   $(basename "$f"): status $status"; fi
done
[ "$n" -gt 0 ] || { echo "FAIL: no regression inputs"; exit 1; }
exit $fail
