#!/bin/sh
# fuzz.sh: build the libFuzzer targets of tests/fuzz/ with clang and run each
# for FUZZ_SECONDS (default 60).  `make fuzz` calls it.
#
#   scripts/fuzz.sh [--build-only|--run-only] [TARGET...]     (targets: dsl safetensors
#                                                   model_config tokenizer cache_entry trace)
#   env: FUZZ_SECONDS (60), BUILDDIR (a configured build folder: config.h,
#        src/build_id.h, src/templates.inc and the Makefile's library flags;
#        default .), FUZZ_DIR (build-fuzz), CLANG (clang-14 or clang),
#        FUZZ_JOBS (parallel compiles, 2), FUZZ_ARGS (more libFuzzer flags)
#
# Every library source is compiled with -fsanitize=fuzzer-no-link,address,
# undefined, so coverage reaches the parsers, into FUZZ_DIR/libmoejit-fuzz.a;
# each target links it with -fsanitize=fuzzer.  The corpus grows in
# FUZZ_DIR/corpus/TARGET (the committed seeds in tests/fuzz/TARGET/ are read,
# never written); crashes land in FUZZ_DIR/artifacts/.  Each finding becomes
# an input in tests/fuzz/regress/TARGET-WHAT, replayed by make check
# (tests/fuzz_regress.sh), and a fix.  Exit status: 1 if any target found
# something, 2 if the build failed.
set -u
srcdir=$(cd "$(dirname "$0")/.." && pwd)
BUILDDIR=$(cd "${BUILDDIR:-.}" && pwd)
FUZZ_DIR=${FUZZ_DIR:-build-fuzz}
FUZZ_SECONDS=${FUZZ_SECONDS:-60}
FUZZ_JOBS=${FUZZ_JOBS:-2}
build_only=0 run_only=0
case ${1:-} in --build-only) build_only=1; shift ;; --run-only) run_only=1; shift ;; esac
targets=${*:-dsl safetensors model_config tokenizer cache_entry trace}

CLANG=${CLANG:-$(command -v clang-14 || command -v clang)}
[ -n "$CLANG" ] || { echo "fuzz.sh: clang not found (apt-get install clang-14 libclang-rt-14-dev)" >&2; exit 2; }
[ -f "$BUILDDIR/config.h" ] && [ -f "$BUILDDIR/src/build_id.h" ] && [ -f "$BUILDDIR/src/templates.inc" ] || {
  echo "fuzz.sh: $BUILDDIR is not a configured and built tree (run ./configure && make, or make fuzz)" >&2; exit 2; }
mkvar() { sed -n "s/^$1 = //p" "$BUILDDIR/Makefile"; }
LLVM_CPPFLAGS=${LLVM_CPPFLAGS:-$(mkvar LLVM_CPPFLAGS)}
CUDA_CPPFLAGS=${CUDA_CPPFLAGS:-$(mkvar CUDA_CPPFLAGS)}
LIBS="${LLVM_LIBS:-$(mkvar LLVM_LIBS)} ${CUDA_LIBS:-$(mkvar CUDA_LIBS)} ${EXTRA_LIBS:-$(mkvar EXTRA_LIBS)}"

mkdir -p "$FUZZ_DIR/obj" "$FUZZ_DIR/corpus" "$FUZZ_DIR/artifacts" "$FUZZ_DIR/logs"
FUZZ_DIR=$(cd "$FUZZ_DIR" && pwd)
SAN="-fsanitize=address,undefined -fno-sanitize-recover=undefined"
CFLAGS="-std=gnu11 -g -O1 -fno-omit-frame-pointer $SAN -I$srcdir/src -I$srcdir/codegen -I$srcdir/cache \
-I$BUILDDIR -I$BUILDDIR/src -I$srcdir/tests $LLVM_CPPFLAGS $CUDA_CPPFLAGS"
export CLANG CFLAGS FUZZ_DIR srcdir

if [ "$run_only" = 0 ]; then
# ---- the library, instrumented ----------------------------------------------------
# An object is rebuilt when its source is newer, or when any header is.
newest_h=$(ls -t "$srcdir"/src/*.h "$srcdir"/src/*.inc "$srcdir"/codegen/*.h "$srcdir"/cache/*.h \
  "$BUILDDIR/src/build_id.h" "$BUILDDIR/src/templates.inc" | head -n 1)
lib_sources=$(cd "$srcdir" && ls src/*.c codegen/*.c cache/*.c | grep -v '^src/main\.c$')
for s in $lib_sources; do
  o="$FUZZ_DIR/obj/$(echo "$s" | tr / _ | sed 's/\.c$/.o/')"
  if [ ! -f "$o" ] || [ "$srcdir/$s" -nt "$o" ] || [ "$newest_h" -nt "$o" ]; then echo "$s"; fi
done | xargs -r -P "$FUZZ_JOBS" -I{} sh -c '
  o="$FUZZ_DIR/obj/$(echo {} | tr / _ | sed "s/\.c\$/.o/")"
  echo "  CC (fuzz) {}"
  $CLANG $CFLAGS -fsanitize=fuzzer-no-link -c "$srcdir/{}" -o "$o"' || exit 2
lib="$FUZZ_DIR/libmoejit-fuzz.a"
rm -f "$lib"
ar rcs "$lib" "$FUZZ_DIR"/obj/*.o || exit 2

for t in $targets; do
  [ -f "$srcdir/tests/fuzz/fuzz_$t.c" ] || { echo "fuzz.sh: no target tests/fuzz/fuzz_$t.c" >&2; exit 2; }
  echo "  LINK fuzz_$t"
  # shellcheck disable=SC2086
  $CLANG $CFLAGS -fsanitize=fuzzer "$srcdir/tests/fuzz/fuzz_$t.c" "$lib" $LIBS -o "$FUZZ_DIR/fuzz_$t" || exit 2
done
fi
[ "$build_only" = 1 ] && exit 0

# ---- run ------------------------------------------------------------------------------
status=0
cd "$srcdir" || exit 2
export srcdir
for t in $targets; do
  mkdir -p "$FUZZ_DIR/corpus/$t"
  seeds="$srcdir/tests/fuzz/$t"
  case $t in dsl) maxlen=8192 ;; *) maxlen=65536 ;; esac
  before=$(ls "$FUZZ_DIR/artifacts" | grep -c "^$t-" || true)
  start=$(date +%s)
  # shellcheck disable=SC2086
  "$FUZZ_DIR/fuzz_$t" -max_total_time="$FUZZ_SECONDS" -max_len=$maxlen -timeout=20 -rss_limit_mb=2560 \
    -print_final_stats=1 -artifact_prefix="$FUZZ_DIR/artifacts/$t-" ${FUZZ_ARGS:-} \
    "$FUZZ_DIR/corpus/$t" "$seeds" > "$FUZZ_DIR/logs/$t.log" 2>&1
  rc=$?
  secs=$(( $(date +%s) - start ))
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$FUZZ_DIR/logs/$t.log" | tail -n 1)
  corpus=$(ls "$FUZZ_DIR/corpus/$t" | wc -l)
  after=$(ls "$FUZZ_DIR/artifacts" | grep -c "^$t-" || true)
  found=$((after - before))
  echo "fuzz $t: ${secs} s, ${execs:-?} executions, corpus $corpus, findings $found (exit $rc; log $FUZZ_DIR/logs/$t.log)"
  if [ "$rc" -ne 0 ] || [ "$found" -gt 0 ]; then
    status=1
    grep -m 3 -E '^==[0-9]+==ERROR|runtime error|^SUMMARY|deadly signal' "$FUZZ_DIR/logs/$t.log"
  fi
done
exit $status
