// LocalRendezvous: a rendezvous service in this process (RendezvousServer)
// that an agent of the same process reaches without a transport.
//
// The agent that hosts the rendezvous talks to it as any agent does, through
// a session (SessionStream, client.h); over this interface that session
// costs no connection, no gRPC thread and none of gRPC's code: a standalone
// run then never starts gRPC unless a worker uses the store. The service
// treats such a session as one carrying its own credentials.
#ifndef CTRUN_RENDEZVOUS_RPC_LOCAL_RENDEZVOUS_H_
#define CTRUN_RENDEZVOUS_RPC_LOCAL_RENDEZVOUS_H_

#include <functional>
#include <memory>

#include "absl/status/status.h"
#include "ctrun/v1/rendezvous.pb.h"

namespace ctrun {

// The service's side of one local session, as the agent holds it.
// Thread-safe.
class LocalSession {
 public:
  virtual ~LocalSession() = default;
  // The agent's next message, handled before this returns; the service's
  // answers may come through the handlers on this thread meanwhile.
  virtual void Send(const v1::AgentMessage& message) = 0;
  // The agent leaves (it half-closed, or cancelled): the service ends the
  // session, and `on_done` comes. Later calls do nothing.
  virtual void Leave() = 0;
};

class LocalRendezvous {
 public:
  struct Handlers {
    // The service's messages, in order, one at a time; must not block.
    std::function<void(const v1::ServerMessage&)> on_message;
    // Once, last: the session ended with this status.
    std::function<void(const absl::Status&)> on_done;
  };
  virtual ~LocalRendezvous() = default;
  // A session; its first message must be the join.
  virtual std::shared_ptr<LocalSession> OpenSession(Handlers handlers) = 0;
};

}  // namespace ctrun

#endif  // CTRUN_RENDEZVOUS_RPC_LOCAL_RENDEZVOUS_H_
