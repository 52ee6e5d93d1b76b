// floors: the physical floors the benchmarks compare with.
//
//   floors spawn N
//       The least a launcher can do: start N `/bin/true` processes at once
//       (posix_spawn, which vforks) and wait for them all. Timed from the
//       outside like ctrun and torchrun, so it includes this program's own
//       start and exit.
//   floors run CMD [ARGS...]
//       Runs CMD (its output to /dev/null), waits for it and prints one JSON
//       line: its wall time from start to exit and its peak resident set
//       (wait4's ru_maxrss, in KiB). Measured from this small process rather
//       than from Python because ru_maxrss starts at the parent's own peak
//       when the child was vforked (Python's subprocess and posix_spawn both
//       vfork): a launcher measured from Python never reads below Python's
//       ~14 MiB. Its children are counted too.
//   floors rtt [ROUND_TRIPS]
//       One byte there and back over a loopback TCP connection, between two
//       processes, ROUND_TRIPS times (default 20000). Prints one JSON line
//       with the median and minimum round trip in microseconds.
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string_view>
#include <vector>

extern char** environ;

namespace {

[[noreturn]] void Die(const char* what) {
  std::perror(what);
  std::exit(1);
}

int Spawn(int n) {
  std::vector<pid_t> pids(n);
  char true_path[] = "/bin/true";
  char* argv[] = {true_path, nullptr};
  for (pid_t& pid : pids) {
    if (posix_spawn(&pid, true_path, nullptr, nullptr, argv, environ) != 0)
      Die("posix_spawn");
  }
  for (pid_t pid : pids) waitpid(pid, nullptr, 0);
  return 0;
}

int Run(char** argv) {
  posix_spawn_file_actions_t quiet;
  posix_spawn_file_actions_init(&quiet);
  posix_spawn_file_actions_addopen(&quiet, STDOUT_FILENO, "/dev/null", O_WRONLY,
                                   0);
  posix_spawn_file_actions_adddup2(&quiet, STDOUT_FILENO, STDERR_FILENO);
  const auto start = std::chrono::steady_clock::now();
  pid_t pid;
  if (posix_spawnp(&pid, argv[0], &quiet, nullptr, argv, environ) != 0)
    Die(argv[0]);
  int status = 0;
  rusage usage{};
  if (wait4(pid, &status, 0, &usage) != pid) Die("wait4");
  const double wall =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();
  const int code =
      WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  std::printf("{\"wall_s\":%.6f,\"maxrss_kib\":%ld,\"exit\":%d}\n", wall,
              usage.ru_maxrss, code);
  return 0;
}

void NoDelay(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

int RoundTrips(int count) {
  const int listener = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  if (bind(listener, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
      listen(listener, 1) != 0 ||
      getsockname(listener, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    Die("listen");
  }
  const pid_t echo = fork();
  if (echo == 0) {  // the other side: echoes every byte
    const int fd = accept(listener, nullptr, nullptr);
    NoDelay(fd);
    char c;
    while (read(fd, &c, 1) == 1 && write(fd, &c, 1) == 1) {
    }
    _exit(0);
  }
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0)
    Die("connect");
  NoDelay(fd);
  std::vector<double> us;
  us.reserve(count);
  char c = 'x';
  for (int i = 0; i < count; ++i) {
    const auto start = std::chrono::steady_clock::now();
    if (write(fd, &c, 1) != 1 || read(fd, &c, 1) != 1) Die("round trip");
    us.push_back(std::chrono::duration<double, std::micro>(
                     std::chrono::steady_clock::now() - start)
                     .count());
  }
  close(fd);
  waitpid(echo, nullptr, 0);
  std::sort(us.begin(), us.end());
  std::printf(
      "{\"bench\":\"rtt\",\"round_trips\":%d,\"median_us\":%.2f,"
      "\"min_us\":%.2f}\n",
      count, us[us.size() / 2], us.front());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc >= 3 && std::string_view(argv[1]) == "spawn") {
    return Spawn(std::atoi(argv[2]));
  }
  if (argc >= 3 && std::string_view(argv[1]) == "run") return Run(argv + 2);
  if (argc >= 2 && std::string_view(argv[1]) == "rtt") {
    return RoundTrips(argc >= 3 ? std::atoi(argv[2]) : 20000);
  }
  std::fprintf(stderr,
               "usage: floors spawn N | floors run CMD [ARGS...] | "
               "floors rtt [ROUND_TRIPS]\n");
  return 2;
}
