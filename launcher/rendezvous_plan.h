// Where this agent's rendezvous is, whether it hosts it, and the address it
// advertises to the other nodes.
#ifndef CTRUN_LAUNCHER_RENDEZVOUS_PLAN_H_
#define CTRUN_LAUNCHER_RENDEZVOUS_PLAN_H_

#include <string>

#include "absl/status/statusor.h"
#include "launcher/launch_options.h"
#include "rendezvous/endpoint.h"

namespace ctrun {

struct RendezvousPlan {
  bool host = false;  // serve the rendezvous in this process
  Endpoint endpoint;  // where it is (port 0: pick one; standalone only)
  // Whether hosting was inferred (not forced by is_host or a static node
  // rank): if the port is taken, another agent here hosts it, so join.
  bool inferred = false;
  std::string address;  // advertised: MASTER_ADDR when group rank 0
};

// Standalone (or one node without an endpoint): host on a free loopback
// port. Otherwise the endpoint decides: is_host when given, node rank 0 for
// a static rendezvous, else whether the endpoint names this node: its
// --local_addr when given (so that 127.0.0.2 and 127.0.0.3 stand for two
// nodes), else a loopback address, this host's name, or one of its
// interfaces' addresses. The advertised address is --local_addr, else the
// local address of the route to the rendezvous (never a guessed name).
absl::StatusOr<RendezvousPlan> PlanRendezvous(const LaunchOptions& options,
                                              const std::string& hostname);

}  // namespace ctrun

#endif  // CTRUN_LAUNCHER_RENDEZVOUS_PLAN_H_
