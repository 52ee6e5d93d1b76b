// The names of every environment variable ctrun reads or sets.
//
// The worker environment is torchrun's (same names, same meanings), plus a
// few CTRUN_* variables through which the launcher hands worker_lib the
// job's store. This header is the one place those names are spelled.
#ifndef CTRUN_ENVIRONMENT_H_
#define CTRUN_ENVIRONMENT_H_

namespace ctrun::env {

// Set for every worker, as torchrun sets them.
inline constexpr char kRank[] = "RANK";
inline constexpr char kLocalRank[] = "LOCAL_RANK";
inline constexpr char kGroupRank[] = "GROUP_RANK";
inline constexpr char kRoleRank[] = "ROLE_RANK";
inline constexpr char kRoleName[] = "ROLE_NAME";
inline constexpr char kLocalWorldSize[] = "LOCAL_WORLD_SIZE";
inline constexpr char kWorldSize[] = "WORLD_SIZE";
inline constexpr char kGroupWorldSize[] = "GROUP_WORLD_SIZE";
inline constexpr char kRoleWorldSize[] = "ROLE_WORLD_SIZE";
inline constexpr char kMasterAddr[] = "MASTER_ADDR";
inline constexpr char kMasterPort[] = "MASTER_PORT";
inline constexpr char kRestartCount[] = "TORCHELASTIC_RESTART_COUNT";
inline constexpr char kMaxRestarts[] = "TORCHELASTIC_MAX_RESTARTS";
inline constexpr char kRunId[] = "TORCHELASTIC_RUN_ID";
inline constexpr char kUseAgentStore[] = "TORCHELASTIC_USE_AGENT_STORE";
inline constexpr char kErrorFile[] = "TORCHELASTIC_ERROR_FILE";
// Set to 1 unless already set: torch >= 2.2 reads the first, 1.13 the second.
inline constexpr char kTorchNcclAsyncErrorHandling[] =
    "TORCH_NCCL_ASYNC_ERROR_HANDLING";
inline constexpr char kNcclAsyncErrorHandling[] = "NCCL_ASYNC_ERROR_HANDLING";
// Set to 1 when several workers share the node and it is unset.
inline constexpr char kOmpNumThreads[] = "OMP_NUM_THREADS";

// ctrun's own, for worker_lib.
inline constexpr char kStoreEndpoint[] = "CTRUN_STORE_ENDPOINT";
inline constexpr char kStoreJob[] = "CTRUN_STORE_JOB";
inline constexpr char kStoreRound[] = "CTRUN_STORE_ROUND";
inline constexpr char kStoreToken[] = "CTRUN_STORE_TOKEN";
// "munge" when the store takes munge credentials (Slurm) instead of a token;
// CTRUN_MUNGE_SOCKET then names munged's socket unless it is the default.
inline constexpr char kStoreAuth[] = "CTRUN_STORE_AUTH";
inline constexpr char kMungeSocket[] = "CTRUN_MUNGE_SOCKET";
// PEM roots that verify the store's TLS certificate, when it serves TLS.
inline constexpr char kStoreTlsCa[] = "CTRUN_STORE_TLS_CA";
// The address this node is reached by (its agent's advertised address):
// where a worker listens for its peers, e.g. Gloo's TCP transport.
inline constexpr char kNodeAddress[] = "CTRUN_NODE_ADDRESS";
// Marks every process an agent started, and their descendants that keep
// the environment: the watchdog ends those left when the agent dies.
inline constexpr char kContainmentMark[] = "CTRUN_AGENT_MARK";

// Progress signals (ctrun/progress_board.h): the node's board and this
// worker's slot in it; and the file its Python stacks are appended to when
// the agent asks for them (faulthandler, registered by the `ctrun` module).
inline constexpr char kProgressFile[] = "CTRUN_PROGRESS_FILE";
inline constexpr char kProgressSlot[] = "CTRUN_PROGRESS_SLOT";
inline constexpr char kStacksFile[] = "CTRUN_STACKS_FILE";
// Set by the Python module in the worker that attached to the slot, so that
// its Python children (multiprocessing's spawn, a subprocess) leave the
// slot alone: their exit is not the worker's.
inline constexpr char kProgressOwner[] = "CTRUN_PROGRESS_PID";
// In-process recovery (--recovery=inprocess): "inprocess" in the first; the
// second names the file where the agent hands the worker each new world
// (launcher/options/worker_env.h has its format).
inline constexpr char kRecovery[] = "CTRUN_RECOVERY";
inline constexpr char kWorldFile[] = "CTRUN_WORLD_FILE";
// "1" in a spare node's worker started before its node has a slot: it has
// no rank yet, and takes one in WaitForSlot / ctrun.wait_for_slot().
inline constexpr char kSpare[] = "CTRUN_SPARE";
// ctrun's Python module is appended here (never replacing the user's).
inline constexpr char kPythonPath[] = "PYTHONPATH";
// torchrun's file timers: the agent serves the FIFO when the first is 1, and
// names it to the workers in the second.
inline constexpr char kEnableFileTimer[] = "TORCHELASTIC_ENABLE_FILE_TIMER";
inline constexpr char kTimerFile[] = "TORCHELASTIC_TIMER_FILE";
// PyTorch's NCCL flight recorder (>= 2.2), pointed at the run directory when
// hangs are watched, unless the user set them.
inline constexpr char kNcclTraceBufferSize[] = "TORCH_NCCL_TRACE_BUFFER_SIZE";
inline constexpr char kNcclDumpOnTimeout[] = "TORCH_NCCL_DUMP_ON_TIMEOUT";
inline constexpr char kNcclDebugInfoTempFile[] =
    "TORCH_NCCL_DEBUG_INFO_TEMP_FILE";

// Read by the launcher.
// The rendezvous token when no --rdzv_conf token_file is given (e.g. set once
// in an sbatch script, so that every srun task shares it).
inline constexpr char kRendezvousToken[] = "CTRUN_RDZV_TOKEN";
inline constexpr char kPetPrefix[] = "PET_";  // PET_<FLAG>: flag overrides
inline constexpr char kPythonExec[] = "PYTHON_EXEC";
inline constexpr char kLogLinePrefixTemplate[] =
    "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE";
// Read for --shutdown_timeout when neither it nor its PET_ variable is set.
inline constexpr char kTorchShutdownTimeout[] =
    "TORCH_ELASTIC_SHUTDOWN_TIMEOUT";
inline constexpr char kCudaVisibleDevices[] = "CUDA_VISIBLE_DEVICES";

}  // namespace ctrun::env

#endif  // CTRUN_ENVIRONMENT_H_
