# Sourced by the shell tests of installed ctrun (consumer_test.sh,
# wheel_test.sh). Sets `work` (a scratch folder, removed at exit, with a
# daemon started by start_ctrund ended by its pid) and defines:
#   fail MESSAGE...            prints "NAME: MESSAGE" and exits 1
#   start_ctrund COMMAND...    runs a ctrund command line in the background
#                              and sets `endpoint` once it listens
#   stop_ctrund                ends it
work=$(mktemp -d)
daemon_pid=""
stop_ctrund() {
  if [ -n "$daemon_pid" ]; then
    kill "$daemon_pid" 2>/dev/null || true
    wait "$daemon_pid" 2>/dev/null || true
    daemon_pid=""
  fi
}
cleanup() {
  stop_ctrund
  rm -rf "$work"
}
trap cleanup EXIT
fail() {
  echo "$(basename "$0" .sh): $*" >&2
  exit 1
}
start_ctrund() {
  "$@" >"$work/ctrund.out" 2>"$work/ctrund.err" &
  daemon_pid=$!
  for _ in $(seq 100); do
    grep -q 'listening on' "$work/ctrund.out" && break
    kill -0 "$daemon_pid" 2>/dev/null || fail "ctrund exited: $(cat "$work/ctrund.err")"
    sleep 0.1
  done
  endpoint=$(sed -n 's/^ctrund listening on //p' "$work/ctrund.out")
  [ -n "$endpoint" ] || fail "ctrund did not start: $(cat "$work/ctrund.err")"
}
