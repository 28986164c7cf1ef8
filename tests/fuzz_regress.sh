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
for t in dsl safetensors model_config tokenizer cache_entry trace; do
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
# Parser findings through the command line too: status 1 and one line.
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
one_line() { # NAME STATUS: the last command's status and $tmp/err
  if [ "$2" -eq 1 ] && [ "$(wc -l < "$tmp/err")" -eq 1 ]; then echo "ok   $1: status 1, one line"
  else echo "FAIL $1: status $2, stderr: $(cat "$tmp/err")"; fail=1; fi
}
for f in "$srcdir"/tests/fuzz/regress/tokenizer-*; do
  [ -e "$f" ] || continue
  tail -c +2 "$f" > "$tmp/in"
  if [ $(( $(od -An -tu1 -N1 "$f") % 2 )) -eq 1 ]; then
    # odd first byte: the rest is a tokenizer.json: refused in one line, or
    # (a finding in encoding or decoding) loaded and used
    $MOEJIT tokenize --tokenizer "$tmp/in" "some text, caf\303\251  x" > /dev/null 2> "$tmp/err"
    st=$?
    if [ $st -eq 0 ] && [ ! -s "$tmp/err" ]; then echo "ok   $(basename "$f") (moejit tokenize): loads and encodes"
    else one_line "$(basename "$f") (moejit tokenize)" $st; fi
  elif $MOEJIT tokenize --tokenizer "$srcdir/tests/data/glm-tiny-tokenizer.json" - < "$tmp/in" > /dev/null; then
    echo "ok   $(basename "$f") (moejit tokenize): text encodes"
  else
    echo "FAIL $(basename "$f"): moejit tokenize of the text failed"; fail=1
  fi
done
for f in "$srcdir"/tests/fuzz/regress/model_config-*; do
  [ -e "$f" ] || continue
  rm -rf "$tmp/m" && mkdir "$tmp/m" && cp "$f" "$tmp/m/config.json"
  $MOEJIT info -m "$tmp/m" > /dev/null 2> "$tmp/err"
  one_line "$(basename "$f") (moejit info)" $?
done
[ "$n" -gt 0 ] || { echo "FAIL: no regression inputs"; exit 1; }
exit $fail
