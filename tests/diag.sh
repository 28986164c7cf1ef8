#!/bin/sh
# diag.sh: runs each case of tests/diag.test (see its header): the compile
# must exit with status 1 and print exactly the expected diagnostic.
set -u
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
awk -v dir="$dir" '
  /^%%ARGS / { n++; opened = 1; args = substr($0, 8); next }
  /^%%SOURCE$/ { if (!opened) n++; opened = 0; mode = "src"; file = dir "/" n ".k";
                 printf "%s", args > (dir "/" n ".args"); close(dir "/" n ".args"); args = ""; next }
  /^%%EXPECT$/ { mode = "exp"; file = dir "/" n ".expect"; next }
  /^%%END$/ { mode = ""; next }
  mode != "" { print > file }
' "$srcdir/tests/diag.test"
fail=0
total=0
for src in "$dir"/*.k; do
  i=$(basename "$src" .k)
  total=$((total + 1))
  mkdir -p "$dir/run$i"
  cp "$src" "$dir/run$i/t.k"
  # shellcheck disable=SC2046
  (cd "$dir/run$i" && $MOEJIT compile t.k $(cat "$dir/$i.args") --emit ptx -o out.ptx > /dev/null 2> stderr)
  status=$?
  if [ "$status" -ne 1 ]; then
    echo "FAIL case $i: exit status $status, expected 1"; fail=1
  fi
  if ! diff -u "$dir/$i.expect" "$dir/run$i/stderr" > "$dir/diff"; then
    echo "FAIL case $i: diagnostic differs:"; cat "$dir/diff"; fail=1
  elif [ "$status" -eq 1 ]; then
    echo "ok   case $i: $(head -n 1 "$dir/$i.expect" | cut -c1-90)"
  fi
  [ ! -e "$dir/run$i/out.ptx" ] || { echo "FAIL case $i: wrote output despite the error"; fail=1; }
done
[ "$total" -ge 10 ] || { echo "FAIL: only $total cases parsed"; fail=1; }
exit $fail
