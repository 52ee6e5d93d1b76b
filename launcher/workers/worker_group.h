// WorkerGroup: the process edge of one node's agent. It spawns the workers
// of an attempt with torchrun's environment, signals their process groups,
// reaps them, carries their output to the console and the log files, and
// ends whatever they leave behind.
//
// Containment: every worker is in its own process group (but local rank 0
// when stdin is ctrun's terminal: it stays in ctrun's group, so that it can
// read the terminal) and dies with the agent (parent-death signal); the agent
// is a child subreaper, so orphaned descendants come to it and are ended when
// their attempt is collected; the watchdog (watchdog.h) ends every worker group
// and every process that carries this agent's containment mark when the agent
// dies, however it dies.
//
// Used by the agent's loop only; not thread-safe. Output pipes are added to
// the loop's epoll set with the pipe's fd as the event's tag.
#ifndef CTRUN_LAUNCHER_WORKERS_WORKER_GROUP_H_
#define CTRUN_LAUNCHER_WORKERS_WORKER_GROUP_H_

#include <sys/types.h>

#include <deque>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "launcher/options/command_line.h"
#include "launcher/options/launch_options.h"
#include "launcher/options/worker_env.h"
#include "launcher/policy/agent_policy.h"
#include "launcher/policy/numa_binding.h"
#include "launcher/workers/console.h"
#include "launcher/workers/watchdog.h"
#include "launcher/workers/worker_output.h"
#include "launcher/workers/worker_process.h"

namespace ctrun {

struct WorkerGroupConfig {
  LaunchOptions options;
  std::vector<std::string> worker_argv;
  EnvMap env;  // the agent's own environment, inherited by the workers
  std::string hostname;
  std::string name;     // RendezvousPlan::name; empty: the hostname
  std::string address;  // this node's, for the workers
  StoreAccess store;
  std::string run_dir;  // attempt_N/LOCAL_RANK/ go below
  // Where workers report progress; unused when `progress.board` is empty.
  ProgressPaths progress;
  // Each worker's --numa_binding, by local rank; empty: not bound.
  std::vector<Binding> bindings;
  Watchdog* watchdog = nullptr;  // optional; not owned
  Spawner* spawner = nullptr;    // not owned; an ExecSpawner when null
  Console* out = nullptr;        // not owned
  Console* err = nullptr;        // not owned

  // How this node is named: in line prefixes (${host}), events, messages.
  const std::string& NodeName() const { return name.empty() ? hostname : name; }
};

class WorkerGroup {
 public:
  // A pipe read gives at most this many bytes per wakeup of the loop, so
  // that a worker that prints without pause cannot starve the rest.
  static constexpr size_t kReadBudget = 64 << 10;

  WorkerGroup(WorkerGroupConfig config, int epoll_fd);
  ~WorkerGroup();
  WorkerGroup(const WorkerGroup&) = delete;
  WorkerGroup& operator=(const WorkerGroup&) = delete;

  // Starts one worker per local rank for `assignment` (the previous
  // attempt's must have been collected), in order, stopping at the first
  // that cannot be started.
  std::vector<WorkerStart> Start(const v1::Assignment& assignment);
  // In-process recovery: starts workers for `local_ranks` only, in
  // `assignment`'s round, beside the workers that still run.
  std::vector<WorkerStart> StartSome(const v1::Assignment& assignment,
                                     const std::vector<int>& local_ranks);
  // A spare node (--spares) whose program parks in wait_for_slot: starts
  // one worker per local rank without a rank (CTRUN_SPARE=1, no RANK,
  // WORLD_SIZE, MASTER_*), its output under the run's spare/ folder; they
  // take a slot's world when HandOver gives it.
  std::vector<WorkerStart> StartParked();
  // In-process recovery, through each worker's world file
  // (worker_env.h): tells every live worker that `round` ends; hands the
  // workers at `local_ranks` `assignment`'s world (their output lines carry
  // their new ranks from then on).
  void EndRound(int64_t round);
  void HandOver(const v1::Assignment& assignment,
                const std::vector<int>& local_ranks);
  // Sends `signal` to the live worker at `local_rank` (its process group).
  void SignalOne(int local_rank, int signal);
  // Sends `signal` to every live worker's process group (to the worker
  // alone in ctrun's group).
  void Signal(int signal);
  // Reaps every child that exited; returns the workers among them, each
  // with what was in its pipes read (LastLines). What a worker left
  // running in its group is SIGKILLed.
  std::vector<WorkerExit> Reap();
  // The pids of the agent's other children reaped since the last call
  // (not workers: gdb reading a hung worker, say).
  std::vector<pid_t> TakeOtherExits() {
    return std::exchange(other_exits_, {});
  }
  // The worker at `local_rank`'s pid (-1 when it is not alive), and its
  // last lines of output, stdout and stderr together, oldest first.
  pid_t PidOf(int local_rank) const;
  // The attempt's global rank of `local_rank`.
  int RankOf(int local_rank) const { return first_global_rank_ + local_rank; }
  // Where the worker at `local_rank` appends its Python stacks.
  std::string StacksFile(int local_rank) const;
  std::vector<std::string> LastLines(int local_rank) const;
  // Lines kept for LastLines, and the longest kept whole.
  static constexpr size_t kTailLines = 20;
  static constexpr size_t kTailLineBytes = 512;

  // Whether, since the last call, the worker in ctrun's process group
  // stopped reading or writing the terminal (SIGTTIN/SIGTTOU) while ctrun
  // was in the background: the job is to stop until it is continued.
  bool TakeTerminalStop() { return std::exchange(terminal_stop_, false); }
  // Stops waiting for the live workers (they ignored SIGKILL).
  void Abandon();
  // Every worker is gone: reads what their pipes still hold, closes them,
  // and ends the descendants they left behind.
  void Collect();
  // Ends the orphaned descendants that came to this process (a subreaper);
  // false when some were still coming after a few passes.
  bool EndStrays();

  // For the loop's epoll events on a pipe.
  bool Owns(int fd) const { return pipes_.contains(fd); }
  void OnReadable(int fd, absl::Time now);
  void OnHangup(int fd);

  // When a worker's line without its newline is next due to be shown in
  // part (WorkerOutput::kPartialAfter), and showing what is due at `now`.
  absl::Time PartialDue() const;
  void ShowPartials(absl::Time now);

 private:
  struct Worker {
    int local_rank = 0;
    pid_t pid = -1;
    bool own_group = true;  // else in ctrun's process group
    bool alive = false;
    std::unique_ptr<WorkerOutput> out;
    std::unique_ptr<WorkerOutput> err;
    // The last lines it wrote (the newest may be unfinished).
    std::deque<std::string> tail;
  };
  static void AddToTail(Worker& w, absl::string_view bytes);

  // Starts the worker at `lr` of `a`, in the attempt folder set; `parked`:
  // without a rank (StartParked).
  WorkerStart Spawn(const v1::Assignment& a, int lr, bool parked = false);
  std::string WorldFile(int local_rank) const;
  void WriteWorldFile(int local_rank, const std::string& text);

  struct StreamPlan;
  // Where local rank `local_rank`'s stream (1 stdout, 2 stderr) goes.
  StreamPlan PlanStream(int local_rank, int stream) const;
  void AddPipe(int fd, size_t worker, int stream);
  // Reads up to `budget` bytes of `fd` (all there is when 0).
  void Read(int fd, size_t budget, absl::Time now);
  // Reads all there is now in the pipes of workers_[worker].
  void DrainPipes(size_t worker);
  void ClosePipe(int fd);
  // The line prefix (--log_line_prefix_template) of a worker.
  std::string Prefix(int local_rank, const std::string& rank,
                     const std::string& group_rank) const;
  std::unique_ptr<WorkerOutput> MakeOutput(int local_rank,
                                           const std::string& prefix,
                                           int stream,
                                           const std::string& dir) const;

  // Constant after construction.
  const WorkerGroupConfig config_;
  ExecSpawner exec_spawner_;
  Spawner* const spawner_;
  // This attempt's filtered_std{out,err}.log, when filters are given.
  DuplicateFilter duplicates_[2];
  const int epoll_fd_;

  std::vector<Worker> workers_;
  // Pipe fd -> (worker index, stream): 1 stdout, 2 stderr.
  std::map<int, std::pair<size_t, int>> pipes_;
  bool terminal_stop_ = false;
  std::vector<pid_t> other_exits_;
  std::string attempt_dir_;
  int first_global_rank_ = 0;
};

}  // namespace ctrun

#endif  // CTRUN_LAUNCHER_WORKERS_WORKER_GROUP_H_
