#!/usr/bin/env bash
# Fails on an #include across a forbidden edge between the layers
# (../shared/DESIGN.md, "Components and folders"; rendezvous/README.md and
# launcher/README.md): dependencies point only downward. Each rule names a
# layer's folder and what its files must never include; a line per
# offending include is printed.
#
#   scripts/check-deps.sh
set -euo pipefail
cd "$(dirname "$0")/.."

grpc='grpcpp/|grpc/|grpc\+\+/'
# layer :: files (extended regex, from the root) :: forbidden includes
rules=(
  "rendezvous/core (pure) :: ^rendezvous/core/ :: rendezvous/(rpc|client|server|durable|etcd|ops)/|launcher/|$grpc|spdlog"
  "rendezvous/durable :: ^rendezvous/durable/ :: rendezvous/(rpc|client|server|etcd|ops)/|launcher/|$grpc"
  "rendezvous/rpc :: ^rendezvous/rpc/ :: rendezvous/(client|server|durable|etcd|ops)/|launcher/"
  "rendezvous/client :: ^rendezvous/client/ :: rendezvous/(server|durable|etcd|ops)/|launcher/"
  "rendezvous/ops :: ^rendezvous/ops/ :: rendezvous/(client|server|durable|etcd)/|launcher/"
  "rendezvous/server :: ^rendezvous/server/ :: rendezvous/(client|etcd)/|rendezvous/durable/(journal|state_files)\.h|rendezvous/ops/metrics\.h|launcher/"
  "rendezvous/etcd :: ^rendezvous/etcd/ :: rendezvous/client/|launcher/"
  "launcher/options :: ^launcher/options/ :: launcher/(policy|workers|hw)/|launcher/agent\.h|rendezvous/(client|server|durable|etcd|ops)/|$grpc"
  "launcher/policy (pure) :: ^launcher/policy/ :: launcher/(workers|hw)/|launcher/agent\.h|rendezvous/core/rendezvous_core|rendezvous/(rpc|client|server|durable|etcd|ops)/|$grpc|hwloc|nvml\.h|spdlog"
  "launcher/workers :: ^launcher/workers/ :: launcher/hw/|launcher/agent\.h|rendezvous/(server|durable|etcd|ops)/"
  "launcher/hw :: ^launcher/hw/ :: launcher/workers/|launcher/agent\.h|rendezvous/(client|server|durable|etcd|ops)/"
  "the agent (hosts nothing) :: ^launcher/agent\.(h|cc)$ :: rendezvous/(server|durable|etcd)/|rendezvous/ops/metrics\.h"
  "worker library :: ^worker_lib/ :: launcher/|rendezvous/(server|durable|etcd|ops)/"
)

failed=0
files=$(git ls-files 'rendezvous/**.h' 'rendezvous/**.cc' 'launcher/**.h' \
  'launcher/**.cc' 'worker_lib/**.h' 'worker_lib/**.cc')
for rule in "${rules[@]}"; do
  layer=${rule%% :: *}
  rest=${rule#* :: }
  scope=${rest%% :: *}
  forbidden=${rest#* :: }
  for f in $files; do
    [[ "$f" =~ $scope ]] || continue
    while IFS= read -r line; do
      [[ -z "$line" ]] && continue
      echo "check-deps: $f ($layer) includes ${line#*:}" >&2
      failed=1
    done < <(grep -nE "^#include [<\"]($forbidden)" "$f" || true)
  done
done
# Only the composition roots sit outside a layer folder.
for f in $(git ls-files 'rendezvous/*.h' 'rendezvous/*.cc' 'launcher/*.h' \
  'launcher/*.cc'); do
  case "$f" in
    rendezvous/*/* | launcher/*/*) ;;
    rendezvous/ctrund_main.cc | launcher/ctrun_main.cc | launcher/agent.h | launcher/agent.cc) ;;
    *)
      echo "check-deps: $f sits outside a layer folder" >&2
      failed=1
      ;;
  esac
done
if [[ $failed -ne 0 ]]; then
  echo "check-deps: includes across forbidden edges (see ../shared/DESIGN.md)" >&2
  exit 1
fi
echo "check-deps: every include points down its layers"
