// The run directory: where one agent's per-attempt logs, error files and
// hang evidence go (--log_dir/RUN_ID_XXXXXX, or $TMPDIR/ctrun-XXXXXX).
#ifndef CTRUN_LAUNCHER_RUN_DIRECTORY_H_
#define CTRUN_LAUNCHER_RUN_DIRECTORY_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace ctrun {

// The folder name that stands for job `run_id` under --log_dir: one path
// component whatever the id holds ('/' becomes '_', so "../x" or "a/b"
// cannot leave the log directory or make folders), at most 200 bytes (with
// mkdtemp's suffix it stays under NAME_MAX), never empty.
std::string RunFolderName(absl::string_view run_id);

// Creates this run's directory: `log_dir`/RunFolderName(run_id)_XXXXXX when
// `log_dir` is given (INVALID_ARGUMENT naming --log_dir when it cannot be),
// else $TMPDIR/ctrun-XXXXXX (INTERNAL when it cannot be).
absl::StatusOr<std::string> MakeRunDirectory(const std::string& log_dir,
                                             absl::string_view run_id);

}  // namespace ctrun

#endif  // CTRUN_LAUNCHER_RUN_DIRECTORY_H_
