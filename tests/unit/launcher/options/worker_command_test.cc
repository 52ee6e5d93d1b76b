// The worker's command: which Python, which entrypoint.
#include "launcher/options/worker_command.h"

#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>

namespace ctrun {
namespace {

TEST_CASE("Python is the one torch's environment would use",
          "[launcher][unit]") {
  const std::string dir = std::filesystem::temp_directory_path() /
                          ("ctrun-python-" + std::to_string(getpid()));
  auto executable = [](const std::string& path, const std::string& text) {
    std::filesystem::create_directories(
        std::filesystem::path(path).parent_path());
    std::ofstream(path) << text;
    chmod(path.c_str(), 0755);
  };
  const std::string venv_python = dir + "/venv/bin/python3";
  const std::string env_python = dir + "/env/bin/python3.12";
  executable(venv_python, "#!/bin/sh\n");
  executable(env_python, "#!/bin/sh\n");
  executable(dir + "/bin/torchrun", "#!" + env_python + "\nimport sys\n");
  executable(dir + "/bin/python3", "#!/bin/sh\n");
  const std::string path = dir + "/bin:/usr/bin:/bin";

  // PYTHON_EXEC > the active virtualenv > torchrun's own interpreter > PATH.
  CHECK(FindPython({{"PATH", path},
                    {"VIRTUAL_ENV", dir + "/venv"},
                    {"PYTHON_EXEC", "/bin/sh"}})
            .path == "/bin/sh");
  const PythonChoice venv =
      FindPython({{"PATH", path}, {"VIRTUAL_ENV", dir + "/venv"}});
  CHECK(venv.path == venv_python);
  CHECK(venv.source == "VIRTUAL_ENV");
  const PythonChoice torchrun = FindPython({{"PATH", path}});
  CHECK(torchrun.path == env_python);
  CHECK(torchrun.source == "the #! line of " + dir + "/bin/torchrun");
  // ctrun run by its path from an environment's bin (pip installed it
  // there) takes that environment's Python, before an activated one's;
  // from any other folder, it changes nothing.
  const std::string own_venv = dir + "/own/bin";
  executable(own_venv + "/python3", "#!/bin/sh\n");
  std::ofstream(dir + "/own/pyvenv.cfg") << "home = /usr/bin\n";
  const PythonChoice own =
      FindPython({{"PATH", path}, {"VIRTUAL_ENV", dir + "/venv"}}, own_venv);
  CHECK(own.path == own_venv + "/python3");
  CHECK(own.source == "the environment ctrun is installed in");
  CHECK(
      FindPython({{"PATH", path}, {"VIRTUAL_ENV", dir + "/venv"}}, dir + "/bin")
          .path == venv_python);
  CHECK(
      FindPython({{"PATH", path}, {"PYTHON_EXEC", "/bin/sh"}}, own_venv).path ==
      "/bin/sh");
  std::filesystem::remove(dir + "/bin/torchrun");
  // (this machine's own torchrun, if any, is off this PATH)
  CHECK(FindPython({{"PATH", dir + "/bin"}}).path == dir + "/bin/python3");
  CHECK(FindPython({{"PATH", dir + "/none"}}).path.empty());
  std::filesystem::remove_all(dir);
}

TEST_CASE("Entrypoints resolve like torchrun's", "[launcher][unit]") {
  const std::string dir = std::filesystem::temp_directory_path() /
                          ("ctrun-cmd-" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  const std::string script = dir + "/train.py";
  std::ofstream(script) << "print(1)\n";
  const std::string program = dir + "/run.sh";
  std::ofstream(program) << "#!/bin/sh\n";
  chmod(program.c_str(), 0755);
  const std::string plain = dir + "/data.txt";
  std::ofstream(plain) << "x\n";
  const EnvMap env = {{"PATH", dir + ":/usr/bin:/bin"},
                      {"PYTHON_EXEC", "/bin/sh"}};  // stands in for python

  LaunchOptions o;
  o.entrypoint = script;
  o.script_args = {"--lr", "1"};
  CHECK(*ResolveWorkerCommand(o, env) ==
        std::vector<std::string>{"/bin/sh", "-u", script, "--lr", "1"});
  o.module = true;
  o.entrypoint = "pkg.train";
  CHECK(*ResolveWorkerCommand(o, env) ==
        std::vector<std::string>{"/bin/sh", "-u", "-m", "pkg.train", "--lr",
                                 "1"});
  o.module = false;
  o.entrypoint = "run.sh";  // found in PATH
  CHECK((*ResolveWorkerCommand(o, env))[0] == program);
  o.no_python = true;
  o.entrypoint = program;
  CHECK((*ResolveWorkerCommand(o, env))[0] == program);

  o.no_python = false;
  o.entrypoint = dir + "/missing.py";
  auto missing = ResolveWorkerCommand(o, env);
  CHECK(missing.status().message().find("not found") != std::string::npos);
  o.entrypoint = "no-such-program";
  auto not_in_path = ResolveWorkerCommand(o, env);
  CHECK(not_in_path.status().message().find("not found in PATH") !=
        std::string::npos);
  o.entrypoint = plain;
  auto not_exec = ResolveWorkerCommand(o, env);
  CHECK(not_exec.status().message().find("not an executable") !=
        std::string::npos);
  o.entrypoint = script;
  auto no_python = ResolveWorkerCommand(o, {{"PATH", "/nonexistent"}});
  CHECK(no_python.status().message().find("python3") != std::string::npos);
  std::filesystem::remove_all(dir);
}

TEST_CASE("A program parks when it names wait_for_slot",
          "[launcher][unit][spares]") {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() /
                                    ("ctrun-parks-" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  auto write = [&](const std::string& name, const std::string& text) {
    std::ofstream(dir / name, std::ios::binary) << text;
    return (dir / name).string();
  };
  const std::string parks =
      write("parks.py", "import ctrun\nctrun.wait_for_slot()\n");
  const std::string plain = write("plain.py", "import torch\n");
  CHECK(ParksForSlot({"/usr/bin/python3", "-u", parks, "--x"}));
  CHECK_FALSE(ParksForSlot({"/usr/bin/python3", "-u", plain}));
  CHECK_FALSE(ParksForSlot({"/usr/bin/python3", "-u", "-m", "parks"}));
  // A binary: the C++ function's symbol, even across a chunk's end, or the
  // mark of a stripped static link; not the Python name.
  const std::string across =
      write("across", std::string((size_t{1} << 20) - 7, '\0') +
                          "_ZN5ctrun11WaitForSlotEv" + std::string(100, '\0'));
  CHECK(ParksForSlot({across, "park"}));
  CHECK(ParksForSlot({write("stripped", "..ctrun::WaitForSlot parks here..")}));
  CHECK_FALSE(ParksForSlot({write("python-name", "wait_for_slot")}));
  CHECK_FALSE(ParksForSlot({(dir / "missing").string()}));
  // A FIFO where the script should be is not read (it would block).
  const std::string fifo = (dir / "fifo.py").string();
  REQUIRE(mkfifo(fifo.c_str(), 0600) == 0);
  CHECK_FALSE(ParksForSlot({"/usr/bin/python3", "-u", fifo}));
  CHECK_FALSE(ParksForSlot({}));
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace ctrun
