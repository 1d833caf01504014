// A worker's requests to the coordinator (lease, report, done) that survive a coordinator
// restart (server/coordinator.h, "Restart").
//
// The request goes out on the registration socket and the answer is awaited in short
// slices. When the heartbeat (common/heartbeat.h) sees a new coordinator incarnation while
// the request is unanswered, the request is sent again, identically (same request id):
// the dead coordinator may never have read it, or its answer may have been lost with the
// connection. The coordinator answers a request it already handled as it did before
// (lease), or takes it once (report). Answers to other request ids (the second answer to a
// request sent twice) are dropped.
//
// Thread model: uses `socket` as its one user for the length of the call; the heartbeat's
// incarnation is read through its thread-safe accessor.
#pragma once

#include <atomic>
#include <chrono>

#include "common/heartbeat.h"
#include "common/status.h"
#include "common/transport.h"
#include "common/wire.h"

namespace ps {

struct CoordinatorCallOptions {
  // The whole call's limit, resends included.
  std::chrono::milliseconds timeout{60000};
  // How often the heartbeat's incarnation (and `stop`) is looked at while waiting.
  std::chrono::milliseconds slice{250};
  // Where the coordinator's incarnation is learned; nullptr: never resend.
  const HeartbeatSender* heartbeat = nullptr;
  // Set: the call ends with Aborted. nullptr: none.
  const std::atomic<bool>* stop = nullptr;
};

// Sends `request` (its header's request id is `request_id`) and returns the answer with
// that id; an `error` answer is its Status.
Result<CallReply> CallCoordinator(ClientSocket& socket, Frames request, uint64_t request_id,
                                  const CoordinatorCallOptions& options);

}  // namespace ps
