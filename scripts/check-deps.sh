#!/usr/bin/env bash
# Fails on an #include across a forbidden edge between the layers
# (../shared/DESIGN.md, "Components and folders"): dependencies point only
# downward. Each rule names the files of one layer and what they must never
# include; a line per offending include is printed.
#
#   scripts/check-deps.sh
set -euo pipefail
cd "$(dirname "$0")/.."

# The service's edges: the server, its state, its transport, replication.
service='rendezvous/(rendezvous_server|server_stream|durable_state|journal|state_files|record_log|etcd_[a-z_]*|metrics|event_log)\.h'
# What only a host of the rendezvous needs (the agent writes events, but
# serves nothing).
hosting='rendezvous/(rendezvous_server|server_stream|durable_state|journal|state_files|record_log|etcd_[a-z_]*|metrics)\.h'
client='rendezvous/(client|client_stream|status_report)\.h'
transport='grpcpp/|grpc/|grpc\+\+/|rendezvous/(grpc_status|grpc_log|munge|auth|user_file)\.h'
process_edge='launcher/(agent|worker_group|worker_process|worker_output|watchdog|console|evidence|proc|progress_board|nvml|run_directory)\.h'
hardware='hwloc|nvml\.h'

# layer name :: files (extended regex, from the root) :: forbidden includes
rules=(
  "rendezvous core (pure) :: ^rendezvous/(rendezvous_core|kv_store|job_settings|straggler_watch|store_request|repeated_warning|leader_lease)\.(h|cc)$ :: $service|$client|$transport|spdlog|launcher/"
  "agent policy (pure) :: ^launcher/(agent_policy|progress_monitor|file_timers|failure_report|gpu_watch)\.(h|cc)$ :: $service|$client|$transport|$process_edge|$hardware|spdlog"
  "launcher options :: ^launcher/(command_line|launch_options|slurm|host_facts|rendezvous_plan|worker_command|worker_env)\.(h|cc)$ :: $service|$client|$process_edge|grpcpp/"
  "agent (hosts nothing) :: ^launcher/[a-z_]+\.(h|cc)$ :: $hosting"
  "worker library :: ^worker_lib/ :: $service|launcher/"
)

failed=0
files=$(git ls-files 'rendezvous/*.h' 'rendezvous/*.cc' 'launcher/*.h' \
  'launcher/*.cc' 'worker_lib/*.h' 'worker_lib/*.cc' 'worker_lib/**/*.h')
for rule in "${rules[@]}"; do
  layer=${rule%% :: *}
  rest=${rule#* :: }
  scope=${rest%% :: *}
  forbidden=${rest#* :: }
  for f in $files; do
    [[ "$f" =~ $scope ]] || continue
    # The composition root of the launcher hosts the rendezvous.
    [[ "$layer" == "agent (hosts nothing)" && "$f" == launcher/ctrun_main.cc ]] && continue
    while IFS= read -r line; do
      [[ -z "$line" ]] && continue
      echo "check-deps: $f ($layer) includes ${line#*:}" >&2
      failed=1
    done < <(grep -nE "^#include [<\"]($forbidden)" "$f" || true)
  done
done
if [[ $failed -ne 0 ]]; then
  echo "check-deps: includes across forbidden edges (see ../shared/DESIGN.md)" >&2
  exit 1
fi
echo "check-deps: every include points down its layers"
