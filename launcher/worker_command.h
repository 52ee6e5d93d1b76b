// The command every worker runs, from the entrypoint and its flags.
#ifndef CTRUN_LAUNCHER_WORKER_COMMAND_H_
#define CTRUN_LAUNCHER_WORKER_COMMAND_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "launcher/command_line.h"
#include "launcher/launch_options.h"

namespace ctrun {

// -m MOD       -> PYTHON -u -m MOD ARGS
// SCRIPT.py    -> PYTHON -u SCRIPT.py ARGS   (unless --no_python)
// anything else-> PROGRAM ARGS, found like a shell finds it (PATH)
// PYTHON is $PYTHON_EXEC, else python3 from PATH. argv[0] is the resolved
// path. INVALID_ARGUMENT, one line, when the script or program does not
// exist or cannot be executed, or there is no Python.
absl::StatusOr<std::vector<std::string>> ResolveWorkerCommand(
    const LaunchOptions& options, const EnvMap& env);

}  // namespace ctrun

#endif  // CTRUN_LAUNCHER_WORKER_COMMAND_H_
