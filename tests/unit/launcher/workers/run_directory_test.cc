// Run folders under --log_dir.
#include "launcher/workers/run_directory.h"

#include <catch2/catch.hpp>

namespace ctrun {
namespace {

TEST_CASE("A job id is one folder name under the log dir, whatever it holds",
          "[launcher][unit]") {
  CHECK(RunFolderName("job-7") == "job-7");
  CHECK(RunFolderName("../x") == ".._x");
  CHECK(RunFolderName("a/b/c") == "a_b_c");
  CHECK(RunFolderName("/") == "_");
  CHECK(RunFolderName("") == "job");
  CHECK(RunFolderName(std::string(300, 'x')).size() == 200);
  // ".." alone gets mkdtemp's suffix: ".._XXXXXX" is a plain name.
  CHECK(RunFolderName("..") == "..");
}

}  // namespace
}  // namespace ctrun
