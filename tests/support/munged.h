// Munged: a private munge daemon (own key, socket and logs in a fresh
// directory under /tmp, which munged needs world-traversable), ended by
// its pid. Needs Debian's munge.
#ifndef CTRUN_TESTS_SUPPORT_MUNGED_H_
#define CTRUN_TESTS_SUPPORT_MUNGED_H_

#include <memory>
#include <string>

#include "tests/support/child_process.h"

namespace ctrun::testing {

class Munged {
 public:
  // Fails the current test when munged does not come up within 5 s.
  Munged();
  ~Munged();
  Munged(const Munged&) = delete;
  Munged& operator=(const Munged&) = delete;

  const std::string& socket() const { return socket_; }

 private:
  std::string dir_;
  std::string socket_;
  std::unique_ptr<ChildProcess> process_;
};

}  // namespace ctrun::testing

#endif  // CTRUN_TESTS_SUPPORT_MUNGED_H_
