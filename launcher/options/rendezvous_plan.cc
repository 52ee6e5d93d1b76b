#include "launcher/options/rendezvous_plan.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "ctrun/environment.h"

namespace ctrun {
namespace {

bool IsInterfaceAddress(const std::string& host) {
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return false;
  bool found = false;
  char text[INET6_ADDRSTRLEN];
  for (ifaddrs* i = list; i != nullptr && !found; i = i->ifa_next) {
    if (i->ifa_addr == nullptr) continue;
    const int family = i->ifa_addr->sa_family;
    const void* addr = nullptr;
    if (family == AF_INET) {
      addr = &reinterpret_cast<sockaddr_in*>(i->ifa_addr)->sin_addr;
    } else if (family == AF_INET6) {
      addr = &reinterpret_cast<sockaddr_in6*>(i->ifa_addr)->sin6_addr;
    } else {
      continue;
    }
    found =
        inet_ntop(family, addr, text, sizeof text) != nullptr && host == text;
  }
  freeifaddrs(list);
  return found;
}

// The source address the kernel would use to reach `ep`: a UDP socket
// "connected" to it sends nothing but has a local address.
absl::StatusOr<std::string> RouteSource(const Endpoint& ep) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* result = nullptr;
  const std::string port = absl::StrCat(ep.port);
  if (int rc = getaddrinfo(ep.host.c_str(), port.c_str(), &hints, &result);
      rc != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot resolve the rendezvous host '", ep.host,
                     "': ", gai_strerror(rc)));
  }
  std::string source;
  for (addrinfo* a = result; a != nullptr && source.empty(); a = a->ai_next) {
    const int fd = socket(a->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    sockaddr_storage local{};
    socklen_t len = sizeof local;
    if (connect(fd, a->ai_addr, a->ai_addrlen) == 0 &&
        getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0) {
      char text[INET6_ADDRSTRLEN];
      const void* addr =
          local.ss_family == AF_INET
              ? static_cast<const void*>(
                    &reinterpret_cast<sockaddr_in*>(&local)->sin_addr)
              : static_cast<const void*>(
                    &reinterpret_cast<sockaddr_in6*>(&local)->sin6_addr);
      if (inet_ntop(local.ss_family, addr, text, sizeof text) != nullptr) {
        source = text;
      }
    }
    close(fd);
  }
  freeaddrinfo(result);
  if (source.empty()) {
    return absl::UnavailableError(
        absl::StrCat("no route to the rendezvous host '", ep.host, "'"));
  }
  return source;
}

// The address other nodes are told must be one this node can listen on:
// otherwise its workers' MASTER_ADDR (and the rendezvous, when hosted here)
// would be unreachable, found only when the job fails much later.
absl::Status CheckLocalAddress(const LaunchOptions& o) {
  if (o.local_addr.empty()) return absl::OkStatus();
  auto bound = BindFreePort(o.local_addr);
  if (bound.ok()) return absl::OkStatus();
  const bool from_master = std::any_of(
      o.settings.begin(), o.settings.end(), [](const auto& setting) {
        return setting.name == "local_addr" &&
               setting.source == Source::kDerived;
      });
  const char* flag = from_master ? "--master_addr" : "--local_addr";
  return absl::InvalidArgumentError(absl::StrCat(
      flag, "=", o.local_addr, " is not an address of this machine (",
      bound.status().message(), "); give one of this node's addresses",
      from_master ? " (a single node is its own master)" : "", ", or leave ",
      flag, " out"));
}

// Whether this node hosts the rendezvous at `ep`, and why.
std::pair<bool, std::string> DecideHost(const LaunchOptions& o,
                                        const Endpoint& ep,
                                        const std::string& hostname,
                                        bool* inferred) {
  *inferred = false;
  if (o.is_host) {
    return {*o.is_host, absl::StrCat("--rdzv_conf is_host=", *o.is_host)};
  }
  if (o.rdzv_backend == "static") {
    return {o.node_rank == 0,
            absl::StrCat("node rank ", o.node_rank, " of a static rendezvous")};
  }
  if (o.slurm_node_id) {
    return {*o.slurm_node_id == 0,
            absl::StrCat("Slurm node id ", *o.slurm_node_id)};
  }
  *inferred = true;
  if (!o.local_addr.empty()) {
    const bool here = ep.host == o.local_addr;
    return {here, absl::StrCat("the endpoint ", here ? "is" : "is not",
                               " this node's --local_addr ", o.local_addr)};
  }
  const bool here = IsLoopbackHost(ep.host) || ep.host == hostname ||
                    IsInterfaceAddress(ep.host);
  return {here, absl::StrCat("the endpoint ",
                             here ? "names this node" : "names another node")};
}

RendezvousPlan::Auth DecideAuth(const LaunchOptions& o,
                                const std::map<std::string, std::string>& env,
                                const RendezvousPlan& plan) {
  using Auth = RendezvousPlan::Auth;
  if (!o.token_file.empty()) return Auth::kTokenFile;
  if (auto it = env.find(env::kRendezvousToken);
      it != env.end() && !it->second.empty()) {
    return Auth::kTokenEnv;
  }
  if (o.slurm_node_id) return Auth::kMunge;
  if (plan.host && plan.endpoint.port == 0) return Auth::kFreshToken;
  return Auth::kNone;
}

}  // namespace

absl::StatusOr<RendezvousPlan> PlanRendezvous(
    const LaunchOptions& o, const std::string& hostname,
    const std::map<std::string, std::string>& env) {
  if (auto s = CheckLocalAddress(o); !s.ok()) return s;
  RendezvousPlan plan;
  plan.tls = !o.tls_ca.empty();
  const bool local_addr_given = std::none_of(
      o.settings.begin(), o.settings.end(), [](const auto& setting) {
        return setting.name == "local_addr" &&
               setting.source == Source::kDerived;
      });
  plan.name =
      !o.local_addr.empty() && local_addr_given ? o.local_addr : hostname;
  if (o.standalone || o.rdzv_endpoint.empty()) {
    plan.host = true;
    plan.host_reason = "a single node";
    plan.endpoint = Endpoint{"127.0.0.1", 0};
    plan.endpoints = {plan.endpoint};
    plan.address = o.local_addr.empty() ? "127.0.0.1" : o.local_addr;
    plan.auth = DecideAuth(o, env, plan);
    return plan;
  }
  auto eps = ParseEndpointList(o.rdzv_endpoint, 29400);
  if (!eps.ok()) return eps.status();
  plan.endpoints = *eps;
  plan.endpoint = eps->front();
  const Endpoint* ep = &plan.endpoint;
  if (eps->size() > 1) {
    // Only ctrund replicas share a rendezvous; an agent hosts one alone.
    if (o.is_host.value_or(false) || o.rdzv_backend == "static") {
      return absl::InvalidArgumentError(absl::StrCat(
          "--rdzv_endpoint=", o.rdzv_endpoint,
          " lists several endpoints, which name the replicas of a ctrund "
          "on etcd; ",
          o.rdzv_backend == "static"
              ? "a static rendezvous is hosted by node 0 at one endpoint"
              : "an agent (--rdzv_conf is_host=1) hosts one endpoint only"));
    }
    plan.host = false;
    plan.host_reason = "several endpoints: ctrund replicas on etcd";
  } else {
    std::tie(plan.host, plan.host_reason) =
        DecideHost(o, *ep, hostname, &plan.inferred);
  }
  // Node 0 of a static rendezvous is at --master_addr by definition.
  const bool static_master =
      o.rdzv_backend == "static" && plan.host && !o.is_host.has_value();
  const bool names_this_node = IsLoopbackHost(ep->host) ||
                               ep->host == hostname ||
                               IsInterfaceAddress(ep->host);
  if (!o.local_addr.empty()) {
    plan.address = o.local_addr;
  } else if (static_master && names_this_node) {
    plan.address = ep->host;
  } else {
    auto source = RouteSource(*ep);
    if (!source.ok()) return source.status();
    plan.address = *source;
    if (static_master) {
      plan.notice = absl::StrCat(
          "--master_addr=", ep->host,
          " is not an address of this node (node rank 0, where the workers' "
          "master is): they get MASTER_ADDR=",
          plan.address,
          ", this node's address on the route to it; give --local_addr to "
          "choose another");
    }
  }
  plan.auth = DecideAuth(o, env, plan);
  return plan;
}

std::string FormatRendezvousPlan(const LaunchOptions& o,
                                 const RendezvousPlan& plan) {
  using Auth = RendezvousPlan::Auth;
  std::string out;
  const std::string where = plan.endpoint.port == 0
                                ? "on a free loopback port"
                                : absl::StrCat("at ", plan.endpoint.ToString());
  absl::StrAppend(
      &out, "  rendezvous: ", plan.host ? "host it here " : "connect to it ",
      where, " (", plan.host_reason, "); this node advertises ", plan.address,
      "\n");
  std::string auth;
  switch (plan.auth) {
    case Auth::kNone:
      auth = "none (the rendezvous must accept clients without a token)";
      break;
    case Auth::kTokenFile:
      auth = absl::StrCat("the token in ", o.token_file,
                          " (--rdzv_conf token_file)");
      break;
    case Auth::kTokenEnv:
      auth = absl::StrCat("the token in $", env::kRendezvousToken);
      break;
    case Auth::kFreshToken:
      auth = "a token made up for this run";
      break;
    case Auth::kMunge:
      auth = absl::StrCat(
          "munge (", o.munge_socket.empty() ? "default socket" : o.munge_socket,
          ")");
      break;
  }
  const char* workers = plan.auth == Auth::kNone ? ""
                        : plan.auth == Auth::kMunge
                            ? ", for the workers too"
                            : "; workers get a token for this job only";
  absl::StrAppend(
      &out, "  authentication: ", auth, workers,
      plan.tls ? absl::StrCat("; TLS, verified with ", o.tls_ca) : "; no TLS",
      plan.host && !o.tls_cert.empty() ? absl::StrCat(", serving ", o.tls_cert)
                                       : "",
      "\n");
  if (!plan.notice.empty())
    absl::StrAppend(&out, "  note: ", plan.notice, "\n");
  return out;
}

}  // namespace ctrun
