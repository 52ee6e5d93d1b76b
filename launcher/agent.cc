#include "launcher/agent.h"

#include <fcntl.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "ctrun/environment.h"
#include "ctrun/progress_board.h"
#include "ctrun/v1/admin.grpc.pb.h"
#include "launcher/hw/topology.h"
#include "launcher/options/worker_command.h"
#include "launcher/policy/health_gate.h"
#include "launcher/python_module.h"
#include "launcher/workers/health_check.h"
#include "launcher/workers/proc.h"
#include "launcher/workers/run_directory.h"
#include "launcher/workers/slurm_requeue.h"
#include "launcher/workers/watchdog.h"
#include "rendezvous/rpc/endpoint.h"
#include "rendezvous/rpc/grpc_status.h"
#include "rendezvous/rpc/monotonic_clock.h"

namespace ctrun {
namespace {

// epoll tags for the fds that are not worker pipes.
constexpr uint64_t kSignalTag = ~uint64_t{0};
constexpr uint64_t kWakeTag = ~uint64_t{0} - 1;
constexpr uint64_t kTimerTag = ~uint64_t{0} - 2;

uint32_t BoardStopState(agent_effect::StopState state) {
  switch (state) {
    case agent_effect::StopState::kIdle:
      return progress::kStopIdle;
    case agent_effect::StopState::kHold:
      return progress::kStopHold;
    case agent_effect::StopState::kAt:
      return progress::kStopAt;
    case agent_effect::StopState::kFallback:
      return progress::kStopFallback;
  }
  return progress::kStopIdle;
}
// Lines of a hung worker's Python stack shown on the console.
constexpr int kStackLinesShown = 24;
// What is read of a worker's stacks to find its main thread (gdb's of a
// process of a hundred threads is some 100 KiB).
constexpr size_t kStacksRead = 4 << 20;
// A file-timer request longer than this is not one (PIPE_BUF is 4096).
constexpr size_t kMaxTimerLine = 4096;

constexpr absl::Duration kProbeTimeout = absl::Seconds(2);

// A port free on this node's address for group rank 0's MASTER_PORT:
// `previous`, the job's port so far, while it is still free (as torchrun's
// fixed port is, a job keeps one MASTER_PORT across restarts), else one the
// OS chooses; 0 (the rendezvous refuses it, naming it) only if the address
// stopped being ours. In process (`fresh`), every round takes a port
// other than the last: a kept rank 0 may still hold the last round's store
// there, and a rank still forming the last round's group may still write
// to it; neither must meet the new round's.
int FindFreePort(const std::string& address, int previous, bool fresh) {
  if (!fresh && previous > 0 && BindFreePort(address, previous).ok()) {
    return previous;
  }
  for (int tries = 0; tries < 8; ++tries) {
    auto port = BindFreePort(address);
    if (!port.ok()) return 0;
    if (*port != previous) return *port;
  }
  return 0;
}

AgentPolicyConfig PolicyConfig(const AgentConfig& c) {
  AgentPolicyConfig p;
  p.options = c.workers.options;
  p.hostname = c.workers.hostname;
  p.endpoint = c.connection.endpoint();
  p.omp_threads_set = c.workers.env.contains(env::kOmpNumThreads);
  // Read only where it matters: a node that may wait as a spare.
  p.parks = c.workers.options.spares > 0 && ParksForSlot(c.workers.worker_argv);
  // Answered at once when there is nothing to check (no --health_check,
  // no NVML).
  p.health_gate = true;
  return p;
}

}  // namespace

// What gRPC's threads hand to the loop: session messages and ends, tagged
// with their session's generation, and probe results. Outlives the agent
// while a callback holds it.
class Agent::Inbox {
 public:
  struct Item {
    enum Kind { kMessage, kSessionEnd, kRedirected, kProbe, kHealth } kind;
    uint64_t generation = 0;
    v1::ServerMessage message;
    absl::Status status;
  };

  Inbox() : wake_fd_(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) {}
  ~Inbox() {
    if (wake_fd_ >= 0) close(wake_fd_);
  }
  int wake_fd() const { return wake_fd_; }

  void Post(Item item) {
    {
      absl::MutexLock lock(&mu_);
      items_.push_back(std::move(item));
    }
    const uint64_t one = 1;
    (void)!write(wake_fd_, &one, sizeof one);
  }
  std::deque<Item> Take() {
    uint64_t count;
    (void)!read(wake_fd_, &count, sizeof count);
    std::deque<Item> items;
    absl::MutexLock lock(&mu_);
    items.swap(items_);
    return items;
  }

 private:
  const int wake_fd_;
  absl::Mutex mu_;
  std::deque<Item> items_ ABSL_GUARDED_BY(mu_);
};

sigset_t AgentSignals(const std::vector<int>& handled) {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGCHLD);
  sigaddset(&set, SIGUSR1);
  sigaddset(&set, SIGUSR2);
  sigaddset(&set, SIGTSTP);  // job control (agent_policy.h)
  for (int sig : handled) sigaddset(&set, sig);
  return set;
}

Agent::Agent(AgentConfig config, Console* out, Console* err)
    : config_(std::move(config)),
      out_(out),
      err_(err),
      inbox_(std::make_shared<Inbox>()),
      policy_(PolicyConfig(config_)) {}

Agent::~Agent() {
  session_.reset();  // before the worker group and the fds it may wake
  evidence_.reset();
  workers_.reset();
  for (int fd : {epoll_fd_, signal_fd_, timer_fd_}) {
    if (fd >= 0) close(fd);
  }
  board_.reset();
  if (!agent_dir_.empty()) {
    std::error_code ec;
    std::filesystem::remove_all(agent_dir_, ec);
  }
}

absl::Status Agent::Setup() {
  epoll_fd_ = epoll_create1(EPOLL_CLOEXEC);
  const sigset_t signals =
      AgentSignals(config_.workers.options.signals_to_handle);
  signal_fd_ = signalfd(-1, &signals, SFD_NONBLOCK | SFD_CLOEXEC);
  if (epoll_fd_ < 0 || signal_fd_ < 0 || inbox_->wake_fd() < 0) {
    return absl::InternalError(
        absl::StrCat("cannot set up the event loop: ", strerror(errno)));
  }
  for (auto [fd, tag] : {std::pair{signal_fd_, kSignalTag},
                         std::pair{inbox_->wake_fd(), kWakeTag}}) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u64 = tag;
    epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &ev);
  }
  WorkerGroupConfig group = config_.workers;
  group.out = out_;
  group.err = err_;
  if (auto s = SetupProgress(group); !s.ok()) return s;
  if (auto s = SetupBinding(group); !s.ok()) return s;
  SetupTemplate(group);
  workers_ = std::make_unique<WorkerGroup>(std::move(group), epoll_fd_);
  if ((nvml_ = Nvml::Load())) {
    GpuWatchConfig watch;
    watch.job_gpus =
        JobGpus(getenv("CUDA_VISIBLE_DEVICES"), nvml_->device_count(),
                config_.workers.options.local_world_size);
    gpu_watch_ = std::make_unique<GpuWatch>(std::move(watch));
  }
  return absl::OkStatus();
}

absl::Status Agent::SetupProgress(WorkerGroupConfig& group) {
  const std::string& run_dir = group.run_dir;
  if (run_dir.empty()) return absl::OkStatus();
  ProgressPaths& paths = group.progress;
  paths.run_dir = run_dir;
  agent_dir_ = absl::StrCat(run_dir, "/", kAgentFolder);
  paths.python_dir = agent_dir_ + "/python";
  std::error_code ec;
  std::filesystem::create_directories(paths.python_dir + "/ctrun", ec);
  for (const auto& [file, text] :
       {std::pair{paths.python_dir + "/ctrun/__init__.py", kPythonModule},
        std::pair{paths.python_dir + "/ctrun/_recovery.py", kPythonRecovery},
        std::pair{agent_dir_ + "/ctrun_template.py", kPythonTemplate},
        std::pair{paths.python_dir + "/sitecustomize.py",
                  kPythonSitecustomize}}) {
    if (!(std::ofstream(file) << text)) {
      // A worker's `import ctrun` would fail on it: say so now.
      return absl::InternalError(
          absl::StrCat("cannot write ctrun's Python module to ", file));
    }
  }
  auto board = ProgressBoard::Create(group.options.local_world_size);
  if (!board.ok()) return board.status();
  board_ = std::move(*board);
  paths.board = board_->path();
  if (group.options.preemption_grace) {
    board_->EnableStops();
    board_->Clear();
  }
  if (!group.options.file_timers) return absl::OkStatus();
  // Read and written here, so that it never reads as closed between two
  // clients' writes, and a client's non-blocking open always finds a
  // reader (torch's FileTimerClient fails without one).
  paths.timer_fifo = agent_dir_ + "/timer.fifo";
  if (mkfifo(paths.timer_fifo.c_str(), 0600) != 0 ||
      (timer_fd_ = open(paths.timer_fifo.c_str(),
                        O_RDWR | O_NONBLOCK | O_CLOEXEC)) < 0) {
    return absl::InternalError(
        absl::StrCat("cannot make the file-timer FIFO ", paths.timer_fifo, " (",
                     env::kEnableFileTimer, "=1): ", strerror(errno)));
  }
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = kTimerTag;
  epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, timer_fd_, &ev);
  return absl::OkStatus();
}

void Agent::SetupTemplate(WorkerGroupConfig& group) {
  const LaunchOptions& o = group.options;
  const std::vector<std::string>& argv = group.worker_argv;
  const bool python = argv.size() > 2 && argv[1] == "-u";
  const bool asked = o.preload
                         ? !o.preload->empty()
                         : o.recovery == Recovery::kInProcess || o.spares > 0;
  if (!python || !asked || agent_dir_.empty()) return;
  TemplateConfig t;
  t.python = {argv[0], argv[1]};
  t.script = agent_dir_ + "/ctrun_template.py";
  t.modules = o.preload.value_or(std::vector<std::string>{"torch"});
  // The loop waits with a start: it must not miss its heartbeats (one is
  // due every keep-alive interval; the rendezvous loses a node silent for
  // the heartbeat timeout), with room for a loaded machine's slowness.
  t.wait_ms = static_cast<int>(std::clamp<int64_t>(
      absl::ToInt64Milliseconds((o.heartbeat_timeout - o.keep_alive_interval) /
                                2),
      0, TemplateSpawner::kReadyWithinMs));
  t.optional = !o.preload;
  // What every worker's environment shares: the agent's, with ctrun's
  // module on the path (modules imported here see this one).
  t.env = group.env;
  t.env.erase(env::kRendezvousToken);
  if (o.local_world_size > 1) t.env.try_emplace(env::kOmpNumThreads, "1");
  std::string& path = t.env[env::kPythonPath];
  path = path.empty() ? group.progress.python_dir
                      : absl::StrCat(path, ":", group.progress.python_dir);
  Console* err = err_;
  t.say = [err](const std::string& line) {
    err->WriteAgentLine(absl::StrCat("ctrun: ", line, "\n"));
  };
  template_ = std::make_unique<TemplateSpawner>(std::move(t));
  group.spawner = template_.get();
}

absl::Status Agent::SetupBinding(WorkerGroupConfig& group) {
  const auto& policy = group.options.numa_binding;
  if (!policy) return absl::OkStatus();
  auto bindings = PlanNodeBindings(*policy, group.options.local_world_size,
                                   getenv("CUDA_VISIBLE_DEVICES"));
  if (!bindings.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("--numa_binding=", NumaPolicyName(*policy), ": ",
                     bindings.status().message()));
  }
  for (size_t lr = 0; lr < bindings->size(); ++lr) {
    const Binding& b = (*bindings)[lr];
    err_->WriteAgentLine(absl::StrCat(
        "ctrun: --numa_binding=", NumaPolicyName(*policy), ": local rank ", lr,
        " on CPUs ", CpuListString(b.cpus),
        b.memory_node >= 0
            ? absl::StrCat(", memory preferred on NUMA node ", b.memory_node)
            : "",
        "\n"));
  }
  group.bindings = std::move(*bindings);
  return absl::OkStatus();
}

int Agent::Run() {
  if (auto s = Setup(); !s.ok()) {
    err_->WriteAgentLine(absl::StrCat("ctrun: ", s.message(), "\n"));
    return 1;
  }
  AgentEffects effects;
  policy_.Start(MonotonicNow(), &effects);
  Apply(std::move(effects));
  absl::Time refresh_mark_at = MonotonicNow() + kMarkRefreshInterval;
  while (!exit_code_) {
    Poll(std::min(
        {policy_.NextDeadline(), workers_->PartialDue(), refresh_mark_at,
         evidence_ ? evidence_->NextDue() : absl::InfiniteFuture(),
         gpu_watch_ ? gpu_watch_->NextDue() : absl::InfiniteFuture()}));
    workers_->ShowPartials(MonotonicNow());
    if (MonotonicNow() >= refresh_mark_at) {
      // A live agent's run folder is never taken for a killed one's.
      RefreshRunDirectoryMark(config_.workers.run_dir);
      refresh_mark_at = MonotonicNow() + kMarkRefreshInterval;
    }
    if (exit_code_) break;
    if (gpu_watch_ && MonotonicNow() >= gpu_watch_->NextDue()) ReadGpus();
    if (evidence_ && !evidence_->done() && evidence_->Step(MonotonicNow())) {
      effects.clear();
      policy_.OnEvidenceCollected(MonotonicNow(), &effects);
      Apply(std::move(effects));
      if (exit_code_) break;
    }
    effects.clear();
    policy_.Tick(MonotonicNow(), &effects);
    Apply(std::move(effects));
  }
  stopped_by_signal_ = policy_.stopped_by_signal();
  ReportUsage();
  err_->WriteAgentLine(absl::StrCat(
      "ctrun: ", policy_.Recap(*exit_code_, MonotonicNow()), "\n"));
  // Leave the rendezvous: a half-close tells it this node is done.
  if (session_) {
    session_->Close();
    if (!session_->WaitFor(absl::Seconds(2))) session_->Cancel();
    session_.reset();
  }
  // Every descendant came to this agent (a subreaper) and is ended: the
  // watchdog need not look for strays across the machine.
  if (workers_->EndStrays() && config_.workers.watchdog != nullptr) {
    config_.workers.watchdog->AllEnded();
  }
  return *exit_code_;
}

void Agent::Poll(absl::Time deadline) {
  int timeout_ms = -1;
  if (deadline != absl::InfiniteFuture()) {
    timeout_ms = static_cast<int>(std::clamp<int64_t>(
        absl::ToInt64Milliseconds(deadline - MonotonicNow()) + 1, 0, 60'000));
  }
  epoll_event events[64];
  const int n = epoll_wait(epoll_fd_, events, 64, timeout_ms);
  for (int i = 0; i < n && !exit_code_; ++i) {
    const uint64_t tag = events[i].data.u64;
    if (tag == kWakeTag) {
      DrainInbox();
    } else if (tag == kSignalTag) {
      OnSignals();
    } else if (tag == kTimerTag) {
      ReadTimerRequests();
    } else {
      const int fd = static_cast<int>(tag);
      if (events[i].events & EPOLLIN) {
        workers_->OnReadable(fd, MonotonicNow());
      } else if (events[i].events & (EPOLLHUP | EPOLLERR)) {
        workers_->OnHangup(fd);
      }
    }
  }
}

void Agent::OnSignals() {
  signalfd_siginfo info;
  while (!exit_code_ && read(signal_fd_, &info, sizeof info) == sizeof info) {
    AgentEffects effects;
    const absl::Time now = MonotonicNow();
    if (info.ssi_signo == SIGCHLD) {
      for (WorkerExit& e : workers_->Reap()) {
        if (e.signal != 0 || e.exit_code != 0) {
          // What its failure's class is read from (classify_failure.h).
          if (e.signal == SIGKILL && oom_kills_) {
            const std::optional<uint64_t> now_kills = CgroupOomKills();
            e.oom_killed = now_kills && *now_kills > *oom_kills_;
          }
          e.last_lines = workers_->LastLines(e.local_rank);
          if (board_) {
            for (const ProgressSample& s : board_->Read()) {
              e.attempt_stepped |= s.beats > 0 || s.sections_done > 0;
            }
          }
          if (auto contents = ReadErrorFile(policy_.ErrorFileOf(e.local_rank));
              contents.ok()) {
            e.error_message = std::move(contents->message);
          }
        }
        if (e.local_rank < static_cast<int>(rank_runs_.size())) {
          rank_runs_[e.local_rank].exit = e;
        }
        policy_.OnWorkerExit(e, now, &effects);
      }
      for (pid_t pid : workers_->TakeOtherExits()) {
        if (evidence_) evidence_->OnChildExit(pid);
      }
      if (workers_->TakeTerminalStop()) policy_.OnTerminalStop(now, &effects);
    } else {
      // Whether a preemption signal can stop the job at one step depends
      // on whether the workers call the stop check now, not at the last
      // poll (they may have just started).
      const auto signal = static_cast<int>(info.ssi_signo);
      if ((signal == SIGTERM || signal == SIGUSR1 || signal == SIGUSR2) &&
          board_) {
        policy_.OnProgressRead(board_->Read(), now, absl::Now(), &effects);
      }
      policy_.OnSignal(static_cast<int>(info.ssi_signo),
                       static_cast<pid_t>(info.ssi_pid) == getppid(), now,
                       &effects);
    }
    Apply(std::move(effects));
  }
}

void Agent::ReadTimerRequests() {
  char buffer[8192];
  ssize_t n;
  while ((n = read(timer_fd_, buffer, sizeof buffer)) > 0 ||
         (n < 0 && errno == EINTR)) {
    if (n < 0) continue;
    timer_partial_.append(buffer, static_cast<size_t>(n));
    size_t eol;
    while ((eol = timer_partial_.find('\n')) != std::string::npos) {
      const std::string line = timer_partial_.substr(0, eol);
      timer_partial_.erase(0, eol + 1);
      AgentEffects effects;
      policy_.OnTimerRequest(line, MonotonicNow(), absl::Now(), &effects);
      Apply(std::move(effects));
    }
    // Not a request: drop it rather than grow without bound.
    if (timer_partial_.size() > kMaxTimerLine) timer_partial_.clear();
  }
}

void Agent::StartEvidence(const agent_effect::CollectEvidence& collect) {
  std::vector<EvidenceCollector::Target> targets;
  for (int lr = 0; lr < config_.workers.options.local_world_size; ++lr) {
    const pid_t pid = workers_->PidOf(lr);
    if (pid <= 0) continue;
    targets.push_back(EvidenceCollector::Target{
        lr, workers_->RankOf(lr), pid,
        board_ ? board_->StacksOf(lr) : StackDump{}, workers_->StacksFile(lr),
        workers_->LastLines(lr)});
  }
  evidence_focus_ = collect.focus;
  evidence_ = std::make_unique<EvidenceCollector>(
      absl::StrCat(config_.workers.run_dir, "/", collect.dir),
      std::move(targets), FindGdb(), MonotonicNow(), collect.deadline);
}

void Agent::EndEvidence() {
  std::vector<RankReading> readings;
  if (evidence_) {
    readings = FinishEvidence();
    evidence_.reset();
  }
  // The policy hears what the stacks say, whatever came of them.
  AgentEffects more;
  policy_.OnStacksRead(readings, &more);
  Apply(std::move(more));
}

std::vector<RankReading> Agent::FinishEvidence() {
  const std::string evidence_dir = evidence_->dir();
  std::string text = absl::StrCat("ctrun: ", evidence_->Finish(), "\n");
  // What each worker's stacks say of its main thread.
  std::vector<RankReading> readings;
  for (const EvidenceCollector::Target& t : evidence_->targets()) {
    const std::string base = absl::StrCat(evidence_dir, "/rank", t.rank);
    readings.push_back(RankReading{
        t.rank, t.local_rank,
        ReadStacks(ReadProcFile(base + ".python.txt", kStacksRead),
                   ReadProcFile(base + ".native.txt", kStacksRead), t.pid)});
  }
  // The worker to show: the one that hung here, unless its stack waits in
  // a collective and another's is outside any (the policy says why).
  int focus = evidence_focus_;
  const auto reading_of = [&](int local_rank) {
    for (const RankReading& r : readings) {
      if (r.local_rank == local_rank) return r.reading.place;
    }
    return StackReading::Place::kUnknown;
  };
  if (focus >= 0 && reading_of(focus) == StackReading::Place::kWaiting) {
    for (const RankReading& r : readings) {
      if (r.reading.place == StackReading::Place::kElsewhere) {
        focus = r.local_rank;
        break;
      }
    }
  }
  if (focus >= 0) {
    const int rank = workers_->RankOf(focus);
    const std::vector<std::string> lines = workers_->LastLines(focus);
    if (lines.empty()) {
      absl::StrAppend(&text, "ctrun: rank ", rank, " printed nothing\n");
    } else {
      absl::StrAppend(&text, "ctrun: the last lines of rank ", rank, ":\n");
      for (const std::string& line : lines) {
        absl::StrAppend(&text, "  | ", line, "\n");
      }
    }
    // Where it is stuck, at a glance: its Python stack, cut short. (The
    // evidence folder is the workers' to write too: read without waiting.)
    const std::string stack = ReadProcFile(
        absl::StrCat(evidence_dir, "/rank", rank, ".python.txt"), 64 << 10);
    int shown = 0;
    for (absl::string_view line :
         absl::StrSplit(absl::StripSuffix(stack, "\n"), '\n')) {
      if (stack.empty() || shown == kStackLinesShown) break;
      if (shown++ == 0) {
        absl::StrAppend(&text, "ctrun: the Python stack of rank ", rank, ":\n");
      }
      absl::StrAppend(&text, "  | ", line, "\n");
    }
  }
  err_->WriteAgentLine(text);
  return readings;
}

void Agent::KillTimedOut(const agent_effect::KillTimedOut& k) {
  // Only a worker, or a process in a worker's own group: a request names
  // any pid it likes.
  const pid_t group = getpgid(k.pid);
  for (int lr = 0; lr < config_.workers.options.local_world_size; ++lr) {
    const pid_t worker = workers_->PidOf(lr);
    if (worker <= 0) continue;
    if (k.pid == worker) {
      kill(k.pid, k.signal);  // the policy said so, with its evidence
      return;
    }
    if (group == worker) {
      err_->WriteAgentLine(absl::StrCat(
          "ctrun: torchrun file timer '", k.scope, "' of pid ", k.pid,
          " (in the process group of worker pid ", worker,
          ") expired; killing it with ", SignalName(k.signal), "\n"));
      kill(k.pid, k.signal);
      return;
    }
  }
  err_->WriteAgentLine(absl::StrCat(
      "ctrun: torchrun file timer '", k.scope, "' of pid ", k.pid,
      " expired; not killing it: it is not one of this node's workers or "
      "their processes\n"));
}

void Agent::ReadGpus() {
  // A worker's GPU processes are the worker or in its process group (a
  // shell's python, a DataLoader's child).
  std::map<pid_t, int> local_rank_of;
  for (int lr = 0; lr < static_cast<int>(rank_runs_.size()); ++lr) {
    if (const pid_t pid = workers_->PidOf(lr); pid > 0) local_rank_of[pid] = lr;
  }
  std::vector<GpuReading> readings;
  for (const GpuDeviceReading& device : nvml_->Read()) {
    GpuReading r;
    r.gpu = device.gpu;
    r.utilization = device.utilization;
    for (const GpuProcess& p : device.processes) {
      auto it = local_rank_of.find(p.pid);
      if (it == local_rank_of.end()) it = local_rank_of.find(getpgid(p.pid));
      if (it != local_rank_of.end()) {
        r.bytes_by_local_rank[it->second] += p.used_bytes;
      }
    }
    readings.push_back(std::move(r));
  }
  if (auto warning = gpu_watch_->Observe(MonotonicNow(), readings)) {
    err_->WriteAgentLine(absl::StrCat("ctrun: ", *warning, "\n"));
  }
}

void Agent::ReportUsage() {
  std::vector<RankUsage> ranks;
  for (int lr = 0; lr < static_cast<int>(rank_runs_.size()); ++lr) {
    const RankRun& run = rank_runs_[lr];
    if (!run.exit) continue;  // never started, or left behind
    ranks.push_back(RankUsage{
        run.rank, run.exit->wall_time - run.started, run.exit->peak_rss_bytes,
        gpu_watch_ ? gpu_watch_->UsageOf(lr) : RankGpuUsage{}});
  }
  if (ranks.empty()) return;
  // Every rank's line in a run directory that is kept (--log_dir; a
  // temporary one holding it would be kept for it); on the console one
  // line for the node, or with -v every rank's.
  std::string per_rank;
  for (const RankUsage& r : ranks) {
    absl::StrAppend(&per_rank,
                    RankUsageLine(r.rank, r.wall, r.peak_rss_bytes, r.gpu),
                    "\n");
  }
  if (!config_.workers.options.log_dir.empty()) {
    ReplaceFile(absl::StrCat(config_.workers.run_dir, "/usage.txt"), per_rank);
  }
  if (config_.workers.options.verbose) {
    std::string text;
    for (absl::string_view line :
         absl::StrSplit(per_rank, '\n', absl::SkipEmpty())) {
      absl::StrAppend(&text, "ctrun: ", line, "\n");
    }
    err_->WriteAgentLine(text);
    return;
  }
  err_->WriteAgentLine(absl::StrCat("ctrun: ", NodeUsageLine(ranks), "\n"));
}

void Agent::DrainInbox() {
  for (Inbox::Item& item : inbox_->Take()) {
    if (exit_code_) return;
    AgentEffects effects;
    const absl::Time now = MonotonicNow();
    switch (item.kind) {
      case Inbox::Item::kProbe:
        policy_.OnProbeResult(item.status, now, &effects);
        break;
      case Inbox::Item::kHealth:
        policy_.OnHealthChecked(std::string(item.status.message()), now,
                                &effects);
        break;
      case Inbox::Item::kMessage:
        if (item.generation != session_generation_) continue;
        // Whether a restart keeps the workers depends on what their slots
        // say now, not at the last poll (a worker may have just started
        // recovering in process).
        if (item.message.has_restart_required() && board_) {
          policy_.OnProgressRead(board_->Read(), now, absl::Now(), &effects);
        }
        policy_.OnMessage(item.message, now, &effects);
        break;
      case Inbox::Item::kSessionEnd:
      case Inbox::Item::kRedirected:
        if (item.generation != session_generation_) continue;
        policy_.OnSessionEnd(item.status, item.kind == Inbox::Item::kRedirected,
                             now, &effects);
        break;
    }
    Apply(std::move(effects));
  }
}

void Agent::Apply(AgentEffects effects) {
  for (const AgentEffect& effect : effects) {
    if (exit_code_) return;
    Apply(effect);
  }
}

void Agent::Apply(const AgentEffect& effect) {
  namespace e = agent_effect;
  if (auto* say = std::get_if<e::Say>(&effect)) {
    err_->WriteAgentLine(absl::StrCat("ctrun: ", say->line, "\n"));
  } else if (auto* print = std::get_if<e::Print>(&effect)) {
    err_->WriteAgentLine(print->text);
  } else if (auto* open = std::get_if<e::OpenSession>(&effect)) {
    OpenSession(open->resume_round, open->unhealthy);
  } else if (std::holds_alternative<e::CancelSession>(effect)) {
    ++session_generation_;
    if (session_) session_->Cancel();
  } else if (auto* send = std::get_if<e::Send>(&effect)) {
    if (session_) session_->Send(send->message);
  } else if (auto* rejoin = std::get_if<e::SendRejoin>(&effect)) {
    if (session_) session_->Send(MakeRejoin(rejoin->round, rejoin->unhealthy));
  } else if (std::holds_alternative<e::CheckHealth>(effect)) {
    CheckHealth();
  } else if (auto* check = std::get_if<e::CheckProcessGroup>(&effect)) {
    AgentEffects more;
    policy_.OnProcessGroupChecked(
        ListensOn(check->port),
        board_ ? board_->Read() : std::vector<ProgressSample>{}, MonotonicNow(),
        &more);
    Apply(std::move(more));
  } else if (std::holds_alternative<e::ReadProgress>(effect)) {
    if (!board_) return;
    AgentEffects more;
    policy_.OnProgressRead(board_->Read(), MonotonicNow(), absl::Now(), &more);
    Apply(std::move(more));
  } else if (auto* requeue = std::get_if<e::RequeueSlurmJob>(&effect)) {
    auto say = [this](std::string line) {
      err_->WriteAgentLine(absl::StrCat("ctrun: ", line, "\n"));
    };
    say(RequeueSlurmJob(requeue->job_id, say));
  } else if (auto* stop = std::get_if<e::PostStop>(&effect)) {
    if (board_)
      board_->SetStop(BoardStopState(stop->state), stop->step, stop->reason);
  } else if (auto* collect = std::get_if<e::CollectEvidence>(&effect)) {
    StartEvidence(*collect);
  } else if (std::holds_alternative<e::EndEvidence>(effect)) {
    EndEvidence();
  } else if (auto* timed_out = std::get_if<e::KillTimedOut>(&effect)) {
    KillTimedOut(*timed_out);
  } else if (auto* start = std::get_if<e::StartWorkers>(&effect)) {
    const v1::Assignment& a = start->assignment;
    master_port_ = a.master_port();
    const bool some = !start->local_ranks.empty();
    if (board_ && !some) board_->Clear();
    if (board_) {
      for (int lr : start->local_ranks) board_->Clear(lr);
    }
    // The kernel's OOM kills so far, to tell one of these workers' later.
    oom_kills_ = CgroupOomKills();
    const std::vector<WorkerStart> started =
        some ? workers_->StartSome(a, start->local_ranks) : workers_->Start(a);
    // One run per local rank: a new attempt starts them all afresh, a
    // replacement takes its local rank's.
    if (!some) rank_runs_.clear();
    for (const WorkerStart& w : started) {
      const auto lr = static_cast<size_t>(w.local_rank);
      if (rank_runs_.size() <= lr) rank_runs_.resize(lr + 1);
      rank_runs_[lr] =
          RankRun{static_cast<int>(a.first_global_rank()) + w.local_rank,
                  absl::Now(), std::nullopt};
    }
    std::vector<int> ranks;
    for (const RankRun& run : rank_runs_) ranks.push_back(run.rank);
    if (gpu_watch_) gpu_watch_->Start(MonotonicNow(), std::move(ranks));
    AgentEffects more;
    policy_.OnWorkersStarted(started, MonotonicNow(), &more);
    Apply(std::move(more));
  } else if (std::holds_alternative<e::ParkWorkers>(effect)) {
    if (board_) board_->Clear();
    const std::vector<WorkerStart> started = workers_->StartParked();
    rank_runs_.assign(started.size(), RankRun{-1, absl::Now(), std::nullopt});
    AgentEffects more;
    policy_.OnWorkersStarted(started, MonotonicNow(), &more);
    Apply(std::move(more));
  } else if (auto* signal = std::get_if<e::SignalWorkers>(&effect)) {
    workers_->Signal(signal->signal);
  } else if (auto* one = std::get_if<e::SignalWorker>(&effect)) {
    workers_->SignalOne(one->local_rank, one->signal);
  } else if (auto* end = std::get_if<e::EndRound>(&effect)) {
    workers_->EndRound(end->round);
  } else if (auto* hand = std::get_if<e::HandOver>(&effect)) {
    master_port_ = hand->assignment.master_port();
    workers_->HandOver(hand->assignment, hand->local_ranks);
    for (int lr : hand->local_ranks) {
      if (static_cast<size_t>(lr) < rank_runs_.size()) {
        rank_runs_[static_cast<size_t>(lr)].rank =
            static_cast<int>(hand->assignment.first_global_rank()) + lr;
      }
    }
  } else if (std::holds_alternative<e::AbandonWorkers>(effect)) {
    for (int lr = 0; lr < config_.workers.options.local_world_size; ++lr) {
      if (const pid_t pid = workers_->PidOf(lr); pid > 0) {
        err_->WriteAgentLine(absl::StrCat("ctrun: pid ", pid, " is in state ",
                                          DescribeProcessState(pid), "\n"));
      }
    }
    workers_->Abandon();
  } else if (std::holds_alternative<e::CollectWorkers>(effect)) {
    workers_->Collect();
  } else if (std::holds_alternative<e::SuspendAgent>(effect)) {
    kill(getpid(), SIGSTOP);  // returns once continued
  } else if (std::holds_alternative<e::ProbeRendezvous>(effect)) {
    Probe();
  } else if (auto* exit = std::get_if<e::Exit>(&effect)) {
    exit_code_ = exit->code;
  } else if (auto* record = std::get_if<e::Record>(&effect)) {
    if (!config_.event_log) return;
    v1::Event event = record->event;
    if (!event.has_job()) event.set_job(config_.workers.options.run_id);
    // As the rendezvous names this node (rendezvous_core.cc, Node::Name).
    event.set_node(absl::StrCat(config_.workers.NodeName(), ":", getpid()));
    config_.event_log->Write("agent", std::move(event));
  }
}

v1::AgentMessage Agent::MakeRejoin(int64_t round,
                                   const std::string& unhealthy) const {
  v1::AgentMessage m;
  m.mutable_rejoin()->set_round(round);
  if (!unhealthy.empty()) {
    m.mutable_rejoin()->set_unhealthy(unhealthy);
    m.mutable_rejoin()->set_quarantine_ms(
        absl::ToInt64Milliseconds(config_.workers.options.quarantine));
  }
  m.mutable_rejoin()->set_master_port_candidate(
      FindFreePort(config_.workers.address, master_port_,
                   config_.workers.options.recovery == Recovery::kInProcess));
  return m;
}

void Agent::CheckHealth() {
  const std::string& command = config_.workers.options.health_check;
  health_.reset();  // one still running answers nothing any more
  if (command.empty() && !nvml_) {
    AgentEffects more;
    policy_.OnHealthChecked("", MonotonicNow(), &more);
    Apply(std::move(more));
    return;
  }
  std::function<std::string()> gpus;
  if (nvml_) {
    gpus = [nvml = nvml_.get()] {
      return JudgeGpus(GivenGpus(getenv("CUDA_VISIBLE_DEVICES"),
                                 getenv("SLURM_GPUS_ON_NODE")),
                       nvml->device_count(), nvml->ReadHealth());
    };
  }
  health_ = std::make_unique<HealthCheck>(
      command, std::move(gpus), [inbox = inbox_](std::string problem) {
        inbox->Post({Inbox::Item::kHealth,
                     0,
                     {},
                     problem.empty() ? absl::OkStatus()
                                     : absl::FailedPreconditionError(problem)});
      });
}

void Agent::OpenSession(std::optional<int64_t> resume_round,
                        const std::string& unhealthy) {
  const auto& o = config_.workers.options;
  v1::Join join;
  join.set_job_id(o.run_id);
  if (!unhealthy.empty()) {
    join.set_unhealthy(unhealthy);
    join.set_quarantine_ms(absl::ToInt64Milliseconds(o.quarantine));
  }
  auto* s = join.mutable_settings();
  s->set_min_nodes(o.min_nodes);
  s->set_max_nodes(o.max_nodes);
  s->set_max_restarts(o.max_restarts);
  s->set_restart_on(o.restart_on);
  s->set_join_timeout_ms(absl::ToInt64Milliseconds(o.join_timeout));
  s->set_last_call_timeout_ms(absl::ToInt64Milliseconds(o.last_call_timeout));
  s->set_heartbeat_timeout_ms(absl::ToInt64Milliseconds(o.heartbeat_timeout));
  s->set_master_port(o.master_port);
  s->set_spares(o.spares);
  join.set_segment(o.segment);
  join.mutable_node()->set_hostname(config_.workers.hostname);
  if (config_.workers.NodeName() != config_.workers.hostname) {
    join.mutable_node()->set_name(config_.workers.NodeName());
  }
  join.mutable_node()->set_pid(getpid());
  // A fresh incarnation for each join; a resume keeps the node's.
  if (!resume_round || incarnation_ == 0) {
    std::random_device rd;
    incarnation_ = ((static_cast<uint64_t>(rd()) << 32) | rd()) | 1;
  }
  join.mutable_node()->set_incarnation(incarnation_);
  if (resume_round) join.mutable_resume()->set_round(*resume_round);
  join.set_address(config_.workers.address);
  join.set_local_world_size(o.local_world_size);
  join.set_node_rank_hint(o.node_rank);
  join.set_master_port_candidate(
      FindFreePort(config_.workers.address, master_port_,
                   o.recovery == Recovery::kInProcess));

  const uint64_t generation = ++session_generation_;
  SessionStream::Handlers handlers;
  handlers.on_message = [inbox = inbox_,
                         generation](const v1::ServerMessage& m) {
    inbox->Post({Inbox::Item::kMessage, generation, m, absl::OkStatus()});
  };
  handlers.on_done = [inbox = inbox_, generation](const absl::Status& status,
                                                  bool redirected) {
    inbox->Post(
        {redirected ? Inbox::Item::kRedirected : Inbox::Item::kSessionEnd,
         generation,
         {},
         status});
  };
  session_.reset();  // the broken one, if any: done already
  session_ = SessionStream::Start(config_.connection, join, handlers);
}

void Agent::Probe() {
  // A call that does not wait for the service to be up: its status says
  // why the session's join (which waits) hears nothing.
  struct Call {
    grpc::ClientContext context;
    v1::ListJobsRequest request;
    v1::ListJobsResponse response;
    std::unique_ptr<v1::Admin::Stub> stub;
  };
  auto call = std::make_shared<Call>();
  call->stub = v1::Admin::NewStub(config_.connection.channel());
  config_.connection.Prepare(&call->context, kProbeTimeout);
  call->context.set_wait_for_ready(false);
  call->stub->async()->ListJobs(
      &call->context, &call->request, &call->response,
      [call, inbox = inbox_,
       connection = config_.connection](grpc::Status status) {
        const absl::Status result = FromGrpcStatus(status);
        connection.Follow(call->context, result);
        inbox->Post({Inbox::Item::kProbe, 0, {}, result});
      });
}

}  // namespace ctrun
