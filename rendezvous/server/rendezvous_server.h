// RendezvousServer: the gRPC services (Rendezvous, Store, Admin) around one
// RendezvousCore, listening on one address.
//
// Used by the `ctrund` daemon and by agents that host the rendezvous
// in-process, whose own session reaches it without a transport (local()).
// All logic lives in RendezvousCore; this class adapts gRPC's callback API
// (and those local sessions) to it: one mutex guards the core, a single timer
// thread drives its deadlines, and messages and store completions are delivered
// after the mutex is released. No RPC parks a thread: waiting store calls are
// stored callbacks.
//
// Thread-safe. Destruction shuts the server down.
#ifndef CTRUN_RENDEZVOUS_SERVER_RENDEZVOUS_SERVER_H_
#define CTRUN_RENDEZVOUS_SERVER_RENDEZVOUS_SERVER_H_

#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "rendezvous/core/rendezvous_core.h"
#include "rendezvous/durable/durable_state.h"
#include "rendezvous/ops/event_log.h"
#include "rendezvous/ops/service_metrics.h"
#include "rendezvous/rpc/endpoint.h"
#include "rendezvous/rpc/local_rendezvous.h"
#include "rendezvous/rpc/monotonic_clock.h"
#include "rendezvous/rpc/munge.h"
#include "rendezvous/server/listener.h"

namespace ctrun {

struct ServerOptions {
  // Port 0 picks a free port; endpoint() tells which.
  Endpoint listen{"127.0.0.1", 0};
  // When non-empty, every RPC must carry it (auth.h); otherwise refused with
  // UNAUTHENTICATED. Start refuses an empty token on a non-loopback address
  // unless `munge` is set.
  std::string token;
  // When set, RPCs may instead carry a munge credential of this process's
  // uid for munge->job_id (munge.h).
  std::optional<MungeAuth> munge;
  // When set, the service speaks TLS.
  std::optional<TlsServerFiles> tls;
  RendezvousLimits limits;
  // When set, jobs, rounds and store contents are kept in the log this
  // opens, and restored from it when the service starts: agents resume
  // without restarting their workers. A journal in a state directory
  // (ctrund --state-dir, JournalOpener in journal.h) or etcd (ctrund
  // --etcd, etcd_log.h); the service itself links neither.
  RecordLogOpener state_log;
  // What that log is, for the service's log lines ("DIR (fsync batch)",
  // "etcd").
  std::string state_where;
  // When set, asked before each request is served: false refuses it with
  // UNAVAILABLE (a ctrund whose etcd lease may have lapsed; it steps down
  // on its own).
  std::function<bool()> may_serve;
  // When set, the service counts what happens there, and tells it what it
  // holds at each scrape until it shuts down (metrics.h).
  std::shared_ptr<ServiceMetrics> metrics;
  // When set, every event of the jobs goes there (event_log.h).
  std::shared_ptr<EventLog> event_log;
  // When store changes and job states are synced (durable_state.h).
  FsyncPolicy fsync = FsyncPolicy::kBatch;
  // How long restored nodes have to resume before they count as lost.
  absl::Duration reconnect_grace = absl::Seconds(10);
  // Without TLS: the service listens itself and starts gRPC at its first
  // connection, handing it every connection. A hosting agent whose only
  // client is itself (local()) then never starts gRPC: no thread of it,
  // none of its memory. With TLS, gRPC listens from the start.
  bool start_grpc_on_first_connection = false;
  // The largest request the transport accepts; larger ones fail with
  // RESOURCE_EXHAUSTED before reaching the store. 0: twice the value limit
  // plus room for keys.
  size_t max_message_bytes = 0;
};

class RendezvousServer {
 public:
  // Restores the state directory's jobs, binds and starts serving.
  // FAILED_PRECONDITION for a token-less non-loopback address, a state
  // directory in use or with a journal that makes no sense; UNAVAILABLE
  // when the address cannot be bound; INVALID_ARGUMENT for unreadable TLS
  // files.
  static absl::StatusOr<std::unique_ptr<RendezvousServer>> Start(
      ServerOptions options);

  ~RendezvousServer();
  RendezvousServer(const RendezvousServer&) = delete;
  RendezvousServer& operator=(const RendezvousServer&) = delete;

  // The bound address, with the actual port.
  const Endpoint& endpoint() const;

  // The service for an agent of this process (local_rendezvous.h). Valid
  // as long as this server.
  LocalRendezvous* local();

  // Whether the service holds no job (every session has ended), waiting up
  // to `timeout` for that.
  bool WaitUntilIdle(absl::Duration timeout);

  // Ends every session and call, stops the timer thread. Idempotent.
  void Shutdown();

  class Impl;

 private:
  explicit RendezvousServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};
}  // namespace ctrun

#endif  // CTRUN_RENDEZVOUS_SERVER_RENDEZVOUS_SERVER_H_
