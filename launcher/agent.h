// Agent: one node's side of a job. It joins the rendezvous, starts a worker
// per local rank with torchrun's environment, watches them, and follows the
// rendezvous through restarts to the job's end.
//
// One thread runs everything from one epoll loop: worker exits (SIGCHLD
// through a signalfd, so at once, without polling), signals to forward,
// worker output, and messages from the rendezvous session (handed over by
// gRPC's threads through an eventfd).
#ifndef CTRUN_LAUNCHER_AGENT_H_
#define CTRUN_LAUNCHER_AGENT_H_

#include <signal.h>
#include <sys/types.h>

#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "launcher/command_line.h"
#include "launcher/failure_report.h"
#include "launcher/launch_options.h"
#include "launcher/watchdog.h"
#include "launcher/worker_env.h"
#include "launcher/worker_output.h"
#include "rendezvous/client.h"

namespace ctrun {

struct AgentConfig {
  LaunchOptions options;
  std::vector<std::string> worker_argv;
  EnvMap env;  // the agent's own environment, inherited by the workers
  std::string hostname;
  std::string address;    // advertised to the rendezvous: MASTER_ADDR on rank 0
  Connection connection;  // to the rendezvous
  StoreAccess store;      // handed to workers for worker_lib
  std::string run_dir;    // per-attempt logs and error files go below
  Watchdog* watchdog = nullptr;  // optional; not owned
};

// The signals the agent takes through its signalfd: SIGCHLD, SIGUSR1,
// SIGUSR2 and `handled`. They must be blocked in every thread, so block
// them before any thread starts.
sigset_t AgentSignals(const std::vector<int>& handled);

class Agent {
 public:
  explicit Agent(AgentConfig config);
  ~Agent();
  Agent(const Agent&) = delete;
  Agent& operator=(const Agent&) = delete;

  // Runs the job to its end and returns ctrun's exit code: 0 when every
  // worker succeeded; the root-cause worker's code (128 + signal when
  // killed) when the job failed; 128 + signal when a handled signal stopped
  // it; 1 when the rendezvous was lost.
  int Run();

  // Whether Run ended because of a handled signal (SIGTERM, ...).
  bool stopped_by_signal() const { return exit_signal_ != 0; }

 private:
  struct Worker {
    int local_rank = 0;
    int rank = 0;
    pid_t pid = -1;
    bool alive = false;
    int exit_code = 0;
    int signal = 0;
    std::string error_file;
    std::unique_ptr<WorkerOutput> out;
    std::unique_ptr<WorkerOutput> err;
  };

  // Setup and the loop.
  absl::Status Setup();
  void Poll(absl::Time now);
  void OnTimers(absl::Time now);
  void Advance();

  // Rendezvous.
  // Joins, or with `resume_round` resumes this node in that round.
  void OpenSession(std::optional<int64_t> resume_round = std::nullopt);
  void DrainSession();
  // The session ended with `status`: resume, give up, or nothing to do.
  void OnSessionEnd(const absl::Status& status);
  void OnResumed(const v1::Resumed& resumed);
  void OnServerMessage(const v1::ServerMessage& message);
  void ReportProgress(const v1::Progress& progress);
  void Report(v1::WorkerReport::State state,
              const WorkerFailureRecord* failure = nullptr);
  void SendHeartbeat();

  // Workers.
  void StartWorkers(const v1::Assignment& assignment);
  // `sender`: the pid that sent it (signalfd's ssi_pid).
  void OnSignal(int signal, pid_t sender);
  void ReapChildren();
  void OnWorkerExit(Worker& worker, int status);
  // Sends `signal` to every live worker's group unless `send` is false (it
  // reached them already) or they are being stopped already, and arms the
  // SIGKILL deadline.
  void StopWorkers(int signal, bool send = true);
  bool AnyAlive() const;
  void ReadOutput(int fd);
  // Reads what the workers' pipes hold now, then closes them all.
  void DrainOutputs();
  void CloseOutput(int fd);
  void KillStrayChildren();

  void Say(const std::string& line) const;
  void Finish(int exit_code);

  // Constant after construction.
  const AgentConfig config_;

  int epoll_fd_ = -1;
  int signal_fd_ = -1;
  int wake_fd_ = -1;  // eventfd: the session has news

  std::unique_ptr<SessionStream> session_;
  absl::Mutex session_mu_;
  std::deque<v1::ServerMessage> inbox_ ABSL_GUARDED_BY(session_mu_);
  std::optional<absl::Status> session_end_ ABSL_GUARDED_BY(session_mu_);
  bool session_ended_ = false;  // seen by the loop
  uint64_t incarnation_ = 0;
  // While reconnecting after a broken session: when to give up.
  absl::Time reconnect_deadline_ = absl::InfiniteFuture();
  bool gave_up_reconnecting_ = false;
  // The rendezvous lost this node: once the workers stop, join afresh.
  bool join_afresh_ = false;

  std::optional<v1::Assignment> assignment_;
  std::vector<Worker> workers_;
  // Pipe fd -> (worker index, stream): 1 stdout, 2 stderr.
  std::map<int, std::pair<size_t, int>> pipes_;
  bool reported_success_ = false;
  bool failed_this_round_ = false;
  std::vector<WorkerFailureRecord> failures_;  // this attempt, first first

  std::optional<int64_t> rejoin_round_;
  bool job_finished_ = false;
  std::optional<std::string> job_failed_;
  int exit_signal_ = 0;

  bool stopping_ = false;
  absl::Time kill_deadline_ = absl::InfiniteFuture();
  absl::Time give_up_deadline_ = absl::InfiniteFuture();
  absl::Time next_heartbeat_ = absl::InfiniteFuture();
  // Until the rendezvous first answers (it may not be up yet).
  absl::Time first_answer_deadline_ = absl::InfiniteFuture();
  bool omp_notice_given_ = false;
  absl::Time next_progress_print_ = absl::InfinitePast();

  std::optional<int> exit_code_;
};

}  // namespace ctrun

#endif  // CTRUN_LAUNCHER_AGENT_H_
