// Failure classes: what a worker's failure most likely was (its agent reads
// it, launcher/policy/classify_failure.h), and which classes a job restarts
// for (JobSettings.restart_on, ctrun --restart_on). Apart from the core so
// that the agent and its flags name classes alike.
#ifndef CTRUN_RENDEZVOUS_CORE_FAILURE_CLASS_H_
#define CTRUN_RENDEZVOUS_CORE_FAILURE_CLASS_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "ctrun/v1/rendezvous.pb.h"

namespace ctrun {

// user_error, oom, hardware, network, hang, signal, other (unspecified and
// unknown values read as other).
const char* FailureClassName(v1::FailureClass c);
// For sentences: "a user error", "out of memory", "a hardware or driver
// fault", "a communication failure", "a hang", "a signal from outside",
// "a failure".
const char* FailureClassWords(v1::FailureClass c);

// A set of classes: bit 1 << class.
uint32_t RestartOnDefault();  // every class but user_error
uint32_t RestartOnAll();
// "all", or a comma-separated list of class names, with "default" standing
// for RestartOnDefault(). INVALID_ARGUMENT naming the bad word and the
// names that would do.
absl::StatusOr<uint32_t> ParseRestartOn(absl::string_view list);
// The list ParseRestartOn reads back: "all", "default", or the names in
// class order.
std::string FormatRestartOn(uint32_t set);
// Whether a failure of class `c` restarts a job with `restart_on` (0: the
// default).
bool RestartsOn(uint32_t restart_on, v1::FailureClass c);

}  // namespace ctrun

#endif  // CTRUN_RENDEZVOUS_CORE_FAILURE_CLASS_H_
