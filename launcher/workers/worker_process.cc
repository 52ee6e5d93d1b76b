#include "launcher/workers/worker_process.h"

#include <dirent.h>
#include <fcntl.h>
#include <linux/mempolicy.h>
#include <sched.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <termios.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace ctrun {
namespace {

void CloseBoth(int fds[2]) {
  close(fds[0]);
  close(fds[1]);
}

absl::Status SystemError(absl::string_view what) {
  return absl::InternalError(absl::StrCat(what, ": ", strerror(errno)));
}

// A pseudo-terminal as a pipe: fds[0] the master (ctrun reads it), fds[1]
// the slave (the worker writes it). Neither becomes anyone's controlling
// terminal (O_NOCTTY; the worker keeps ctrun's).
absl::Status OpenTerminalPipe(int fds[2], int window_from) {
  const int master = posix_openpt(O_RDWR | O_NOCTTY | O_CLOEXEC);
  if (master < 0) return SystemError("posix_openpt");
  char name[128];
  if (grantpt(master) != 0 || unlockpt(master) != 0 ||
      ptsname_r(master, name, sizeof name) != 0) {
    const absl::Status s = SystemError("pseudo-terminal");
    close(master);
    return s;
  }
  const int slave = open(name, O_RDWR | O_NOCTTY | O_CLOEXEC);
  if (slave < 0) {
    const absl::Status s = SystemError(name);
    close(master);
    return s;
  }
  termios raw{};
  if (tcgetattr(slave, &raw) == 0) {
    cfmakeraw(&raw);
    tcsetattr(slave, TCSANOW, &raw);
  }
  winsize size{};
  if (window_from >= 0 && ioctl(window_from, TIOCGWINSZ, &size) == 0) {
    ioctl(slave, TIOCSWINSZ, &size);
  }
  fds[0] = master;
  fds[1] = slave;
  return absl::OkStatus();
}

}  // namespace

absl::Status OpenWorkerOutput(int fds[2], bool terminal, int window_from) {
  if (terminal) return OpenTerminalPipe(fds, window_from);
  if (pipe2(fds, O_CLOEXEC) != 0) return SystemError("pipe");
  return absl::OkStatus();
}

void KeepDescriptorsFromWorkers() {
  if (close_range(3, ~0U, CLOSE_RANGE_CLOEXEC) == 0) return;
  // Kernels before 5.11: one by one, as /proc lists them.
  DIR* dir = opendir("/proc/self/fd");
  if (dir == nullptr) return;
  const int own = dirfd(dir);
  while (const dirent* entry = readdir(dir)) {
    const int fd = atoi(entry->d_name);
    if (fd > 2 && fd != own) fcntl(fd, F_SETFD, FD_CLOEXEC);
  }
  closedir(dir);
}

absl::StatusOr<SpawnedProcess> SpawnWorker(const std::vector<std::string>& argv,
                                           const EnvMap& env,
                                           const SpawnOptions& options) {
  // Everything the child needs is prepared before the fork: after it, only
  // system calls (the agent has other threads, and the child shares its
  // memory until exec).
  std::vector<std::string> env_strings;
  env_strings.reserve(env.size());
  for (const auto& [k, v] : env) env_strings.push_back(absl::StrCat(k, "=", v));
  std::vector<char*> envp, args;
  for (auto& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);

  int out[2], err[2], exec_status[2];
  if (auto s = OpenWorkerOutput(out, options.tty_stdout, options.window_from);
      !s.ok()) {
    return s;
  }
  if (auto s = OpenWorkerOutput(err, options.tty_stderr, options.window_from);
      !s.ok()) {
    CloseBoth(out);
    return s;
  }
  if (pipe2(exec_status, O_CLOEXEC) != 0) {
    CloseBoth(out);
    CloseBoth(err);
    return SystemError("pipe");
  }
  // The binding, as the system calls take it.
  cpu_set_t cpus;
  CPU_ZERO(&cpus);
  unsigned long memory_nodes[16] = {};  // NOLINT: set_mempolicy's type
  const Binding* binding = options.binding;
  if (binding != nullptr) {
    for (int c : binding->cpus) {
      if (c < CPU_SETSIZE) CPU_SET(c, &cpus);
    }
    const int node = binding->memory_node;
    if (node >= 0 && node < static_cast<int>(sizeof memory_nodes * 8)) {
      memory_nodes[node / 64] |= 1UL << (node % 64);
    }
  }
  const bool own_group = options.own_group;
  const pid_t parent = getpid();
  // vfork: the child borrows the agent's memory until it execs, so starting
  // a worker costs no copy of the agent's page tables (fork of a process
  // with gRPC's threads and mappings took ~1.5 ms a worker). Until exec the
  // child only makes system calls on data prepared above.
  const pid_t pid = vfork();
  if (pid < 0) {
    CloseBoth(out);
    CloseBoth(err);
    CloseBoth(exec_status);
    return SystemError("fork");
  }
  if (pid == 0) {
    if (own_group) setpgid(0, 0);
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(127);  // the agent died before prctl
    // Under Yama's ptrace_scope=1 only an ancestor may attach: this lets
    // the agent's gdb (its child, the worker's sibling) read a hung
    // worker's stacks. (Fails harmlessly without Yama.)
    prctl(PR_SET_PTRACER, parent, 0, 0, 0);
    // Until exec, job control must not stop this child: the agent waits in
    // vfork for it. A stop signal sent to the agent's group meanwhile (Ctrl-Z,
    // a worker reading the terminal in the background) is dropped while
    // ignored, and would otherwise be pending here from the agent's mask.
    struct sigaction dfl = {}, ign = {};
    dfl.sa_handler = SIG_DFL;
    ign.sa_handler = SIG_IGN;
    for (int sig = 1; sig < NSIG; ++sig) {
      const bool stop = sig == SIGTSTP || sig == SIGTTIN || sig == SIGTTOU;
      sigaction(sig, stop ? &ign : &dfl, nullptr);
    }
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    for (int sig : {SIGTSTP, SIGTTIN, SIGTTOU}) sigaction(sig, &dfl, nullptr);
    dup2(out[1], STDOUT_FILENO);
    dup2(err[1], STDERR_FILENO);
    if (binding != nullptr) {
      // Planned from ctrun's own affinity, so it cannot be refused for
      // naming no usable CPU.
      sched_setaffinity(0, sizeof cpus, &cpus);
      if (binding->memory_node >= 0) {
        syscall(SYS_set_mempolicy, MPOL_PREFERRED, memory_nodes,
                sizeof memory_nodes * 8 + 1);
      }
    }
    execve(args[0], args.data(), envp.data());
    const int e = errno;
    (void)!write(exec_status[1], &e, sizeof e);
    _exit(127);
  }
  if (own_group) setpgid(pid, pid);  // both sides: the group exists now
  close(out[1]);
  close(err[1]);
  close(exec_status[1]);
  int child_errno = 0;
  ssize_t n;
  do {
    n = read(exec_status[0], &child_errno, sizeof child_errno);
  } while (n < 0 && errno == EINTR);
  close(exec_status[0]);
  if (n == sizeof child_errno) {
    waitpid(pid, nullptr, 0);
    close(out[0]);
    close(err[0]);
    return absl::FailedPreconditionError(
        absl::StrCat("cannot execute ", argv[0], ": ", strerror(child_errno)));
  }
  fcntl(out[0], F_SETFL, O_NONBLOCK);
  fcntl(err[0], F_SETFL, O_NONBLOCK);
  return SpawnedProcess{pid, out[0], err[0]};
}

}  // namespace ctrun
