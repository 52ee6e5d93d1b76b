// What a worker's failure most likely was, read from what its agent sees:
// how it ended, the message of its error file (torch's @record) and its
// last output lines. The class decides whether the job restarts for it
// (ctrun --restart_on); the line that decided it goes into the failure's
// message, the summary and the event log.
#ifndef CTRUN_LAUNCHER_POLICY_CLASSIFY_FAILURE_H_
#define CTRUN_LAUNCHER_POLICY_CLASSIFY_FAILURE_H_

#include <string>
#include <vector>

#include "ctrun/v1/rendezvous.pb.h"

namespace ctrun {

struct FailureFacts {
  int exit_code = 0;
  int signal = 0;  // the signal that killed it, or 0
  bool hung = false;
  // The kernel's OOM killer ended it (its cgroup counted an OOM kill).
  bool oom_killed = false;
  std::string error_message;            // from its error file; may be empty
  std::vector<std::string> last_lines;  // its last output lines, oldest first
};

struct ClassifiedFailure {
  v1::FailureClass failure_class = v1::OTHER;
  // The line that decided, at most 200 bytes: a Python exception's last
  // line ("ModuleNotFoundError: No module named 'x'") or the marker's line
  // ("... CUDA out of memory. Tried to allocate ..."); empty when the
  // exit alone decided.
  std::string error;
};

// In order: a hang; an OOM kill; the text's markers of running out of
// memory, of a hardware or driver fault, of a communication failure; a
// Python exception that is a user's error (ImportError and
// ModuleNotFoundError, SyntaxError and its kind, FileNotFoundError) or
// argparse's refusal; a signal from outside (SIGKILL, SIGTERM, SIGINT,
// SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2; a crash's own SIGSEGV, SIGABRT, ... is
// not); exit code 2 (a bad argument, Python's missing script), 126 or 127
// (the program cannot run); anything else.
ClassifiedFailure ClassifyFailure(const FailureFacts& facts);

}  // namespace ctrun

#endif  // CTRUN_LAUNCHER_POLICY_CLASSIFY_FAILURE_H_
