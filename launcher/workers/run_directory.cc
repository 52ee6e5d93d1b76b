#include "launcher/workers/run_directory.h"

#include <dirent.h>
#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

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

std::vector<std::string> RemoveStaleRunDirectories(const std::string& tmp,
                                                   absl::Duration min_age) {
  std::vector<std::string> removed;
  const std::string scope = PidScope();
  DIR* dir = opendir(tmp.c_str());
  if (dir == nullptr) return removed;
  const absl::Time now = absl::Now();
  while (const dirent* entry = readdir(dir)) {
    const absl::string_view name = entry->d_name;
    if (!absl::StartsWith(name, "ctrun-") || name.size() != 12) continue;
    const std::string folder = absl::StrCat(tmp, "/", name);
    const std::string mark = absl::StrCat(folder, "/", kAgentFolder, "/agent");
    struct stat st {};
    if (lstat(folder.c_str(), &st) != 0 || !S_ISDIR(st.st_mode) ||
        st.st_uid != geteuid() || lstat(mark.c_str(), &st) != 0 ||
        // A worker can write in its run directory: anything but a plain
        // file there (a FIFO would block this read) is not a mark.
        !S_ISREG(st.st_mode) || st.st_size > 256 ||
        now - absl::FromTimeT(st.st_mtime) < min_age) {
      continue;
    }
    long long pid = 0;
    unsigned long long started = 0;
    std::string boot, pid_namespace;
    std::ifstream in(mark);
    if (!(in >> pid >> started >> boot >> pid_namespace) || pid <= 0 ||
        absl::StrCat(boot, " ", pid_namespace) != scope) {
      continue;  // its pid names no process here
    }
    if (ProcessStartTime(static_cast<pid_t>(pid)) == started) continue;
    std::error_code ec;
    std::filesystem::remove_all(folder, ec);
    if (!ec) removed.push_back(folder);
  }
  closedir(dir);
  return removed;
}

}  // namespace ctrun
