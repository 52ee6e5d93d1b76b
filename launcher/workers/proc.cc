#include "launcher/workers/proc.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace ctrun {
namespace {

// Calls `f(pid)` for every process in /proc.
template <typename F>
void ForEachProcess(F f) {
  DIR* dir = opendir("/proc");
  if (dir == nullptr) return;
  while (const dirent* entry = readdir(dir)) {
    if (!std::isdigit(static_cast<unsigned char>(entry->d_name[0]))) continue;
    f(static_cast<pid_t>(std::atoi(entry->d_name)));
  }
  closedir(dir);
}

}  // namespace

std::string ReadProcFile(const std::string& path, size_t limit, off_t from) {
  // Non-blocking and regular files only: a FIFO or a device put where a
  // file was expected (in a folder the workers write) must not hold the
  // agent.
  const int fd = open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return "";
  struct stat st {};
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) ||
      (from > 0 && lseek(fd, from, SEEK_SET) != from)) {
    close(fd);
    return "";
  }
  std::string text;
  char buffer[4096];
  while (text.size() < limit) {
    const ssize_t n = read(fd, buffer, sizeof buffer);
    if (n <= 0) break;
    text.append(buffer, static_cast<size_t>(n));
  }
  close(fd);
  return text;
}

std::optional<uint64_t> ParseOomKill(const std::string& text) {
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    uint64_t n = 0;
    if (absl::ConsumePrefix(&line, "oom_kill ") && absl::SimpleAtoi(line, &n)) {
      return n;
    }
  }
  return std::nullopt;
}

std::optional<uint64_t> CgroupOomKills() {
  // Lines "ID:CONTROLLERS:PATH": v2's is "0::PATH", v1's memory one
  // "N:memory:PATH".
  for (absl::string_view line :
       absl::StrSplit(ReadProcFile("/proc/self/cgroup", 64 << 10), '\n')) {
    const std::vector<absl::string_view> parts =
        absl::StrSplit(line, absl::MaxSplits(':', 2));
    if (parts.size() != 3) continue;
    std::string file;
    if (parts[0] == "0" && parts[1].empty()) {
      file = absl::StrCat("/sys/fs/cgroup", parts[2], "/memory.events");
    } else if (parts[1] == "memory") {
      file = absl::StrCat("/sys/fs/cgroup/memory", parts[2],
                          "/memory.oom_control");
    } else {
      continue;
    }
    if (auto n = ParseOomKill(ReadProcFile(file, 4096))) return n;
  }
  return std::nullopt;
}

unsigned long long ProcessStartTime(pid_t pid) {
  const std::string text =
      ReadProcFile("/proc/" + std::to_string(pid) + "/stat", 1024);
  const size_t close_paren = text.rfind(')');
  if (close_paren == std::string::npos) return 0;
  // Fields after the command: state (3) ... starttime (22).
  const char* p = text.c_str() + close_paren + 1;
  for (int field = 3; field < 22 && *p != '\0'; ++field) {
    while (*p == ' ') ++p;
    while (*p != ' ' && *p != '\0') ++p;
  }
  return std::strtoull(p, nullptr, 10);
}

std::vector<pid_t> ChildrenOf(pid_t parent) {
  std::vector<pid_t> children;
  // The kernel's own list, thread by thread (an orphan is given to one
  // thread of its reaper): the cost grows with this process, not with the
  // machine.
  const std::string tasks = absl::StrCat("/proc/", parent, "/task");
  if (DIR* dir = opendir(tasks.c_str())) {
    bool listed = false;
    while (const dirent* entry = readdir(dir)) {
      if (entry->d_name[0] == '.') continue;
      const std::string path =
          absl::StrCat(tasks, "/", entry->d_name, "/children");
      if (access(path.c_str(), R_OK) != 0) continue;
      listed = true;
      for (absl::string_view pid :
           absl::StrSplit(ReadProcFile(path), ' ', absl::SkipWhitespace())) {
        int value = 0;
        if (absl::SimpleAtoi(pid, &value)) children.push_back(value);
      }
    }
    closedir(dir);
    if (listed) return children;
  }
  // A kernel without CONFIG_PROC_CHILDREN: every process's parent.
  ForEachProcess([&](pid_t pid) {
    const std::string text =
        ReadProcFile("/proc/" + std::to_string(pid) + "/stat", 1024);
    const size_t close_paren = text.rfind(')');
    if (close_paren == std::string::npos) return;
    char state;
    int ppid = 0;
    if (sscanf(text.c_str() + close_paren + 1, " %c %d", &state, &ppid) == 2 &&
        ppid == parent) {
      children.push_back(pid);
    }
  });
  return children;
}

int KillProcessesWithEnvironment(const std::string& entry) {
  int found = 0;
  const pid_t self = getpid();
  ForEachProcess([&](pid_t pid) {
    if (pid == self) return;
    const int pidfd = static_cast<int>(syscall(SYS_pidfd_open, pid, 0));
    if (pidfd < 0 && errno == ESRCH) return;  // gone already
    const std::string env =
        ReadProcFile("/proc/" + std::to_string(pid) + "/environ", 1 << 20);
    bool marked = false;
    for (size_t start = 0; start < env.size() && !marked;) {
      size_t end = env.find('\0', start);
      if (end == std::string::npos) end = env.size();
      marked = env.compare(start, end - start, entry) == 0;
      start = end + 1;
    }
    if (marked) {
      ++found;
      // The pidfd names the process whose /proc entry was read, or one
      // that ended before the read (the signal then goes nowhere). Without
      // one (a kernel before 5.3, no descriptor left), by pid as before.
      if (pidfd >= 0) {
        syscall(SYS_pidfd_send_signal, pidfd, SIGKILL, nullptr, 0);
      } else {
        kill(pid, SIGKILL);
      }
    }
    if (pidfd >= 0) close(pidfd);
  });
  return found;
}

std::string DescribeProcessState(pid_t pid) {
  std::ifstream status(absl::StrCat("/proc/", pid, "/status"));
  std::string line, state;
  while (std::getline(status, line)) {
    if (absl::StartsWith(line, "State:")) {
      state = std::string(absl::StripAsciiWhitespace(line.substr(6)));
      break;
    }
  }
  if (state.empty()) return "gone";
  std::ifstream wchan_file(absl::StrCat("/proc/", pid, "/wchan"));
  std::string wchan;
  std::getline(wchan_file, wchan);
  if (!wchan.empty() && wchan != "0") absl::StrAppend(&state, " in ", wchan);
  return state;
}

bool ListensOn(int port) {
  constexpr char kListen[] = "0A";  // TCP_LISTEN, as /proc/net/tcp shows it
  for (const char* table : {"/proc/net/tcp", "/proc/net/tcp6"}) {
    const std::string text = ReadProcFile(table, size_t{64} << 20);
    // "sl local_address rem_address st ...": the local address ends in
    // ":PORT" in hex.
    for (absl::string_view line : absl::StrSplit(text, '\n')) {
      std::vector<absl::string_view> fields =
          absl::StrSplit(line, ' ', absl::SkipEmpty());
      if (fields.size() < 4 || fields[3] != kListen) continue;
      const size_t colon = fields[1].rfind(':');
      int local = 0;
      if (colon != absl::string_view::npos &&
          absl::SimpleHexAtoi(fields[1].substr(colon + 1), &local) &&
          local == port) {
        return true;
      }
    }
  }
  return false;
}

}  // namespace ctrun
