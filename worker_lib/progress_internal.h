// What the rest of libctrun_worker writes into this worker's progress slot
// (progress_board.h) besides the public progress signals: in-process
// recovery's marks. Each does nothing outside ctrun.
#ifndef CTRUN_WORKER_LIB_PROGRESS_INTERNAL_H_
#define CTRUN_WORKER_LIB_PROGRESS_INTERNAL_H_

#include <cstdint>

namespace ctrun::progress_internal {

// The worker recovers in process (kResilient).
void MarkResilient();
// The worker connected to the job's store (kStoreUsed).
void MarkStoreUsed();
// It took `round`'s world (kLeft), or formed its communicator in it
// (kReady), now.
enum class RoundMark { kLeft, kReady };
void MarkRound(RoundMark which, int64_t round);

}  // namespace ctrun::progress_internal

#endif  // CTRUN_WORKER_LIB_PROGRESS_INTERNAL_H_
