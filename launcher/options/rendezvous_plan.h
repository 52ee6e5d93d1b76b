// Where this agent's rendezvous is, whether this node hosts it or connects
// to it, how it authenticates, and the address it advertises to the other
// nodes: the one place these are decided.
#ifndef CTRUN_LAUNCHER_OPTIONS_RENDEZVOUS_PLAN_H_
#define CTRUN_LAUNCHER_OPTIONS_RENDEZVOUS_PLAN_H_

#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "launcher/options/launch_options.h"
#include "rendezvous/rpc/endpoint.h"

namespace ctrun {

struct RendezvousPlan {
  bool host = false;  // serve the rendezvous in this process
  Endpoint endpoint;  // where it is (port 0: pick one; standalone only)
  // Every endpoint given: `endpoint` alone, or the replicas of a ctrund on
  // etcd, which clients try in order.
  std::vector<Endpoint> endpoints;
  // Whether hosting was inferred from addresses (not decided by is_host, a
  // static node rank or Slurm's node id): if the port is taken, another
  // agent here hosts it, so join.
  bool inferred = false;
  std::string host_reason;  // why this node hosts or connects, for --dry_run
  std::string address;      // advertised: MASTER_ADDR when group rank 0
  // How this node is named in its workers' line prefixes (${host}) and in
  // the rendezvous's messages: the --local_addr the user gave, where it is
  // not the host's name (several nodes of one machine are told apart by
  // it), else the host's name.
  std::string name;
  // Said once at start when the advertised address is not the one the
  // user gave (a static node 0 whose --master_addr is not its own).
  std::string notice;

  // How agents (and workers, with a job token derived from it) prove
  // themselves to the rendezvous.
  enum class Auth {
    kNone,        // a rendezvous that asks for nothing (a ctrund on loopback)
    kTokenFile,   // --rdzv_conf token_file
    kTokenEnv,    // $CTRUN_RDZV_TOKEN
    kFreshToken,  // made up here: nobody else reaches this rendezvous
    kMunge,       // Slurm's munge credentials, bound to the job and the uid
  };
  Auth auth = Auth::kNone;
  bool tls = false;  // the connection is TLS (tls_ca given)
};

// Decides, in this order: standalone (or one node without an endpoint):
// host on a free loopback port with a fresh token. Otherwise the endpoint
// decides where, and hosting is: is_host when given; node rank 0 for a
// static rendezvous; Slurm's node id 0 for one Slurm made up; else whether
// the endpoint names this node: its --local_addr when given (so that
// 127.0.0.2 and 127.0.0.3 stand for two nodes), else a loopback address,
// this host's name, or one of its interfaces' addresses. The advertised
// address is --local_addr; else, for node 0 of a static rendezvous,
// --master_addr as given when it names this node (torchrun passes it
// through as MASTER_ADDR); else the local address of the route to the
// rendezvous (never a guessed name), with a notice when that replaces a
// --master_addr that is not this node's. Authentication: the token file, else
// $CTRUN_RDZV_TOKEN from `env`, else munge in a Slurm rendezvous, else none.
//
// INVALID_ARGUMENT when --local_addr (or a single node's --master_addr) is
// not an address this machine can bind; UNAVAILABLE when there is no route
// to the rendezvous.
absl::StatusOr<RendezvousPlan> PlanRendezvous(
    const LaunchOptions& options, const std::string& hostname,
    const std::map<std::string, std::string>& env);

// The plan as --dry_run prints it: two indented lines, where the rendezvous
// is and whether this node hosts it or connects (and why), then how it
// authenticates.
std::string FormatRendezvousPlan(const LaunchOptions& options,
                                 const RendezvousPlan& plan);

}  // namespace ctrun

#endif  // CTRUN_LAUNCHER_OPTIONS_RENDEZVOUS_PLAN_H_
