#!/bin/sh
# example_simple.sh: examples/simple (the C API's example) on the built-in
# model, written into a scratch data folder: two requests from two threads,
# one by callback, one by poll, each text equal to its request run alone
# (the example checks that and exits 1 when not).
. "$srcdir/tests/lib.sh"
MOEJIT_DATA_DIR="$tmp/data" "$builddir/examples/simple" > "$tmp/out" 2> "$tmp/err"
st=$?
[ $st -eq 0 ] && grep -q "^ok: each text equals its request run alone$" "$tmp/out" &&
  ok "examples/simple: $(tail -2 "$tmp/out" | head -1)" || bad "examples/simple: status $st: $(cat "$tmp/out" "$tmp/err")"
[ "$(grep -c '^\[callback, seed 1, [0-9]* tokens\] The quick brown fox\|^\[poll, seed 2, [0-9]* tokens\] Once upon a time' "$tmp/out")" -eq 2 ] &&
  ok "both texts printed" || bad "texts: $(cat "$tmp/out")"
exit $fail
