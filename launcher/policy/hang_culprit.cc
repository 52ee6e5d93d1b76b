#include "launcher/policy/hang_culprit.h"

#include <algorithm>
#include <optional>
#include <set>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace ctrun {
namespace {

using Place = StackReading::Place;

// One thread's frames, innermost first (both dumps list them so).
struct Thread {
  std::vector<std::string> frames;
  bool current = false;  // faulthandler: the thread that took the signal
  long lwp = -1;         // gdb
};

// The Python code a collective or a store wait runs through. Backward is
// one: under DistributedDataParallel, a rank's main thread waits in it for
// the gradients' all-reduce. (A rank stuck in backward for a reason of its
// own then reads as waiting too, and the verdict falls back to saying
// that every rank waits, never naming a wrong culprit.)
constexpr absl::string_view kPythonWaits[] = {
    "/torch/distributed/", "/torch/nn/parallel/distributed.py",
    "/torch/autograd/"};
// Native code of the same: the collective libraries and c10d (its stores
// included); ctrun's own communicators run through Gloo or NCCL.
constexpr absl::string_view kNativeWaits[] = {"gloo::", "c10d::", "nccl"};

// `  File "PATH", line N in FUNC`: PATH and "BASENAME, line N, in FUNC".
struct PythonFrame {
  std::string path;
  std::string function;
  std::string shown;
};

std::optional<PythonFrame> ParsePythonFrame(absl::string_view line) {
  line = absl::StripLeadingAsciiWhitespace(line);
  if (!absl::ConsumePrefix(&line, "File \"")) return std::nullopt;
  const size_t quote = line.find('"');
  if (quote == absl::string_view::npos) return std::nullopt;
  PythonFrame f;
  f.path = std::string(line.substr(0, quote));
  absl::string_view rest = line.substr(quote + 1);
  absl::ConsumePrefix(&rest, ", line ");
  const size_t in = rest.find(" in ");
  const absl::string_view number = rest.substr(0, in);
  f.function =
      in == absl::string_view::npos
          ? ""
          : std::string(absl::StripAsciiWhitespace(rest.substr(in + 4)));
  const size_t slash = f.path.rfind('/');
  f.shown = absl::StrCat(
      slash == std::string::npos ? f.path : f.path.substr(slash + 1), ", line ",
      number, f.function.empty() ? "" : ", in ", f.function);
  return f;
}

// A gdb frame line: "#3  0x... in FUNC (ARGS) at FILE:LINE" or
// "#0  FUNC (ARGS) at FILE:LINE": FUNC, and FILE:LINE when given.
std::string NativeFunction(absl::string_view line) {
  absl::string_view rest = line;
  const size_t space = rest.find(' ');
  if (space == absl::string_view::npos) return "";
  rest = absl::StripLeadingAsciiWhitespace(rest.substr(space));
  if (absl::StartsWith(rest, "0x")) {
    const size_t in = rest.find(" in ");
    if (in == absl::string_view::npos) return "";
    rest = rest.substr(in + 4);
  }
  const size_t paren = rest.find('(');
  return std::string(absl::StripTrailingAsciiWhitespace(rest.substr(0, paren)));
}

std::string NativeSource(absl::string_view line) {
  const size_t at = line.rfind(" at ");
  if (at == absl::string_view::npos) return "";
  absl::string_view file = line.substr(at + 4);
  const size_t slash = file.rfind('/');
  if (slash != absl::string_view::npos) file = file.substr(slash + 1);
  return std::string(file);
}

std::string Ranks(const std::vector<int>& ranks) {
  return absl::StrCat(ranks.size() == 1 ? "rank " : "ranks ",
                      absl::StrJoin(ranks, ", "));
}

}  // namespace

StackReading ReadPythonStack(absl::string_view dump) {
  std::vector<Thread> threads;
  for (absl::string_view line : absl::StrSplit(dump, '\n')) {
    if (absl::StartsWith(line, "Thread 0x") ||
        absl::StartsWith(line, "Current thread 0x") ||
        absl::StartsWith(line, "Stack (most recent call first)")) {
      threads.emplace_back();
      threads.back().current = !absl::StartsWith(line, "Thread ");
    } else if (!threads.empty() && absl::StartsWith(line, "  File \"")) {
      threads.back().frames.emplace_back(line);
    }
  }
  const Thread* main = nullptr;
  for (const Thread& t : threads) {
    if (!t.frames.empty() &&
        absl::EndsWith(absl::StripTrailingAsciiWhitespace(t.frames.back()),
                       " in <module>")) {
      main = &t;
      break;
    }
  }
  for (const Thread& t : threads) {
    if (main == nullptr && t.current && !t.frames.empty()) main = &t;
  }
  if (main == nullptr) return {};
  StackReading r;
  r.source = "Python";
  for (const std::string& line : main->frames) {
    const std::optional<PythonFrame> f = ParsePythonFrame(line);
    if (!f) continue;
    for (absl::string_view wait : kPythonWaits) {
      if (absl::StrContains(f->path, wait)) {
        r.place = Place::kWaiting;
        r.where = f->function;
        return r;
      }
    }
    if (r.where.empty()) r.where = f->shown;
  }
  r.place = r.where.empty() ? Place::kUnknown : Place::kElsewhere;
  return r;
}

StackReading ReadNativeStack(absl::string_view dump, pid_t pid) {
  std::vector<Thread> threads;
  for (absl::string_view line : absl::StrSplit(dump, '\n')) {
    if (absl::StartsWith(line, "Thread ")) {
      threads.emplace_back();
      const size_t lwp = line.find("(LWP ");
      if (lwp != absl::string_view::npos) {
        absl::string_view number = line.substr(lwp + 5);
        number = number.substr(0, number.find(')'));
        long value = -1;
        if (absl::SimpleAtoi(number, &value)) threads.back().lwp = value;
      }
    } else if (!threads.empty() && absl::StartsWith(line, "#")) {
      threads.back().frames.emplace_back(line);
    }
  }
  // gdb on a process of one thread may print no "Thread" header.
  if (threads.empty() && absl::StrContains(dump, "\n#0 ")) {
    Thread only;
    only.lwp = pid;
    for (absl::string_view line : absl::StrSplit(dump, '\n')) {
      if (absl::StartsWith(line, "#")) only.frames.emplace_back(line);
    }
    threads.push_back(std::move(only));
  }
  auto main = std::find_if(threads.begin(), threads.end(),
                           [pid](const Thread& t) { return t.lwp == pid; });
  if (main == threads.end() || main->frames.empty()) return {};
  StackReading r;
  r.source = "native";
  std::string innermost, with_source;
  for (const std::string& line : main->frames) {
    const std::string function = NativeFunction(line);
    for (absl::string_view wait : kNativeWaits) {
      if (absl::StrContains(line, wait)) {
        r.place = Place::kWaiting;
        r.where = function;
        return r;
      }
    }
    if (innermost.empty()) innermost = function;
    // The C library's own frames (sleep, futex) say less than their caller.
    const std::string source = NativeSource(line);
    if (with_source.empty() && !source.empty() &&
        !absl::StartsWith(function, "_")) {
      with_source = absl::StrCat(function, " at ", source);
    }
  }
  r.where = with_source.empty() ? innermost : with_source;
  r.place = r.where.empty() ? Place::kUnknown : Place::kElsewhere;
  return r;
}

StackReading ReadStacks(absl::string_view python, absl::string_view native,
                        pid_t pid) {
  StackReading r = ReadPythonStack(python);
  if (r.place != Place::kUnknown) return r;
  return ReadNativeStack(native, pid);
}

std::optional<HangVerdict> JudgeHang(const std::vector<RankReading>& ranks) {
  HangVerdict v;
  std::set<std::string> waits, sources;
  std::vector<const RankReading*> elsewhere;
  for (const RankReading& r : ranks) {
    if (r.reading.place == Place::kWaiting) {
      v.waiting.push_back(r.rank);
      waits.insert(r.reading.where);
    } else if (r.reading.place == Place::kElsewhere) {
      v.culprits.push_back(r.rank);
      elsewhere.push_back(&r);
    } else {
      continue;
    }
    sources.insert(r.reading.source);
  }
  if (v.waiting.empty()) return std::nullopt;
  const std::string wait_in =
      waits.size() == 1
          ? *waits.begin()
          : absl::StrCat("collectives (", absl::StrJoin(waits, ", "), ")");
  const std::string how = absl::StrCat(
      "decided from the workers' ", absl::StrJoin(sources, " and "), " stacks");
  if (v.culprits.empty()) {
    v.line = absl::StrCat(
        "every worker here (", Ranks(v.waiting), ") waits in ", wait_in,
        ": the rank they wait for is not on this node; ", how);
    return v;
  }
  const bool one = v.culprits.size() == 1;
  std::vector<std::string> places;
  for (const RankReading* r : elsewhere) {
    places.push_back(
        one ? absl::StrCat("at ", r->reading.where)
            : absl::StrCat("rank ", r->rank, " at ", r->reading.where));
  }
  v.line = absl::StrCat(
      Ranks(v.culprits), one ? " holds" : " hold",
      " up the job: ", one ? "its main thread is" : "their main threads are",
      " outside any collective (", absl::StrJoin(places, "; "), ") while ",
      Ranks(v.waiting), v.waiting.size() == 1 ? " waits" : " wait", " in ",
      wait_in, "; ", how);
  return v;
}

}  // namespace ctrun
