#include "launcher/workers/evidence.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "launcher/workers/proc.h"
#include "launcher/workers/run_directory.h"

extern char** environ;

namespace ctrun {
namespace {

constexpr absl::Duration kStepEvery = absl::Milliseconds(50);

off_t SizeOf(const std::string& path) {
  struct stat st {};
  return stat(path.c_str(), &st) == 0 ? st.st_size : 0;
}

// What faulthandler appended to a worker's stacks file since `from`, at
// most this much. The file is in the run directory, which the workers
// write: a FIFO put in its place is never waited on.
constexpr size_t kMaxStacksBytes = 8 << 20;

// In the run directory, which the workers write too.
void WriteFile(const std::string& path, const std::string& text) {
  ReplaceFile(path, text);
}

// gdb reading every thread's stack of `pid` into `out`, in a process group
// of its own (the workers' signals must not reach it); -1 when it cannot
// be started.
pid_t SpawnGdb(const std::string& gdb, pid_t pid, const std::string& out) {
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null",
                                   O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, out.c_str(),
                                   O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&actions, STDOUT_FILENO, STDERR_FILENO);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  sigset_t none;
  sigemptyset(&none);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setpgroup(&attr, 0);
  posix_spawnattr_setflags(&attr,
                           POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGMASK);
  const std::string pid_text = absl::StrCat(pid);
  // Never a download of debug symbols (DEBUGINFOD_URLS) while a job waits.
  std::vector<const char*> argv = {gdb.c_str(), "-batch",
                                   "-nx",       "-q",
                                   "-iex",      "set debuginfod enabled off",
                                   "-p",        pid_text.c_str(),
                                   "-ex",       "thread apply all bt",
                                   nullptr};
  pid_t child = -1;
  const int rc = posix_spawn(&child, gdb.c_str(), &actions, &attr,
                             const_cast<char* const*>(argv.data()), environ);
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  return rc == 0 ? child : -1;
}

}  // namespace

std::string FindGdb() {
  const char* path = getenv("PATH");
  for (absl::string_view dir :
       absl::StrSplit(path ? path : "/usr/bin:/bin", ':', absl::SkipEmpty())) {
    const std::string candidate = absl::StrCat(dir, "/gdb");
    if (access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return "";
}

EvidenceCollector::EvidenceCollector(std::string dir,
                                     std::vector<Target> targets,
                                     std::string gdb, absl::Time now,
                                     absl::Time deadline)
    : dir_(std::move(dir)),
      targets_(std::move(targets)),
      gdb_(std::move(gdb)),
      deadline_(deadline) {
  std::error_code ec;
  std::filesystem::create_directories(dir_, ec);
  for (const Target& t : targets_) {
    WriteFile(
        absl::StrCat(dir_, "/rank", t.rank, ".output.txt"),
        absl::StrJoin(t.last_lines, "\n") + (t.last_lines.empty() ? "" : "\n"));
  }
  python_.resize(targets_.size());
  python_until_ = std::min(deadline_, now + kPythonWait);
  next_step_ = now + kStepEvery;
  bool asked = false;
  for (size_t i = 0; i < targets_.size(); ++i) {
    const Target& t = targets_[i];
    if (!t.python.on_signal || t.stacks_file.empty()) {
      python_[i].done = true;
      continue;
    }
    python_[i].from = SizeOf(t.stacks_file);
    if (kill(t.pid, t.python.signal) != 0) {
      python_[i].done = true;
      continue;
    }
    asked = true;
  }
  if (!asked) StartNative();
}

EvidenceCollector::~EvidenceCollector() {
  if (stage_ != Stage::kDone) Finish();
}

bool EvidenceCollector::Step(absl::Time now) {
  next_step_ = now + kStepEvery;
  if (stage_ == Stage::kPython) {
    // A dump is complete once its file stopped growing.
    bool all = true;
    for (size_t i = 0; i < targets_.size(); ++i) {
      Python& p = python_[i];
      if (p.done) continue;
      const off_t size = SizeOf(targets_[i].stacks_file);
      // Unchanged over two steps: a worker slowed by a busy machine may
      // pause between the lines of its dump.
      if (size > p.from && size == p.seen && ++p.still >= 2) {
        p.done = true;
      } else {
        if (size != p.seen) p.still = 0;
        p.seen = size;
        all = false;
      }
    }
    if (all || now >= python_until_) StartNative();
  }
  if (stage_ == Stage::kNative && native_done_ == native_started_) {
    stage_ = Stage::kDone;
  }
  return stage_ == Stage::kDone;
}

void EvidenceCollector::SavePython() {
  for (size_t i = 0; i < targets_.size(); ++i) {
    const Target& t = targets_[i];
    if (!t.python.on_signal || t.stacks_file.empty()) continue;
    const std::string dump =
        ReadProcFile(t.stacks_file, kMaxStacksBytes, python_[i].from);
    if (dump.empty()) continue;
    WriteFile(absl::StrCat(dir_, "/rank", t.rank, ".python.txt"), dump);
    ++python_saved_;
  }
}

void EvidenceCollector::StartNative() {
  SavePython();
  stage_ = Stage::kNative;
  if (gdb_.empty()) return;
  for (const Target& t : targets_) {
    const pid_t child = SpawnGdb(
        gdb_, t.pid, absl::StrCat(dir_, "/rank", t.rank, ".native.txt"));
    if (child <= 0) continue;
    gdbs_.push_back(child);
    ++native_started_;
  }
}

void EvidenceCollector::OnChildExit(pid_t pid) {
  auto it = std::find(gdbs_.begin(), gdbs_.end(), pid);
  if (it == gdbs_.end()) return;
  *it = -1;
  ++native_done_;
}

std::string EvidenceCollector::Finish() {
  if (stage_ == Stage::kPython) {
    SavePython();
    stage_ = Stage::kNative;
  }
  const int cut = native_started_ - native_done_;
  for (pid_t& child : gdbs_) {
    if (child <= 0) continue;
    kill(-child, SIGKILL);
    child = -1;
  }
  // A worker that gdb held when it was killed may be left stopped.
  for (const Target& t : targets_) kill(t.pid, SIGCONT);
  stage_ = Stage::kDone;
  std::string line = absl::StrCat(
      "evidence in ", dir_, ": last output of ", targets_.size(),
      targets_.size() == 1 ? " worker" : " workers", ", Python stacks of ",
      python_saved_, ", native stacks of ", native_started_ - cut);
  if (gdb_.empty()) absl::StrAppend(&line, " (gdb is not installed)");
  if (cut > 0) {
    absl::StrAppend(&line, " (", cut, " gdb cut short at the deadline)");
  }
  return line;
}

}  // namespace ctrun
