// JobRecap: the one line that ends every job on a node, for the user who
// asks what the failures cost: the job's wall time on this node, its
// rounds, the restarts used, the processes started anew, and the time lost
// to failures.
//
// Time lost is counted per round change, from the moment this node saw the
// old round end (a worker failed, a restart was asked, a node was lost)
// until a worker of this node stepped again (a heartbeat or an outermost
// section's end) in a later round. Where no step ever comes (a job that
// sends no progress signals), it counts until that later round started
// here, and the line says so. Steps replayed from a checkpoint are the
// job's own business and are not seen.
//
// Pure: fed `now` by the agent's policy. Not thread-safe.
#ifndef CTRUN_LAUNCHER_POLICY_JOB_RECAP_H_
#define CTRUN_LAUNCHER_POLICY_JOB_RECAP_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/time/time.h"

namespace ctrun {

// A wall time as the job's last lines say it: "1.7s" (rounded to a tenth)
// under a minute, "2m5s" (whole seconds) beyond.
std::string FormatWall(absl::Duration wall);

class JobRecap {
 public:
  // The agent started.
  void Start(absl::Time now);
  // This node saw its round end; only the first call of a round counts.
  void RoundEnded(absl::Time now);
  // A round's assignment: its number, the restarts the job used and allows,
  // and how many of this node's workers got a new process for it (none
  // counted for this node's first round).
  void RoundStarted(int64_t round, int32_t restarts_used, int32_t max_restarts,
                    int new_processes, absl::Time now);
  // The sum of this node's workers' steps (heartbeats and outermost
  // sections) as just read.
  void Stepped(uint64_t steps, absl::Time now);

  // "job ended with exit 0 after 1m2s: 3 rounds, restarts used 1/3, 2
  // processes started anew, 0.42s lost to failures".
  std::string Line(int exit_code, absl::Time now) const;

 private:
  absl::Time start_ = absl::InfinitePast();
  int64_t first_round_ = -1, last_round_ = -1;
  int32_t restarts_used_ = 0, max_restarts_ = 0;
  int new_processes_ = 0;
  uint64_t steps_ = 0;
  bool stepped_ever_ = false;
  // The current loss: since when, and when the next round started here
  // (what is counted if no step comes).
  std::optional<absl::Time> ended_, restarted_;
  absl::Duration lost_ = absl::ZeroDuration();
};

}  // namespace ctrun

#endif  // CTRUN_LAUNCHER_POLICY_JOB_RECAP_H_
