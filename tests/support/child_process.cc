#include "tests/support/child_process.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

extern char** environ;

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>

#include "absl/time/clock.h"
#include "launcher/workers/proc.h"

namespace ctrun::testing {

std::vector<std::string> EnvironmentWith(std::vector<std::string> overrides) {
  std::vector<std::string> env = overrides;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string entry = *e;
    const std::string name = entry.substr(0, entry.find('='));
    bool overridden = false;
    for (const auto& o : overrides) overridden |= o.rfind(name + "=", 0) == 0;
    if (!overridden) env.push_back(entry);
  }
  return env;
}

ChildProcess::ChildProcess(std::vector<std::string> argv,
                           std::vector<std::string> overrides) {
  // Built before fork: the child only execs. It must not allocate: another
  // thread of this process (gRPC's) may have held the allocator's lock at
  // the fork, and the sanitizers' allocator, unlike glibc's, does not take
  // its locks around fork, so the child would wait for ever.
  std::vector<std::string> env = EnvironmentWith(std::move(overrides));
  std::vector<char*> envp;
  for (auto& e : env) envp.push_back(e.data());
  envp.push_back(nullptr);
  std::vector<char*> args;
  for (auto& a : argv) args.push_back(a.data());
  args.push_back(nullptr);
  std::string path =
      std::filesystem::temp_directory_path() / "ctrun-test-stderr-XXXXXX";
  const int err_fd = mkstemp(path.data());
  stderr_path_ = path;
  int out[2];
  if (err_fd < 0 || pipe2(out, O_CLOEXEC) != 0) std::abort();
  pid_ = fork();
  if (pid_ < 0) std::abort();
  if (pid_ == 0) {
    setpgid(0, 0);
    // A test binary killed outright (a timeout, a crash) takes its children
    // along; PDEATHSIG follows the forking thread, which outlives the child.
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    dup2(out[1], STDOUT_FILENO);
    dup2(err_fd, STDERR_FILENO);
    execve(args[0], args.data(), envp.data());
    static constexpr char kFailed[] = "execve of the test's child failed\n";
    (void)!write(STDERR_FILENO, kFailed, sizeof kFailed - 1);
    _exit(127);
  }
  setpgid(pid_, pid_);  // also here, so that the group exists on return
  close(out[1]);
  close(err_fd);
  stdout_fd_ = out[0];
}

std::vector<ProcessInfo> AllProcesses() {
  std::vector<ProcessInfo> all;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/proc", ec)) {
    const std::string name = entry.path().filename();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    const std::string stat = ReadProcFile("/proc/" + name + "/stat");
    // The command is in parentheses, which it may itself contain.
    const size_t open = stat.find('('), close = stat.rfind(')');
    if (open == std::string::npos || close == std::string::npos) continue;
    ProcessInfo p;
    p.pid = static_cast<pid_t>(std::stol(name));
    p.command = stat.substr(open + 1, close - open - 1);
    std::istringstream rest(stat.substr(close + 1));
    long parent = 0, group = 0, session = 0;
    rest >> p.state >> parent >> group >> session;
    if (!rest) continue;
    p.group = static_cast<pid_t>(group);
    p.session = static_cast<pid_t>(session);
    all.push_back(std::move(p));
  }
  return all;
}

void EndProcesses(const std::function<bool(const ProcessInfo&)>& of,
                  absl::Duration grace) {
  const absl::Time deadline = absl::Now() + grace;
  while (true) {
    std::vector<pid_t> left;
    for (const ProcessInfo& p : AllProcesses()) {
      if (p.state != 'Z' && of(p)) left.push_back(p.pid);
    }
    if (left.empty()) return;
    if (absl::Now() >= deadline) {
      for (pid_t pid : left) kill(pid, SIGKILL);
      return;
    }
    absl::SleepFor(absl::Milliseconds(10));
  }
}

ChildProcess::~ChildProcess() {
  if (!exit_code_) {
    kill(-pid_, SIGKILL);
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  } else {
    // Anything the child left in its group.
    const pid_t group = pid_;
    EndProcesses([group](const ProcessInfo& p) { return p.group == group; },
                 absl::Seconds(2));
  }
  close(stdout_fd_);
  unlink(stderr_path_.c_str());
}

std::optional<std::string> ChildProcess::ReadLine(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (true) {
    if (size_t nl = buffer_.find('\n'); nl != std::string::npos) {
      std::string line = buffer_.substr(0, nl);
      buffer_.erase(0, nl + 1);
      return line;
    }
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) return std::nullopt;
    pollfd p{stdout_fd_, POLLIN, 0};
    const int ready =
        poll(&p, 1, static_cast<int>(absl::ToInt64Milliseconds(left)) + 1);
    if (ready < 0 && errno == EINTR) continue;
    if (ready <= 0) return std::nullopt;
    char chunk[4096];
    const ssize_t n = read(stdout_fd_, chunk, sizeof chunk);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return std::nullopt;
    buffer_.append(chunk, static_cast<size_t>(n));
  }
}

std::string ChildProcess::ReadAll(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  std::string out;
  while (auto line = ReadLine(deadline - absl::Now())) out += *line + "\n";
  return out;
}

std::optional<std::string> ChildProcess::WaitForLine(const std::string& needle,
                                                     absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (true) {
    auto line = ReadLine(deadline - absl::Now());
    if (!line) return std::nullopt;
    if (line->find(needle) != std::string::npos) return line;
  }
}

void ChildProcess::Signal(int signal) const { kill(pid_, signal); }

std::optional<int> ReapWithin(pid_t pid, absl::Duration timeout,
                              const std::function<void()>& meanwhile) {
  const absl::Time deadline = absl::Now() + timeout;
  while (true) {
    int status = 0;
    if (waitpid(pid, &status, WNOHANG) == pid) {
      return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    }
    if (absl::Now() >= deadline) return std::nullopt;
    if (meanwhile) {
      meanwhile();
    } else {
      absl::SleepFor(absl::Milliseconds(5));
    }
  }
}

std::optional<int> ChildProcess::Wait(absl::Duration timeout) {
  if (!exit_code_) exit_code_ = ReapWithin(pid_, timeout);
  return exit_code_;
}

std::string ChildProcess::Stderr() const {
  std::ifstream in(stderr_path_);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

}  // namespace ctrun::testing

namespace ctrun::testing {

bool ChildProcess::StderrContains(const std::string& needle,
                                  absl::Duration timeout) const {
  const absl::Time deadline = absl::Now() + timeout;
  while (Stderr().find(needle) == std::string::npos) {
    if (absl::Now() >= deadline) return false;
    absl::SleepFor(absl::Milliseconds(10));
  }
  return true;
}

int CountMatches(const std::string& text, const std::string& pattern) {
  std::regex re(pattern);
  return static_cast<int>(
      std::distance(std::sregex_iterator(text.begin(), text.end(), re),
                    std::sregex_iterator()));
}

long CpuTicks(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string stat((std::istreambuf_iterator<char>(in)),
                   std::istreambuf_iterator<char>());
  const size_t paren = stat.rfind(')');
  if (paren == std::string::npos) return 0;
  std::istringstream rest(stat.substr(paren + 2));
  std::string field;
  long ticks = 0;
  for (int i = 3; i <= 15 && rest >> field; ++i) {
    if (i == 14 || i == 15) ticks += std::stol(field);
  }
  return ticks;
}

}  // namespace ctrun::testing
