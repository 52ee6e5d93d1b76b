#include "launcher/workers/run_briefly.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
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
  std::string output;
  const absl::Time deadline = absl::Now() + timeout;
  bool timed_out = false;
  for (;;) {
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) {
      timed_out = true;
      break;
    }
    pollfd p{fds[0], POLLIN, 0};
    const int ready =
        poll(&p, 1, static_cast<int>(absl::ToInt64Milliseconds(left)) + 1);
    if (ready < 0 && errno == EINTR) continue;
    if (ready <= 0) continue;
    char buffer[4096];
    const ssize_t n = read(fds[0], buffer, sizeof buffer);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;  // EOF: the command closed its output
    // The end is what matters (a health check's last line and status):
    // the first bytes give way.
    output.append(buffer, static_cast<size_t>(n));
    if (output.size() > 2 * kMaxOutput)
      output.erase(0, output.size() - kMaxOutput);
  }
  close(fds[0]);
  if (output.size() > kMaxOutput) output.erase(0, output.size() - kMaxOutput);
  if (timed_out) kill(-child, SIGKILL);
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
