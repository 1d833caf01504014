// Chain replication of a server's shards (Li et al., OSDI 2014, with a chain of two): with
// --replicas=2 the primary of shard p (server p) has a backup on server (p + 1) % S. The
// primary applies each state-changing request (push, clock tick, evict), forwards the
// request as it got it to the backup, and answers the worker only once the backup has
// applied it. The backup keeps, per primary it backs up, a shadow ServerCore built with the
// primary's id: the same rows, the same clock table (SSP) and the same recent-request table
// (exactly-once), because a ServerCore is a deterministic function of the requests it has
// applied, in order. Pulls are not forwarded (they change nothing).
//
// Failover: when primary p dies, the coordinator sends its backup a `promote` message;
// from then on the backup serves p's shards from the shadow core (requests whose header
// names targetServer = p). Workers learn the new endpoint of p from their heartbeat
// replies and resend what p had not answered, with the same request ids
// (worker/kv_client.h).
//
// Re-replication: after a failover p's shards have one copy (on its backup B), and so do
// the shards p backed up (its predecessor's). When a ps_server restarts as p (it registers
// while the job runs; the coordinator answers it `rejoin`), the coordinator sends B a
// `rereplicate` with handBack: B stops serving p's shards, saves their whole state
// (ServerCore::SaveReplica: rows, optimizer state, spilled rows, clocks, the exactly-once
// table) and sends it to the new p as a `seed`; once p loaded it, B keeps its copy as p's
// backup again (it is no longer promoted), drops the pulls it held for p, and no longer
// answers requests for p's shards; the workers, redirected to p, resend them there. p serves
// its shards again and forwards to B as before. Then the predecessor of p (if alive) gets a
// `rereplicate` for its own shards: it sends its state to p as the first forward of a new
// link, and forwards to p from then on. The chain is whole again: every shard has two
// copies, and the job survives the next failure of any server.
// While B makes the snapshot and p loads it, B serves nothing (the pause is measured and
// reported); a failure of B in that window loses p's shards (both copies down).
//
// Thread model: BackupStore and BackupLink are not thread-safe; the server's request loop
// owns both.
#pragma once

#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <vector>

#include "common/job_config.h"
#include "common/status.h"
#include "common/transport.h"
#include "server/server_core.h"

namespace ps {

// The server that backs up server `primary`'s shards; -1 without replication.
int BackupOf(const JobConfig& config, int primary);

// What a request to a server is, for replication: kChangesState for a push, a clock tick or
// an evict (they go to the backup), kReplicate for a primary's forwarded request, kOther
// for the rest. A request that does not decode is kOther (the primary refuses it and
// changes nothing).
// kPromote: the coordinator's `promote`; kRereplicate its `rereplicate`; kSeed: a
// whole copy of this server's own shards (a hand back).
enum class RequestKind { kOther, kChangesState, kReplicate, kPromote, kRereplicate, kSeed };
RequestKind Classify(const Frames& request);

// Whether the request is a worker's push, pull or clock tick: one that reads or changes a
// server's shards (false for anything that does not decode).
bool IsShardRequest(const Frames& request);

// The header's targetServer (-1: none, or a request that does not decode).
int TargetServer(const Frames& request);

// The message a primary sends its backup: a `replicate` header naming the primary, then
// the request's frames (moved in: share them with ShareFrames to keep the request).
Frames WrapForBackup(int primary, uint64_t request_id, Frames request);

// A `seed` message with the whole state of `core` (its server's shards), and the
// snapshot's size in *bytes.
Result<Frames> SeedMessage(ServerCore& core, uint64_t request_id, size_t* bytes);
// Loads a `seed` message into `core` (fresh, of the seed's server); the reply to send.
Frames LoadSeed(ServerCore& core, int self, const Frames& message);

// The backup side: shadow cores of the primaries this server backs up.
class BackupStore {
 public:
  // `self` is this server's id; shadows are created on the first message from a primary
  // that this server backs up (BackupOf(primary) == self).
  BackupStore(JobConfig config, int self, StoreOptions store = {});

  // Applies a `replicate` message to the shadow of its primary (a forwarded `seed`
  // replaces the shadow with a new one made from it). The reply is
  // replicateReply, or an error (not a backup of that primary, bad message). Replies the
  // shadow would send to workers are dropped: the primary answers them.
  Frames Handle(Frames& message);

  // The primaries whose shards this server holds a copy of.
  std::vector<int> primaries() const;
  // The shadow of `primary`'s shards, nullptr when none was created.
  ServerCore* shadow(int primary);
  // Promotion: hands the shadow over to be served as the primary's shards.
  std::unique_ptr<ServerCore> Release(int primary);

  // Applies the coordinator's `promote` message: the shadow of its primary (created empty
  // when the primary never forwarded anything) is served as that primary's shards from
  // now on, and later `replicate` messages from it are refused. Answers promoteReply, or an
  // error (not the backup of that primary, bad message). Promoting twice is a no-op.
  Frames HandlePromote(Frames& message);
  // The promoted core serving `primary`'s shards, nullptr when not promoted.
  ServerCore* promoted(int primary);
  // A hand back (re-replication, above): the promoted copy of `primary`'s shards becomes its
  // shadow again, fed by `replicate` messages from the restarted primary; the pulls it
  // held are dropped. Returns how many. No-op when not promoted.
  size_t Unpromote(int primary);
  bool is_promoted(int primary) const { return promoted_.count(primary) > 0; }
  bool any_promoted() const { return !promoted_.empty(); }
  std::vector<ServerCore*> promoted_cores();
  // The server this one forwards its own state changes to (-1: none).
  int backup_of_self() const;

 private:
  // A replicate or promote message's request id and primary.
  struct Addressed {
    uint64_t request_id = 0;
    int primary = -1;
  };
  // Decodes `message` (a `which` with at least `min_frames` frames) addressed to a primary
  // this server backs up into *to; or the error reply to send.
  std::optional<Frames> Address(const Frames& message, wire::Header::Body::Which which,
                                size_t min_frames, Addressed* to) const;
  // A forwarded seed: `primary`'s copy is made anew from it; the reply to the primary.
  Frames Reseed(int primary, uint64_t request_id, const Frames& seed);
  // The copy of `primary`'s shards, created (as the job starts them, or restored from the
  // job's checkpoint) on first use.
  Result<ServerCore*> Shadow(int primary);

  JobConfig config_;
  int self_;
  StoreOptions store_;
  std::map<int, std::unique_ptr<ServerCore>> shadows_;
  std::map<int, ServerCore*> promoted_;  // primary -> its shadow, now served
  int refusals_logged_ = 0;              // errors of shadows, logged (the first 20)
  std::map<int, uint64_t> last_seq_;     // primary -> the last forward applied (its number)
};

// The primary side: one connection to the backup. Forwarding is asynchronous so that two
// servers that back up each other (S = 2) never wait on each other: the request loop sends
// the request, keeps serving, and holds back the replies of everything it handled since
// until the backup acknowledged it (the backup applies in order, so an acknowledgement of
// request n covers all before it). Acknowledged pushes are therefore always on the backup.
class BackupLink {
 public:
  BackupLink(std::unique_ptr<ClientSocket> socket, int self, std::chrono::milliseconds timeout)
      : socket_(std::move(socket)), self_(self), timeout_(timeout) {}

  // Sends `request` to the backup; returns its sequence number (1, 2, ...). An error marks
  // the link down.
  Result<uint64_t> Send(Frames request);
  // Reads the backup's acknowledgements that arrived, without waiting, and returns the
  // highest sequence number acknowledged so far. Marks the link down when the backup
  // refused a request, or left one unacknowledged for longer than the timeout; the
  // coordinator will have declared such a backup dead, and the primary goes on alone.
  uint64_t Poll(std::chrono::steady_clock::time_point now);
  uint64_t sent() const { return sent_; }
  uint64_t acked() const { return acked_; }
  // After a failure: later requests are not forwarded, held replies may go.
  bool down() const { return down_; }
  // The backup refused a forward because it was promoted: the coordinator declared this
  // server dead (e.g. it was stopped, not killed) and the backup serves its shards. This
  // server must not acknowledge what it applied since: the copy that counts lacks it.
  bool fenced() const { return fenced_; }
  // The coordinator declared the backup dead (it promoted it): stop forwarding and release
  // the held replies now instead of after the timeout.
  void Abandon(const Status& why) { MarkDown(why); }
  std::chrono::milliseconds timeout() const { return timeout_; }
  zmq::socket_ref PollHandle() { return socket_->PollHandle(); }

 private:
  void MarkDown(const Status& why);

  std::unique_ptr<ClientSocket> socket_;
  int self_;
  std::chrono::milliseconds timeout_;
  uint64_t sent_ = 0;
  uint64_t acked_ = 0;
  // When the oldest unacknowledged request was sent (valid while sent_ > acked_).
  std::chrono::steady_clock::time_point oldest_unacked_;
  bool down_ = false;
  bool fenced_ = false;
};

}  // namespace ps
