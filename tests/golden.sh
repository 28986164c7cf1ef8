#!/bin/sh
# golden.sh: the LLVM IR and PTX of each kernel in tests/golden/ equal the
# committed goldens (made by scripts/regen-golden.sh), and the PTX assembles
# for sm_90a through nvJitLink; and the PTX of the product kernels listed in
# tests/golden/templates.txt (the MoE expert kernel, the batched GEMV).
set -u
cd "$srcdir" || exit 1
fail=0
n=0
for k in tests/golden/*.k; do
  defs=$(grep '^// golden:' "$k" | sed 's#^// golden:##')
  base=${k%.k}
  for kind in ll ptx; do
    emit=$([ $kind = ll ] && echo llvm || echo ptx)
    # shellcheck disable=SC2086
    $MOEJIT compile "$k" $defs --emit $emit -q > "${TMPDIR:-/tmp}/golden.$$" || { echo "FAIL $k: compile"; fail=1; continue; }
    if tail -n +2 "$base.$kind" | diff -u - "${TMPDIR:-/tmp}/golden.$$" > "${TMPDIR:-/tmp}/golden.diff.$$"; then
      echo "ok   $base.$kind"
    else
      echo "FAIL $base.$kind differs (if intended: scripts/regen-golden.sh):"
      head -n 40 "${TMPDIR:-/tmp}/golden.diff.$$"
      fail=1
    fi
    n=$((n + 1))
  done
  # shellcheck disable=SC2086
  $MOEJIT compile "$k" $defs -o "${TMPDIR:-/tmp}/golden.$$.cubin" -q || { echo "FAIL $k: nvJitLink rejected the PTX"; fail=1; }
done
# product kernels at the shapes the engine runs: their PTX (tests/golden/templates.txt)
while read -r name tmpl defs; do
  case $name in ''|'#'*) continue ;; esac
  # shellcheck disable=SC2086
  $MOEJIT compile "templates/$tmpl" $defs --emit ptx -q > "${TMPDIR:-/tmp}/golden.$$" || { echo "FAIL $name: compile"; fail=1; continue; }
  if tail -n +2 "tests/golden/$name.ptx" | diff -u - "${TMPDIR:-/tmp}/golden.$$" > "${TMPDIR:-/tmp}/golden.diff.$$"; then
    echo "ok   tests/golden/$name.ptx"
  else
    echo "FAIL tests/golden/$name.ptx differs (if intended: scripts/regen-golden.sh):"
    head -n 40 "${TMPDIR:-/tmp}/golden.diff.$$"
    fail=1
  fi
  n=$((n + 1))
done < tests/golden/templates.txt
rm -f "${TMPDIR:-/tmp}/golden.$$" "${TMPDIR:-/tmp}/golden.diff.$$" "${TMPDIR:-/tmp}/golden.$$.cubin"
[ "$n" -gt 0 ] || { echo "FAIL: no goldens"; exit 1; }
exit $fail
