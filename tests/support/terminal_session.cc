#include "tests/support/terminal_session.h"

#include <fcntl.h>
#include <poll.h>
#include <pty.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/time/clock.h"
#include "tests/support/child_process.h"

namespace ctrun::testing {
TerminalSession::TerminalSession(std::vector<std::string> argv,
                                 std::vector<std::string> overrides) {
  std::vector<std::string> env = EnvironmentWith(std::move(overrides));
  std::vector<char*> envp;
  for (auto& e : env) envp.push_back(e.data());
  envp.push_back(nullptr);
  std::vector<char*> args;
  for (auto& a : argv) args.push_back(a.data());
  args.push_back(nullptr);
  winsize size{};
  size.ws_row = 24;
  size.ws_col = 80;
  pid_ = forkpty(&master_, nullptr, nullptr, &size);
  if (pid_ < 0) std::abort();
  if (pid_ == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    execve(args[0], args.data(), envp.data());
    std::perror("execve");
    _exit(127);
  }
  fcntl(master_, F_SETFL, O_NONBLOCK);
  fcntl(master_, F_SETFD, FD_CLOEXEC);
}

TerminalSession::~TerminalSession() {
  const pid_t session = pid_;
  EndProcesses([session](const ProcessInfo& p) { return p.session == session; },
               exit_code_ ? absl::Seconds(2) : absl::ZeroDuration());
  if (!exit_code_) waitpid(pid_, nullptr, 0);
  close(master_);
}

void TerminalSession::Type(const std::string& text) {
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = write(master_, text.data() + done, text.size() - done);
    if (n > 0) {
      done += static_cast<size_t>(n);
    } else if (n < 0 && errno != EINTR && errno != EAGAIN) {
      return;
    }
  }
}

bool TerminalSession::Read(absl::Duration timeout) {
  pollfd p{master_, POLLIN, 0};
  const int ms = static_cast<int>(absl::ToInt64Milliseconds(timeout));
  if (poll(&p, 1, ms) <= 0) return true;
  char buffer[4096];
  while (true) {
    const ssize_t n = read(master_, buffer, sizeof buffer);
    if (n > 0) {
      screen_.append(buffer, static_cast<size_t>(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    return n < 0 && errno == EAGAIN;  // EIO: no process holds the terminal
  }
}

bool TerminalSession::WaitFor(const std::string& needle, absl::Duration timeout,
                              size_t from) {
  const absl::Time deadline = absl::Now() + timeout;
  while (true) {
    if (screen_.size() > from &&
        screen_.find(needle, from) != std::string::npos)
      return true;
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) return false;
    if (!Read(std::min(left, absl::Milliseconds(50)))) {
      return screen_.find(needle, from) != std::string::npos;
    }
  }
}

std::optional<int> TerminalSession::Wait(absl::Duration timeout) {
  if (exit_code_) return exit_code_;
  // The terminal is drained meanwhile: a child blocked writing to a full
  // pty would never exit.
  exit_code_ = ReapWithin(pid_, timeout, [this] {
    if (!Read(absl::Milliseconds(20))) absl::SleepFor(absl::Milliseconds(20));
  });
  if (exit_code_) Read(absl::ZeroDuration());
  return exit_code_;
}

std::vector<ProcessInfo> TerminalSession::Members() const {
  std::vector<ProcessInfo> members;
  for (ProcessInfo& p : AllProcesses()) {
    if (p.session == pid_) members.push_back(std::move(p));
  }
  return members;
}

}  // namespace ctrun::testing
