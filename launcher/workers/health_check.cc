#include "launcher/workers/health_check.h"

#include <signal.h>

#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "launcher/workers/agent_board.h"
#include "launcher/workers/run_briefly.h"

namespace ctrun {
namespace {

// The shell says the command's exit status on its last line: the agent's
// loop reaps every child, and may take the shell's status first.
constexpr char kStatusMark[] = "ctrun-health-status=";

// The check's own line travels in the join (a protobuf string: UTF-8) and
// is printed on every node's console: at most this many bytes of it, as
// valid UTF-8 without control characters.
constexpr size_t kMaxLineBytes = 1024;

std::string Presentable(absl::string_view line) {
  std::string out = SanitizeUtf8(line.substr(0, kMaxLineBytes));
  for (char& c : out) {
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) c = ' ';
  }
  return out;
}

}  // namespace

std::string RunHealthCommand(const std::string& command, absl::Duration timeout,
                             std::atomic<pid_t>* running) {
  const std::string script = absl::StrCat(
      "(", command, "\n) </dev/null\nprintf '\\n", kStatusMark, "%d\\n' $?");
  auto run = RunBriefly({"/bin/sh", "-c", script}, timeout, running);
  if (!run.ok()) {
    if (absl::StrContains(run.status().message(), "did not end within")) {
      return absl::StrCat("`", command, "` did not end within ",
                          absl::FormatDuration(timeout));
    }
    return absl::StrCat("`", command,
                        "` could not run: ", run.status().message());
  }
  std::vector<std::string> lines;
  for (absl::string_view line : absl::StrSplit(*run, '\n')) {
    line = absl::StripAsciiWhitespace(line);
    if (!line.empty()) lines.emplace_back(line);
  }
  int status = -1;
  if (!lines.empty() && absl::StartsWith(lines.back(), kStatusMark) &&
      absl::SimpleAtoi(lines.back().substr(sizeof kStatusMark - 1), &status)) {
    lines.pop_back();
  }
  if (status == 0) return "";
  return absl::StrCat("`", command, "` ",
                      status < 0 ? std::string("ended without an exit status")
                                 : absl::StrCat("exited ", status),
                      lines.empty() ? "" : ": ",
                      lines.empty() ? "" : Presentable(lines.back()));
}

HealthCheck::HealthCheck(std::string command, std::function<std::string()> gpus,
                         std::function<void(std::string)> done) {
  thread_ = std::thread([this, command = std::move(command),
                         gpus = std::move(gpus), done = std::move(done)] {
    std::vector<std::string> problems;
    if (!command.empty()) {
      std::string p = RunHealthCommand(command, kTimeout, &running_);
      if (!p.empty()) problems.push_back(std::move(p));
    }
    if (gpus && !cancelled_) {
      std::string p = gpus();
      if (!p.empty()) problems.push_back(std::move(p));
    }
    if (!cancelled_) done(absl::StrJoin(problems, "; "));
    finished_ = true;
  });
}

HealthCheck::~HealthCheck() {
  cancelled_ = true;
  // The command may be about to start: end it whenever it shows.
  while (!finished_) {
    if (const pid_t pid = running_.load(); pid > 0) kill(-pid, SIGKILL);
    absl::SleepFor(absl::Milliseconds(5));
  }
  thread_.join();
}

}  // namespace ctrun
