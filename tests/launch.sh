#!/bin/sh
# launch.sh: the multi-GPU launcher end to end, on a machine without GPUs:
# a fake CUDA driver (tests/fakecuda, through MOEJIT_LIBCUDA) reports
# FAKE_GPUS devices and fails when one is opened.  Too few GPUs is one line
# before any rank starts; with enough, moejit re-executes itself once per
# rank, rank k opens device k, the ranks' failures come back as the first
# failure's status with a line naming the rank, rank 0's error reaches the
# terminal and the others' go to MOEJIT_RANK_LOGS, the slow rank is stopped,
# and the private folder of the NCCL id is removed.  (docs/multigpu.md)
. "$srcdir/tests/lib.sh"
fake="$builddir/tests/fakecuda/libcuda.so.1"
[ -f "$fake" ] || { echo "FAIL: $fake was not built"; exit 1; }
$MOEJIT mkmodel --preset tiny --seed 5 --out "$tmp/m" -q || { echo "FAIL mkmodel"; exit 1; }

expect 3 "moejit: moejit generate: --tp 2 needs 2 GPUs, 1 found" \
  env MOEJIT_LIBCUDA="$fake" FAKE_GPUS=1 $MOEJIT generate -m "$tmp/m" -p x --tp 2
expect 3 "moejit: moejit bench decode: --tp 4 --ep 4 needs 4 GPUs, 2 found" \
  env MOEJIT_LIBCUDA="$fake" FAKE_GPUS=2 $MOEJIT bench decode --tp 4 --ep 4
expect 3 "moejit: moejit generate: --ep 8 needs 8 GPUs, 0 found" \
  env MOEJIT_LIBCUDA="$fake" FAKE_GPUS=0 $MOEJIT generate -m "$tmp/m" -p x --ep 8

if $MOEJIT version | grep -q "^NCCL      none"; then
  echo "skip: the ranks need libnccl.so.2 ($($MOEJIT version | grep '^NCCL'))"
  exit $fail
fi
mkdir "$tmp/t"
# two ranks; rank 1 fails first, rank 0 is stopped
env TMPDIR="$tmp/t" MOEJIT_LIBCUDA="$fake" FAKE_GPUS=2 FAKE_FIRST=1 MOEJIT_RANK_LOGS="$tmp/logs" \
  $MOEJIT generate -m "$tmp/m" -p x --ep 2 > "$tmp/out" 2> "$tmp/err"
st=$?
[ $st -eq 5 ] && ok "generate --ep 2: the first failure's status (5)" || bad "generate --ep 2: status $st: $(cat "$tmp/err")"
grep -qx "fake driver: rank 0 opens device 0" "$tmp/err" && ok "rank 0 opened device 0, its stderr on the terminal" ||
  bad "rank 0: $(cat "$tmp/err")"
grep -qx "fake driver: rank 1 opens device 1" "$tmp/logs/rank-1.log" && ok "rank 1 opened device 1, its output in the log" ||
  bad "rank 1: $(cat "$tmp/logs/rank-1.log")"
grep -q "^moejit: CUDA error .* in cu.cuDeviceGet(" "$tmp/logs/rank-1.log" && ok "rank 1's own error line" ||
  bad "rank 1's error: $(cat "$tmp/logs/rank-1.log")"
grep -qx "moejit: rank 1 of 2 failed (exit status 5); the other ranks were stopped (its output: $tmp/logs/rank-1.log)" "$tmp/err" &&
  ok "the launcher names the failed rank" || bad "launcher line: $(cat "$tmp/err")"
! grep -q "cu.cuDeviceGet" "$tmp/err" && ok "rank 0 was stopped before its own error" || bad "rank 0 was not stopped: $(cat "$tmp/err")"
[ ! -s "$tmp/out" ] && ok "no output on stdout" || bad "stdout: $(cat "$tmp/out")"
[ -z "$(ls -A "$tmp/t")" ] && ok "the NCCL id folder is removed" || bad "left in TMPDIR: $(ls -A "$tmp/t")"
# bench decode on four ranks (no logs: the others' stderr on the terminal): each rank k opens device k,
# rank 2 fails first
env TMPDIR="$tmp/t" MOEJIT_LIBCUDA="$fake" FAKE_GPUS=4 FAKE_FIRST=2 $MOEJIT bench decode --tp 4 > "$tmp/out" 2> "$tmp/err"
st=$?
n=0
for k in 0 1 2 3; do grep -qx "fake driver: rank $k opens device $k" "$tmp/err" && n=$((n + 1)); done
[ $st -eq 5 ] && [ $n -eq 4 ] && grep -qx "moejit: rank 2 of 4 failed (exit status 5); the other ranks were stopped" "$tmp/err" &&
  ok "bench decode --tp 4: four ranks, four devices" || bad "bench decode --tp 4: status $st, $n devices: $(cat "$tmp/err")"
# serve: the same launcher (rank 0 would serve, rank 1 follow); rank 1 fails first
env TMPDIR="$tmp/t" MOEJIT_LIBCUDA="$fake" FAKE_GPUS=2 FAKE_FIRST=1 $MOEJIT serve -m "$tmp/m" --port 0 --tp 2 > "$tmp/out" 2> "$tmp/err"
st=$?
[ $st -eq 5 ] && grep -qx "fake driver: rank 1 opens device 1" "$tmp/err" &&
  grep -qx "moejit: rank 1 of 2 failed (exit status 5); the other ranks were stopped" "$tmp/err" &&
  [ -z "$(ls -A "$tmp/t")" ] && ok "serve --tp 2: two ranks, the first failure's line, the folder removed" ||
  bad "serve --tp 2: status $st: $(cat "$tmp/err")"
exit $fail
