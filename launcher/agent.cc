#include "launcher/agent.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "ctrun/environment.h"
#include "launcher/worker_process.h"
#include "rendezvous/rendezvous_server.h"

namespace ctrun {
namespace {

// epoll tags for the fds that are not worker pipes.
constexpr uint64_t kSignalTag = ~uint64_t{0};
constexpr uint64_t kWakeTag = ~uint64_t{0} - 1;

// How long a worker that ignores SIGKILL (stuck in the kernel) may hold up
// the agent before it is abandoned.
constexpr absl::Duration kGiveUpAfterKill = absl::Seconds(10);

// Progress of a round that is collecting nodes: printed only after this
// long, then this often.
constexpr absl::Duration kProgressQuietFor = absl::Seconds(2);
constexpr absl::Duration kProgressEvery = absl::Seconds(5);

// A TCP port that is free on `address` now: the OS picks it for a socket
// bound to port 0, which is then closed. 0 when none could be had.
int FindFreePort(const std::string& address) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return 0;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  if (inet_pton(AF_INET, address.c_str(), &addr.sin_addr) != 1) {
    addr.sin_addr.s_addr = htonl(INADDR_ANY);
  }
  socklen_t len = sizeof addr;
  int port = 0;
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  close(fd);
  return port;
}

// What a /proc file holds, or "" when the process is gone. Plain read(2):
// a process that exits while we read makes it fail with ESRCH, which
// std::ifstream turns into an exception.
std::string ReadProcFile(const std::filesystem::path& path) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return "";
  char buffer[1024];
  const ssize_t n = read(fd, buffer, sizeof buffer - 1);
  close(fd);
  return n > 0 ? std::string(buffer, static_cast<size_t>(n)) : "";
}

std::string SignalName(int signal) {
  const char* abbrev = sigabbrev_np(signal);
  return abbrev ? absl::StrCat("SIG", abbrev) : absl::StrCat("signal ", signal);
}

}  // namespace

sigset_t AgentSignals(const std::vector<int>& handled) {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGCHLD);
  sigaddset(&set, SIGUSR1);
  sigaddset(&set, SIGUSR2);
  for (int sig : handled) sigaddset(&set, sig);
  return set;
}

Agent::Agent(AgentConfig config) : config_(std::move(config)) {}

Agent::~Agent() {
  for (int fd : {epoll_fd_, signal_fd_, wake_fd_}) {
    if (fd >= 0) close(fd);
  }
  for (const auto& [fd, owner] : pipes_) close(fd);
}

void Agent::Say(const std::string& line) const {
  const std::string text = absl::StrCat("ctrun: ", line, "\n");
  (void)!write(STDERR_FILENO, text.data(), text.size());
}

absl::Status Agent::Setup() {
  epoll_fd_ = epoll_create1(EPOLL_CLOEXEC);
  const sigset_t signals = AgentSignals(config_.options.signals_to_handle);
  signal_fd_ = signalfd(-1, &signals, SFD_NONBLOCK | SFD_CLOEXEC);
  wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (epoll_fd_ < 0 || signal_fd_ < 0 || wake_fd_ < 0) {
    return absl::InternalError(
        absl::StrCat("cannot set up the event loop: ", strerror(errno)));
  }
  for (auto [fd, tag] :
       {std::pair{signal_fd_, kSignalTag}, std::pair{wake_fd_, kWakeTag}}) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u64 = tag;
    epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &ev);
  }
  return absl::OkStatus();
}

int Agent::Run() {
  if (auto s = Setup(); !s.ok()) {
    Say(std::string(s.message()));
    return 1;
  }
  OpenSession();
  while (!exit_code_) {
    Poll(MonotonicNow());
    OnTimers(MonotonicNow());
    DrainSession();
    Advance();
  }
  // Leave the rendezvous: a half-close tells it this node is done.
  if (session_) {
    session_->Close();
    if (!session_->WaitFor(absl::Seconds(2))) session_->Cancel();
    session_.reset();
  }
  KillStrayChildren();
  return *exit_code_;
}

void Agent::Poll(absl::Time now) {
  const absl::Time next =
      std::min({next_heartbeat_, kill_deadline_, give_up_deadline_,
                first_answer_deadline_, reconnect_deadline_});
  int timeout_ms = -1;
  if (next != absl::InfiniteFuture()) {
    timeout_ms = static_cast<int>(std::clamp<int64_t>(
        absl::ToInt64Milliseconds(next - now) + 1, 0, 60'000));
  }
  epoll_event events[64];
  const int n = epoll_wait(epoll_fd_, events, 64, timeout_ms);
  for (int i = 0; i < n; ++i) {
    const uint64_t tag = events[i].data.u64;
    if (tag == kWakeTag) {
      uint64_t count;
      (void)!read(wake_fd_, &count, sizeof count);
    } else if (tag == kSignalTag) {
      signalfd_siginfo info;
      while (read(signal_fd_, &info, sizeof info) == sizeof info) {
        if (info.ssi_signo == SIGCHLD) {
          ReapChildren();
        } else {
          OnSignal(static_cast<int>(info.ssi_signo),
                   static_cast<pid_t>(info.ssi_pid));
        }
      }
    } else {
      const int fd = static_cast<int>(tag);
      if (events[i].events & EPOLLIN) {
        ReadOutput(fd);
      } else if (events[i].events & (EPOLLHUP | EPOLLERR)) {
        CloseOutput(fd);
      }
    }
  }
}

void Agent::OnTimers(absl::Time now) {
  if (now >= first_answer_deadline_) {
    first_answer_deadline_ = absl::InfiniteFuture();
    Say(absl::StrCat("no answer from the rendezvous at ",
                     config_.connection.endpoint(),
                     " within the join timeout "
                     "of ",
                     absl::FormatDuration(config_.options.join_timeout),
                     "; is it up, and is this the right endpoint?"));
    if (session_) session_->Cancel();
    Finish(1);
    return;
  }
  if (now >= reconnect_deadline_) {
    reconnect_deadline_ = absl::InfiniteFuture();
    Say(absl::StrCat("could not reconnect to the rendezvous at ",
                     config_.connection.endpoint(), " within ",
                     absl::FormatDuration(config_.options.reconnect_timeout),
                     " (--rdzv_conf reconnect_timeout); stopping the workers"));
    gave_up_reconnecting_ = true;
    if (session_) session_->Cancel();
    StopWorkers(SIGTERM);
  }
  if (now >= next_heartbeat_) {
    SendHeartbeat();
    next_heartbeat_ = now + config_.options.keep_alive_interval;
  }
  if (now >= kill_deadline_) {
    kill_deadline_ = absl::InfiniteFuture();
    for (const auto& w : workers_) {
      if (!w.alive) continue;
      Say(absl::StrCat("worker rank ", w.rank, " (pid ", w.pid,
                       ") still running after ",
                       absl::FormatDuration(config_.options.shutdown_timeout),
                       "; sending SIGKILL"));
      kill(-w.pid, SIGKILL);
    }
    give_up_deadline_ = now + kGiveUpAfterKill;
  }
  if (now >= give_up_deadline_) {
    give_up_deadline_ = absl::InfiniteFuture();
    for (auto& w : workers_) {
      if (!w.alive) continue;
      Say(absl::StrCat("worker rank ", w.rank, " (pid ", w.pid,
                       ") did not exit after SIGKILL (stuck in the kernel?); "
                       "leaving it behind"));
      w.alive = false;
    }
  }
}

// --- rendezvous -------------------------------------------------------------

void Agent::OpenSession(std::optional<int64_t> resume_round) {
  const auto& o = config_.options;
  {
    absl::MutexLock lock(&session_mu_);
    inbox_.clear();
    session_end_.reset();
  }
  session_ended_ = false;
  v1::Join join;
  join.set_job_id(o.run_id);
  auto* s = join.mutable_settings();
  s->set_min_nodes(o.min_nodes);
  s->set_max_nodes(o.max_nodes);
  s->set_max_restarts(o.max_restarts);
  s->set_join_timeout_ms(absl::ToInt64Milliseconds(o.join_timeout));
  s->set_last_call_timeout_ms(absl::ToInt64Milliseconds(o.last_call_timeout));
  s->set_heartbeat_timeout_ms(absl::ToInt64Milliseconds(o.heartbeat_timeout));
  s->set_master_port(o.master_port);
  join.mutable_node()->set_hostname(config_.hostname);
  join.mutable_node()->set_pid(getpid());
  // A fresh incarnation for each join; a resume keeps the node's.
  if (!resume_round || incarnation_ == 0) {
    std::random_device rd;
    incarnation_ = ((static_cast<uint64_t>(rd()) << 32) | rd()) | 1;
  }
  join.mutable_node()->set_incarnation(incarnation_);
  if (resume_round) join.mutable_resume()->set_round(*resume_round);
  join.set_address(config_.address);
  join.set_local_world_size(o.local_world_size);
  join.set_node_rank_hint(o.node_rank);
  join.set_master_port_candidate(FindFreePort(config_.address));

  SessionStream::Handlers handlers;
  handlers.on_message = [this](const v1::ServerMessage& m) {
    {
      absl::MutexLock lock(&session_mu_);
      inbox_.push_back(m);
    }
    const uint64_t one = 1;
    (void)!write(wake_fd_, &one, sizeof one);
  };
  handlers.on_done = [this](const absl::Status& status) {
    {
      absl::MutexLock lock(&session_mu_);
      session_end_ = status;
    }
    const uint64_t one = 1;
    (void)!write(wake_fd_, &one, sizeof one);
  };
  session_.reset();  // the broken one, if any: done already
  session_ = SessionStream::Start(config_.connection, join, handlers);
  next_heartbeat_ = MonotonicNow() + o.keep_alive_interval;
  if (!resume_round) first_answer_deadline_ = MonotonicNow() + o.join_timeout;
}

void Agent::DrainSession() {
  std::deque<v1::ServerMessage> messages;
  std::optional<absl::Status> end;
  {
    absl::MutexLock lock(&session_mu_);
    messages.swap(inbox_);
    end = session_end_;
  }
  for (const auto& m : messages) OnServerMessage(m);
  if (end && !session_ended_) {
    session_ended_ = true;
    next_heartbeat_ = absl::InfiniteFuture();
    OnSessionEnd(*end);
  }
}

void Agent::OnSessionEnd(const absl::Status& status) {
  if (job_finished_ || job_failed_ || exit_signal_ || gave_up_reconnecting_) {
    return;
  }
  const std::string& endpoint = config_.connection.endpoint();
  const bool resuming = reconnect_deadline_ != absl::InfiniteFuture();
  if (resuming && absl::IsNotFound(status)) {
    reconnect_deadline_ = absl::InfiniteFuture();
    Say(absl::StrCat("the rendezvous at ", endpoint, " is back but ",
                     status.message(), "; stopping the workers"));
    join_afresh_ = true;
    StopWorkers(SIGTERM);
    return;
  }
  // The service went away (killed, restarted, or the network): a service
  // that keeps its state takes the node back with its workers running. (In
  // the middle of a restart it answers NOT_FOUND, as it keeps no members of
  // a round that collects nodes, and the node joins afresh.)
  const bool transport = absl::IsUnavailable(status) ||
                         absl::IsCancelled(status) || absl::IsUnknown(status) ||
                         absl::IsInternal(status);
  if (transport && assignment_ && assignment_->resumable()) {
    if (!resuming) {  // a retry keeps the first attempt's deadline
      reconnect_deadline_ = MonotonicNow() + config_.options.reconnect_timeout;
      Say(absl::StrCat(
          "lost the rendezvous at ", endpoint, " (", status.ToString(), "); ",
          AnyAlive() && !stopping_
              ? "the workers keep running while ctrun reconnects"
              : "reconnecting",
          " (up to ", absl::FormatDuration(config_.options.reconnect_timeout),
          ")"));
    }
    OpenSession(assignment_->round());
    return;
  }
  reconnect_deadline_ = absl::InfiniteFuture();
  Say(absl::StrCat("lost the rendezvous at ", endpoint, ": ",
                   status.ToString()));
  StopWorkers(SIGTERM);
}

void Agent::OnResumed(const v1::Resumed& resumed) {
  reconnect_deadline_ = absl::InfiniteFuture();
  Say(absl::StrCat("resumed with the rendezvous at ",
                   config_.connection.endpoint(), " in round ", resumed.round(),
                   "; the workers kept running"));
  // A report sent while the service was away may be lost: say it again.
  if (failed_this_round_ && !failures_.empty()) {
    Report(v1::WorkerReport::FAILED, &failures_.front());
  } else if (reported_success_) {
    Report(v1::WorkerReport::SUCCEEDED);
  } else {
    Report(v1::WorkerReport::RUNNING);
  }
}

void Agent::OnServerMessage(const v1::ServerMessage& m) {
  first_answer_deadline_ = absl::InfiniteFuture();
  switch (m.kind_case()) {
    case v1::ServerMessage::kAssignment:
      if (exit_signal_ || job_failed_) return;
      StartWorkers(m.assignment());
      return;
    case v1::ServerMessage::kRestartRequired: {
      // Stopping for good: the other nodes restart without this one.
      if (exit_signal_ || job_failed_) return;
      const auto& r = m.restart_required();
      Say(absl::StrCat("restarting the workers (round ", r.round(),
                       ", restarts used ", r.restart_count(), "/",
                       config_.options.max_restarts, "): ", r.detail()));
      rejoin_round_ = r.round();
      StopWorkers(SIGTERM);
      return;
    }
    case v1::ServerMessage::kJobFinished:
      job_finished_ = true;
      return;
    case v1::ServerMessage::kJobFailed:
      job_failed_ = m.job_failed().reason();
      StopWorkers(SIGTERM);
      return;
    case v1::ServerMessage::kProgress:
      ReportProgress(m.progress());
      return;
    case v1::ServerMessage::kResumed:
      OnResumed(m.resumed());
      return;
    case v1::ServerMessage::KIND_NOT_SET:
      return;
  }
}

void Agent::ReportProgress(const v1::Progress& p) {
  // Quiet when the round closes quickly; then at most every few seconds.
  const absl::Time now = MonotonicNow();
  if (now < next_progress_print_) return;
  if (next_progress_print_ == absl::InfinitePast()) {
    next_progress_print_ = now + kProgressQuietFor;
    return;
  }
  next_progress_print_ = now + kProgressEvery;
  std::string line =
      absl::StrCat("waiting for nodes (round ", p.round(), "): ", p.joined(),
                   " joined, need ", p.min_nodes());
  if (p.max_nodes() != p.min_nodes()) {
    absl::StrAppend(&line, "..", p.max_nodes());
  }
  if (p.missing_node_ranks_size() > 0) {
    absl::StrAppend(&line, "; missing node ranks [",
                    absl::StrJoin(p.missing_node_ranks(), ","), "]");
  }
  if (p.pending_count() > 0) {
    absl::StrAppend(&line,
                    "; not back yet: ", absl::StrJoin(p.pending(), ", "));
  }
  if (p.last_call_remaining_ms() >= 0) {
    absl::StrAppend(
        &line, "; closing in ",
        absl::FormatDuration(absl::Milliseconds(p.last_call_remaining_ms())));
  }
  absl::StrAppend(&line, "; join timeout in ",
                  absl::FormatDuration(
                      absl::Seconds(p.join_timeout_remaining_ms() / 1000)));
  if (p.waiting_for_slot()) {
    absl::StrAppend(&line, "; the job is full, waiting for a free slot");
  }
  Say(line);
}

void Agent::Report(v1::WorkerReport::State state,
                   const WorkerFailureRecord* failure) {
  if (!session_ || !assignment_) return;
  v1::AgentMessage m;
  auto* r = m.mutable_worker_report();
  r->set_round(assignment_->round());
  r->set_state(state);
  if (failure != nullptr) {
    auto* f = r->mutable_failure();
    f->set_global_rank(failure->rank);
    f->set_local_rank(failure->local_rank);
    f->set_exit_code(failure->ExitCode());
    f->set_signal(failure->signal);
    if (failure->signal != 0) f->set_message(SignalName(failure->signal));
  }
  session_->Send(std::move(m));
}

void Agent::SendHeartbeat() {
  if (!session_) return;
  v1::AgentMessage m;
  m.mutable_heartbeat();
  session_->Send(std::move(m));
}

// --- the job's course
// ---------------------------------------------------------

void Agent::Advance() {
  if (exit_code_ || AnyAlive()) return;
  if (stopping_) {
    stopping_ = false;
    kill_deadline_ = give_up_deadline_ = absl::InfiniteFuture();
    KillStrayChildren();
  }
  // The workers' last words come before anything ctrun says about them.
  DrainOutputs();
  if (exit_signal_) return Finish(128 + exit_signal_);
  if (job_failed_) {
    if (!failures_.empty()) {
      const std::string summary =
          FormatFailureSummary(config_.options.entrypoint, failures_);
      (void)!write(STDERR_FILENO, summary.data(), summary.size());
      return Finish(failures_.front().ExitCode());
    }
    Say(absl::StrCat("job failed: ", *job_failed_));
    return Finish(1);
  }
  if (job_finished_) return Finish(0);
  if (join_afresh_) {
    join_afresh_ = false;
    rejoin_round_.reset();  // that round's service is gone
    assignment_.reset();
    workers_.clear();
    OpenSession();
    return;
  }
  if (session_ended_) return Finish(1);
  if (rejoin_round_) {
    v1::AgentMessage m;
    m.mutable_rejoin()->set_round(*rejoin_round_);
    m.mutable_rejoin()->set_master_port_candidate(
        FindFreePort(config_.address));
    session_->Send(std::move(m));
    rejoin_round_.reset();
  }
}

void Agent::Finish(int exit_code) { exit_code_ = exit_code; }

// --- workers
// ------------------------------------------------------------------

void Agent::StartWorkers(const v1::Assignment& a) {
  const auto& o = config_.options;
  DrainOutputs();  // the last attempt's, before its workers are forgotten
  next_progress_print_ = absl::InfinitePast();
  assignment_ = a;
  workers_.clear();
  failures_.clear();
  reported_success_ = false;
  failed_this_round_ = false;

  if (!omp_notice_given_ && o.local_world_size > 1 &&
      !config_.env.contains(env::kOmpNumThreads)) {
    Say(absl::StrCat(
        "OMP_NUM_THREADS is unset; setting it to 1 for each of "
        "the ",
        o.local_world_size, " workers so that they do not overload the node"));
    omp_notice_given_ = true;
  }

  const std::string attempt_dir =
      absl::StrCat(config_.run_dir, "/attempt_", a.restart_count());
  std::error_code ec;
  std::filesystem::remove_all(attempt_dir, ec);
  for (int lr = 0; lr < o.local_world_size; ++lr) {
    Worker w;
    w.local_rank = lr;
    w.rank = a.first_global_rank() + lr;
    const std::string dir = absl::StrCat(attempt_dir, "/", lr);
    std::filesystem::create_directories(dir, ec);
    w.error_file = dir + "/error.json";

    const EnvMap env = WorkerEnvironment(o, a, lr, config_.env, config_.store,
                                         config_.address, w.error_file);
    auto spawned = SpawnWorker(config_.worker_argv, env);
    if (!spawned.ok()) {
      Say(std::string(spawned.status().message()));
      WorkerFailureRecord failure{
          absl::Now(), config_.hostname, w.rank, lr, 127, 0, 0, w.error_file};
      failures_.push_back(failure);
      failed_this_round_ = true;
      workers_.push_back(std::move(w));
      Report(v1::WorkerReport::FAILED, &failures_.back());
      StopWorkers(SIGTERM);
      return;
    }
    w.pid = spawned->pid;
    w.alive = true;
    if (config_.watchdog) config_.watchdog->Track(w.pid);

    const std::string prefix =
        ExpandTemplate(o.log_line_prefix_template,
                       {{"host", config_.hostname},
                        {"rank", absl::StrCat(w.rank)},
                        {"local_rank", absl::StrCat(lr)},
                        {"group_rank", absl::StrCat(a.group_rank())},
                        {"role_name", o.role}});
    const bool shown = !o.local_ranks_filter ||
                       std::count(o.local_ranks_filter->begin(),
                                  o.local_ranks_filter->end(), lr) > 0;
    const int redirect = o.redirects.For(lr);
    const int keep = redirect | o.tee.For(lr);
    auto open_log = [&](int bit, const char* name) {
      if (!(keep & bit)) return -1;
      return open(absl::StrCat(dir, "/", name).c_str(),
                  O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    };
    w.out = std::make_unique<WorkerOutput>(
        prefix, shown && !(redirect & 1) ? STDOUT_FILENO : -1,
        open_log(1, "stdout.log"));
    w.err = std::make_unique<WorkerOutput>(
        prefix, shown && !(redirect & 2) ? STDERR_FILENO : -1,
        open_log(2, "stderr.log"));
    const size_t index = workers_.size();
    for (auto [fd, stream] :
         {std::pair{spawned->stdout_fd, 1}, std::pair{spawned->stderr_fd, 2}}) {
      pipes_[fd] = {index, stream};
      epoll_event ev{};
      ev.events = EPOLLIN;
      ev.data.u64 = static_cast<uint64_t>(fd);
      epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &ev);
    }
    workers_.push_back(std::move(w));
  }
  Report(v1::WorkerReport::RUNNING);
}

void Agent::OnSignal(int signal, pid_t sender) {
  // Under Slurm, slurmstepd signals every process of the step: forwarding
  // would deliver it to the workers twice.
  const bool delivered =
      config_.options.parent_signals_workers && sender == getppid();
  if (signal == SIGUSR1 || signal == SIGUSR2) {
    if (delivered) return;
    for (const auto& w : workers_) {
      if (w.alive) kill(-w.pid, signal);
    }
    return;
  }
  if (exit_signal_) {
    Say(absl::StrCat(SignalName(signal), " again: killing the workers now"));
    for (const auto& w : workers_) {
      if (w.alive) kill(-w.pid, SIGKILL);
    }
    return;
  }
  exit_signal_ = signal;
  int alive = 0;
  for (const auto& w : workers_) alive += w.alive;
  Say(absl::StrCat("received ", SignalName(signal), "; stopping ", alive,
                   " workers (SIGKILL after ",
                   absl::FormatDuration(config_.options.shutdown_timeout),
                   ")"));
  StopWorkers(signal, /*send=*/!delivered);
}

void Agent::StopWorkers(int signal, bool send) {
  // Workers asked to stop are not asked again (a node lost while a signal
  // stops them, say): a second signal can cut short the handler that saves
  // their state. The SIGKILL deadline stands.
  if (stopping_) send = false;
  stopping_ = true;
  bool any = false;
  for (const auto& w : workers_) {
    if (!w.alive) continue;
    if (send) kill(-w.pid, signal);
    any = true;
  }
  if (any && kill_deadline_ == absl::InfiniteFuture() &&
      give_up_deadline_ == absl::InfiniteFuture()) {
    kill_deadline_ = MonotonicNow() + config_.options.shutdown_timeout;
  }
}

bool Agent::AnyAlive() const {
  return std::any_of(workers_.begin(), workers_.end(),
                     [](const Worker& w) { return w.alive; });
}

void Agent::ReapChildren() {
  int status = 0;
  pid_t pid;
  while ((pid = waitpid(-1, &status, WNOHANG)) > 0) {
    if (config_.watchdog && pid == config_.watchdog->pid()) {
      Say("the watchdog process exited; workers may outlive a crash of ctrun");
      continue;
    }
    auto it = std::find_if(workers_.begin(), workers_.end(),
                           [pid](const Worker& w) { return w.pid == pid; });
    // Anything else is an orphaned grandchild (ctrun is a subreaper).
    if (it != workers_.end() && it->alive) OnWorkerExit(*it, status);
  }
}

void Agent::OnWorkerExit(Worker& w, int status) {
  w.alive = false;
  if (WIFSIGNALED(status)) {
    w.signal = WTERMSIG(status);
  } else {
    w.exit_code = WEXITSTATUS(status);
  }
  // What the worker left running in its group goes with it.
  kill(-w.pid, SIGKILL);
  if (config_.watchdog) config_.watchdog->Untrack(w.pid);
  if (stopping_) return;  // expected: we stopped it

  if (w.signal == 0 && w.exit_code == 0) {
    const bool all_done =
        std::all_of(workers_.begin(), workers_.end(), [](const Worker& x) {
          return !x.alive && x.signal == 0 && x.exit_code == 0;
        });
    if (all_done && !reported_success_) {
      reported_success_ = true;
      Report(v1::WorkerReport::SUCCEEDED);
    }
    return;
  }
  WorkerFailureRecord failure{absl::Now(),  config_.hostname, w.rank,
                              w.local_rank, w.exit_code,      w.signal,
                              w.pid,        w.error_file};
  failures_.push_back(failure);
  if (failed_this_round_) return;
  failed_this_round_ = true;
  Say(absl::StrCat(
      "worker rank ", w.rank, " (local ", w.local_rank, ", pid ", w.pid, ") ",
      w.signal ? absl::StrCat("was killed by ", SignalName(w.signal))
               : absl::StrCat("exited with code ", w.exit_code),
      "; stopping the others"));
  Report(v1::WorkerReport::FAILED, &failure);
  StopWorkers(SIGTERM);
}

void Agent::ReadOutput(int fd) {
  auto it = pipes_.find(fd);
  if (it == pipes_.end()) return;
  auto& w = workers_[it->second.first];
  WorkerOutput& sink = it->second.second == 1 ? *w.out : *w.err;
  char buffer[16384];
  while (true) {
    const ssize_t n = read(fd, buffer, sizeof buffer);
    if (n > 0) {
      sink.Append(absl::string_view(buffer, static_cast<size_t>(n)));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EAGAIN) return;
    CloseOutput(fd);  // EOF or error
    return;
  }
}

void Agent::DrainOutputs() {
  std::vector<int> fds;
  for (const auto& [fd, owner] : pipes_) fds.push_back(fd);
  for (int fd : fds) ReadOutput(fd);
  // Whatever is still open belongs to something that outlived its worker.
  fds.clear();
  for (const auto& [fd, owner] : pipes_) fds.push_back(fd);
  for (int fd : fds) CloseOutput(fd);
}

void Agent::CloseOutput(int fd) {
  auto it = pipes_.find(fd);
  if (it == pipes_.end()) return;
  auto& w = workers_[it->second.first];
  (it->second.second == 1 ? w.out : w.err)->Finish();
  epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, fd, nullptr);
  close(fd);
  pipes_.erase(it);
}

void Agent::KillStrayChildren() {
  // Orphaned descendants of workers were reparented to ctrun (a child
  // subreaper); end them and reap them. A few passes catch children that
  // were forked while we looked.
  const pid_t self = getpid();
  const pid_t watchdog = config_.watchdog ? config_.watchdog->pid() : -1;
  for (int pass = 0; pass < 5; ++pass) {
    bool found = false;
    std::error_code ec;
    for (const auto& entry : std::filesystem::directory_iterator("/proc", ec)) {
      const std::string name = entry.path().filename().string();
      if (name.empty() || !std::isdigit(static_cast<unsigned char>(name[0]))) {
        continue;
      }
      const std::string text = ReadProcFile(entry.path() / "stat");
      const size_t close_paren = text.rfind(')');
      if (close_paren == std::string::npos) continue;
      char state;
      int ppid = 0;
      if (sscanf(text.c_str() + close_paren + 1, " %c %d", &state, &ppid) !=
          2) {
        continue;
      }
      const pid_t pid = std::stoi(name);
      if (ppid != self || pid == watchdog) continue;
      const bool worker =
          std::any_of(workers_.begin(), workers_.end(),
                      [pid](const Worker& w) { return w.pid == pid; });
      if (worker) continue;  // abandoned as unkillable, or still running
      found = true;
      kill(pid, SIGKILL);
      waitpid(pid, nullptr, WNOHANG);
    }
    if (!found) return;
    absl::SleepFor(absl::Milliseconds(10));
  }
}

}  // namespace ctrun
