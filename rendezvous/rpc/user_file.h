// ReadUserFile: reads a small file named on a command line (a token, a TLS
// certificate or key) without ever waiting for it.
//
// Both binaries read these with their stop signals already blocked, so an
// open or read that blocks (a FIFO nobody writes, a terminal) would leave
// them deaf to Ctrl-C and SIGTERM. A regular file is read as usual; anything
// else (a FIFO, `<(cmd)`, a device) is read non-blocking for at most
// `patience`, and refused when it has not ended by then.
#ifndef CTRUN_RENDEZVOUS_RPC_USER_FILE_H_
#define CTRUN_RENDEZVOUS_RPC_USER_FILE_H_

#include <cstddef>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace ctrun {

// Certificates, keys and CA bundles are far smaller than this.
inline constexpr size_t kMaxPemBytes = 4 << 20;

// The whole of `path`, at most `max_bytes` of it (a longer file is refused).
// INVALID_ARGUMENT naming `what`, the path and the reason: missing,
// unreadable, a directory, too long, or a non-regular file that gave no end
// within `patience`.
absl::StatusOr<std::string> ReadUserFile(
    const std::string& path, const char* what, size_t max_bytes,
    absl::Duration patience = absl::Seconds(5));

}  // namespace ctrun

#endif  // CTRUN_RENDEZVOUS_RPC_USER_FILE_H_
