#!/bin/sh
# replay.sh: `moejit replay --dry-run` on a trace written by the trace
# writer (test_replay --write-trace): the buckets it lists, each kernel's
# cache status flipping from "compile" to "cached" once a bucket's kernels
# are compiled into a scratch cache (test_replay --compile-bucket, through
# jit_get for sm_90a), the --json object, the arch the probe asks about,
# and the exact one-line errors of bad flags and inputs.  No GPU needed;
# without one, a replay that is not a dry run must exit 3.
set -u
: "${MOEJIT:=./moejit}"
here=$(dirname "$MOEJIT")/tests
dir=$(mktemp -d "${TMPDIR:-/tmp}/moejit-replay.XXXXXX")
trap 'rm -rf "$dir"' EXIT
MOEJIT_CACHE=on MOEJIT_CACHE_DIR=$dir/cache
export MOEJIT_CACHE MOEJIT_CACHE_DIR
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
# expect STATUS PATTERN CMD...: exit status, and a line of the output
# (stdout + stderr) matching PATTERN.
expect() {
  want=$1 pat=$2
  shift 2
  out=$("$@" 2>&1)
  st=$?
  [ "$st" = "$want" ] || fail "$* exited $st, want $want: $out"
  printf '%s\n' "$out" | grep -q -- "$pat" || fail "$*: no line matching '$pat' in: $out"
}
t=$dir/t.jsonl
"$here/test_replay" --write-trace "$t" || { echo "FAIL: cannot write the test trace"; exit 1; }

# Three buckets, nothing cached yet.
c='compile | compile | compile | compile | compile |'
expect 0 "^| 1 | 2 | 1 | 0 | 1 | 8.0 | $c\$" "$MOEJIT" replay "$t" --dry-run
expect 0 "^| 8 | 4 | 2 | 2 | 5 | " "$MOEJIT" replay "$t" --dry-run
expect 0 "^| 64 | 2 | 1 | 0 | 40 | " "$MOEJIT" replay "$t" --dry-run
expect 0 "^12 distinct kernels, 12 to compile\$" "$MOEJIT" replay "$t" --dry-run
expect 0 "4 steps, 8 MoE records, 3 buckets" "$MOEJIT" replay "$t" --dry-run
expect 0 '"kernels":12,"to_compile":12,' "$MOEJIT" replay "$t" --dry-run --json
expect 0 '{"bucket":8,"records":4,"steps":2,"eager":2,"max_rows":5,' "$MOEJIT" replay "$t" --dry-run --json
n=$("$MOEJIT" replay "$t" --dry-run --json | wc -l)
[ "$n" = 1 ] || fail "--json printed $n lines, want 1"
# A dry run compiles and stores nothing.
[ ! -d "$dir/cache/v1" ] || [ -z "$(ls "$dir/cache/v1")" ] || fail "--dry-run stored entries"

# Compile bucket 1's kernels for sm_90a: its row flips, the others stay.
"$here/test_replay" --compile-bucket 1 sm_90a || fail "compiling bucket 1"
c='cached | cached | cached | cached | cached |'
expect 0 "^| 1 | 2 | 1 | 0 | 1 | 8.0 | $c\$" "$MOEJIT" replay "$t" --dry-run
expect 0 "^| 64 | .* compile | compile | compile | compile | cached |\$" "$MOEJIT" replay "$t" --dry-run
expect 0 "^12 distinct kernels, 7 to compile\$" "$MOEJIT" replay "$t" --dry-run
expect 0 '"bucket":1,.*"kernels":{"router":"cached","route":"cached","gate_up":"cached","down":"cached","combine":"cached"}' \
  "$MOEJIT" replay "$t" --dry-run --json
# The combine kernel depends on the widths alone: bucket 8's is bucket 1's.
# (Buckets 8 and 64 share a router, TB 8: 12 distinct kernels, not 15.)
expect 0 "^| 8 | .* compile | compile | compile | compile | cached |\$" "$MOEJIT" replay "$t" --dry-run
# Another target: nothing cached.
expect 0 "^12 distinct kernels, 12 to compile\$" "$MOEJIT" replay "$t" --dry-run --arch sm_80
# Every target the compiler takes, Blackwell's included (the forward path).
expect 0 "^12 distinct kernels, 12 to compile\$" "$MOEJIT" replay "$t" --dry-run --arch sm_100
# The cache off: nothing is found.
MOEJIT_CACHE=off expect 0 "^12 distinct kernels, 12 to compile\$" "$MOEJIT" replay "$t" --dry-run

# Bad flags and inputs: one line each, exit 1.
expect 1 "^moejit: moejit replay: give one trace file (moejit replay FILE.jsonl)\$" "$MOEJIT" replay --dry-run
expect 1 "^moejit: moejit replay: give one trace file" "$MOEJIT" replay "$t" "$t" --dry-run
expect 1 "^moejit: moejit replay: unknown option '--bogus' (see moejit replay --help)\$" "$MOEJIT" replay "$t" --bogus
expect 1 "^moejit: moejit replay: --synthetic knows only glm5, not 'llama'\$" "$MOEJIT" replay "$t" --synthetic llama
expect 1 "^moejit: moejit replay: --arch sm_99: unknown target (use sm_80, sm_86, sm_87, sm_89, sm_90, sm_90a, sm_100, sm_100a, sm_120 or sm_120a)\$" \
  "$MOEJIT" replay "$t" --dry-run --arch sm_99
expect 1 "^moejit: moejit replay: --dry-run runs nothing; it cannot be combined with --verify\$" \
  "$MOEJIT" replay "$t" --dry-run --verify
expect 1 "^moejit: moejit replay: -m and --synthetic exclude each other\$" "$MOEJIT" replay "$t" -m "$dir" --synthetic glm5
expect 1 "^moejit: moejit replay: --copies is 1..8\$" "$MOEJIT" replay "$t" --copies 0
expect 1 "^moejit: moejit replay: --reps expects an integer, not 'x'\$" "$MOEJIT" replay "$t" --reps x
expect 0 "^usage: moejit replay FILE.jsonl" "$MOEJIT" replay --help
# A trace of other widths is refused, naming both.
"$here/test_replay" --write-trace "$dir/w.jsonl" 4096 || fail "writing the 4096-wide trace"
expect 1 "w.jsonl: the trace's MoE widths (hidden 4096, inter 2048, 256 experts, top-8, groups 1/1) differ from the synthetic GLM-5 model's (hidden 6144," \
  "$MOEJIT" replay "$dir/w.jsonl" --dry-run
# A missing file: the reader's one line (exit 2, as any unreadable file).
out=$("$MOEJIT" replay "$dir/none.jsonl" --dry-run 2>&1)
st=$?
[ "$st" != 0 ] || fail "a missing trace exited 0"
[ "$(printf '%s\n' "$out" | wc -l)" = 1 ] || fail "a missing trace printed more than one line: $out"
printf '%s\n' "$out" | grep -q "none.jsonl" || fail "the missing file is not named: $out"

# Without a GPU, a real replay is exit 3 (a dry run is the only mode without one).
if "$MOEJIT" version | grep -q "^driver    none"; then
  expect 3 "GPU\|CUDA\|driver" "$MOEJIT" replay "$t"
  expect 3 "GPU\|CUDA\|driver" "$MOEJIT" replay "$t" --steps
fi

[ "$fails" = 0 ] || { echo "$fails failures"; exit 1; }
echo "replay: all checks passed"
