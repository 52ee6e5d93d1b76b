// The root-cause summary printed when a job fails, in the spirit of
// torchrun's: which worker failed first, how, and the traceback a Python
// worker recorded in its error file.
#ifndef CTRUN_LAUNCHER_POLICY_FAILURE_REPORT_H_
#define CTRUN_LAUNCHER_POLICY_FAILURE_REPORT_H_

#include <sys/types.h>

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "ctrun/v1/rendezvous.pb.h"

namespace ctrun {

// ctrun's exit code when a hang ended the job (as timeout(1) exits).
inline constexpr int kHangExitCode = 124;
// ctrun's exit code when attempts in a row made no progress: requeueing
// the job would not help (sysexits' EX_CONFIG).
inline constexpr int kNoProgressExitCode = 78;

struct WorkerFailureRecord {
  absl::Time time;  // when the agent saw it exit
  std::string host;
  int rank = 0;
  int local_rank = 0;
  int exit_code = 0;  // as the process reported it; 0 when killed
  int signal = 0;     // the signal that killed it, or 0
  pid_t pid = 0;
  std::string error_file;
  // What ended it, when ctrun did: a hang, an expired file timer.
  std::string cause;
  bool hung = false;  // it was hung (still running when recorded)
  // Its stacks show it waiting in a collective for another rank.
  bool waiting = false;
  // Recorded by another node (the job's root cause, as the rendezvous
  // told it): its error file is there, not here.
  bool remote = false;
  // What it most likely was (classify_failure.h), and the line that said.
  v1::FailureClass failure_class = v1::OTHER;
  std::string error{};
  // Its attempt made no progress on this node (WorkerFailure.no_progress).
  bool no_progress = false;

  // The code ctrun exits with for this failure: kHangExitCode for a hang,
  // else its exit code, or 128 + signal.
  int ExitCode() const {
    return hung ? kHangExitCode : signal != 0 ? 128 + signal : exit_code;
  }
};

// What a worker wrote to TORCHELASTIC_ERROR_FILE (torch's
// `@record` format: {"message": {"message": ..., "extraInfo":
// {"py_callstack": ..., "timestamp": ...}}} or {"message": "..."}).
struct ErrorFileContents {
  std::string message;
  std::string traceback;
};

// NOT_FOUND when the worker wrote no file; INVALID_ARGUMENT when it is not
// JSON of that shape, or not a regular file of at most 1 MiB (a FIFO put
// there is never waited on).
absl::StatusOr<ErrorFileContents> ReadErrorFile(const std::string& path);

// The summary block: `failures` in the order seen, the first being the root
// cause. `title` names the entrypoint.
std::string FormatFailureSummary(
    const std::string& title, const std::vector<WorkerFailureRecord>& failures);

}  // namespace ctrun

#endif  // CTRUN_LAUNCHER_POLICY_FAILURE_REPORT_H_
