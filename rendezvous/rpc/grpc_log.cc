#include "rendezvous/rpc/grpc_log.h"

#include <grpc/support/log.h>
#include <spdlog/spdlog.h>

namespace ctrun {

void RouteGrpcLogsToSpdlog() {
  gpr_set_log_function([](gpr_log_func_args* args) {
    spdlog::debug("grpc {}:{}: {}", args->file, args->line, args->message);
  });
}

}  // namespace ctrun
