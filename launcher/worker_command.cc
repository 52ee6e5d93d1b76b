#include "launcher/worker_command.h"

#include <sys/stat.h>
#include <unistd.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "ctrun/environment.h"

namespace ctrun {
namespace {

bool IsExecutableFile(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) &&
         access(path.c_str(), X_OK) == 0;
}

// Like execvp's search: a name with a slash is a path, others go through
// PATH. Empty when not found.
std::string FindProgram(const std::string& name, const EnvMap& env) {
  if (name.find('/') != std::string::npos) {
    return IsExecutableFile(name) ? name : "";
  }
  auto it = env.find("PATH");
  const std::string path = it == env.end() ? "/usr/bin:/bin" : it->second;
  for (absl::string_view dir : absl::StrSplit(path, ':')) {
    std::string candidate = absl::StrCat(dir.empty() ? "." : dir, "/", name);
    if (IsExecutableFile(candidate)) return candidate;
  }
  return "";
}

}  // namespace

absl::StatusOr<std::vector<std::string>> ResolveWorkerCommand(
    const LaunchOptions& options, const EnvMap& env) {
  const std::string& entry = options.entrypoint;
  const bool python =
      options.module || (!options.no_python && absl::EndsWith(entry, ".py"));
  std::vector<std::string> argv;
  if (python) {
    auto it = env.find(env::kPythonExec);
    const std::string name =
        it != env.end() && !it->second.empty() ? it->second : "python3";
    std::string interpreter = FindProgram(name, env);
    if (interpreter.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "Python interpreter '", name, "' not found",
          it == env.end() ? " in PATH; set PYTHON_EXEC" : " (PYTHON_EXEC)"));
    }
    argv = {interpreter, "-u"};
    if (options.module) {
      argv.push_back("-m");
    } else if (access(entry.c_str(), R_OK) != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("script '", entry, "' not found or not readable"));
    }
    argv.push_back(entry);
  } else {
    std::string program = FindProgram(entry, env);
    if (program.empty()) {
      struct stat st;
      if (entry.find('/') != std::string::npos &&
          stat(entry.c_str(), &st) == 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            "entrypoint '", entry,
            "' is not an executable file (chmod +x it, or name its "
            "interpreter)"));
      }
      return absl::InvalidArgumentError(
          absl::StrCat("entrypoint '", entry, "' not found",
                       entry.find('/') == std::string::npos
                           ? " in PATH (give a path, e.g. ./" + entry + ")"
                           : ""));
    }
    argv = {program};
  }
  argv.insert(argv.end(), options.script_args.begin(),
              options.script_args.end());
  return argv;
}

}  // namespace ctrun
