// TerminalSession: a real process on a pseudo-terminal of its own, as a
// user's shell or program runs on a terminal, for end-to-end tests of what
// only a terminal shows: prompts, job control (Ctrl-Z, fg, bg), isatty.
//
// The child leads a new session whose controlling terminal is the pty (its
// process group in the terminal's foreground); what it and its descendants
// write is read from the master, what a test writes there is typed. The
// destructor SIGKILLs every process of the session (after a short grace
// when the child has exited) and reaps the child, so a failing test leaks
// nothing; a test binary that is itself killed takes
// the child along (parent-death signal). Create it on a thread that
// outlives it (the test's own).
#ifndef CTRUN_TESTS_SUPPORT_TERMINAL_SESSION_H_
#define CTRUN_TESTS_SUPPORT_TERMINAL_SESSION_H_

#include <sys/types.h>

#include <optional>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "tests/support/child_process.h"

namespace ctrun::testing {

class TerminalSession {
 public:
  // Starts `argv` (argv[0] is a path) with this process's environment plus
  // `env` ("NAME=VALUE", overriding) on an 80x24 terminal. Aborts the test
  // binary if the pty or the fork fails.
  explicit TerminalSession(std::vector<std::string> argv,
                           std::vector<std::string> env = {});
  ~TerminalSession();
  TerminalSession(const TerminalSession&) = delete;
  TerminalSession& operator=(const TerminalSession&) = delete;

  pid_t pid() const { return pid_; }

  // Types `text` (a control character such as "\x1a", Ctrl-Z, included).
  void Type(const std::string& text);
  // Reads the terminal until everything read after the first `from` bytes
  // contains `needle`; whether it did within `timeout`.
  bool WaitFor(const std::string& needle, absl::Duration timeout,
               size_t from = 0);
  // Everything the terminal showed so far (what is typed is echoed).
  const std::string& Screen() const { return screen_; }

  // Waits for the child's exit; its code (128 + signal if killed), or
  // nullopt after `timeout`. The terminal is read meanwhile.
  std::optional<int> Wait(absl::Duration timeout);

  // The processes of the session now.
  std::vector<ProcessInfo> Members() const;

 private:
  // Reads what the terminal holds, waiting up to `timeout` for the first
  // byte; false once it is closed.
  bool Read(absl::Duration timeout);

  pid_t pid_ = -1;
  int master_ = -1;
  std::string screen_;
  std::optional<int> exit_code_;
};

}  // namespace ctrun::testing

#endif  // CTRUN_TESTS_SUPPORT_TERMINAL_SESSION_H_
