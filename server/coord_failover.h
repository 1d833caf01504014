// Failover and replacement of servers, and the coordinator's calls to servers.
//
// --replicas=2: a server declared dead is failed over to its backup (the next server),
// which serves the copy of its shards (server/replication.h); workers learn the new
// endpoint from their heartbeat replies (Redirects).
// --replicas=1: a dead server's slot waits for a replacement: a ps_server that registers
// while the job runs (before or after the death is declared) takes the dead server's id
// and restores the latest recorded checkpoint set. The updates to its shards after the
// set's clock are lost (a bounded rollback, accepted rather than replayed: the other
// servers' shards keep their updates and the workers' leases moved on); ComputeRollback
// says how much, in the failure entry.
// --replicas=2, re-replication (server/replication.h): a ps_server that registers while
// the job runs restarts a dead server whose backup serves its shards (Rejoin); once it
// reports, that backup hands the shards back to it and its predecessor sends it a copy of
// its own (OnRejoinedServing): every shard has two copies again.
// Evictions: a worker that is gone is dropped from every server's clock table (or from
// the promoted backup's, for a failed-over server's shards).
// Shutdown: every live server is asked to stop and answers with its counters.
//
// Thread model: not thread-safe; the coordinator's one thread owns it. Calls to servers
// block up to the options' timeouts.
#pragma once

#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "common/run_summary.h"
#include "common/transport.h"
#include "common/wire.h"
#include "server/coord_checkpoints.h"
#include "server/coord_failures.h"
#include "server/coord_membership.h"
#include "server/coord_progress.h"

namespace ps {

struct FailoverOptions {
  // How long a server may take to confirm an eviction or a promotion.
  std::chrono::milliseconds evict_timeout{5000};
  // How long each server may take to answer the shutdown request.
  std::chrono::milliseconds shutdown_timeout{30000};
  // How long a server may take to send a copy of shards to a restarted one.
  std::chrono::milliseconds rereplicate_timeout{60000};
};

// The rollback of a server restarted from the set at `checkpoint_clock` (`set`: none for
// the initial values) after it was lost at `clock_at_loss` (its slowest live clock) with
// the fastest worker at `workers_clock_at_loss`; `before`: its last status.
Rollback ComputeRollback(int64_t checkpoint_clock, const std::optional<std::string>& set,
                         int64_t clock_at_loss, int64_t workers_clock_at_loss,
                         const ServerLive& before);

class Failover {
 public:
  // `transport` and `members` are borrowed and must outlive it.
  Failover(FailoverOptions options, Transport* transport, Membership* members)
      : options_(options), transport_(transport), members_(members) {}

  // The live server that serves server `s`'s shards: s itself, its promoted backup, or -1
  // when they are lost.
  int ServedBy(int s) const;
  // Server `s` for ps_status: {"state": "serving" | "lost", "served_by": the live server
  // serving its shards (lost ones; -1: nobody), "serves_for": the lost servers whose shards
  // it serves (a promoted backup)}; {"state": "unknown"} for an id that is no server's.
  nlohmann::json StatusOf(int s) const;
  // Where the dead servers' shards are served now, for the workers: (id, endpoint).
  std::vector<std::pair<uint32_t, std::string>> Redirects() const;
  bool any_redirects() const { return !promoted_.empty() || !replaced_.empty(); }

  // --replicas=2: server `s` (silent since `last_seen`) is dead; asks its backup to serve
  // its shards. Fills the entry's failover fields; prints the console line.
  void PromoteBackup(int s, CoordClock::time_point last_seen, double elapsed, FailureEntry* entry);
  // Tells every server that worker `w` is gone.
  void EvictOnServers(int w);

  // --replicas=1: server `s` was declared dead; `entry` is its failure entry's index and
  // `last` its last status (for the rollback).
  void OnServerLost(int s, size_t entry, const ServerLive& last);
  // A server registered while the job runs: it waits for a dead slot (the same peer
  // asking again replaces its earlier request).
  void AddWaiting(Member m);
  // Pairs each dead slot with a waiting server: the one that asked for that id, else the
  // first to come. Removes them from the waiting ones. `replicated` (--replicas=2): the
  // slots whose shards a backup serves; else those not failed over.
  std::vector<std::pair<int, Member>> TakeAssignments(bool replicated = false);
  // --replicas=2: `m` restarts dead server `s`, whose shards its promoted backup serves:
  // installed in the membership; its shards come back when it serves (OnRejoinedServing).
  void Rejoin(int s, Member m, double elapsed, FailureLog* log);
  // A server's status report: when it is a restarted one's first, the backup that serves
  // its shards hands them back to it, the workers are redirected to it, and its
  // predecessor sends it a copy of its own shards. Fills the failure entry's
  // re-replication fields; prints the console line.
  void OnRejoinedServing(int s, double elapsed, FailureLog* log);
  // `m` takes dead server `s`'s place, restored from `set` (none: the initial values):
  // completes the failure entry in `log` and installs `m` in the membership.
  void Replace(int s, Member m, const std::optional<JobSet>& set, double elapsed, FailureLog* log);
  // A replacement's first status report: it restored and serves.
  void OnReplacementServing(int s, double restore_seconds, FailureLog* log);
  // Registrations still waiting when the job ends.
  std::vector<Member> TakeWaiting() { return std::move(waiting_); }

  // Which servers were failed over or replaced, for the coordinator's journal
  // (server/coord_resume.h), and back.
  nlohmann::json StateJson() const;
  void RestoreState(const nlohmann::json& state);

  // Shuts every live server down; the summary's server entries (a server lost during the
  // job, whatever became of it, with the counters of its last report before the loss: only
  // those this coordinator saw, not those before a coordinator restart). The first error,
  // if any.
  Status ShutdownServers(std::vector<ServerSummary>* out);

 private:
  Result<CallReply> CallServer(int s, Frames f, std::chrono::milliseconds timeout);

  FailoverOptions options_;
  Transport* transport_;
  Membership* members_;
  std::vector<std::unique_ptr<ClientSocket>> sockets_;  // by server id; reset after a failure
  uint64_t request_ = 0;
  std::map<int, int> promoted_;          // dead server -> the backup serving its shards
  std::set<int> replaced_;               // servers replaced by a restarted process
  std::vector<Member> waiting_;          // registrations waiting for a dead server to replace
  std::map<int, size_t> lost_event_;     // dead server -> its failure entry
  std::map<int, ServerLive> lost_live_;  // dead server -> its last status
  std::map<int, size_t> awaiting_first_report_;  // replacement -> its failure entry
  std::set<int> awaiting_rejoin_;                // restarted servers waiting for their shards
  // Dead server `s`'s failure entry (made when it was lost before a coordinator restart).
  FailureEntry& EntryFor(int s, FailureLog* log);
  // Asks server `to` to send server `primary`'s shards to `endpoint` (a `rereplicate`).
  Result<CallReply> CallRereplicate(int to, int primary, const std::string& endpoint,
                                    bool hand_back);
};

}  // namespace ps
