#!/bin/sh
# cache.sh: measure the JIT front door (cold compile, disk hit, memory hit;
# bench/bench_cache.c says how) and record the result in
# bench/results/YYYY-MM-DD-cache.md with the date, commit, command and
# machine.  Run from the top of a built tree: sh bench/cache.sh [--reps N]
# [--arch sm_90a].
set -eu
top=$(cd "$(dirname "$0")/.." && pwd)
make -C "$top" -s bench/bench_cache >/dev/null
date=$(date +%Y-%m-%d)
out="$top/bench/results/$date-cache.md"
commit=$(git -C "$top" rev-parse --short HEAD)
dirty=$(git -C "$top" status --porcelain --untracked-files=no | grep -q . && echo " (with uncommitted changes)" || true)
cpu=$(grep -m1 'model name' /proc/cpuinfo | sed 's/.*: //')
table=$("$top/bench/bench_cache" "$@")
{
  echo "# JIT front door and cubin cache: $date"
  echo
  echo "- commit: $commit$dirty"
  echo "- command: \`sh bench/cache.sh $*\`"
  echo "- machine: $(nproc) cores, $cpu; cache folder on $(df -T "${TMPDIR:-/tmp}" | awk 'NR==2 {print $2}')"
  echo "- versions: $("$top/moejit" version | tr -s ' ' | paste -sd ';' -)"
  echo
  echo "$table"
  echo
  echo "Targets: disk hit <= 2 ms, memory hit <= 1 us (1000 ns)."
} > "$out"
cat "$out"
echo "wrote $out"
