#include "rendezvous/core/restart_reason.h"

namespace ctrun {

const char* RestartReasonName(v1::RestartRequired::Reason reason) {
  switch (reason) {
    case v1::RestartRequired::WORKER_FAILED:
      return "worker_failed";
    case v1::RestartRequired::NODE_LOST:
      return "node_lost";
    case v1::RestartRequired::NODE_WAITING:
      return "scale_up";
    case v1::RestartRequired::WORKER_HUNG:
      return "worker_hung";
    default:
      return "unspecified";
  }
}

}  // namespace ctrun
