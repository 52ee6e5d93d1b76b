#include "launcher/workers/run_directory.h"

#include <dirent.h>
#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <optional>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "launcher/workers/proc.h"
#include "launcher/workers/watchdog.h"

namespace ctrun {

std::string TemporaryDirectory() {
  const char* tmp = getenv("TMPDIR");
  return tmp != nullptr && *tmp != '\0' ? tmp : "/tmp";
}

std::string RunFolderName(absl::string_view run_id) {
  // A job id is any string torchrun accepts; a folder name is not.
  std::string name(run_id.substr(0, 200));
  for (char& c : name) {
    if (c == '/' || c == '\0') c = '_';
  }
  return name.empty() ? "job" : name;
}

absl::StatusOr<std::string> MakeRunDirectory(const std::string& log_dir,
                                             absl::string_view run_id) {
  if (!log_dir.empty()) {
    // A folder of its own for each agent's run (torchrun's RUN_ID_xxxx):
    // nodes sharing a --log_dir (NFS), or two runs under one id, never
    // write over each other's logs.
    std::string dir =
        absl::StrCat(log_dir, "/", RunFolderName(run_id), "_XXXXXX");
    std::error_code ec;
    std::filesystem::create_directories(log_dir, ec);
    if (ec || mkdtemp(dir.data()) == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("--log_dir: cannot create ", dir, ": ",
                       ec ? ec.message() : std::string(strerror(errno))));
    }
    return dir;
  }
  std::string dir = absl::StrCat(TemporaryDirectory(), "/ctrun-XXXXXX");
  if (mkdtemp(dir.data()) == nullptr) {
    return absl::InternalError(
        absl::StrCat("cannot create a temporary directory like ", dir, ": ",
                     strerror(errno)));
  }
  return dir;
}

bool ReplaceFile(const std::string& path, const std::string& text) {
  const std::string temporary = path + ".new";
  unlink(temporary.c_str());
  const int fd =
      open(temporary.c_str(),
           O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd < 0) return false;
  const bool written =
      write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
  close(fd);
  if (!written || std::rename(temporary.c_str(), path.c_str()) != 0) {
    unlink(temporary.c_str());
    return false;
  }
  return true;
}

std::string PidScope() {
  std::string boot = "unknown-boot";
  std::ifstream("/proc/sys/kernel/random/boot_id") >> boot;
  std::error_code ec;
  std::string pid_namespace =
      std::filesystem::read_symlink("/proc/self/ns/pid", ec).string();
  if (ec || pid_namespace.empty()) pid_namespace = "unknown-pidns";
  return absl::StrCat(boot, " ", pid_namespace);
}

absl::Status MarkRunDirectory(const std::string& dir) {
  const std::string agent_dir = absl::StrCat(dir, "/", kAgentFolder);
  std::error_code ec;
  std::filesystem::create_directories(agent_dir, ec);
  std::ofstream mark(agent_dir + "/agent");
  mark << getpid() << " " << ProcessStartTime(getpid()) << " " << PidScope()
       << "\n";
  if (ec || !mark.flush()) {
    return absl::InternalError(
        absl::StrCat("cannot mark the run directory ", dir, " as this run's"));
  }
  return absl::OkStatus();
}

void RefreshRunDirectoryMark(const std::string& dir) {
  if (dir.empty()) return;
  // Never follows a link a worker may have put there.
  utimensat(AT_FDCWD, absl::StrCat(dir, "/", kAgentFolder, "/agent").c_str(),
            nullptr, AT_SYMLINK_NOFOLLOW);
}

namespace {

// A plain file of this user at `path`, at most `limit` bytes: a worker can
// write in its run directory, and anything else there (a FIFO would block
// the read, a link would lead elsewhere) is not ctrun's.
bool IsOwnSmallFile(const std::string& path, off_t limit,
                    struct stat* st = nullptr) {
  struct stat own {};
  if (st == nullptr) st = &own;
  return lstat(path.c_str(), st) == 0 && S_ISREG(st->st_mode) &&
         st->st_uid == geteuid() && st->st_size <= limit;
}

// An agent's mark, as read from its run folder.
struct Mark {
  pid_t pid = 0;
  unsigned long long started = 0;
  absl::Time refreshed;
  // Whether the process that wrote it still runs (reads its /proc entry).
  bool Alive() const { return ProcessStartTime(pid) == started; }
};

// The mark of `folder` (a ctrun-XXXXXX directory of this user) when its pid
// names a process here: this boot, this pid namespace.
std::optional<Mark> ReadMark(const std::string& folder,
                             const std::string& scope) {
  struct stat st {};
  if (lstat(folder.c_str(), &st) != 0 || !S_ISDIR(st.st_mode) ||
      st.st_uid != geteuid()) {
    return std::nullopt;
  }
  const std::string path = absl::StrCat(folder, "/", kAgentFolder, "/agent");
  if (!IsOwnSmallFile(path, 256, &st)) return std::nullopt;
  Mark mark;
  mark.refreshed = absl::FromTimeT(st.st_mtime);
  long long pid = 0;
  std::string boot, pid_namespace;
  // Read without waiting: a worker may have put a FIFO there since.
  std::istringstream in(ReadProcFile(path, 256));
  if (!(in >> pid >> mark.started >> boot >> pid_namespace) || pid <= 0 ||
      pid > std::numeric_limits<pid_t>::max() ||
      absl::StrCat(boot, " ", pid_namespace) != scope) {
    return std::nullopt;  // its pid names no process here
  }
  mark.pid = static_cast<pid_t>(pid);
  return mark;
}

// Calls `fn(folder)` for each ctrun-XXXXXX entry of `tmp`.
template <typename Fn>
void ForEachRunFolder(const std::string& tmp, Fn fn) {
  DIR* dir = opendir(tmp.c_str());
  if (dir == nullptr) return;
  while (const dirent* entry = readdir(dir)) {
    const absl::string_view name = entry->d_name;
    if (absl::StartsWith(name, "ctrun-") && name.size() == 12) {
      fn(absl::StrCat(tmp, "/", name));
    }
  }
  closedir(dir);
}

constexpr char kRendezvousNote[] = "rendezvous";

}  // namespace

absl::Status NoteRendezvous(const std::string& dir, const NotedRendezvous& r) {
  const std::string path =
      absl::StrCat(dir, "/", kAgentFolder, "/", kRendezvousNote);
  const int fd = open(
      path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  const std::string text =
      absl::StrCat(r.endpoint, "\n", r.run_id, "\n", r.token, "\n");
  const bool written = fd >= 0 && write(fd, text.data(), text.size()) ==
                                      static_cast<ssize_t>(text.size());
  if (fd >= 0) close(fd);
  if (!written) {
    return absl::InternalError(
        absl::StrCat("cannot write ", path, ": ", strerror(errno)));
  }
  return absl::OkStatus();
}

std::vector<NotedRendezvous> FindNotedRendezvous(const std::string& tmp) {
  std::vector<std::pair<unsigned long long, NotedRendezvous>> found;
  const std::string scope = PidScope();
  ForEachRunFolder(tmp, [&](const std::string& folder) {
    const std::optional<Mark> mark = ReadMark(folder, scope);
    const std::string path =
        absl::StrCat(folder, "/", kAgentFolder, "/", kRendezvousNote);
    if (!mark || !IsOwnSmallFile(path, 4096) || !mark->Alive()) return;
    NotedRendezvous r;
    std::istringstream in(ReadProcFile(path, 4096));
    if (!std::getline(in, r.endpoint) || !std::getline(in, r.run_id) ||
        !std::getline(in, r.token) || r.endpoint.empty()) {
      return;  // still being written, or not ctrun's
    }
    r.agent = mark->pid;
    r.folder = folder;
    found.emplace_back(mark->started, std::move(r));
  });
  std::sort(found.begin(), found.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<NotedRendezvous> result;
  for (auto& [started, r] : found) result.push_back(std::move(r));
  return result;
}

std::vector<std::string> RemoveStaleRunDirectories(const std::string& tmp,
                                                   absl::Duration min_age) {
  std::vector<std::string> removed;
  const std::string scope = PidScope();
  const absl::Time now = absl::Now();
  ForEachRunFolder(tmp, [&](const std::string& folder) {
    const std::optional<Mark> mark = ReadMark(folder, scope);
    // A fresh mark is not looked into: its agent's /proc entry is read
    // only once the mark is old enough to be stale.
    if (!mark || now - mark->refreshed < min_age || mark->Alive()) return;
    std::error_code ec;
    std::filesystem::remove_all(folder, ec);
    if (!ec) removed.push_back(folder);
  });
  return removed;
}

}  // namespace ctrun
