// The coordinator: rendezvous, the shard map, progress and the end of the job.
//
// Life of a job: (1) servers and workers register; once all `num_servers` and
// `num_workers` have, each gets its id, the job config and the shard map. (2) Workers
// train and send reports, which go to metrics.jsonl and the console. (3) A worker that
// finishes sends `done`; the answer waits until every worker is done (a barrier), so that
// worker 0's final evaluation sees the final model. (4) After the final evaluation the
// coordinator shuts the servers down, collects their counters and writes summary.json.
//
// Failures: every process sends a heartbeat (common/heartbeat.h). A worker silent for
// longer than the job's --heartbeat_timeout is declared dead: its data leases go back to
// the queue, every server drops it from its clock table and refuses its later requests,
// and summary.json lists the event under `failures`. A worker that gets SIGTERM returns
// its lease and says it leaves (the same, without the wait). A worker may join the running
// job at any time: it gets the next id, the config and the shard map, and leases data.
// The evaluator is worker 0, or the lowest live worker once 0 is gone. A server silent
// past the timeout is listed; with --replicas=2 it is declared dead and its backup
// promoted: the backup serves the copy of its shards, the workers are redirected in their
// heartbeat replies, and the end of the job skips it (server/replication.h). With
// --replicas=1 it is declared dead (`server_lost`) and its slot waits for a replacement: a
// ps_server that registers while the job runs (before or after the death is declared)
// takes the dead server's id and gets, in its registration reply, the latest checkpoint
// set this job recorded (or none: the initial values) and the workers that are gone or
// done. The workers are redirected to it in their heartbeat replies, resend what the dead
// server had not answered and tick their current clocks there. The updates to its shards
// after the set's clock are lost: a bounded rollback, accepted rather than replayed,
// because the other servers' shards keep their updates and the workers' data leases have
// moved on (replaying clocks would train those examples twice on the other shards). The
// failure entry's `rollback` says which clock was restored, where the workers were, and
// how many pushes the dead server had reported since that checkpoint.
//
// Checkpoints (server/checkpoint.h): servers report the clock of each checkpoint they
// commit; once every server has one and every training worker's lease requests have passed
// its clock, the coordinator records the set in --checkpoint_dir/checkpoints.json with the
// epoch to resume at (the first one not wholly trained by that clock) and the LR iteration.
// With --restore it hands the servers the set and the workers its clock and epoch.
//
// Restart: the coordinator journals the job's state as it changes (membership with
// endpoints, data leases and the answers it gave, clocks, the checkpoint record, failures,
// the start time) in <run_dir>/coordinator.db (server/coord_journal.h). A coordinator killed
// and started again with --resume at the same endpoint and run directory takes that state
// back. Servers and workers keep training meanwhile (pushes and pulls do not go through the
// coordinator) and keep beating; for the job's --coordinator_restart_timeout they wait for a
// coordinator instead of stopping. Their connections reach the new process on their own
// (ZeroMQ reconnects); it learns their new routing identities from the sender ids of their
// requests (Reattach), and every heartbeat reply carries its incarnation, so that a worker
// sends again a request the dead coordinator never answered (worker/coordinator_call.h); a
// lease request it had answered gets the same answer again. Leases outstanding at the
// crash stay with their live workers; those of a worker that does not come back return to
// the queue when it is declared dead, as always. summary.json lists the restart under
// `failures` (`coordinator_restart`).
//
// Parts: RunCoordinator's event loop owns the socket, decodes each request and sends what
// the part that owns the state decided: who is in the job and alive
// (server/coord_membership.h), data leases (coord_leases.h), the failure log
// (coord_failures.h), the checkpoint record (coord_checkpoints.h), failover and server
// replacement (coord_failover.h), the live view and console progress (coord_progress.h)
// and summary.json (coord_summary.h; its type is common/run_summary.h).
//
// Thread model: one thread (the caller of RunCoordinator) owns the socket and all state.
#pragma once

#include <atomic>
#include <chrono>
#include <string>

#include "common/job_config.h"
#include "common/metrics.h"
#include "common/status.h"
#include "common/transport.h"

namespace ps {

struct CoordinatorOptions {
  // Where to listen; "tcp://127.0.0.1:*" picks a free port (see endpoint_file).
  std::string listen = "tcp://127.0.0.1:7000";
  // The run directory: metrics.jsonl and summary.json are written here. Required.
  std::string run_dir;
  // When set, the bound endpoint is written to this file once listening, so that a
  // launcher can start the other processes without guessing a free port.
  std::string endpoint_file;
  // How long to wait for every process to register.
  std::chrono::milliseconds register_timeout{120000};
  // How long each server may take to answer the shutdown request.
  std::chrono::milliseconds shutdown_timeout{30000};
  // How long after the last `done` to wait for worker 0's final evaluation.
  std::chrono::milliseconds final_eval_timeout{600000};
  // On `stop` (SIGTERM) with a --checkpoint_dir: how long to keep training until the
  // checkpoint set the coordinator names then is written and recorded, before the job
  // stops anyway (0: stop at once; the servers' last recorded set stays the latest).
  std::chrono::milliseconds stop_checkpoint_timeout{30000};
  // Seconds between progress lines on stdout while training (0: only per epoch).
  double progress_every_seconds = 5;
  // How long a server may take to confirm that it evicted a dead worker.
  std::chrono::milliseconds evict_timeout{5000};
  // How often the loop looks at `stop` (and at heartbeats) while idle.
  std::chrono::milliseconds poll_interval{200};
  // Resume the job journaled in the run directory (a coordinator restarted after it died):
  // its processes re-attach with their ids and the job goes on. Off: a new job (an
  // earlier journal there is replaced). See "Restart" above.
  bool resume = false;
  // The journal (server/coord_journal.h); empty: <run_dir>/coordinator.db.
  std::string journal;
  // Sync each journal write to disk (off only in tests).
  bool journal_sync = true;
  // Where the Prometheus metrics go (common/metrics.h); nullptr: none. Borrowed.
  Metrics* metrics = nullptr;
};

// Runs a whole job. Returns OK when every worker finished and summary.json was written.
Status RunCoordinator(const JobConfig& config, const CoordinatorOptions& options,
                      Transport* transport, const std::atomic<bool>& stop);

}  // namespace ps
