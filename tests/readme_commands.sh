#!/bin/sh
# readme_commands.sh: the README's command list against the command table.
# Every command of MJ_COMMANDS (src/cli.h) has a line `    moejit NAME ...`
# in the README's "## Commands" section, and every such line names a
# command that exists: a command added, renamed or removed without the
# README following fails make check.  Each command's long options shown in
# the README must be options its --help lists.
. "$srcdir/tests/lib.sh"
readme="$srcdir/README.md"
table=$(sed -n 's/^  X(\([a-z]*\),.*/\1/p' "$srcdir/src/cli.h")
[ -n "$table" ] || { echo "FAIL: no commands in src/cli.h"; exit 1; }
sed -n '/^## Commands/,/^## /p' "$readme" > "$tmp/section"
listed=$(sed -n 's/^    moejit \([a-z]*\).*/\1/p' "$tmp/section" | sort -u)
for c in $table; do
  echo "$listed" | grep -qx "$c" && ok "README lists moejit $c" || bad "README's command list lacks moejit $c"
done
for c in $listed; do
  echo "$table" | grep -qx "$c" && ok "moejit $c is a command" || bad "README lists moejit $c, which is no command"
done
for c in $listed; do
  opts=$(grep "^    moejit $c\b" "$tmp/section" | grep -o -- '--[a-z][a-z0-9-]*' | sort -u)
  help=$($MOEJIT "$c" --help 2>&1)
  for o in $opts; do
    echo "$help" | grep -q -- "$o\b" || bad "README shows moejit $c $o, which its --help does not list"
  done
done
exit $fail
