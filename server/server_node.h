// A server process: listens, registers with the coordinator, then answers pushes and
// pulls until the coordinator tells it to shut down.
//
// Thread model: one thread runs the request loop and owns the socket and the ServerCore;
// requests are handled in arrival order, so a worker's pull after its push sees the push.
// `stop` (may be set from a signal handler's thread) ends the loop within poll_interval.
// A HeartbeatSender thread tells the coordinator the server is alive.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>

#include "common/heartbeat.h"
#include "common/status.h"
#include "common/transport.h"
#include "server/replication.h"
#include "server/server_core.h"
#include "server/server_metrics.h"

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
  // Where the rows live: memory budget and spill directory (server_core.h).
  StoreOptions store;
  // When set, the server writes its rows to <export_dir>/server-<id>.safetensors once the
  // coordinator shuts it down (server/export.h); with --replicas=2 also the copy it holds
  // of its predecessor's rows, as server-<p>.backup.safetensors.
  std::string export_dir;
  // How often the loop looks at `stop` while idle.
  std::chrono::milliseconds poll_interval{200};
  // How often the server tells the coordinator its counters, held pulls and rows (for
  // ps_status); 0: never.
  std::chrono::milliseconds report_interval{1000};
  // Where the Prometheus metrics go (common/metrics.h); nullptr: none. Borrowed.
  Metrics* metrics = nullptr;
  // Bounds on one push or pull (see server/server_core.h).
  RequestLimits limits;
  // Runs once, on the heartbeat thread, when the coordinator answered no heartbeat for
  // 3 x the job's --heartbeat_timeout (it died: nobody will shut this server down);
  // ps_server stops as on SIGTERM (checkpoint, then exit). nullptr: keep serving.
  std::function<void()> on_coordinator_lost;
};

// How ServeUntilShutdown serves, beyond the socket, core and stop flag it is given. Every
// pointer is borrowed, may be null (the feature is then off) and must outlive the call.
struct ServeOptions {
  // How often the loop looks at `stop` while idle.
  std::chrono::milliseconds poll_interval{200};
  // The coordinator's socket: a status report (ServerStatusJson) goes to it every
  // report_interval; its replies are drained without waiting, and a failed report is only
  // logged. nullptr: no reports.
  ClientSocket* coordinator = nullptr;
  // How often a report goes to `coordinator`; 0: never.
  std::chrono::milliseconds report_interval{1000};
  // Brought up to date with the core's counters every quarter second. nullptr: none.
  ServerMetrics* metrics = nullptr;
  // The copies this server holds of the shards it backs up (server/replication.h):
  // `replicate` and `promote` messages go to them. nullptr: refused.
  BackupStore* backups = nullptr;
  // This server's own backup: each push, clock tick and evict is forwarded to it after the
  // core applied it, and its replies wait until the backup acknowledged it. When the backup
  // stops answering, the server logs it and goes on without replication. nullptr: none.
  BackupLink* backup_link = nullptr;
  // Re-replication (server/replication.h): `transport` connects to a restarted server (a
  // hand back, a new backup); `relink` owns backup_link and takes the link to a restarted
  // backup in its place. nullptr: `rereplicate` messages are refused.
  Transport* transport = nullptr;
  std::unique_ptr<BackupLink>* relink = nullptr;
  // How long a hand back may wait for the restarted server to load the shards.
  std::chrono::milliseconds seed_timeout{30000};
  // This server restarts a dead one (--replicas=2, RegisterReply.rejoin): `core` is empty
  // until the backup that served its shards sends them (a `seed`); a seed that does not
  // load ends the loop with its error. Until then workers' pushes, pulls and clock ticks
  // go unanswered: they are sent again when the coordinator redirects the workers here.
  bool awaiting_seed = false;
  // When its replies say this server was declared dead and replaced (--replicas=1), the
  // loop ends with FailedPrecondition. nullptr: not asked.
  const HeartbeatSender* heartbeat = nullptr;
};

// Answers requests on `socket` with `core` until a shutdown request has been answered or
// `stop` becomes true (then Aborted). Returns the first transport error.
Status ServeUntilShutdown(ServerSocket& socket, ServerCore& core, const std::atomic<bool>& stop,
                          const ServeOptions& options = {});

// A server's live status as it reports it to the coordinator: kind "server", server,
// shards, rows, rows_spilled, pushes, pulls, bytes, held pulls (queue_depth) and who each
// held pull waits on (held: [{worker, waits_on, seconds}]).
nlohmann::json ServerStatusJson(const ServerCore& core, ServerCore::Clock::time_point now);

// The whole life of a server process.
Status RunServer(const ServerOptions& options, Transport* transport, const std::atomic<bool>& stop);

}  // namespace ps
