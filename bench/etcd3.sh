#!/usr/bin/env bash
# A 3-member etcd on 127.0.0.1 for the benchmarks, with the v2 API enabled
# for torchrun's etcd-v2 rendezvous.
#
#   bench/etcd3.sh start DIR   starts it (data and logs in DIR), prints the
#                              v3 client endpoints, HOST:PORT,...
#   bench/etcd3.sh stop DIR    ends every member by its pid
set -euo pipefail
cmd=${1:?usage: bench/etcd3.sh start|stop DIR}
dir=${2:?usage: bench/etcd3.sh start|stop DIR}
case "$cmd" in
  stop)
    [ -f "$dir/pids" ] && xargs -r kill -9 <"$dir/pids" 2>/dev/null || true
    rm -f "$dir/pids"
    exit 0 ;;
  start) ;;
  *) echo "usage: bench/etcd3.sh start|stop DIR" >&2; exit 2 ;;
esac
mkdir -p "$dir"
free_port() {
  /usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}
clients=() peers=() initial=""
for i in 0 1 2; do
  clients+=("$(free_port)") peers+=("$(free_port)")
  initial+="${initial:+,}m$i=http://127.0.0.1:${peers[$i]}"
done
: >"$dir/pids"
for i in 0 1 2; do
  c=http://127.0.0.1:${clients[$i]} p=http://127.0.0.1:${peers[$i]}
  etcd --name "m$i" --data-dir "$dir/m$i" --enable-v2=true \
    --listen-client-urls "$c" --advertise-client-urls "$c" \
    --listen-peer-urls "$p" --initial-advertise-peer-urls "$p" \
    --initial-cluster "$initial" --initial-cluster-state new \
    --initial-cluster-token "bench-$$" --logger zap --log-level warn \
    >"$dir/m$i.log" 2>&1 &
  echo $! >>"$dir/pids"
done
endpoints=""
for i in 0 1 2; do endpoints+="${endpoints:+,}127.0.0.1:${clients[$i]}"; done
for _ in $(seq 100); do
  # etcd's /health answers {"health":"true"} once the member has a leader
  # (etcdctl, in another package, is not needed for that).
  if /usr/bin/python3 - "${clients[@]}" <<'EOF' 2>/dev/null; then
import json, sys, urllib.request
for port in sys.argv[1:]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1) as r:
        assert json.load(r)["health"] == "true"
EOF
    echo "$endpoints"
    exit 0
  fi
  sleep 0.1
done
echo "bench/etcd3.sh: etcd did not come up (logs in $dir)" >&2
exit 1
