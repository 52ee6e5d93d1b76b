#include "launcher/run_directory.h"

#include <stdlib.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "absl/strings/str_cat.h"

namespace ctrun {

std::string RunFolderName(absl::string_view run_id) {
  // A job id is any string torchrun accepts; a folder name is not.
  std::string name(run_id.substr(0, 200));
  for (char& c : name) {
    if (c == '/' || c == '\0') c = '_';
  }
  return name.empty() ? "job" : name;
}

absl::StatusOr<std::string> MakeRunDirectory(const std::string& log_dir,
                                             absl::string_view run_id) {
  if (!log_dir.empty()) {
    // A folder of its own for each agent's run (torchrun's RUN_ID_xxxx):
    // nodes sharing a --log_dir (NFS), or two runs under one id, never
    // write over each other's logs.
    std::string dir =
        absl::StrCat(log_dir, "/", RunFolderName(run_id), "_XXXXXX");
    std::error_code ec;
    std::filesystem::create_directories(log_dir, ec);
    if (ec || mkdtemp(dir.data()) == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("--log_dir: cannot create ", dir, ": ",
                       ec ? ec.message() : std::string(strerror(errno))));
    }
    return dir;
  }
  const char* tmp = getenv("TMPDIR");
  std::string dir = absl::StrCat(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp",
                                 "/ctrun-XXXXXX");
  if (mkdtemp(dir.data()) == nullptr) {
    return absl::InternalError(
        absl::StrCat("cannot create a temporary directory like ", dir, ": ",
                     strerror(errno)));
  }
  return dir;
}

}  // namespace ctrun
