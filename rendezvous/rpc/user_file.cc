#include "rendezvous/rpc/user_file.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace ctrun {

absl::StatusOr<std::string> ReadUserFile(const std::string& path,
                                         const char* what, size_t max_bytes,
                                         absl::Duration patience) {
  const auto refuse = [&](const std::string& why) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot read ", what, " '", path, "': ", why));
  };
  // O_NONBLOCK: opening a FIFO for reading does not wait for a writer.
  const int fd = open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return refuse(strerror(errno));
  struct stat st {};
  if (fstat(fd, &st) != 0 || S_ISDIR(st.st_mode)) {
    close(fd);
    return refuse(S_ISDIR(st.st_mode) ? "it is a directory" : strerror(errno));
  }
  const bool regular = S_ISREG(st.st_mode);
  const absl::Time deadline = absl::Now() + patience;
  std::string text;
  char buffer[4096];
  for (;;) {
    const ssize_t n = read(fd, buffer, sizeof buffer);
    if (n > 0) {
      text.append(buffer, static_cast<size_t>(n));
      if (text.size() > max_bytes) {
        close(fd);
        return refuse(absl::StrCat("longer than ", max_bytes, " bytes"));
      }
      continue;
    }
    if (n == 0) break;
    if (errno == EINTR) continue;
    if (errno != EAGAIN || regular) {
      const std::string why = strerror(errno);
      close(fd);
      return refuse(why);
    }
    // A pipe or FIFO whose writer has not finished: wait a little, bounded.
    const absl::Duration left = deadline - absl::Now();
    pollfd p{fd, POLLIN, 0};
    if (left <= absl::ZeroDuration() ||
        (poll(&p, 1, static_cast<int>(absl::ToInt64Milliseconds(left)) + 1) ==
             0 &&
         absl::Now() >= deadline)) {
      close(fd);
      return refuse(
          absl::StrCat("it is not a regular file and did not end within ",
                       absl::FormatDuration(patience),
                       " (a FIFO that nobody writes? name a regular file)"));
    }
  }
  close(fd);
  return text;
}

}  // namespace ctrun
