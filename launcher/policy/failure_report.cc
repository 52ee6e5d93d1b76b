#include "launcher/policy/failure_report.h"

#include <fcntl.h>
#include <google/protobuf/struct.pb.h>
#include <google/protobuf/util/json_util.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "rendezvous/core/failure_class.h"

namespace ctrun {
namespace {

const google::protobuf::Value* Field(const google::protobuf::Struct& s,
                                     const std::string& name) {
  auto it = s.fields().find(name);
  return it == s.fields().end() ? nullptr : &it->second;
}

// `cascade`: it followed the root cause and reads as its consequence (a
// peer gone), so it is labelled as such.
std::string Describe(const WorkerFailureRecord& f, bool cascade = false) {
  std::string out;
  absl::StrAppend(
      &out, "  time       : ",
      absl::FormatTime("%Y-%m-%d_%H:%M:%S", f.time, absl::LocalTimeZone()),
      "\n");
  absl::StrAppend(&out, "  host       : ", f.host, "\n");
  absl::StrAppend(&out, "  rank       : ", f.rank,
                  " (local_rank: ", f.local_rank, ")\n");
  if (!f.cause.empty()) {
    absl::StrAppend(&out, "  cause      : ", f.hung ? "hung: " : "", f.cause,
                    "\n");
  }
  if (f.hung) {
    absl::StrAppend(&out, "  exitcode   : <hung> (pid: ", f.pid,
                    "; ctrun exits ", kHangExitCode, ")\n");
  } else if (f.signal != 0) {
    absl::StrAppend(&out, "  exitcode   : ", -f.signal, " (pid: ", f.pid,
                    ")\n  signal     : SIG", sigabbrev_np(f.signal), " (",
                    strsignal(f.signal), ")\n");
  } else {
    absl::StrAppend(&out, "  exitcode   : ", f.exit_code, " (pid: ", f.pid,
                    ")\n");
  }
  absl::StrAppend(&out, "  class      : ", FailureClassName(f.failure_class),
                  cascade ? ", after the root cause (a cascade of it)" : "",
                  f.error.empty() || f.error == f.cause
                      ? ""
                      : absl::StrCat(" (", f.error, ")"),
                  "\n");
  if (f.remote) {
    // The same path here would be another file, if any: not read.
    absl::StrAppend(&out, "  error_file : ",
                    f.error_file.empty()
                        ? std::string("<N/A>")
                        : absl::StrCat(f.error_file, " on ", f.host,
                                       " (its traceback is in that node's "
                                       "summary)"),
                    "\n");
    return out;
  }
  auto contents = ReadErrorFile(f.error_file);
  absl::StrAppend(
      &out, "  error_file : ", contents.ok() ? f.error_file : "<N/A>", "\n");
  if (contents.ok()) {
    if (!contents->message.empty()) {
      absl::StrAppend(&out, "  message    : ", contents->message, "\n");
    }
    if (!contents->traceback.empty()) {
      absl::StrAppend(
          &out, "  traceback  :\n    ",
          absl::StrReplaceAll(contents->traceback, {{"\n", "\n    "}}), "\n");
    }
  } else {
    absl::StrAppend(&out,
                    "  traceback  : to record one, decorate the Python "
                    "entrypoint with torch.distributed.elastic."
                    "multiprocessing.errors.record\n");
  }
  return out;
}

}  // namespace

absl::StatusOr<ErrorFileContents> ReadErrorFile(const std::string& path) {
  // The workers write where it lies: a FIFO there must not hold the agent,
  // so it is opened without waiting and read only when regular.
  const int fd = open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return absl::NotFoundError(absl::StrCat("no error file ", path));
  absl::Cleanup closing = [fd] { close(fd); };
  struct stat st {};
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size > (1 << 20)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "error file ", path, " is not a regular file of at most 1 MiB"));
  }
  std::string text(static_cast<size_t>(st.st_size), '\0');
  text.resize(std::max<ssize_t>(0, read(fd, text.data(), text.size())));
  google::protobuf::Struct root;
  if (!google::protobuf::util::JsonStringToMessage(text, &root).ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("error file ", path, " is not JSON"));
  }
  ErrorFileContents contents;
  const auto* message = Field(root, "message");
  if (message == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("error file ", path, " has no \"message\""));
  }
  if (message->has_string_value()) {
    contents.message = message->string_value();
    return contents;
  }
  if (!message->has_struct_value()) {
    return absl::InvalidArgumentError(
        absl::StrCat("error file ", path, " has an unknown \"message\""));
  }
  const auto& m = message->struct_value();
  if (const auto* text_field = Field(m, "message")) {
    contents.message = text_field->string_value();
  }
  if (const auto* extra = Field(m, "extraInfo");
      extra != nullptr && extra->has_struct_value()) {
    if (const auto* stack = Field(extra->struct_value(), "py_callstack")) {
      contents.traceback = stack->string_value();
      while (!contents.traceback.empty() && contents.traceback.back() == '\n') {
        contents.traceback.pop_back();
      }
    }
  }
  return contents;
}

std::string FormatFailureSummary(
    const std::string& title,
    const std::vector<WorkerFailureRecord>& failures) {
  const std::string rule(72, '=');
  const std::string thin(72, '-');
  std::string out = absl::StrCat(rule, "\n", title, " FAILED\n", thin, "\n");
  absl::StrAppend(&out, "Failures:\n");
  if (failures.size() <= 1) {
    absl::StrAppend(&out, "  <NO_OTHER_FAILURES>\n");
  } else {
    for (size_t i = 1; i < failures.size(); ++i) {
      absl::StrAppend(
          &out, "[", i, "]:\n",
          Describe(failures[i], failures[i].failure_class == v1::NETWORK));
    }
  }
  absl::StrAppend(&out, thin, "\nRoot Cause (first observed failure):\n");
  if (!failures.empty()) {
    absl::StrAppend(&out, "[0]:\n", Describe(failures.front()));
  }
  absl::StrAppend(&out, rule, "\n");
  return out;
}

}  // namespace ctrun
