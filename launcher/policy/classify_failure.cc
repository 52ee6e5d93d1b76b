#include "launcher/policy/classify_failure.h"

#include <signal.h>

#include <initializer_list>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"

namespace ctrun {

namespace {

constexpr size_t kMaxErrorBytes = 200;

// The markers are what the libraries print: PyTorch's and the CUDA
// runtime's errors, NCCL's result names and messages, Gloo's, the kernel's
// Xid through nvidia-smi-like tools. Matched case-sensitively.
constexpr absl::string_view kOutOfMemory[] = {
    "CUDA out of memory",
    "OutOfMemoryError",
    "MemoryError",
    "std::bad_alloc",
    "Cannot allocate memory",
    "CUBLAS_STATUS_ALLOC_FAILED",
    "cudaErrorMemoryAllocation",
};
constexpr absl::string_view kHardware[] = {
    "NVRM: Xid",
    "ECC error",
    "uncorrectable ECC",
    "cudaErrorECCUncorrectable",
    "cudaErrorDevicesUnavailable",
    "busy or unavailable",
    "unhandled system error",
    "ncclSystemError",
    "unhandled cuda error",
    "ncclUnhandledCudaError",
    "GPU is lost",
    "fallen off the bus",
    "NVLink error",
};
constexpr absl::string_view kNetwork[] = {
    "ncclRemoteError",
    "remote process exited or there was a network error",
    "NCCL error",
    "DistNetworkError",
    "Connection reset by peer",
    "Connection closed by peer",
    "Connection refused",
    "Broken pipe",
    "Socket Timeout",
    "Watchdog caught collective operation timeout",
};
// Python exceptions that say the program or its files are wrong, not the
// machine: restarting cannot mend them.
constexpr absl::string_view kUserExceptions[] = {
    "ImportError", "ModuleNotFoundError", "SyntaxError", "IndentationError",
    "TabError",    "FileNotFoundError",
};

std::string Cut(absl::string_view line) {
  line = absl::StripAsciiWhitespace(line);
  if (line.size() > kMaxErrorBytes) line = line.substr(0, kMaxErrorBytes);
  return std::string(line);
}

// The name of the exception a Python traceback's last line raises
// ("torch.OutOfMemoryError: ..." gives "OutOfMemoryError"); empty for a
// line that is not one.
absl::string_view ExceptionName(absl::string_view line) {
  line = absl::StripAsciiWhitespace(line);
  const size_t colon = line.find(':');
  absl::string_view name = line.substr(0, colon);
  if (name.empty() || name.find(' ') != absl::string_view::npos) return "";
  for (char c : name) {
    if (!absl::ascii_isalnum(c) && c != '_' && c != '.') return "";
  }
  if (const size_t dot = name.rfind('.'); dot != absl::string_view::npos) {
    name = name.substr(dot + 1);
  }
  if (!absl::EndsWith(name, "Error") && !absl::EndsWith(name, "Exception") &&
      !absl::EndsWith(name, "Interrupt") && name != "SystemExit") {
    return "";
  }
  return name;
}

}  // namespace

ClassifiedFailure ClassifyFailure(const FailureFacts& facts) {
  if (facts.hung) return {v1::HANG, ""};
  if (facts.oom_killed) {
    return {v1::OUT_OF_MEMORY, "killed by the kernel's OOM killer"};
  }
  // The text, the error file's message first; the newest lines first, as
  // the last exception is the one that ended it.
  std::vector<absl::string_view> text;
  if (!facts.error_message.empty()) text.push_back(facts.error_message);
  for (auto it = facts.last_lines.rbegin(); it != facts.last_lines.rend();
       ++it) {
    text.push_back(*it);
  }
  std::string exception;
  for (absl::string_view line : text) {
    if (!ExceptionName(line).empty()) {
      exception = Cut(line);
      break;
    }
  }
  struct Marked {
    v1::FailureClass failure_class;
    const absl::string_view* begin;
    const absl::string_view* end;
  };
  for (const Marked& m :
       {Marked{v1::OUT_OF_MEMORY, std::begin(kOutOfMemory),
               std::end(kOutOfMemory)},
        Marked{v1::HARDWARE, std::begin(kHardware), std::end(kHardware)},
        Marked{v1::NETWORK, std::begin(kNetwork), std::end(kNetwork)}}) {
    for (absl::string_view line : text) {
      for (const absl::string_view* marker = m.begin; marker != m.end;
           ++marker) {
        if (absl::StrContains(line, *marker)) {
          return {m.failure_class, exception.empty() ? Cut(line) : exception};
        }
      }
    }
  }
  for (absl::string_view line : text) {
    const absl::string_view name = ExceptionName(line);
    if (name.empty()) continue;
    for (absl::string_view user : kUserExceptions) {
      if (name == user) return {v1::USER_ERROR, Cut(line)};
    }
    break;  // the last exception decides
  }
  for (absl::string_view line : text) {
    // argparse: "prog: error: unrecognized arguments: ..." (exit 2).
    if (absl::StrContains(line, ": error: ") && facts.exit_code == 2) {
      return {v1::USER_ERROR, Cut(line)};
    }
  }
  switch (facts.signal) {
    case 0:
      break;
    case SIGKILL:
    case SIGTERM:
    case SIGINT:
    case SIGHUP:
    case SIGQUIT:
    case SIGUSR1:
    case SIGUSR2:
      return {v1::SIGNAL, exception};
    default:
      return {v1::OTHER, exception};
  }
  if (facts.exit_code == 2 || facts.exit_code == 126 ||
      facts.exit_code == 127) {
    // Python's "can't open file", a shell's "command not found".
    for (absl::string_view line : text) {
      if (!absl::StripAsciiWhitespace(line).empty()) {
        return {v1::USER_ERROR, exception.empty() ? Cut(line) : exception};
      }
    }
    return {v1::USER_ERROR, exception};
  }
  return {v1::OTHER, exception};
}

}  // namespace ctrun
