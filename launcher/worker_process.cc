#include "launcher/worker_process.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
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

}  // namespace

absl::StatusOr<SpawnedProcess> SpawnWorker(const std::vector<std::string>& argv,
                                           const EnvMap& env) {
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
  if (pipe2(out, O_CLOEXEC) != 0) {
    return absl::InternalError(absl::StrCat("pipe: ", strerror(errno)));
  }
  if (pipe2(err, O_CLOEXEC) != 0) {
    CloseBoth(out);
    return absl::InternalError(absl::StrCat("pipe: ", strerror(errno)));
  }
  if (pipe2(exec_status, O_CLOEXEC) != 0) {
    CloseBoth(out);
    CloseBoth(err);
    return absl::InternalError(absl::StrCat("pipe: ", strerror(errno)));
  }
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
    return absl::InternalError(absl::StrCat("fork: ", strerror(errno)));
  }
  if (pid == 0) {
    setpgid(0, 0);
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(127);  // the agent died before prctl
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    struct sigaction dfl = {};
    dfl.sa_handler = SIG_DFL;
    for (int sig = 1; sig < NSIG; ++sig) sigaction(sig, &dfl, nullptr);
    dup2(out[1], STDOUT_FILENO);
    dup2(err[1], STDERR_FILENO);
    execve(args[0], args.data(), envp.data());
    const int e = errno;
    (void)!write(exec_status[1], &e, sizeof e);
    _exit(127);
  }
  setpgid(pid, pid);  // both sides, so the group exists when we return
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
