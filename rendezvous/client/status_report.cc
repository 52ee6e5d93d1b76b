#include "rendezvous/client/status_report.h"

#include <google/protobuf/descriptor.h>
#include <google/protobuf/util/json_util.h>

#include <regex>
#include <set>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/time.h"

namespace ctrun {
namespace {

std::string Lower(const std::string& name) {
  return absl::AsciiStrToLower(name);
}

std::string Ranks(const v1::NodeStatus& n) {
  if (n.first_global_rank() < 0) return "-";
  const int last = n.first_global_rank() + n.local_world_size() - 1;
  return last == n.first_global_rank()
             ? absl::StrCat(last)
             : absl::StrCat(n.first_global_rank(), "-", last);
}

}  // namespace

std::string FormatJobs(const std::vector<v1::JobStatus>& jobs) {
  if (jobs.empty()) return "no jobs\n";
  std::string out;
  for (const auto& job : jobs) {
    const auto& s = job.settings();
    absl::StrAppendFormat(
        &out,
        "job %s  %s  round %d  nodes %d (min %d, max %d%s)  world %d  "
        "restarts %d/%d",
        job.job_id(), Lower(v1::JobStatus::Phase_Name(job.phase())),
        job.round(), job.nodes_size(), s.min_nodes(), s.max_nodes(),
        s.spares() > 0 ? absl::StrCat(", spares ", s.spares()) : "",
        job.world_size(), job.restart_count(), s.max_restarts());
    if (!job.master_addr().empty()) {
      absl::StrAppendFormat(&out, "  master %s:%d", job.master_addr(),
                            job.master_port());
    }
    absl::StrAppend(&out, "  keys ", job.num_keys(), "\n");
    if (!job.failure().empty()) {
      absl::StrAppend(&out, "  failure: ", job.failure(), "\n");
    }
    if (job.has_last_restart()) {
      const v1::RestartRequired& r = job.last_restart();
      absl::StrAppend(&out, "  last restart: round ", r.round(), ", ",
                      Lower(v1::RestartRequired::Reason_Name(r.reason())), ": ",
                      r.detail(), "\n");
    }
    absl::StrAppendFormat(&out, "  %-5s %-24s %-22s %-8s %-14s %-11s %s\n",
                          "GROUP", "HOST", "ADDRESS", "PID", "STATE", "RANKS",
                          "HEARTBEAT");
    for (const auto& n : job.nodes()) {
      absl::StrAppendFormat(
          &out, "  %-5s %-24s %-22s %-8d %-14s %-11s %s\n",
          n.group_rank() < 0 ? "-" : absl::StrCat(n.group_rank()),
          n.node().hostname(), n.address(), n.node().pid(),
          n.spare() ? std::string("spare")
                    : Lower(v1::NodeStatus::State_Name(n.state())),
          Ranks(n),
          n.resuming()
              ? std::string("resuming")
              : absl::StrFormat("%.1fs ago", n.heartbeat_age_ms() / 1000.0));
    }
    for (const auto& n : job.nodes()) {
      if (n.kept_workers() == 0) continue;
      absl::StrAppendFormat(&out, "  in-process: %s kept %d of %d processes",
                            n.node().hostname(), n.kept_workers(),
                            n.local_world_size());
      if (n.recovery_s() > 0) {
        absl::StrAppendFormat(&out, ", every rank back in %.2fs",
                              n.recovery_s());
      }
      absl::StrAppend(&out, "\n");
    }
    for (const auto& lost : job.lost_nodes()) {
      absl::StrAppend(&out, "  lost: ", lost, "\n");
    }
    for (const auto& p : job.promotions()) {
      absl::StrAppend(&out, "  spare: ", p, "\n");
    }
    for (const auto& l : job.longest()) {
      absl::StrAppendFormat(
          &out, "  longest silence%s: %.3gs (--hang_timeout=auto)\n",
          l.section().empty() ? "" : absl::StrCat(" in '", l.section(), "'"),
          l.longest_ms() / 1000.0);
    }
    for (const auto& s : job.stragglers()) {
      absl::StrAppendFormat(
          &out, "  straggler: rank %d on %s, %.1fx the median %s (%d steps)\n",
          s.rank(), s.node(), s.ratio(),
          s.sections() ? "time in sections" : "step", s.steps());
    }
  }
  return out;
}

namespace {

// The names of the 64-bit integer fields of `type` and of the messages it
// holds, minus any name that some string field also has.
void Int64Fields(const google::protobuf::Descriptor* type,
                 std::set<const google::protobuf::Descriptor*>* seen,
                 std::set<std::string>* int64s, std::set<std::string>* others) {
  using google::protobuf::FieldDescriptor;
  if (!seen->insert(type).second) return;
  for (int i = 0; i < type->field_count(); ++i) {
    const FieldDescriptor* f = type->field(i);
    switch (f->cpp_type()) {
      case FieldDescriptor::CPPTYPE_INT64:
      case FieldDescriptor::CPPTYPE_UINT64:
        (f->is_repeated() ? others : int64s)->insert(f->name());
        break;
      case FieldDescriptor::CPPTYPE_MESSAGE:
        Int64Fields(f->message_type(), seen, int64s, others);
        break;
      default:
        others->insert(f->name());
    }
  }
}

}  // namespace

std::string FormatJobsJson(const v1::ListJobsResponse& jobs) {
  std::string json;
  google::protobuf::util::JsonPrintOptions print;
  print.add_whitespace = true;
  print.always_print_primitive_fields = true;
  print.preserve_proto_field_names = true;
  if (!google::protobuf::util::MessageToJsonString(jobs, &json, print).ok()) {
    return "{}\n";  // cannot happen for a message that was parsed
  }
  std::set<const google::protobuf::Descriptor*> seen;
  std::set<std::string> int64s, others;
  Int64Fields(v1::ListJobsResponse::descriptor(), &seen, &int64s, &others);
  for (const std::string& name : int64s) {
    if (others.contains(name)) continue;
    json = std::regex_replace(
        json, std::regex("(\"" + name + "\": )\"(-?[0-9]+)\""), "$1$2");
  }
  return json;
}

absl::StatusOr<v1::ListJobsResponse> FetchJobs(AdminClient& admin,
                                               const std::string& job) {
  if (job.empty()) return admin.ListJobs();
  auto described = admin.DescribeJob(job);
  if (!described.ok()) return described.status();
  v1::ListJobsResponse jobs;
  *jobs.add_jobs() = *std::move(described);
  return jobs;
}

void PrintJobs(const v1::ListJobsResponse& jobs, bool json,
               const Connection& connection, const std::string& asked,
               std::ostream& out, std::ostream& notes) {
  if (const std::string leader = connection.leader(); !leader.empty()) {
    (json ? notes : out) << "leader: " << leader << " (" << asked
                         << " stands by)\n";
  }
  if (json) {
    out << FormatJobsJson(jobs);
    return;
  }
  out << FormatJobs({jobs.jobs().begin(), jobs.jobs().end()});
  if (jobs.quarantined().empty()) return;
  out << "quarantined nodes (their health check failed; no job admits them "
         "until then, or only that job when it joined with a job token):\n";
  for (const v1::QuarantinedNode& q : jobs.quarantined()) {
    out << "  " << q.hostname() << "  for another "
        << absl::FormatDuration(absl::Ceil(absl::Milliseconds(q.remaining_ms()),
                                           absl::Seconds(1)))
        << " (job " << q.job_id() << (q.job_only() ? ", that job only" : "")
        << "): " << q.reason() << "\n";
  }
}

}  // namespace ctrun
