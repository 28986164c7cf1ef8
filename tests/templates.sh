#!/bin/sh
# templates.sh: every DSL template in templates/ (and DSL test kernel in
# tests/kernels/) compiles to a cubin for sm_90a (nvJitLink runs ptxas on it,
# the real validation of any inline PTX), once for each "// test: -D ..."
# line it carries; and every kernel of templates/ opens with the
# programmatic-launch prologue.  No GPU needed.
set -u
fail=0
n=0
for k in "$srcdir"/templates/*.k "$srcdir"/tests/kernels/*.k; do
  lines=$(grep '^// test:' "$k" | sed 's#^// test:##')
  [ -n "$lines" ] || { echo "FAIL $k: no '// test: -D ...' line"; fail=1; continue; }
  echo "$lines" | while read -r defs; do
    # shellcheck disable=SC2086
    if ! $MOEJIT compile "$k" $defs --arch sm_90a -o "${TMPDIR:-/tmp}/tpl.$$.cubin" -q < /dev/null; then
      echo "FAIL $k $defs"
      exit 1
    fi
    # A template's PTX waits for its predecessor (griddepcontrol.wait)
    # before its first access to memory other than its parameters, shared
    # or local memory: LLVM may treat restrict const pointers as constant
    # memory it could read earlier, so the order is checked, not assumed.
    case $k in */templates/*)
      # shellcheck disable=SC2086
      order=$($MOEJIT compile "$k" $defs --arch sm_90a --emit ptx -q < /dev/null | awk '
        /griddepcontrol\.wait/ { if (!w) w = NR }
        /^[ \t]*(@%p[0-9]+ )?(ld|st|atom|red|cp\.async|prefetch)\./ && !/\.(param|shared|local|const)[. \t]/ { if (!m) m = NR }
        END { print (w && (!m || w < m)) ? "ok" : "wait at line " w ", first memory access at line " m }')
      if [ "$order" != ok ]; then echo "FAIL $k $defs: $order"; exit 1; fi ;;
    esac
    echo "ok   $(basename "$k") $defs"
  done || fail=1
  n=$((n + 1))
done
rm -f "${TMPDIR:-/tmp}/tpl.$$.cubin"
[ "$n" -gt 0 ] || { echo "no templates found"; exit 1; }

# Every kernel of templates/ opens with the programmatic-launch prologue
# (cudrv.h, cu_launch_tpl): its first two statements are griddep_wait();
# griddep_launch(); (DSL) or MJ_GRIDDEP_WAIT(); MJ_GRIDDEP_LAUNCH();
# (NVRTC).  A kernel without them, launched programmatically, could read
# its predecessor's output before that is written.
for f in "$srcdir"/templates/*.k "$srcdir"/templates/*.cu; do
  case $f in *.k) start='^kernel void'; w='griddep_wait();'; l='griddep_launch();' ;;
             *) start='__global__'; w='MJ_GRIDDEP_WAIT();'; l='MJ_GRIDDEP_LAUNCH();' ;; esac
  bad=$(awk -v start="$start" -v w="$w" -v l="$l" '
    $0 ~ start { k = 1; name = FNR }
    k == 1 && /\{/ { k = 2; next }
    k == 2 && NF { if ($1 != w) { print "line " name; k = 0; next } k = 3; next }
    k == 3 && NF { if ($1 != l) print "line " name; k = 0 }
    END { if (k) print "line " name }' "$f")
  kernels=$(grep -c "$start" "$f")
  if [ -n "$bad" ]; then
    echo "FAIL $(basename "$f"): the kernel at $bad does not open with $w $l"; fail=1
  elif [ "$kernels" -eq 0 ]; then
    echo "FAIL $(basename "$f"): no kernel found"; fail=1
  else
    echo "ok   $(basename "$f"): $kernels kernel(s) open with $w $l"
  fi
done
exit $fail
