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
set -u
mode=$1 dir=$2
case $mode in
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
