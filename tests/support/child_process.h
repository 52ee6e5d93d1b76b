// ChildProcess: a real process for integration tests, ended by its pid.
//
// The child runs in its own process group with its stdout on a pipe (read
// line by line with a timeout) and its stderr in a file. The destructor
// SIGKILLs the group and reaps the child, so a failing test leaks nothing;
// a test binary that is itself killed takes the child along (parent-death
// signal). Create it on a thread that outlives it (the test's own).
#ifndef CTRUN_TESTS_SUPPORT_CHILD_PROCESS_H_
#define CTRUN_TESTS_SUPPORT_CHILD_PROCESS_H_

#include <sys/types.h>

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/time/time.h"

namespace ctrun::testing {

// This process's environment with `overrides` ("NAME=VALUE") in place of
// the variables they name, for a child's execve.
std::vector<std::string> EnvironmentWith(std::vector<std::string> overrides);

// How many times `pattern` (a regular expression) matches in `text`.
int CountMatches(const std::string& text, const std::string& pattern);

// A process as /proc/PID/stat shows it.
struct ProcessInfo {
  pid_t pid = -1;
  std::string command;
  char state = '?';  // 'R', 'S', 'T' (stopped), 'Z' (a zombie), ...
  pid_t group = -1;
  pid_t session = -1;
};
// Every process of this machine now.
std::vector<ProcessInfo> AllProcesses();

// The CPU ticks (user + system, 1/100 s) process `pid` has used; 0 when it
// cannot be read.
long CpuTicks(pid_t pid);
// Waits up to `grace` for the live (not zombie) processes that `of` selects
// to end by themselves, then SIGKILLs those left. Something a test's child
// left behind may still be at work (ctrun's watchdog removing a run
// directory); killing it at once would leave that work half done.
void EndProcesses(const std::function<bool(const ProcessInfo&)>& of,
                  absl::Duration grace);

// Waits up to `timeout` for child `pid` to exit and reaps it; its exit code
// (128 + signal if killed), or nullopt if it still runs. `meanwhile` runs
// between looks (a short sleep when none is given).
std::optional<int> ReapWithin(pid_t pid, absl::Duration timeout,
                              const std::function<void()>& meanwhile = {});

class ChildProcess {
 public:
  // Starts `argv` (argv[0] is a path) with this process's environment plus
  // `env` ("NAME=VALUE", overriding). Aborts the test binary if fork fails.
  explicit ChildProcess(std::vector<std::string> argv,
                        std::vector<std::string> env = {});
  ~ChildProcess();
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  pid_t pid() const { return pid_; }

  // The next stdout line, or nullopt at EOF or after `timeout`.
  std::optional<std::string> ReadLine(absl::Duration timeout);
  // Reads lines until one contains `needle`; returns it, or nullopt.
  std::optional<std::string> WaitForLine(const std::string& needle,
                                         absl::Duration timeout);

  void Signal(int signal) const;
  // Waits for the exit; returns the exit code (128 + signal if killed), or
  // nullopt after `timeout`.
  std::optional<int> Wait(absl::Duration timeout);
  // Reads all of stdout until EOF or `timeout`.
  std::string ReadAll(absl::Duration timeout);

  // Everything the child wrote to stderr so far.
  std::string Stderr() const;
  // Whether stderr contains `needle` within `timeout`.
  bool StderrContains(const std::string& needle, absl::Duration timeout) const;

 private:
  pid_t pid_ = -1;
  int stdout_fd_ = -1;
  std::string stderr_path_;
  std::string buffer_;
  std::optional<int> exit_code_;
};

}  // namespace ctrun::testing

#endif  // CTRUN_TESTS_SUPPORT_CHILD_PROCESS_H_
