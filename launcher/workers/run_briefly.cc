#include "launcher/workers/run_briefly.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"

extern char** environ;

namespace ctrun {
namespace {

constexpr size_t kMaxOutput = 64 * 1024;
// Once the command has exited, its output still in the pipe is read for at
// most this long (a process it left behind may keep the pipe open).
constexpr absl::Duration kDrainAfterExit = absl::Milliseconds(200);

// Whether `child` has exited, without reaping it.
bool Exited(pid_t child) {
  siginfo_t info{};
  return waitid(P_PID, static_cast<id_t>(child), &info,
                WEXITED | WNOHANG | WNOWAIT) != 0 ||
         info.si_pid == child;
}

}  // namespace

absl::StatusOr<std::string> RunBriefly(const std::vector<std::string>& argv,
                                       absl::Duration timeout,
                                       std::atomic<pid_t>* running) {
  const std::string command = absl::StrJoin(argv, " ");
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) {
    return absl::InternalError(
        absl::StrCat("cannot run ", command, ": pipe: ", strerror(errno)));
  }
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null",
                                   O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&actions, fds[1], STDOUT_FILENO);
  posix_spawn_file_actions_adddup2(&actions, fds[1], STDERR_FILENO);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  sigset_t none;
  sigemptyset(&none);
  posix_spawnattr_setsigmask(&attr, &none);  // the agent blocks its signals
  posix_spawnattr_setpgroup(&attr, 0);
  posix_spawnattr_setflags(&attr,
                           POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGMASK);
  std::vector<char*> args;
  for (const std::string& a : argv)
    args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t child = -1;
  const int rc = posix_spawnp(&child, argv[0].c_str(), &actions, &attr,
                              args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  close(fds[1]);
  if (rc != 0) {
    close(fds[0]);
    return absl::InternalError(
        absl::StrCat("cannot run ", command, ": ", strerror(rc)));
  }
  if (running != nullptr) running->store(child);
  // The command's end is its exit, not the end of its output: a process it
  // left in the background may hold the pipe for ever. Its exit is seen
  // through a pidfd (which works whoever reaps it), or, on kernels before
  // 5.3, by polling for it.
  const int pidfd = static_cast<int>(syscall(SYS_pidfd_open, child, 0));
  std::string output;
  const absl::Time deadline = absl::Now() + timeout;
  absl::Time drain_until = absl::InfiniteFuture();
  bool timed_out = false, exited = false;
  for (;;) {
    const absl::Time now = absl::Now();
    if (now >= deadline && !exited) {
      timed_out = true;
      break;
    }
    if (now >= drain_until) break;
    pollfd p[2] = {{fds[0], POLLIN, 0}, {pidfd, POLLIN, 0}};
    const absl::Duration left = std::min(deadline, drain_until) - now;
    int wait_ms = static_cast<int>(absl::ToInt64Milliseconds(left)) + 1;
    if (pidfd < 0 && !exited) wait_ms = std::min(wait_ms, 10);
    const int ready = poll(p, pidfd < 0 ? 1 : 2, wait_ms);
    if (ready < 0 && errno != EINTR) break;
    if (!exited && (pidfd >= 0 ? p[1].revents != 0 : Exited(child))) {
      // What it wrote before it exited is in the pipe: read that, briefly.
      exited = true;
      drain_until = absl::Now() + kDrainAfterExit;
    }
    if (ready <= 0 || p[0].revents == 0) continue;
    char buffer[4096];
    const ssize_t n = read(fds[0], buffer, sizeof buffer);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      if (exited) break;  // all of it read
      // End of output before the exit: wait for the exit alone.
      close(fds[0]);
      fds[0] = -1;
      continue;
    }
    // The end is what matters (a health check's last line and status):
    // the first bytes give way.
    output.append(buffer, static_cast<size_t>(n));
    if (output.size() > 2 * kMaxOutput)
      output.erase(0, output.size() - kMaxOutput);
  }
  if (fds[0] >= 0) close(fds[0]);
  if (pidfd >= 0) close(pidfd);
  if (output.size() > kMaxOutput) output.erase(0, output.size() - kMaxOutput);
  // Whatever it left running ends with it (its process group, which the
  // unreaped command still holds, so the id names no other group).
  kill(-child, SIGKILL);
  int status = 0;
  pid_t waited;
  while ((waited = waitpid(child, &status, 0)) < 0 && errno == EINTR) {
  }
  if (running != nullptr) running->store(0);
  // A loop that reaps every child (the agent's) may have taken its status
  // first: the command ended, how is not known here.
  if (waited < 0 && !timed_out) return output;
  const std::string said(absl::StripAsciiWhitespace(output));
  if (timed_out) {
    return absl::InternalError(absl::StrCat(command, " did not end within ",
                                            absl::FormatDuration(timeout)));
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    return absl::InternalError(absl::StrCat(
        command, " failed",
        WIFEXITED(status) ? absl::StrCat(" (exit ", WEXITSTATUS(status), ")")
                          : std::string(" (killed)"),
        said.empty() ? "" : ": ", said));
  }
  return output;
}

}  // namespace ctrun
