// A restart's reason as the event log and the metrics name it. Apart from
// the core so that the agent's policy can name reasons alike without the
// core.
#ifndef CTRUN_RENDEZVOUS_CORE_RESTART_REASON_H_
#define CTRUN_RENDEZVOUS_CORE_RESTART_REASON_H_

#include "ctrun/v1/rendezvous.pb.h"

namespace ctrun {

// worker_failed, node_lost, scale_up, worker_hung; unspecified otherwise.
const char* RestartReasonName(v1::RestartRequired::Reason reason);

}  // namespace ctrun

#endif  // CTRUN_RENDEZVOUS_CORE_RESTART_REASON_H_
