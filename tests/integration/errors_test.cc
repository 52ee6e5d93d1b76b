// docs/errors.md, checked: every row of its command-line tables is run, and
// its exit code and its one line on stderr must be exactly as written.
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "tests/support/child_process.h"
#include "tests/support/daemon.h"

namespace ctrun::testing {
namespace {

struct Row {
  std::vector<std::string> argv;
  int exit_code = 0;
  std::string message;
};

// The cells of a markdown table row; "\|" is a literal bar.
std::vector<std::string> Cells(const std::string& line) {
  std::vector<std::string> cells;
  std::string cell;
  for (size_t i = 1; i < line.size(); ++i) {
    if (line[i] == '\\' && i + 1 < line.size() && line[i + 1] == '|') {
      cell += '|';
      ++i;
    } else if (line[i] == '|') {
      cells.emplace_back(absl::StripAsciiWhitespace(cell));
      cell.clear();
    } else {
      cell += line[i];
    }
  }
  return cells;
}

std::string Unquote(const std::string& cell) {
  absl::string_view v = cell;
  REQUIRE(absl::ConsumePrefix(&v, "`"));
  REQUIRE(absl::ConsumeSuffix(&v, "`"));
  return std::string(v);
}

// A FIFO that nobody reads or writes, for $FIFO; removed with the object.
struct Fifo {
  const std::string path = std::filesystem::temp_directory_path() /
                           absl::StrCat("ctrun-errors-fifo-", getpid());
  Fifo() {
    unlink(path.c_str());
    REQUIRE(mkfifo(path.c_str(), 0600) == 0);
  }
  ~Fifo() { unlink(path.c_str()); }
};

// The rows whose command starts with `program`, with $TOKEN_FILE and $FIFO
// standing for those files.
std::vector<Row> RowsOf(const std::string& program,
                        const std::string& token_file, const Fifo& fifo) {
  std::ifstream in(SourceDir() + "/docs/errors.md");
  REQUIRE(in);
  std::vector<Row> rows;
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("| `" + program + " ", 0) != 0) continue;
    const auto cells = Cells(line);
    REQUIRE(cells.size() == 3);
    Row row;
    const std::string command = absl::StrReplaceAll(
        Unquote(cells[0]), {{"$TOKEN_FILE", token_file}, {"$FIFO", fifo.path}});
    row.argv = absl::StrSplit(command, ' ', absl::SkipEmpty());
    row.argv[0] = program == "ctrun" ? CtrunPath() : CtrundPath();
    row.exit_code = std::stoi(cells[1]);
    row.message =
        absl::StrReplaceAll(Unquote(cells[2]), {{"$FIFO", fifo.path}});
    rows.push_back(std::move(row));
  }
  return rows;
}

void Check(const std::vector<Row>& rows) {
  // A TMPDIR of their own: `ctrun status` with no flags shows the
  // --standalone jobs it finds there, and other tests run such jobs.
  char dir_template[] = "/tmp/ctrun-errors-XXXXXX";
  const std::string tmp = mkdtemp(dir_template);
  for (const Row& row : rows) {
    INFO(absl::StrJoin(row.argv, " "));
    ChildProcess p(row.argv, {"TMPDIR=" + tmp});
    CHECK(p.Wait(absl::Seconds(20)) == row.exit_code);
    CHECK(p.Stderr() == row.message + "\n");
  }
  std::filesystem::remove_all(tmp);
}

TEST_CASE("Every refused ctrun command line in docs/errors.md says so",
          "[errors][integration]") {
  const Fifo fifo;
  const auto rows = RowsOf("ctrun", "", fifo);
  CHECK(rows.size() >= 30);
  Check(rows);
}

TEST_CASE("Every refused ctrund command line in docs/errors.md says so",
          "[errors][integration]") {
  char path[] = "/tmp/ctrun-errors-token-XXXXXX";
  const int fd = mkstemp(path);
  REQUIRE(fd >= 0);
  REQUIRE(write(fd, "t0ken\n", 6) == 6);
  close(fd);
  const Fifo fifo;
  const auto rows = RowsOf("ctrund", path, fifo);
  CHECK(rows.size() >= 15);
  Check(rows);
  unlink(path);
}

}  // namespace
}  // namespace ctrun::testing
