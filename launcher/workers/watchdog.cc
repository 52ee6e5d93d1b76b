#include "launcher/workers/watchdog.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "ctrun/environment.h"
#include "launcher/workers/proc.h"

namespace ctrun {
namespace {

// The record that says AllEnded (the others are +pgid, -pgid).
constexpr int32_t kAllEnded = 0;

// The watchdog's whole life: collect process groups, and kill those left
// when the agent's end of the pipe closes, then every marked process.
[[noreturn]] void RunWatchdog(int fd, const std::string& marked,
                              const std::string& temporary_dir) {
  // Terminal signals reach the agent's process group, this one included;
  // the watchdog must outlive the agent, and stay awake to end its workers
  // even while the job is stopped (Ctrl-Z), so it ignores them.
  for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2, SIGPIPE,
                  SIGTSTP, SIGTTIN, SIGTTOU}) {
    signal(sig, SIG_IGN);
  }
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, nullptr);
  prctl(PR_SET_NAME, "ctrun-watchdog");
  std::set<pid_t> groups;
  bool all_ended = false;  // the agent said so, and started nothing since
  int32_t record;
  while (true) {
    const ssize_t n = read(fd, &record, sizeof record);
    if (n < 0 && errno == EINTR) continue;
    if (n != sizeof record) break;  // EOF: the agent is gone
    if (record > 0) groups.insert(record);
    if (record < 0) groups.erase(-record);
    all_ended = record == kAllEnded;
  }
  for (pid_t pgid : groups) kill(-pgid, SIGKILL);
  // The sweep reads every process's environment on the machine: after an
  // agent that ended its own descendants (a subreaper, every orphan came to
  // it) it would find nothing, at a cost that grows with the machine.
  if (all_ended && groups.empty()) {
    if (!temporary_dir.empty()) RemoveUnlessKept(temporary_dir);
    _exit(0);
  }
  // A few passes catch what was forked while we looked. One empty pass is
  // not enough: a process in the middle of execve shows an empty environ
  // for a moment (its new stack is not set up yet), and would be missed
  // (the "descendants that left the session" flake). Two in a row, a moment
  // apart, are.
  int empty_passes = 0;
  for (int pass = 0; pass < 12; ++pass) {
    const int left = KillProcessesWithEnvironment(marked);
    empty_passes = left == 0 ? empty_passes + 1 : 0;
    if (empty_passes == 2) break;
    usleep(left == 0 ? 2'000 : 20'000);
  }
  // An agent that exited normally removed it already, or kept it for a
  // reason; one that was killed could not.
  if (!temporary_dir.empty()) RemoveUnlessKept(temporary_dir);
  _exit(0);
}

}  // namespace

bool RemoveUnlessKept(const std::string& dir) {
  std::error_code ec;
  for (auto it = std::filesystem::recursive_directory_iterator(dir, ec);
       it != std::filesystem::recursive_directory_iterator();
       it.increment(ec)) {
    if (it->path().filename() == kAgentFolder) {
      it.disable_recursion_pending();
      continue;
    }
    if (it->is_regular_file(ec) && it->file_size(ec) > 0) return true;
  }
  std::filesystem::remove_all(dir, ec);
  return false;
}

absl::StatusOr<Watchdog> Watchdog::Start(const std::string& mark,
                                         const std::string& temporary_dir) {
  // Prepared before the fork: the child only reads it.
  const std::string marked = absl::StrCat(env::kContainmentMark, "=", mark);
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) {
    return absl::InternalError(
        absl::StrCat("pipe for the watchdog: ", strerror(errno)));
  }
  const pid_t pid = fork();
  if (pid < 0) {
    return absl::InternalError(
        absl::StrCat("fork of the watchdog: ", strerror(errno)));
  }
  if (pid == 0) {
    close(fds[1]);
    RunWatchdog(fds[0], marked, temporary_dir);
  }
  close(fds[0]);
  return Watchdog(pid, fds[1]);
}

Watchdog::Watchdog(Watchdog&& other) noexcept
    : pid_(std::exchange(other.pid_, -1)), fd_(std::exchange(other.fd_, -1)) {}

Watchdog::~Watchdog() {
  if (fd_ >= 0) close(fd_);
  // Its sweep is bounded (RunWatchdog), so this wait is too.
  if (pid_ > 0) {
    while (waitpid(pid_, nullptr, 0) < 0 && errno == EINTR) {
    }
  }
}

void Watchdog::Send(int32_t record) {
  if (fd_ < 0) return;
  // 4 bytes are below PIPE_BUF: one write, never split.
  while (write(fd_, &record, sizeof record) < 0 && errno == EINTR) {
  }
}

void Watchdog::Track(pid_t pgid) { Send(pgid); }
void Watchdog::AllEnded() { Send(kAllEnded); }
void Watchdog::Untrack(pid_t pgid) { Send(-pgid); }

}  // namespace ctrun
