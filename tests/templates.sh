#!/bin/sh
# templates.sh: every DSL template in templates/ (and DSL test kernel in
# tests/kernels/) compiles to a cubin for sm_90a (nvJitLink runs ptxas on it,
# the real validation of any inline PTX), once for each "// test: -D ..."
# line it carries.  No GPU needed.
set -u
fail=0
n=0
for k in "$srcdir"/templates/*.k "$srcdir"/tests/kernels/*.k; do
  lines=$(grep '^// test:' "$k" | sed 's#^// test:##')
  [ -n "$lines" ] || { echo "FAIL $k: no '// test: -D ...' line"; fail=1; continue; }
  echo "$lines" | while read -r defs; do
    # shellcheck disable=SC2086
    if ! $MOEJIT compile "$k" $defs --arch sm_90a -o "${TMPDIR:-/tmp}/tpl.$$.cubin" -q; then
      echo "FAIL $k $defs"
      exit 1
    fi
    echo "ok   $(basename "$k") $defs"
  done || fail=1
  n=$((n + 1))
done
rm -f "${TMPDIR:-/tmp}/tpl.$$.cubin"
[ "$n" -gt 0 ] || { echo "no templates found"; exit 1; }
exit $fail
