#!/bin/sh
# cli.sh: the moejit command line: help, version, exit codes and the exact
# one-line errors for bad flags and arguments.
. "$srcdir/tests/lib.sh"
expect 0 "" $MOEJIT help
grep -q "compile" "$tmp/out" || { echo "FAIL: help lists no compile"; fail=1; }
expect 0 "" $MOEJIT help exit
grep -q "3  no usable GPU" "$tmp/out" || { echo "FAIL: help exit lacks the GPU code"; fail=1; }
expect 0 "" $MOEJIT version
grep -q "^LLVM      19" "$tmp/out" || { echo "FAIL: version lacks LLVM 19"; fail=1; }
expect 0 "" $MOEJIT version --json
grep -q '"nvjitlink":"13' "$tmp/out" || { echo "FAIL: version --json lacks nvJitLink"; fail=1; }
# NCCL is loaded with dlopen: a missing library is one line in version, not a crash
MOEJIT_NCCL_LIB=/nonexistent/libnccl.so.2 $MOEJIT version > "$tmp/out" 2>&1 || { echo "FAIL: version without NCCL"; fail=1; }
grep -q "^NCCL      none (libnccl.so.2 not found: /nonexistent/libnccl.so.2: .*MOEJIT_NCCL_LIB" "$tmp/out" ||
  { echo "FAIL: version lacks the missing-NCCL line"; cat "$tmp/out"; fail=1; }
expect 1 "moejit: unknown command 'frobnicate' (see moejit help)" $MOEJIT frobnicate
expect 1 "moejit: moejit compile: expected one kernel file (see moejit compile --help)" $MOEJIT compile
expect 1 "moejit: moejit compile: unknown option '--fast' (see moejit compile --help)" $MOEJIT compile --fast x.k
expect 1 "moejit: moejit compile: -D N: expected NAME=VALUE" $MOEJIT compile gemv_bf16_b.k -D N
expect 1 "moejit: moejit compile: --emit must be llvm, ptx or cubin, not 'sass'" $MOEJIT compile gemv_bf16_b.k --emit sass
expect 1 "moejit: moejit compile: --emit cubin needs -o FILE (a cubin is binary)" $MOEJIT compile gemv_bf16_b.k --emit cubin
expect 1 "moejit: moejit compile: -O expects an integer, not 'fast'" $MOEJIT compile gemv_bf16_b.k -O fast
expect 1 "moejit: nope.k: cannot open: No such file or directory (and no built-in template of that name)" $MOEJIT compile nope.k
expect 1 "moejit: gemv_bf16_b.k: -D Q: the kernel has no specialisation constant 'Q' (it has: N, K, B, THREADS, ROWS, UNROLL)" \
  $MOEJIT compile gemv_bf16_b.k -D N=64 -D K=64 -D Q=1 -q
# the built-in template compiles to an ELF cubin, reporting its resources
$MOEJIT compile gemv_bf16_b.k -D N=6144 -D K=2048 -o "$tmp/g.cubin" > "$tmp/out" 2>&1 || { echo "FAIL: cubin compile"; fail=1; }
head -c 4 "$tmp/g.cubin" | od -An -c | grep -q 'E   L   F' || { echo "FAIL: cubin is not ELF"; fail=1; }
grep -q "registers" "$tmp/out" || { echo "FAIL: no resource report"; fail=1; }
expect 1 "moejit: moejit bench decode: --tp 4 --ep 2: each must be 1 or the number of ranks (the larger, 4)" \
  $MOEJIT bench decode --tp 4 --ep 2
expect 1 "moejit: moejit bench decode: --ep must be 1 to 1024, not 0" $MOEJIT bench decode --ep 0
expect 1 "moejit: moejit bench decode: --max-ctx must be --ctx + 2 (12) .. 1048576, not 11" \
  $MOEJIT bench decode --ctx 10 --max-ctx 11
# without a GPU the GPU commands say so plainly (status 3)
if ! $MOEJIT version | grep -q "^driver    CUDA"; then
  expect 3 "moejit: no GPU: the CUDA driver (libcuda.so.1) is not installed" $MOEJIT bench gemv
fi
exit $fail
