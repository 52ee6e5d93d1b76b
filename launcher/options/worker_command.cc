#include "launcher/options/worker_command.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "absl/strings/ascii.h"
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

// The interpreter a torchrun script names in its #! line, if executable.
std::string TorchrunInterpreter(const std::string& torchrun) {
  std::ifstream in(torchrun);
  std::string line;
  if (!std::getline(in, line) || !absl::StartsWith(line, "#!")) return "";
  const std::string interpreter(absl::StripAsciiWhitespace(
      absl::string_view(line).substr(2, line.find(' ', 3) - 2)));
  return absl::StrContains(interpreter, "python") &&
                 IsExecutableFile(interpreter)
             ? interpreter
             : "";
}

}  // namespace

PythonChoice FindPython(const EnvMap& env, const std::string& ctrun_dir) {
  if (auto it = env.find(env::kPythonExec);
      it != env.end() && !it->second.empty()) {
    return {FindProgram(it->second, env), "PYTHON_EXEC", it->second};
  }
  // pip installed ctrun into an environment's bin: its Python is the one
  // the user installed torch for, activated or not.
  if (!ctrun_dir.empty()) {
    const std::string root =
        std::filesystem::path(ctrun_dir).parent_path().string();
    std::error_code ec;
    if (std::filesystem::exists(root + "/pyvenv.cfg", ec) ||
        std::filesystem::is_directory(root + "/conda-meta", ec)) {
      const std::string python = ctrun_dir + "/python3";
      if (IsExecutableFile(python)) {
        return {python, "the environment ctrun is installed in", python};
      }
    }
  }
  for (const char* var : {"VIRTUAL_ENV", "CONDA_PREFIX"}) {
    if (auto it = env.find(var); it != env.end() && !it->second.empty()) {
      const std::string python = absl::StrCat(it->second, "/bin/python3");
      if (IsExecutableFile(python)) return {python, var, python};
    }
  }
  // The interpreter torchrun itself would run the script under (its
  // sys.executable): the one torch is installed for.
  if (const std::string torchrun = FindProgram("torchrun", env);
      !torchrun.empty()) {
    if (std::string python = TorchrunInterpreter(torchrun); !python.empty()) {
      return {python, absl::StrCat("the #! line of ", torchrun), python};
    }
  }
  return {FindProgram("python3", env), "PATH", "python3"};
}

std::string OwnExecutableDirectory() {
  std::error_code ec;
  const std::filesystem::path self =
      std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? "" : self.parent_path().string();
}

absl::StatusOr<std::vector<std::string>> ResolveWorkerCommand(
    const LaunchOptions& options, const EnvMap& env,
    const std::string& ctrun_dir) {
  const std::string& entry = options.entrypoint;
  const bool python =
      options.module || (!options.no_python && absl::EndsWith(entry, ".py"));
  std::vector<std::string> argv;
  if (python) {
    const PythonChoice python = FindPython(env, ctrun_dir);
    if (python.path.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("Python interpreter '", python.name, "' not found",
                       python.source == "PATH" ? " in PATH; set PYTHON_EXEC"
                                               : " (PYTHON_EXEC)"));
    }
    argv = {python.path, "-u"};
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

bool ParksForSlot(const std::vector<std::string>& argv) {
  if (argv.empty()) return false;
  const bool python = argv.size() > 2 && argv[1] == "-u";
  if (python && argv[2] == "-m") return false;
  const std::string& file = python ? argv[2] : argv[0];
  const std::vector<std::string> needles =
      python ? std::vector<std::string>{"wait_for_slot"}
             : std::vector<std::string>{"_ZN5ctrun11WaitForSlotEv",
                                        "ctrun::WaitForSlot parks here"};
  // Only a regular file: a FIFO at the script's path would block the agent.
  std::error_code ec;
  if (!std::filesystem::is_regular_file(file, ec)) return false;
  std::ifstream in(file, std::ios::binary);
  constexpr size_t kChunk = size_t{1} << 20;
  constexpr size_t kMostRead = size_t{512} << 20;
  // Each chunk is searched with the end of the one before: a name may
  // straddle two.
  std::string window;
  std::vector<char> chunk(kChunk);
  for (size_t read = 0; in && read < kMostRead; read += kChunk) {
    in.read(chunk.data(), static_cast<std::streamsize>(kChunk));
    const size_t got = static_cast<size_t>(in.gcount());
    if (got == 0) break;
    const size_t keep = std::min<size_t>(window.size(), 64);
    window = window.substr(window.size() - keep);
    window.append(chunk.data(), got);
    for (const std::string& needle : needles) {
      if (window.find(needle) != std::string::npos) return true;
    }
  }
  return false;
}

}  // namespace ctrun
