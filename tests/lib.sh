# lib.sh: what the shell tests share, sourced first (". "$srcdir/tests/lib.sh"):
# a scratch folder $tmp removed on exit, the failure flag $fail, report lines
# ok/bad, and expect STATUS "STDERR" CMD..., which runs CMD and checks its
# exit status and its exact standard error (the one-line error contract).
set -u
fail=0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
ok() { echo "ok   $1"; }
bad() { echo "FAIL $1"; fail=1; }
# expect STATUS "STDERR" CMD...: run CMD, check its status and its stderr.
expect() {
  want_status=$1 want_err=$2
  shift 2
  "$@" > "$tmp/out" 2> "$tmp/err"
  status=$?
  got_err=$(cat "$tmp/err")
  if [ "$status" -ne "$want_status" ] || [ "$got_err" != "$want_err" ]; then
    echo "FAIL: $*"
    echo "  status $status (want $want_status)"
    echo "  stderr: $got_err"
    echo "  want:   $want_err"
    fail=1
  else
    echo "ok   $*"
  fi
}
