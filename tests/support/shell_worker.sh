#!/bin/sh
# A worker for tests that need one in plain shell, run by ctrun with
# --no_python (or by /bin/sh).
#
#   shell_worker.sh env DIR [CMD...] writes its environment to DIR/env.RANK,
#                                    then runs CMD
#   shell_worker.sh fail DIR R CODE  rank R exits CODE; the others wait to be
#                                    stopped
#   shell_worker.sh signal DIR SIG   writes DIR/ready.RANK, then counts the
#                                    SIGs (USR1, TERM) it receives into
#                                    DIR/SIG.RANK; exits 0 one second after
#                                    the first
#   shell_worker.sh wait DIR         writes DIR/ready.RANK, then waits for
#                                    DIR/go (at most 120 s) and exits 0
#   shell_worker.sh flaky DIR R CODE in the first attempt rank R exits CODE
#                                    and the others wait to be stopped; in
#                                    the next ones every rank waits as above
set -u
mode=$1 dir=$2

wait_for_go() {
  touch "$dir/ready.$RANK"
  i=0
  while [ ! -e "$dir/go" ] && [ $i -lt 1200 ]; do
    sleep 0.1
    i=$((i + 1))
  done
  [ -e "$dir/go" ]
}

case $mode in
  wait)
    wait_for_go
    ;;
  flaky)
    if [ "$TORCHELASTIC_RESTART_COUNT" = 0 ]; then
      [ "$RANK" = "$3" ] && exit "$4"
      exec sleep 120
    fi
    wait_for_go
    ;;
  env)
    env > "$dir/env.$RANK"
    shift 2
    [ $# -eq 0 ] || exec "$@"
    ;;
  fail)
    [ "$RANK" = "$3" ] && exit "$4"
    exec sleep 120
    ;;
  signal)
    count=0
    trap 'count=$((count + 1)); echo $count > "$dir/$3.$RANK"' "$3"
    touch "$dir/ready.$RANK"
    while [ "$count" -eq 0 ]; do sleep 0.1; done
    # Room for a second delivery, which would be a bug.
    i=0
    while [ $i -lt 10 ]; do sleep 0.1; i=$((i + 1)); done
    ;;
  *)
    echo "shell_worker.sh: unknown mode $mode" >&2
    exit 2
    ;;
esac
