// What the progress board reader makes of a worker's bytes.
#include "launcher/workers/agent_board.h"

#include <catch2/catch.hpp>

namespace ctrun {
namespace {

TEST_CASE("Section names become valid UTF-8 whatever the worker wrote",
          "[launcher][unit]") {
  CHECK(SanitizeUtf8("step") == "step");
  CHECK(SanitizeUtf8("\xc3\xa9tape \xe2\x9c\x93") ==
        "\xc3\xa9tape \xe2\x9c\x93");
  // Cut in the middle of a character, stray bytes, an overlong form, a
  // surrogate.
  CHECK(SanitizeUtf8("ab\xe2\x9c") == "ab??");
  CHECK(SanitizeUtf8("\xff\x80x") == "??x");
  CHECK(SanitizeUtf8("\xc0\xafx") == "??x");
  CHECK(SanitizeUtf8("\xed\xa0\x80") == "???");
  CHECK(SanitizeUtf8("\xf0\x9f\x98\x80") == "\xf0\x9f\x98\x80");
}

}  // namespace
}  // namespace ctrun
