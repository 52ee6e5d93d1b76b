// FileTimers: torchrun's file-based worker timers, served by the agent.
//
// With TORCHELASTIC_ENABLE_FILE_TIMER=1 the agent makes a FIFO and names it
// to the workers in TORCHELASTIC_TIMER_FILE; torch's FileTimerClient (and
// `torch.distributed.elastic.timer.expires`) writes one JSON line per
// acquire or release: {"version": 1, "pid": P, "scope_id": S,
// "expiration_time": WALL_SECONDS, "signal": N}, a negative expiration_time
// releasing the scope. An expired timer kills its process with its signal.
// This is the pure part: requests in, expiries out, on the agent's
// monotonic clock (a request's wall-clock expiry is converted on arrival).
#ifndef CTRUN_LAUNCHER_POLICY_FILE_TIMERS_H_
#define CTRUN_LAUNCHER_POLICY_FILE_TIMERS_H_

#include <sys/types.h>

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace ctrun {

struct FileTimerRequest {
  pid_t pid = 0;
  std::string scope;
  double expiration_time = -1;  // wall-clock seconds; < 0: release
  int signal = 0;               // <= 0: expire without killing
};

// One line as FileTimerClient writes it. INVALID_ARGUMENT naming what is
// wrong.
absl::StatusOr<FileTimerRequest> ParseFileTimerRequest(absl::string_view line);

class FileTimers {
 public:
  // More timers than this are refused (a worker that never releases).
  static constexpr size_t kMaxTimers = 4096;

  struct Expired {
    pid_t pid = 0;
    std::string scope;
    int signal = 0;
  };

  // Sets or releases a timer. `now` and `wall_now` are the same moment on
  // the monotonic and the wall clock. RESOURCE_EXHAUSTED beyond kMaxTimers.
  absl::Status Apply(const FileTimerRequest& request, absl::Time now,
                     absl::Time wall_now);
  // The timers expired at `now`, one per process: its earliest with a
  // signal, as torchrun reaps them (a process whose expired timers carry
  // no signal is not killed). Every timer of those processes is dropped,
  // and so are expired timers without a signal.
  std::vector<Expired> TakeExpired(absl::Time now);
  absl::Time NextExpiry() const;
  void Clear() { timers_.clear(); }
  size_t size() const { return timers_.size(); }

 private:
  struct Timer {
    absl::Time expires;
    int signal = 0;
  };
  std::map<std::pair<pid_t, std::string>, Timer> timers_;
};

}  // namespace ctrun

#endif  // CTRUN_LAUNCHER_POLICY_FILE_TIMERS_H_
