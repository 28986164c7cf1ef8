# lib.sh: what the shell tests share, sourced first (". "$srcdir/tests/lib.sh"):
# a scratch folder $tmp removed on exit, the failure flag $fail, report lines
# ok/bad, expect STATUS "STDERR" CMD..., which runs CMD and checks its exit
# status and its exact standard error (the one-line error contract), and
# serve_bg, a server started in the background and its port.
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
# serve_bg NAME CMD...: CMD, a `moejit serve --port 0` on 127.0.0.1, in the
# background, its stderr in $tmp/NAME.err; sets pid (also added to $pids, for
# the test's clean-up) and port, once the server says where it listens (60 s
# at most), or stops the test.
serve_bg() {
  name=$1
  shift
  : > "$tmp/$name.err"
  "$@" 2> "$tmp/$name.err" &
  pid=$!
  pids="${pids:-} $pid"
  port=
  for _ in $(seq 600); do
    port=$(sed -n 's/^moejit: listening on http:\/\/127\.0\.0\.1:\([0-9][0-9]*\) .*/\1/p' "$tmp/$name.err")
    [ -n "$port" ] && return 0
    kill -0 $pid 2> /dev/null || break
    sleep 0.1
  done
  echo "FAIL: $name did not start: $(cat "$tmp/$name.err")"
  exit 1
}
