#include "launcher/workers/template_spawner.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace ctrun {
namespace {

// One message of the template's, waiting at most `timeout_ms` (0: only
// what is there now). Empty when none came, or the template is gone.
std::string Receive(int socket, int timeout_ms, bool* gone) {
  pollfd p{socket, POLLIN, 0};
  int n;
  do {
    n = poll(&p, 1, timeout_ms);
  } while (n < 0 && errno == EINTR);
  if (n <= 0) return "";
  char buffer[4096];
  ssize_t got;
  do {
    got = recv(socket, buffer, sizeof buffer, 0);
  } while (got < 0 && errno == EINTR);
  if (got <= 0) {
    *gone = true;
    return "";
  }
  return std::string(buffer, static_cast<size_t>(got));
}

}  // namespace

TemplateSpawner::TemplateSpawner(TemplateConfig config)
    : config_(std::move(config)) {
  int pair[2];
  if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, pair) != 0) {
    TurnOff(absl::StrCat("socketpair: ", strerror(errno)));
    return;
  }
  // The template's end crosses its exec; nothing else is started meanwhile
  // (the loop's thread is the only one that starts processes).
  fcntl(pair[1], F_SETFD, 0);
  std::vector<std::string> argv = config_.python;
  argv.push_back(config_.script);
  argv.push_back(absl::StrCat(pair[1]));
  argv.push_back(absl::StrJoin(config_.modules, ","));
  if (config_.optional) argv.push_back("optional");
  auto spawned = SpawnWorker(argv, config_.env);
  close(pair[1]);
  if (!spawned.ok()) {
    close(pair[0]);
    TurnOff(std::string(spawned.status().message()));
    return;
  }
  // It writes nothing: whatever it would print has nowhere to go.
  close(spawned->stdout_fd);
  close(spawned->stderr_fd);
  socket_ = pair[0];
  pid_ = spawned->pid;
}

TemplateSpawner::~TemplateSpawner() {
  if (socket_ >= 0) close(socket_);  // it exits on the end of its socket
  if (pid_ > 0) kill(pid_, SIGKILL);
}

void TemplateSpawner::TurnOff(const std::string& why) {
  if (state_ == State::kOff) return;
  state_ = State::kOff;
  if (config_.say) {
    config_.say(absl::StrCat("warm starts are off: ", why,
                             "; workers start cold (with a fresh import)"));
  }
  if (socket_ >= 0) close(socket_);
  socket_ = -1;
  if (pid_ > 0) kill(pid_, SIGKILL);  // reaped by the group as a stray
}

bool TemplateSpawner::Ready() {
  if (state_ != State::kImporting) return state_ == State::kReady;
  bool gone = false;
  const absl::Time now = absl::Now();
  // The starts of one batch (every local rank's, within milliseconds)
  // share one wait: the loop sends no heartbeat between them. A start
  // after the loop has run again gets a wait of its own.
  if (now >= wait_until_ + absl::Milliseconds(config_.wait_ms)) {
    wait_until_ = now + absl::Milliseconds(config_.wait_ms);
  }
  const int64_t left_ms =
      kReadyWithinMs - absl::ToInt64Milliseconds(now - started_);
  const int wait_ms = static_cast<int>(std::clamp<int64_t>(
      std::min<int64_t>(absl::ToInt64Milliseconds(wait_until_ - now), left_ms),
      0, kReadyWithinMs));
  const std::string said = Receive(socket_, wait_ms, &gone);
  if (said.empty() && !gone && wait_ms < left_ms) {
    if (!said_importing_ && config_.say) {
      said_importing_ = true;
      config_.say(
          absl::StrCat("the template interpreter is still importing after ",
                       absl::ToInt64Seconds(absl::Now() - started_),
                       "s; workers start cold until it is ready, then warm"));
    }
  } else if (said.empty() && !gone) {
    TurnOff(absl::StrCat("the template interpreter's imports took over ",
                         kReadyWithinMs / 1000, "s"));
  } else if (gone) {
    TurnOff("the template interpreter exited while importing");
  } else if (absl::StartsWith(said, "ready")) {
    state_ = State::kReady;
  } else if (absl::StartsWith(said, "refuse ")) {
    TurnOff(
        absl::StrCat("the template interpreter cannot fork: ", said.substr(7)));
  }
  return state_ == State::kReady;
}

absl::StatusOr<SpawnedProcess> TemplateSpawner::Spawn(
    const std::vector<std::string>& argv, const EnvMap& env,
    const SpawnOptions& options) {
  const size_t flags = config_.python.size();
  const bool python =
      argv.size() > flags &&
      std::equal(config_.python.begin(), config_.python.end(), argv.begin());
  if (!python || options.binding != nullptr || !Ready()) {
    return exec_.Spawn(argv, env, options);
  }
  auto forked = Fork(argv, env, options);
  if (forked.ok()) {
    ++warm_starts_;
    return forked;
  }
  TurnOff(std::string(forked.status().message()));
  return exec_.Spawn(argv, env, options);
}

absl::StatusOr<SpawnedProcess> TemplateSpawner::Fork(
    const std::vector<std::string>& argv, const EnvMap& env,
    const SpawnOptions& options) {
  int out[2], err[2];
  if (auto s = OpenWorkerOutput(out, options.tty_stdout, options.window_from);
      !s.ok()) {
    return s;
  }
  if (auto s = OpenWorkerOutput(err, options.tty_stderr, options.window_from);
      !s.ok()) {
    close(out[0]);
    close(out[1]);
    return s;
  }
  std::error_code ec;
  std::string request = absl::StrCat(
      options.own_group ? "1" : "0", std::string(1, '\0'), getpgrp(),
      std::string(1, '\0'), getpid(), std::string(1, '\0'),
      std::filesystem::current_path(ec).string(), std::string(1, '\0'),
      argv.size() - config_.python.size());
  for (size_t i = config_.python.size(); i < argv.size(); ++i) {
    absl::StrAppend(&request, std::string(1, '\0'), argv[i]);
  }
  absl::StrAppend(&request, std::string(1, '\0'), env.size());
  for (const auto& [key, value] : env) {
    absl::StrAppend(&request, std::string(1, '\0'), key, "=", value);
  }
  // The worker's ends of its stdout and stderr travel with the request.
  const int fds[2] = {out[1], err[1]};
  char control[CMSG_SPACE(sizeof fds)] = {};
  iovec io{request.data(), request.size()};
  msghdr message{};
  message.msg_iov = &io;
  message.msg_iovlen = 1;
  message.msg_control = control;
  message.msg_controllen = sizeof control;
  cmsghdr* header = CMSG_FIRSTHDR(&message);
  header->cmsg_level = SOL_SOCKET;
  header->cmsg_type = SCM_RIGHTS;
  header->cmsg_len = CMSG_LEN(sizeof fds);
  std::memcpy(CMSG_DATA(header), fds, sizeof fds);
  ssize_t sent;
  do {
    sent = sendmsg(socket_, &message, MSG_NOSIGNAL);
  } while (sent < 0 && errno == EINTR);
  close(out[1]);
  close(err[1]);
  auto fail = [&](std::string why) {
    close(out[0]);
    close(err[0]);
    return absl::InternalError(std::move(why));
  };
  if (sent != static_cast<ssize_t>(request.size())) {
    return fail(absl::StrCat("cannot reach the template interpreter: ",
                             strerror(errno)));
  }
  bool gone = false;
  // The loop waits with the answer, heartbeats included: no longer than a
  // batch may wait for the imports (heartbeat-safe), then the start is cold.
  const int answer_within_ms = std::min(kAnswerWithinMs, config_.wait_ms);
  const std::string answer = Receive(socket_, answer_within_ms, &gone);
  pid_t pid = 0;
  if (!absl::StartsWith(answer, "pid ") ||
      !absl::SimpleAtoi(answer.substr(4), &pid) || pid <= 0) {
    if (absl::StartsWith(answer, "error ")) {
      return fail(absl::StrCat("the template interpreter cannot fork: ",
                               answer.substr(6)));
    }
    return fail(gone ? "the template interpreter exited"
                     : absl::StrCat("the template interpreter did not answer "
                                    "within ",
                                    absl::FormatDuration(
                                        absl::Milliseconds(answer_within_ms))));
  }
  // The worker is the agent's child now (the template's middle process
  // has exited): its group is set from both sides, as SpawnWorker does.
  setpgid(pid, options.own_group ? pid : getpgrp());
  fcntl(out[0], F_SETFL, O_NONBLOCK);
  fcntl(err[0], F_SETFL, O_NONBLOCK);
  return SpawnedProcess{pid, out[0], err[0], /*warm=*/true};
}

}  // namespace ctrun
