#include "launcher/workers/worker_group.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <termios.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "ctrun/environment.h"
#include "launcher/workers/proc.h"
#include "launcher/workers/run_directory.h"
#include "launcher/workers/worker_process.h"

namespace ctrun {

WorkerGroup::WorkerGroup(WorkerGroupConfig config, int epoll_fd)
    : config_(std::move(config)),
      spawner_(config_.spawner ? config_.spawner : &exec_spawner_),
      epoll_fd_(epoll_fd) {}

WorkerGroup::~WorkerGroup() {
  for (const auto& [fd, owner] : pipes_) close(fd);
  workers_.clear();  // their outputs write to the files below
  for (const DuplicateFilter& d : duplicates_) {
    if (d.fd >= 0) close(d.fd);
  }
}

// Where one of a worker's streams goes.
struct WorkerGroup::StreamPlan {
  bool console = false;  // shown on ctrun's console
  bool file = false;     // kept in the attempt's log file
  bool tty = false;      // written to a pseudo-terminal
};

WorkerGroup::StreamPlan WorkerGroup::PlanStream(int local_rank,
                                                int stream) const {
  const auto& o = config_.options;
  const bool shown = !o.local_ranks_filter ||
                     std::count(o.local_ranks_filter->begin(),
                                o.local_ranks_filter->end(), local_rank) > 0;
  // As in torchrun, tee wins over redirects for a stream given to both.
  const bool redirected = (o.redirects.For(local_rank) & stream) &&
                          !(o.tee.For(local_rank) & stream);
  StreamPlan plan;
  plan.console = shown && !redirected;
  plan.file = (o.redirects.For(local_rank) | o.tee.For(local_rank)) & stream;
  switch (o.worker_tty) {
    case WorkerTty::kYes:
      plan.tty = true;
      break;
    case WorkerTty::kNo:
      plan.tty = false;
      break;
    case WorkerTty::kAuto:
      plan.tty = plan.console && !plan.file &&
                 isatty(stream == 1 ? STDOUT_FILENO : STDERR_FILENO) == 1;
      break;
  }
  return plan;
}

std::string WorkerGroup::Prefix(int local_rank, const std::string& rank,
                                const std::string& group_rank) const {
  const auto& o = config_.options;
  return ExpandTemplate(o.log_line_prefix_template,
                        {{"host", config_.NodeName()},
                         {"rank", rank},
                         {"local_rank", absl::StrCat(local_rank)},
                         {"group_rank", group_rank},
                         {"role_name", o.role}});
}

std::unique_ptr<WorkerOutput> WorkerGroup::MakeOutput(
    int local_rank, const std::string& prefix, int stream,
    const std::string& dir) const {
  const StreamPlan plan = PlanStream(local_rank, stream);
  int file = -1;
  if (plan.file) {
    file =
        open(absl::StrCat(dir, "/", stream == 1 ? "stdout.log" : "stderr.log")
                 .c_str(),
             O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  }
  Console* console = stream == 1 ? config_.out : config_.err;
  const DuplicateFilter& duplicate = duplicates_[stream - 1];
  return std::make_unique<WorkerOutput>(
      prefix, plan.console ? console : nullptr, file,
      duplicate.fd >= 0 ? &duplicate : nullptr);
}

std::vector<WorkerStart> WorkerGroup::Start(const v1::Assignment& a) {
  const auto& o = config_.options;
  workers_.clear();
  // By round, not restart count: a round whose restart was given back, or
  // opened for a membership change, must not overwrite an earlier one's
  // logs and error files.
  const std::string attempt_dir =
      absl::StrCat(config_.run_dir, "/attempt_", a.round());
  attempt_dir_ = attempt_dir;
  first_global_rank_ = static_cast<int>(a.first_global_rank());
  std::error_code ec;
  std::filesystem::remove_all(attempt_dir, ec);
  std::filesystem::create_directories(attempt_dir, ec);
  for (int stream : {1, 2}) {
    DuplicateFilter& d = duplicates_[stream - 1];
    if (d.fd >= 0) close(d.fd);
    d.fd = -1;
    d.filters = o.duplicate_filters[stream - 1];
    if (d.filters.empty()) continue;
    d.fd = open(absl::StrCat(attempt_dir, stream == 1 ? "/filtered_stdout.log"
                                                      : "/filtered_stderr.log")
                    .c_str(),
                O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  }
  std::vector<WorkerStart> started;
  for (int lr = 0; lr < o.local_world_size; ++lr) {
    started.push_back(Spawn(a, lr));
    if (started.back().pid < 0) break;
  }
  return started;
}

std::vector<WorkerStart> WorkerGroup::StartSome(
    const v1::Assignment& a, const std::vector<int>& local_ranks) {
  // The kept workers' files stay in the attempt they started in; the new
  // ones go to this round's.
  attempt_dir_ = absl::StrCat(config_.run_dir, "/attempt_", a.round());
  first_global_rank_ = static_cast<int>(a.first_global_rank());
  std::error_code ec;
  std::filesystem::create_directories(attempt_dir_, ec);
  std::vector<WorkerStart> started;
  for (int lr : local_ranks) {
    started.push_back(Spawn(a, lr));
    if (started.back().pid < 0) break;
  }
  return started;
}

std::vector<WorkerStart> WorkerGroup::StartParked() {
  const auto& o = config_.options;
  workers_.clear();
  attempt_dir_ = absl::StrCat(config_.run_dir, "/spare");
  std::error_code ec;
  std::filesystem::create_directories(attempt_dir_, ec);
  // What a parked worker knows already; its world comes with its slot.
  v1::Assignment none;
  none.set_job_id(o.run_id);
  none.set_max_restarts(o.max_restarts);
  std::vector<WorkerStart> started;
  for (int lr = 0; lr < o.local_world_size; ++lr) {
    started.push_back(Spawn(none, lr, /*parked=*/true));
    if (started.back().pid < 0) break;
  }
  return started;
}

WorkerStart WorkerGroup::Spawn(const v1::Assignment& a, int lr, bool parked) {
  const auto& o = config_.options;
  // Local rank 0 shares ctrun's process group when stdin is ctrun's
  // controlling terminal, so that it reads it (pdb, input()) as torchrun's
  // rank 0 can: while the job is in the terminal's foreground, and after
  // `fg` when it was not (it stops the job until then). Ctrl-C and Ctrl-Z
  // reach it with ctrun.
  const bool share_terminal =
      isatty(STDIN_FILENO) == 1 && tcgetsid(STDIN_FILENO) == getsid(0);
  const int rank = static_cast<int>(a.first_global_rank()) + lr;
  const std::string dir = absl::StrCat(attempt_dir_, "/", lr);
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  WorkerStart start;
  start.local_rank = lr;
  start.error_file = dir + "/error.json";
  EnvMap env = WorkerEnvironment(o, a, lr, config_.env, config_.store,
                                 config_.address, start.error_file);
  if (!config_.progress.board.empty()) {
    AddProgressEnvironment(o, config_.progress, lr, StacksFile(lr), &env);
  }
  if (o.recovery == Recovery::kInProcess || parked) {
    // A replacement must not find the round its predecessor was told of.
    std::filesystem::remove(WorldFile(lr), ec);
    if (o.recovery == Recovery::kInProcess) env[env::kRecovery] = "inprocess";
    env[env::kWorldFile] = WorldFile(lr);
  }
  if (parked) {
    for (const auto& [key, value] : WorldVariables(o, a, lr)) {
      if (key != env::kLocalRank && key != env::kLocalWorldSize) {
        env.erase(key);
      }
    }
    env[env::kSpare] = "1";
  }
  SpawnOptions spawn;
  spawn.own_group = !(share_terminal && lr == 0);
  spawn.tty_stdout = PlanStream(lr, 1).tty;
  spawn.tty_stderr = PlanStream(lr, 2).tty;
  spawn.window_from = isatty(STDOUT_FILENO) ? STDOUT_FILENO : STDERR_FILENO;
  if (lr < static_cast<int>(config_.bindings.size())) {
    spawn.binding = &config_.bindings[lr];
  }
  auto spawned = spawner_->Spawn(config_.worker_argv, env, spawn);
  if (!spawned.ok()) {
    start.error = std::string(spawned.status().message());
    start.wall_time = absl::Now();
    return start;
  }
  start.pid = spawned->pid;
  start.warm = spawned->warm;
  // A worker in ctrun's group dies with ctrun by its parent-death signal;
  // its group is not the watchdog's to kill.
  if (config_.watchdog && spawn.own_group) {
    config_.watchdog->Track(spawned->pid);
  }
  // A new entry even for a replacement: the one it replaces keeps its
  // outputs until its pipes are drained.
  Worker w;
  w.local_rank = lr;
  w.pid = spawned->pid;
  w.own_group = spawn.own_group;
  w.alive = true;
  const std::string prefix =
      parked ? Prefix(lr, "spare", "spare")
             : Prefix(lr, absl::StrCat(rank), absl::StrCat(a.group_rank()));
  w.out = MakeOutput(lr, prefix, 1, dir);
  w.err = MakeOutput(lr, prefix, 2, dir);
  workers_.push_back(std::move(w));
  AddPipe(spawned->stdout_fd, workers_.size() - 1, 1);
  AddPipe(spawned->stderr_fd, workers_.size() - 1, 2);
  return start;
}

std::string WorkerGroup::WorldFile(int local_rank) const {
  // In the agent's folder: removed with it, and never a reason to keep the
  // run directory.
  return absl::StrCat(config_.run_dir, "/", kAgentFolder, "/world_",
                      local_rank);
}

void WorkerGroup::WriteWorldFile(int local_rank, const std::string& text) {
  // Replaced whole, so that a worker reading it sees one version; if it
  // cannot be written, the kept worker misses the round: bounded.
  ReplaceFile(WorldFile(local_rank), text);
}

void WorkerGroup::EndRound(int64_t round) {
  for (const Worker& w : workers_) {
    if (w.alive) WriteWorldFile(w.local_rank, RoundEndingText(round));
  }
}

void WorkerGroup::HandOver(const v1::Assignment& a,
                           const std::vector<int>& local_ranks) {
  first_global_rank_ = static_cast<int>(a.first_global_rank());
  for (int lr : local_ranks) {
    WriteWorldFile(lr, WorldFileText(config_.options, a, lr));
    const std::string prefix = Prefix(lr, absl::StrCat(first_global_rank_ + lr),
                                      absl::StrCat(a.group_rank()));
    for (Worker& w : workers_) {
      if (!w.alive || w.local_rank != lr) continue;
      w.out->set_prefix(prefix);
      w.err->set_prefix(prefix);
    }
  }
}

void WorkerGroup::SignalOne(int local_rank, int signal) {
  for (const Worker& w : workers_) {
    if (w.alive && w.local_rank == local_rank) {
      kill(w.own_group ? -w.pid : w.pid, signal);
    }
  }
}

void WorkerGroup::AddPipe(int fd, size_t worker, int stream) {
  pipes_[fd] = {worker, stream};
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = static_cast<uint64_t>(fd);
  epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &ev);
}

void WorkerGroup::Signal(int signal) {
  for (const Worker& w : workers_) {
    if (w.alive) kill(w.own_group ? -w.pid : w.pid, signal);
  }
}

std::vector<WorkerExit> WorkerGroup::Reap() {
  std::vector<WorkerExit> exits;
  int status = 0;
  pid_t pid;
  rusage usage{};
  while ((pid = wait4(-1, &status, WNOHANG | WUNTRACED, &usage)) > 0) {
    if (config_.watchdog && pid == config_.watchdog->pid()) {
      config_.err->WriteAgentLine(
          "ctrun: the watchdog process exited; workers may outlive a crash "
          "of ctrun\n");
      continue;
    }
    auto it = std::find_if(workers_.begin(), workers_.end(),
                           [pid](const Worker& w) { return w.pid == pid; });
    // Anything else is an orphaned descendant (ctrun is a subreaper), or
    // another child of the agent's.
    if (it == workers_.end() || !it->alive) {
      if (!WIFSTOPPED(status)) other_exits_.push_back(pid);
      continue;
    }
    const bool on_terminal =
        WIFSTOPPED(status) &&
        (WSTOPSIG(status) == SIGTTIN || WSTOPSIG(status) == SIGTTOU);
    // Stopped otherwise (SIGSTOP, a debugger): it may be continued.
    if (WIFSTOPPED(status) && !on_terminal) continue;
    if (on_terminal && !it->own_group) {
      // In ctrun's group, it reads the terminal while ctrun is in the
      // background: the shell's job is to stop, all of it, until `fg`.
      terminal_stop_ = true;
      continue;
    }
    it->alive = false;
    // Its last words are in its pipes now, but the agent's loop may take
    // the exit before their readability: read them first, so that its
    // failure is classified (LastLines) on everything it said.
    DrainPipes(static_cast<size_t>(it - workers_.begin()));
    // What the worker left running in its group goes with it; what a
    // worker in ctrun's group left comes to ctrun (EndStrays).
    if (it->own_group) {
      kill(-it->pid, SIGKILL);
      if (config_.watchdog) config_.watchdog->Untrack(it->pid);
    }
    WorkerExit e;
    e.local_rank = it->local_rank;
    e.wall_time = absl::Now();
    e.peak_rss_bytes = static_cast<uint64_t>(usage.ru_maxrss) * 1024;
    if (on_terminal) {
      // A worker outside the terminal's foreground group would wait for it
      // forever; it ends as a failure instead (SIGKILLed with its group
      // above; its exit is reaped later and ignored).
      e.signal = WSTOPSIG(status);
      e.stopped_on_terminal = true;
    } else if (WIFSIGNALED(status)) {
      e.signal = WTERMSIG(status);
    } else {
      e.exit_code = WEXITSTATUS(status);
    }
    exits.push_back(e);
  }
  return exits;
}

void WorkerGroup::Abandon() {
  for (Worker& w : workers_) w.alive = false;
}

void WorkerGroup::OnReadable(int fd, absl::Time now) {
  Read(fd, kReadBudget, now);
}

void WorkerGroup::OnHangup(int fd) { Read(fd, 0, absl::InfinitePast()); }

void WorkerGroup::DrainPipes(size_t worker) {
  std::vector<int> fds;
  for (const auto& [fd, owner] : pipes_) {
    if (owner.first == worker) fds.push_back(fd);
  }
  // At most what a pipe holds (pipe-max-size): a descendant that keeps the
  // pipe open and writes does not keep the agent here.
  for (int fd : fds) Read(fd, size_t{1} << 20, absl::InfinitePast());
}

absl::Time WorkerGroup::PartialDue() const {
  absl::Time due = absl::InfiniteFuture();
  for (const Worker& w : workers_) {
    due = std::min({due, w.out->PartialDue(), w.err->PartialDue()});
  }
  return due;
}

void WorkerGroup::ShowPartials(absl::Time now) {
  for (Worker& w : workers_) {
    w.out->ShowPartial(now);
    w.err->ShowPartial(now);
  }
}

void WorkerGroup::Read(int fd, size_t budget, absl::Time now) {
  auto it = pipes_.find(fd);
  if (it == pipes_.end()) return;
  Worker& w = workers_[it->second.first];
  WorkerOutput& sink = it->second.second == 1 ? *w.out : *w.err;
  char buffer[16384];
  size_t total = 0;
  while (budget == 0 || total < budget) {
    const ssize_t n = read(fd, buffer, sizeof buffer);
    if (n > 0) {
      sink.Append(absl::string_view(buffer, static_cast<size_t>(n)), now);
      AddToTail(w, absl::string_view(buffer, static_cast<size_t>(n)));
      total += static_cast<size_t>(n);
      if (sink.Unread()) break;
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EAGAIN) return;
    ClosePipe(fd);  // EOF or error
    return;
  }
  if (sink.Unread()) ClosePipe(fd);
}

void WorkerGroup::AddToTail(Worker& w, absl::string_view bytes) {
  while (!bytes.empty()) {
    if (w.tail.empty() ||
        (!w.tail.back().empty() && w.tail.back().back() == '\n')) {
      w.tail.emplace_back();
      if (w.tail.size() > kTailLines) w.tail.pop_front();
    }
    const size_t eol = bytes.find('\n');
    const size_t take = eol == absl::string_view::npos ? bytes.size() : eol + 1;
    std::string& line = w.tail.back();
    const size_t room =
        line.size() < kTailLineBytes ? kTailLineBytes - line.size() : 0;
    line.append(bytes.data(), std::min(take, room));
    // A line cut at the bound still ends where the worker's did.
    if (take > room && eol != absl::string_view::npos) line.push_back('\n');
    bytes.remove_prefix(take);
  }
}

std::string WorkerGroup::StacksFile(int local_rank) const {
  return absl::StrCat(attempt_dir_, "/", local_rank, "/stacks.txt");
}

pid_t WorkerGroup::PidOf(int local_rank) const {
  for (const Worker& w : workers_) {
    if (w.local_rank == local_rank && w.alive) return w.pid;
  }
  return -1;
}

std::vector<std::string> WorkerGroup::LastLines(int local_rank) const {
  std::vector<std::string> lines;
  // The newest process of the local rank (in-process recovery may have
  // replaced one).
  for (auto it = workers_.rbegin(); it != workers_.rend(); ++it) {
    const Worker& w = *it;
    if (w.local_rank != local_rank) continue;
    for (std::string line : w.tail) {
      while (!line.empty() && (line.back() == '\n' || line.back() == '\r')) {
        line.pop_back();
      }
      lines.push_back(std::move(line));
    }
    break;
  }
  return lines;
}

void WorkerGroup::ClosePipe(int fd) {
  auto it = pipes_.find(fd);
  if (it == pipes_.end()) return;
  Worker& w = workers_[it->second.first];
  (it->second.second == 1 ? w.out : w.err)->Finish();
  epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, fd, nullptr);
  close(fd);
  pipes_.erase(it);
}

void WorkerGroup::Collect() {
  EndStrays();
  // The workers' last words; whatever is still open after that belongs to
  // something that outlived its worker.
  std::vector<int> fds;
  for (const auto& [fd, owner] : pipes_) fds.push_back(fd);
  for (int fd : fds) Read(fd, 0, absl::InfinitePast());
  fds.clear();
  for (const auto& [fd, owner] : pipes_) fds.push_back(fd);
  for (int fd : fds) ClosePipe(fd);
}

bool WorkerGroup::EndStrays() {
  // Orphaned descendants of workers were reparented to ctrun (a child
  // subreaper); end them and reap them. A few passes catch children that
  // were forked while we looked.
  const pid_t self = getpid();
  const pid_t watchdog = config_.watchdog ? config_.watchdog->pid() : -1;
  for (int pass = 0; pass < 5; ++pass) {
    bool found = false;
    for (pid_t pid : ChildrenOf(self)) {
      if (pid == watchdog || pid == spawner_->helper()) continue;
      const bool worker = std::any_of(
          workers_.begin(), workers_.end(),
          [pid](const Worker& w) { return w.pid == pid && w.alive; });
      if (worker) continue;  // still running
      found = true;
      kill(pid, SIGKILL);
      waitpid(pid, nullptr, WNOHANG);
    }
    if (!found) return true;
    absl::SleepFor(absl::Milliseconds(10));
  }
  return false;
}

}  // namespace ctrun
