// A server process: listens, registers with the coordinator, then answers pushes and
// pulls until the coordinator tells it to shut down.
//
// Thread model: one thread runs the request loop and owns the socket and the ServerCore;
// requests are handled in arrival order, so a worker's pull after its push sees the push.
// `stop` (may be set from a signal handler's thread) ends the loop within poll_interval.
#pragma once

#include <atomic>
#include <chrono>
#include <string>

#include "common/status.h"
#include "common/transport.h"
#include "server/server_core.h"

namespace ps {

struct ServerOptions {
  // The coordinator's endpoint, e.g. tcp://127.0.0.1:7000. Required.
  std::string coordinator;
  // Where to listen; "*" as the port picks a free one (reported to the coordinator).
  std::string listen = "tcp://127.0.0.1:*";
  // How long to wait for the whole job to register.
  std::chrono::milliseconds register_timeout{120000};
  // The id a launcher gave this server; -1: registration order.
  int requested_id = -1;
  // How often the loop looks at `stop` while idle.
  std::chrono::milliseconds poll_interval{200};
  // Bounds on one push or pull (see server/server_core.h).
  RequestLimits limits;
};

// Answers requests on `socket` with `core` until a shutdown request has been answered or
// *stop becomes true. Returns the first transport error.
Status ServeUntilShutdown(ServerSocket& socket, ServerCore& core, const std::atomic<bool>& stop,
                          std::chrono::milliseconds poll_interval = std::chrono::milliseconds(200));

// The whole life of a server process.
Status RunServer(const ServerOptions& options, Transport* transport, const std::atomic<bool>& stop);

}  // namespace ps
