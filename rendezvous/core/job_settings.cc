#include "rendezvous/core/job_settings.h"

#include <algorithm>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "rendezvous/core/failure_class.h"

namespace ctrun {

namespace {

// `what` (a name operators write) is 1..max_bytes of [A-Za-z0-9._:/-].
absl::Status CheckLabel(absl::string_view what, absl::string_view text,
                        size_t max_bytes) {
  auto valid = [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
           (c >= '0' && c <= '9') || c == '.' || c == '_' || c == ':' ||
           c == '/' || c == '-';
  };
  if (text.empty() || text.size() > max_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, " must be 1..", max_bytes, " bytes, got ", text.size()));
  }
  if (auto bad = std::find_if_not(text.begin(), text.end(), valid);
      bad != text.end()) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, " may hold only [A-Za-z0-9._:/-], not byte 0x",
        absl::Hex(static_cast<unsigned char>(*bad), absl::kZeroPad2), " ('",
        absl::CHexEscape(absl::string_view(&*bad, 1)), "')"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckJobId(absl::string_view id) {
  return CheckLabel("job id", id, 128);
}

absl::Status CheckSegment(absl::string_view segment) {
  if (segment.empty()) return absl::OkStatus();
  return CheckLabel("segment", segment, 63);
}

absl::StatusOr<v1::JobSettings> ResolveJobSettings(v1::JobSettings s) {
  if (s.min_nodes() < 0 || s.max_nodes() < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "nodes ", s.min_nodes(), ":", s.max_nodes(), " must be positive"));
  }
  if (s.min_nodes() == 0) s.set_min_nodes(1);
  if (s.max_nodes() == 0) s.set_max_nodes(s.min_nodes());
  if (s.min_nodes() > s.max_nodes()) {
    return absl::InvalidArgumentError(
        absl::StrCat("min_nodes ", s.min_nodes(), " exceeds max_nodes ",
                     s.max_nodes(), "; use MIN:MAX with MIN <= MAX"));
  }
  if (s.max_nodes() > kMaxNodesPerJob) {
    return absl::InvalidArgumentError(absl::StrCat(
        "max_nodes ", s.max_nodes(), " exceeds the limit ", kMaxNodesPerJob));
  }
  if (s.max_restarts() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_restarts ", s.max_restarts(), " must be >= 0"));
  }
  struct Timeout {
    const char* name;
    int64_t value;
    int64_t fallback;
    void (v1::JobSettings::*set)(int64_t);
  };
  for (const Timeout& t :
       {Timeout{"join_timeout", s.join_timeout_ms(), kDefaultJoinTimeoutMs,
                &v1::JobSettings::set_join_timeout_ms},
        Timeout{"last_call_timeout", s.last_call_timeout_ms(),
                kDefaultLastCallTimeoutMs,
                &v1::JobSettings::set_last_call_timeout_ms},
        Timeout{"heartbeat_timeout", s.heartbeat_timeout_ms(),
                kDefaultHeartbeatTimeoutMs,
                &v1::JobSettings::set_heartbeat_timeout_ms}}) {
    if (t.value < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(t.name, " of ", t.value, " ms must be positive"));
    }
    if (t.value == 0) (s.*t.set)(t.fallback);
  }
  if (s.spares() < 0 || s.spares() > kMaxSpares) {
    return absl::InvalidArgumentError(absl::StrCat(
        "spares ", s.spares(), " is out of range (0..", kMaxSpares, ")"));
  }
  if (s.restart_on() == 0) s.set_restart_on(RestartOnDefault());
  if ((s.restart_on() & ~RestartOnAll()) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "restart_on 0x", absl::Hex(s.restart_on()),
        " names failure classes this service does not know (it knows ",
        FormatRestartOn(RestartOnAll()), ": 0x", absl::Hex(RestartOnAll()),
        ")"));
  }
  if (s.master_port() < 0 || s.master_port() > 65535) {
    return absl::InvalidArgumentError(absl::StrCat(
        "master_port ", s.master_port(), " is not a port (1..65535)"));
  }
  return s;
}

std::string DescribeSettingsDifference(const v1::JobSettings& job,
                                       const v1::JobSettings& join) {
  struct Field {
    const char* name;
    int64_t job;
    int64_t join;
  };
  for (const Field& f :
       {Field{"min_nodes", job.min_nodes(), join.min_nodes()},
        Field{"max_nodes", job.max_nodes(), join.max_nodes()},
        Field{"max_restarts", job.max_restarts(), join.max_restarts()},
        Field{"join_timeout_ms", job.join_timeout_ms(), join.join_timeout_ms()},
        Field{"last_call_timeout_ms", job.last_call_timeout_ms(),
              join.last_call_timeout_ms()},
        Field{"heartbeat_timeout_ms", job.heartbeat_timeout_ms(),
              join.heartbeat_timeout_ms()},
        Field{"master_port", job.master_port(), join.master_port()},
        Field{"spares", job.spares(), join.spares()},
        Field{"restart_on", job.restart_on(), join.restart_on()}}) {
    if (f.job != f.join) {
      return absl::StrCat(f.name, " is ", f.job, " for the job, ", f.join,
                          " in this join");
    }
  }
  return "";
}

}  // namespace ctrun
