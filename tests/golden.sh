#!/bin/sh
# golden.sh: the LLVM IR and PTX of each kernel in tests/golden/ equal the
# committed goldens (made by scripts/regen-golden.sh), and the PTX assembles
# for sm_90a through nvJitLink; and the PTX of the product kernels listed in
# tests/golden/templates.txt (the MoE expert kernel, the batched GEMV, SiLU *
# up, add + RMSNorm, mla_vout).
set -u
cd "$srcdir" || exit 1
fail=0
n=0
out=${TMPDIR:-/tmp}/golden.$$

# compare GOLDEN SOURCE EMIT DEFS...: `moejit compile SOURCE DEFS --emit EMIT`
# equals GOLDEN (after its first line, the generator's note)
compare() {
  golden=$1 src=$2 emit=$3
  shift 3
  $MOEJIT compile "$src" "$@" --emit "$emit" -q > "$out" || { echo "FAIL $src: compile"; fail=1; return; }
  if tail -n +2 "$golden" | diff -u - "$out" > "$out.diff"; then
    echo "ok   $golden"
  else
    echo "FAIL $golden differs (if intended: scripts/regen-golden.sh):"
    head -n 40 "$out.diff"
    fail=1
  fi
  n=$((n + 1))
}

for k in tests/golden/*.k; do
  defs=$(grep '^// golden:' "$k" | sed 's#^// golden:##')
  # shellcheck disable=SC2086
  compare "${k%.k}.ll" "$k" llvm $defs
  # shellcheck disable=SC2086
  compare "${k%.k}.ptx" "$k" ptx $defs
  # shellcheck disable=SC2086
  $MOEJIT compile "$k" $defs -o "$out.cubin" -q || { echo "FAIL $k: nvJitLink rejected the PTX"; fail=1; }
done
# product kernels at the shapes the engine runs: their PTX
while read -r name tmpl defs; do
  case $name in ''|'#'*) continue ;; esac
  # shellcheck disable=SC2086
  compare "tests/golden/$name.ptx" "templates/$tmpl" ptx $defs
done < tests/golden/templates.txt
rm -f "$out" "$out.diff" "$out.cubin"
[ "$n" -gt 0 ] || { echo "FAIL: no goldens"; exit 1; }
exit $fail
