#!/bin/sh
# cache_cli.sh: `moejit cache stats|list|verify|prune|clear` on a scratch
# folder filled by `test_cache --populate`: the counts it prints, a bad entry
# found by verify (exit 7, the file named), prune to a cap, clear, and the
# exact text of usage errors.  Then `moejit compile -o X.cubin` through the
# front door: compiled once, then from the cache, assert-warm both ways.
set -u
: "${MOEJIT:=./moejit}"
MOEJIT_CACHE=on # make check turns the cache off for every other test
export MOEJIT_CACHE
here=$(dirname "$MOEJIT")/tests  # the build folder's test programs
dir=$(mktemp -d "${TMPDIR:-/tmp}/moejit-cache-cli.XXXXXX")
trap 'rm -rf "$dir"' EXIT
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
# expect STATUS PATTERN CMD...: runs CMD, checks its exit status and that
# its output (stdout + stderr) has a line matching PATTERN.
expect() {
  want=$1 pat=$2
  shift 2
  out=$("$@" 2>&1)
  st=$?
  [ "$st" = "$want" ] || fail "$* exited $st, want $want: $out"
  printf '%s\n' "$out" | grep -q -- "$pat" || fail "$*: no line matching '$pat' in: $out"
}

"$here/test_cache" --populate "$dir" 5 || fail "populate"
expect 0 "^entries *5$" "$MOEJIT" cache stats --dir "$dir"
expect 0 "^stores *5$" "$MOEJIT" cache stats --dir "$dir"
expect 0 "^misses *0$" "$MOEJIT" cache stats --dir "$dir"
expect 0 "kernel_4$" "$MOEJIT" cache list --dir "$dir"
n=$("$MOEJIT" cache list --dir "$dir" | grep -c kernel_)
[ "$n" = 5 ] || fail "list shows $n entries, want 5"
# most recently used first: kernel_4 was stored last
first=$("$MOEJIT" cache list --dir "$dir" | sed -n 2p)
case "$first" in *kernel_4) ;; *) fail "list starts with '$first', want kernel_4" ;; esac
expect 0 "^5 entries checked, 0 bad$" "$MOEJIT" cache verify --dir "$dir"
MOEJIT_CACHE_DIR=$dir expect 0 "^5 entries checked, 0 bad$" "$MOEJIT" cache verify

# flip one byte in the middle of one entry
victim=$(find "$dir/v1" -type f | head -1)
size=$(wc -c < "$victim")
printf 'Z' | dd of="$victim" bs=1 seek=$((size / 2)) conv=notrunc 2>/dev/null
expect 7 "^$victim: checksum mismatch$" "$MOEJIT" cache verify --dir "$dir"
expect 7 "5 entries checked, 1 bad" "$MOEJIT" cache verify --dir "$dir"
expect 0 "(bad entry)" "$MOEJIT" cache list --dir "$dir"

expect 0 "^removed 3 entries" "$MOEJIT" cache prune --dir "$dir" --max 6K
total=$(find "$dir/v1" -type f -exec cat {} + | wc -c)
[ "$total" -le 6144 ] || fail "after prune --max 6K: $total bytes"
expect 0 "^evictions *3$" "$MOEJIT" cache stats --dir "$dir"
expect 0 "^removed 2 entries from $dir$" "$MOEJIT" cache clear --dir "$dir"
expect 0 "^entries *0$" "$MOEJIT" cache stats --dir "$dir"
expect 0 "^removed 0 entries" "$MOEJIT" cache clear --dir "$dir/none"

expect 1 "^moejit: moejit cache: unknown action 'frob'" "$MOEJIT" cache frob
expect 1 "^moejit: moejit cache: name an action" "$MOEJIT" cache
expect 1 "^moejit: moejit cache prune: --max expects a size such as 512M or 2G, not '12Q'$" \
  "$MOEJIT" cache prune --dir "$dir" --max 12Q
expect 1 "^moejit: moejit cache list: --max belongs to prune$" "$MOEJIT" cache list --max 1G
MOEJIT_CACHE_MAX=huge expect 1 "^moejit: MOEJIT_CACHE_MAX=huge: expected a size" "$MOEJIT" cache stats
expect 2 "^moejit: /etc/hostname: not a folder$" "$MOEJIT" cache stats --dir /etc/hostname

# moejit compile -o X.cubin goes through the front door: the second time
# the cubin comes from the cache, byte for byte the same.  The kernel is the
# DSL test fixture, named by path (it is not built in).
c=$dir/compile
g=${srcdir:-.}/tests/kernels/gemv_bf16.k
MOEJIT_CACHE_DIR=$c expect 0 "compiled in .* (stored in the cache)" \
  "$MOEJIT" compile "$g" -D N=256 -D K=256 -o "$dir/a.cubin"
MOEJIT_CACHE_DIR=$c expect 0 "from the cubin cache in" \
  "$MOEJIT" compile "$g" -D K=256 -D N=256 -o "$dir/b.cubin"
cmp -s "$dir/a.cubin" "$dir/b.cubin" || fail "the cached cubin differs from the compiled one"
expect 0 " gemv_bf16$" "$MOEJIT" cache list --dir "$c"
MOEJIT_CACHE_DIR=$c MOEJIT_CACHE=assert-warm expect 0 "from the cubin cache" \
  "$MOEJIT" compile "$g" -D N=256 -D K=256 -o "$dir/b.cubin"
MOEJIT_CACHE_DIR=$c MOEJIT_CACHE=assert-warm expect 7 "^moejit: MOEJIT_CACHE=assert-warm: cache miss" \
  "$MOEJIT" compile "$g" -D N=512 -D K=256 -o "$dir/c.cubin"
MOEJIT_CACHE_DIR=$c expect 0 "compiled in" \
  "$MOEJIT" compile "$g" -D N=256 -D K=256 -O 1 -o "$dir/d.cubin"
MOEJIT_CACHE_DIR=$c expect 1 "^moejit: $g:[0-9]*:[0-9]*: error: static_assert failed" \
  "$MOEJIT" compile "$g" -D N=255 -D K=256 -o "$dir/e.cubin"
expect 0 "^entries *2$" "$MOEJIT" cache stats --dir "$c"
expect 0 "^failures *1$" "$MOEJIT" cache stats --dir "$c"

# Tuning records (moejit warmup --tune) beside the entries: list shows a
# line per record (family, shape, winner and its time, the built-in and its
# time, GPU, date) and names and counts the bad ones; verify holds them to
# their check line, fields and slot; clear keeps them, clear --tuning
# removes them and nothing else.
t=$dir/tuned
"$here/test_tune" --populate "$t" || fail "populate tuning records"
"$here/test_cache" --populate "$t" 2 || fail "populate entries"
expect 0 "^moe_expert  gate_up hidden=2048 inter=1024 experts=64 topk=8 bucket=8 mt=2 timed=layer  winner 16:256:8:0:0:0:4 250.5 us  built-in 4:256:8:0:0:2:0:1 264.2 us (-5.2%)  Test GPU 141GB sm_90a driver 13.0  2025-12-03 19:26 UTC$" \
  "$MOEJIT" cache list --dir "$t"
expect 0 "^gemv_mma  N=2784 K=6144 B=8  winner 256:1:4:8:2 12.5 us  built-in 256:1:8:8:1 14.0 us (-10.7%)  Test GPU 141GB sm_90a driver 13.0  2025-12-03 19:26 UTC$" \
  "$MOEJIT" cache list --dir "$t"
expect 0 "^1 bad tuning record (never used" "$MOEJIT" cache list --dir "$t"
expect 0 "^$t/tune/[0-9a-f]\{32\}: no check line at the end$" "$MOEJIT" cache list --dir "$t"
# verify reads the records too: the bad one named with its reason, exit 7.
expect 7 "^$t/tune/[0-9a-f]\{32\}: no check line at the end$" "$MOEJIT" cache verify --dir "$t"
expect 7 "^3 tuning records checked, 1 bad$" "$MOEJIT" cache verify --dir "$t"
expect 7 "^2 entries checked, 0 bad$" "$MOEJIT" cache verify --dir "$t"
expect 7 "^moejit: $t: 1 bad tuning record (never used" "$MOEJIT" cache verify --dir "$t"
expect 0 "^removed 2 entries from $t$" "$MOEJIT" cache clear --dir "$t"
expect 0 "winner 16:256:8:0:0:0:4" "$MOEJIT" cache list --dir "$t"
expect 0 "^removed 3 tuning records from $t$" "$MOEJIT" cache clear --tuning --dir "$t"
n=$("$MOEJIT" cache list --dir "$t" | grep -c "winner\|bad tuning")
[ "$n" = 0 ] || fail "cache clear --tuning left $n tuning lines"
expect 0 "^0 tuning records checked, 0 bad$" "$MOEJIT" cache verify --dir "$t"
expect 1 "^moejit: moejit cache list: --tuning belongs to clear$" "$MOEJIT" cache list --tuning

[ "$fails" = 0 ] && echo "cache_cli: all passed"
exit $((fails != 0))
