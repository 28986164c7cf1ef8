#!/bin/sh
# fuzz_regress.sh: every input a fuzzer once crashed on (tests/fuzz/regress/
# TARGET-*) and every seed (tests/fuzz/TARGET/) goes through the fuzz
# target again, linked into tests/fuzz/replay_TARGET (no libFuzzer), where a
# crash, a sanitizer report or a broken invariant fails.  DSL findings also
# go through `moejit compile`: success or a clean error (status 0 or 1),
# never a crash, an abort or an internal error.
set -u
fail=0
n=0
for t in dsl safetensors model_config tokenizer cache_entry; do
  set --
  for f in "$srcdir"/tests/fuzz/regress/"$t"-*; do [ -e "$f" ] && set -- "$@" "$f"; done
  n=$((n + $#))
  if ! out=$("$builddir/tests/fuzz/replay_$t" "$srcdir/tests/fuzz/$t" "$@" 2>&1); then
    echo "$out" | tail -n 20
    echo "FAIL replay_$t"
    fail=1
  else
    echo "ok   replay_$t: $(echo "$out" | grep -c '^ok ') inputs"
  fi
done
for f in "$srcdir"/tests/fuzz/regress/dsl-*; do
  [ -e "$f" ] || continue
  $MOEJIT compile "$f" --emit ptx -o /dev/null -q 2>/dev/null
  status=$?
  if [ "$status" -gt 1 ]; then echo "FAIL $(basename "$f"): status $status"; fail=1; else echo "ok   $(basename "$f"): status $status"; fi
done
[ "$n" -gt 0 ] || { echo "FAIL: no regression inputs"; exit 1; }
exit $fail
