// ctrun on a real terminal (a pseudo-terminal, with a real interactive bash
// where job control is tested): pdb on local rank 0, what the workers see,
// Ctrl-Z and fg, a background job that wants input.
#include <signal.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>

#include "absl/strings/str_cat.h"
#include "tests/support/daemon.h"
#include "tests/support/terminal_session.h"

namespace ctrun::testing {
namespace {

constexpr absl::Duration kWait = absl::Seconds(60);

// A script file under a fresh directory, removed with it.
class Script {
 public:
  Script(const std::string& name, const std::string& text)
      : dir_(std::filesystem::temp_directory_path() /
             ("ctrun-tty-" + std::to_string(getpid()) + "-" + name)) {
    std::filesystem::create_directories(dir_);
    path_ = dir_ + "/" + name;
    std::ofstream(path_) << text;
  }
  ~Script() { std::filesystem::remove_all(dir_); }
  const std::string& path() const { return path_; }
  const std::string& dir() const { return dir_; }

 private:
  std::string dir_, path_;
};

int Count(const std::string& text, const std::string& pattern) {
  std::regex re(pattern);
  return static_cast<int>(
      std::distance(std::sregex_iterator(text.begin(), text.end(), re),
                    std::sregex_iterator()));
}

// An interactive bash on the terminal, with job control and a plain prompt.
std::unique_ptr<TerminalSession> Shell() {
  auto shell = std::make_unique<TerminalSession>(
      std::vector<std::string>{"/bin/bash", "--norc", "--noprofile",
                               "--noediting", "-i"},
      std::vector<std::string>{"PS1=prompt$ ", "TERM=dumb"});
  REQUIRE(shell->WaitFor("prompt$ ", kWait));
  return shell;
}

TEST_CASE("pdb on local rank 0 reads the terminal, as under torchrun",
          "[ctrun][e2e][terminal]") {
  Script script("debugged.py",
                "import os\n"
                "x = 6\n"
                "if os.environ['LOCAL_RANK'] == '0':\n"
                "    breakpoint()\n"
                "print('done', x * 7, flush=True)\n");
  TerminalSession t({CtrunPath(), "--nproc_per_node=2", "--no_python",
                     "/usr/bin/python3", script.path()},
                    {"TERM=dumb", "PYTHONBREAKPOINT="});
  REQUIRE(t.WaitFor("(Pdb) ", kWait));
  const size_t asked = t.Screen().size();
  t.Type("p x * 7\n");
  REQUIRE(t.WaitFor("42", kWait, asked));
  t.Type("c\n");
  CHECK(t.Wait(kWait) == 0);
  INFO(t.Screen());
  CHECK(Count(t.Screen(), "done 42") == 2);
}

TEST_CASE("Workers see a terminal where torchrun's would",
          "[ctrun][e2e][terminal]") {
  const std::string probe =
      "for fd in 0 1 2; do if [ -t $fd ]; then echo fd$fd=tty; "
      "else echo fd$fd=pipe; fi; done";
  auto run = [&](std::vector<std::string> flags) {
    std::vector<std::string> argv = {CtrunPath(), "--nproc_per_node=2"};
    argv.insert(argv.end(), flags.begin(), flags.end());
    argv.insert(argv.end(), {"/bin/sh", "-c", probe});
    TerminalSession t(argv);
    CHECK(t.Wait(kWait) == 0);
    return t.Screen();
  };
  SECTION("ctrun's output on a terminal: so is theirs") {
    const std::string screen = run({});
    INFO(screen);
    CHECK(Count(screen, "\\]: fd0=tty") == 2);  // the terminal itself
    CHECK(Count(screen, "\\]: fd1=tty") == 2);
    CHECK(Count(screen, "\\]: fd2=tty") == 2);
  }
  SECTION("--worker_tty=no: pipes") {
    const std::string screen = run({"--worker_tty=no"});
    INFO(screen);
    CHECK(Count(screen, "\\]: fd1=pipe") == 2);
    CHECK(Count(screen, "\\]: fd2=pipe") == 2);
  }
  SECTION("a stream also kept in a log file is not a terminal (tee)") {
    const std::string logs = std::filesystem::temp_directory_path() /
                             ("ctrun-tty-logs-" + std::to_string(getpid()));
    const std::string screen = run({"--tee=1", "--log_dir=" + logs});
    std::filesystem::remove_all(logs);
    INFO(screen);
    CHECK(Count(screen, "\\]: fd1=pipe") == 2);
    CHECK(Count(screen, "\\]: fd2=tty") == 2);
  }
}

TEST_CASE("A worker other than local rank 0 reading the terminal is named",
          "[ctrun][e2e][terminal]") {
  TerminalSession t({CtrunPath(), "--nproc_per_node=2", "/bin/sh", "-c",
                     "if [ $LOCAL_RANK = 1 ]; then read line; fi"});
  CHECK(t.Wait(kWait) != 0);
  INFO(t.Screen());
  CHECK(t.Screen().find("(local 1, pid") != std::string::npos);
  CHECK(t.Screen().find("only local rank 0 of a job in the terminal's "
                        "foreground can read") != std::string::npos);
}

// The shell's last job exited 0; then the shell exits.
void ExpectSuccessThenExit(TerminalSession& shell) {
  REQUIRE(shell.WaitFor("prompt$ ", kWait, shell.Screen().size()));
  shell.Type("echo status=$?\n");
  CHECK(shell.WaitFor("status=0", kWait));
  shell.Type("exit\n");
  CHECK(shell.Wait(kWait) == 0);
}

// Every stopped process of the session, by command name.
std::multiset<std::string> Stopped(const TerminalSession& t) {
  std::multiset<std::string> stopped;
  for (const auto& m : t.Members()) {
    if (m.state == 'T') stopped.insert(m.command);
  }
  return stopped;
}

TEST_CASE("Ctrl-Z stops the whole job and fg continues it",
          "[ctrun][e2e][terminal]") {
  Script script("ticks.sh",
                "i=0; while [ $i -lt 12 ]; do echo tick$LOCAL_RANK=$i; "
                "i=$((i+1)); sleep 0.25; done\n");
  auto shell = Shell();
  shell->Type(absl::StrCat(CtrunPath(), " --nproc_per_node=3 /bin/sh ",
                           script.path(), "\n"));
  REQUIRE(shell->WaitFor("tick2=1", kWait));
  shell->Type("\x1a");  // Ctrl-Z
  REQUIRE(shell->WaitFor("Stopped", kWait));
  // ctrun and its three workers stop (each worker's sleep with it, if it
  // was sleeping); the watchdog stays awake to end them if need be.
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (Stopped(*shell).count("sh") < 3 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  const auto stopped = Stopped(*shell);
  CHECK(stopped.count("ctrun") == 1);
  CHECK(stopped.count("sh") == 3);
  CHECK(stopped.count("ctrun-watchdog") == 0);
  // Nothing moves while stopped.
  const size_t before = shell->Screen().size();
  absl::SleepFor(absl::Seconds(1));
  CHECK_FALSE(shell->WaitFor("tick", absl::Milliseconds(10), before));
  shell->Type("fg\n");
  for (int rank = 0; rank < 3; ++rank) {
    CHECK(shell->WaitFor(absl::StrCat("tick", rank, "=11"), kWait));
  }
  ExpectSuccessThenExit(*shell);
  INFO(shell->Screen());
  for (int rank = 0; rank < 3; ++rank) {
    CHECK(Count(shell->Screen(), absl::StrCat("tick", rank, "=")) == 12);
  }
}

TEST_CASE("A job in the background that wants input stops until fg",
          "[ctrun][e2e][terminal]") {
  Script script("ask.sh",
                "if [ $LOCAL_RANK = 0 ]; then read answer; "
                "echo got=$answer; fi\n");
  auto shell = Shell();
  shell->Type(absl::StrCat(CtrunPath(), " --nproc_per_node=2 /bin/sh ",
                           script.path(), " &\n"));
  // Local rank 0 reads the terminal of a background job: the job stops, as
  // any program would, instead of failing or hanging.
  REQUIRE(shell->WaitFor("prompt$ ", kWait, shell->Screen().size()));
  bool stopped = false;
  for (const absl::Time deadline = absl::Now() + kWait;
       !stopped && absl::Now() < deadline;) {
    const size_t asked = shell->Screen().size();
    shell->Type("jobs\n");
    stopped = shell->WaitFor("Stopped", absl::Seconds(1), asked);
  }
  REQUIRE(stopped);
  // fg names the job once it has taken it out of the shell's hands; what
  // is typed after that is the job's.
  const size_t asked = shell->Screen().size();
  shell->Type("fg\n");
  REQUIRE(shell->WaitFor(script.path(), kWait, asked));
  shell->Type("forty-two\n");
  CHECK(shell->WaitFor("got=forty-two", kWait));
  ExpectSuccessThenExit(*shell);
}

}  // namespace
}  // namespace ctrun::testing
