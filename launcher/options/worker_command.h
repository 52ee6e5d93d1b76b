// The command every worker runs, from the entrypoint and its flags.
#ifndef CTRUN_LAUNCHER_OPTIONS_WORKER_COMMAND_H_
#define CTRUN_LAUNCHER_OPTIONS_WORKER_COMMAND_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "launcher/options/command_line.h"
#include "launcher/options/launch_options.h"

namespace ctrun {

// The Python a .py entrypoint or -m module runs under, and why that one:
// $PYTHON_EXEC; else the python3 beside ctrun's own executable when that
// folder is a virtualenv's or conda environment's bin (`ctrun_dir`: the
// venv's own ctrun run by its path, as torchrun's #! line would run the
// venv's Python); else the python3 of the active virtualenv ($VIRTUAL_ENV)
// or conda environment ($CONDA_PREFIX); else the interpreter of the
// torchrun on PATH (its #! line: the Python torch is installed for, which
// torchrun would use); else python3 from PATH. `path` is empty when the
// chosen one is not found.
struct PythonChoice {
  std::string path;
  std::string source;  // "PYTHON_EXEC", "VIRTUAL_ENV", ..., "PATH"
  std::string name;    // as asked for, for messages
};
PythonChoice FindPython(const EnvMap& env, const std::string& ctrun_dir = "");

// The folder of this process's executable (/proc/self/exe's), or "".
std::string OwnExecutableDirectory();

// -m MOD       -> PYTHON -u -m MOD ARGS
// SCRIPT.py    -> PYTHON -u SCRIPT.py ARGS   (unless --no_python)
// anything else-> PROGRAM ARGS, found like a shell finds it (PATH)
// PYTHON is FindPython(env, ctrun_dir)'s. argv[0] is the resolved path.
// INVALID_ARGUMENT, one line, when the script or program does not exist or
// cannot be executed, or there is no Python.
absl::StatusOr<std::vector<std::string>> ResolveWorkerCommand(
    const LaunchOptions& options, const EnvMap& env,
    const std::string& ctrun_dir = "");

// Whether the resolved command `argv` parks in ctrun.wait_for_slot() /
// ctrun::WaitForSlot(), so that a spare node may start it before it has a
// slot: the script of `PYTHON -u SCRIPT` names wait_for_slot, or the
// program's file holds the C++ function's symbol (or the mark it leaves in
// a stripped static link). A module (-m) is not read: it does not park.
// Reads at most the first 512 MiB of the file.
bool ParksForSlot(const std::vector<std::string>& argv);

}  // namespace ctrun

#endif  // CTRUN_LAUNCHER_OPTIONS_WORKER_COMMAND_H_
