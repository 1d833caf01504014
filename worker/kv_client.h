// The client side of the parameter server: push gradients to and pull rows from the
// servers holding a table, by key list or (for dense tables) by row range. Requests are
// split per server by the shard map and the replies merged, as ps-lite's KVWorker does.
//
// Every call returns at once with a Ticket; Wait(ticket) blocks until every server part
// has been answered (or the request timeout passed) and returns the outcome. A callback,
// when given, runs on the client's I/O thread once the request completes; such a ticket
// is forgotten after its callback runs (Wait on it is then NotFound).
//
// Buffers: a Push copies its gradients before returning, so the caller may reuse them at
// once. The copy is the encode itself, written on the caller's thread straight into the
// payload frame, which on an ipc:// socket with shared memory lies in the socket's ring
// (ClientSocket::NewFrame): the server applies from those bytes, so the gradients are
// copied once. The part keeps that frame (and with it the slot) until it is answered, for
// retries and a failover's resend (a resend on another socket copies it from the slot). A Pull
// writes into `out` from the I/O thread: `out` must stay valid and untouched until the request
// completes.
//
// Ordering: requests to one server are sent and answered in call order, so a pull issued
// after a push to the same rows sees that push.
//
// Chunks (KVClientOptions::chunk_bytes): a large part, of a range or of a key list, is sent
// as row chunks, each its own request part; the ticket completes when all are answered, retries
// and deduplication work per chunk. The server counts a chunked push once (its version and
// push count move with the last chunk, wire Push.moreChunks), so staleness is unchanged.
// Every chunk is checked on its own (all-or-nothing per chunk): a bad chunk (a NaN) is
// refused alone while the others are applied, and the ticket reports that chunk's error,
// as a bad server part already did. Push stats (staleness, dropped) count a part once,
// from its last chunk's answer.
//
// Clocks (the staleness bound): the client counts the steps its worker completed. Clock()
// completes one and tells every server, after the pushes issued before it; every pull
// carries the current clock, and a server holds it while the job's bound requires (see
// server/server_core.h). Leave() takes the worker out of the clock table when it is done,
// so that nobody waits on it. Pushes carry the clock too (the learning-rate schedule's
// iteration) and the table shard's version of the last pull, from which the server knows
// each gradient's staleness.
//
// Retries: a request part not answered within `retry_interval` is sent again with the same
// request id (until request_timeout); servers apply a retried push once and answer it again
// (server/recent_requests.h); pulls and clock ticks are idempotent. Request ids start at a
// random value, so that they are unique per client even when a worker that rejoined reuses
// a sender id.
//
// Failover (--replicas=2, server/replication.h): when a server dies, the coordinator
// promotes its backup and tells the workers in their heartbeat replies; Redirect(server,
// endpoint) then connects that server's socket to the backup and resends every part the
// dead server had not answered, with the same request ids: the promoted copy applied the
// pushes the dead primary acknowledged, and answers a retried one again without applying
// it twice. Every request names its target server (header targetServer), so that the
// backup knows which of its shards copies a request is for.
// With --replicas=1 a dead server is replaced by a new process restored from a checkpoint
// (server/coordinator.h), and the redirect names that process: the same resend, then a
// clock tick with this worker's current clock (or a leave, when it is out of the clock
// table), so that the restored server's clock table learns where the worker stands.
//
// Thread model: all public methods are thread-safe. One internal I/O thread owns the
// sockets (one DEALER per server; its side is kv_client_io.cc); callers hand it requests
// through a queue and an eventfd wakeup. Callers also build payload frames with a socket's
// NewFrame (which is thread-safe), under sockets_mu_, the lock the I/O thread takes to
// replace a socket.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "common/job_config.h"
#include "common/shard_map.h"
#include "common/status.h"
#include "common/transport.h"
#include "common/wire_dtype.h"

namespace ps {

using Ticket = uint64_t;
using Callback = std::function<void(const Status&)>;

struct KVClientOptions {
  // The sender id put in every request (the worker's id).
  int32_t client_id = 0;
  // A request not answered within this time completes with DeadlineExceeded.
  std::chrono::milliseconds request_timeout{60000};
  // When set, called as each push or pull completes (from the client's I/O thread): whether
  // it was a push, the seconds from the call to its last reply (a pull held by the staleness
  // bound included), and whether it succeeded. For metrics: must be fast and thread-safe.
  std::function<void(bool push, double seconds, bool ok)> on_request_done;
  // A part not answered within this time is sent again, same request id (0: never).
  std::chrono::milliseconds retry_interval{10000};
  // How pushed gradients travel (common/wire_dtype.h): fp32, or bf16/fp16 for half the
  // bytes.
  WireDtype wire_dtype = WireDtype::kFp32;
  // How pulled parameters travel: fp32, or bf16/fp16 (the server rounds each value, this
  // side widens it back to fp32), until set_pull_dtype changes it.
  WireDtype pull_dtype = WireDtype::kFp32;
  // PushRange/PullRange split each server's share into row chunks of at most this many
  // bytes (of fp32 rows; at least one row), each its own request part with its own request
  // id, all in flight at once: the server applies (or copies out) chunk k while this side
  // builds chunk k+1, and the next chunk's bytes travel while one is applied. 0: one part
  // per server. Default 512 KB: on ps_bench (ipc, shared memory, --rounds=5, two cores)
  // 512 KB chunks beat 256 KB on pushes at 1, 4 and 16 MB (1 MB: 3.7-4.0 GB/s against
  // 3.3-3.5), pulls alike; each part costs the same thread hand-offs and system calls
  // whatever its size, and on a virtual machine those cost more than the copies (64 KB: the
  // fixed cost shows; 1 MB: a 1 MB request is one chunk and nothing overlaps). Requests
  // made under a Cork go out together when it ends, so their chunks do not overlap the
  // encoding. Key lists are chunked alike (keys of a server's share in call order, at most
  // chunk_bytes of fp32 rows a chunk), which also keeps a huge batch's request under the
  // server's RequestLimits.
  size_t chunk_bytes = size_t{512} << 10;
};

struct KVClientStats {
  uint64_t pushes = 0;          // Push calls
  uint64_t pulls = 0;           // Pull calls
  uint64_t bytes_pushed = 0;    // gradient payload bytes sent
  uint64_t bytes_pulled = 0;    // value payload bytes received
  uint64_t pushes_dropped = 0;  // server parts refused as too stale
  // Over applied push parts: their staleness (shard versions behind) and learning rate.
  uint64_t staleness_count = 0;
  uint64_t staleness_sum = 0;
  uint64_t staleness_max = 0;
  double last_learning_rate = 0;
  int64_t max_clock_lag = 0;  // over pull replies
  uint64_t retries = 0;       // request parts sent again after retry_interval
};

// What a completed request's servers said about it, beyond the data.
struct RequestInfo {
  // Pulls: the longest any server held a part for the staleness bound, and the largest
  // clock lag a server saw when it answered.
  double held_seconds = 0;
  int64_t clock_lag = 0;
  // Pulls: the table shard's version each server answered with, by server id (0 for a
  // server that held no part). A push computed from this pull passes them back
  // (PushRange's pulled_versions), so that its staleness is counted from this pull even
  // when later pulls were answered meanwhile (prefetching).
  std::vector<uint64_t> versions;
};

class KVClient {
 public:
  // Connects to every server (endpoints indexed by server id).
  static Result<std::unique_ptr<KVClient>> Create(Transport* transport, const JobConfig& config,
                                                  const std::vector<std::string>& server_endpoints,
                                                  const KVClientOptions& options);
  ~KVClient();  // completes every pending request with Aborted, then stops the I/O thread
  KVClient(const KVClient&) = delete;
  KVClient& operator=(const KVClient&) = delete;

  // The id of the table named `name`, or NotFound.
  Result<uint32_t> FindTable(const std::string& name) const;
  const TableSpec& table(uint32_t id) const { return config_.table_specs.at(id); }

  // grads holds keys.size() * width floats, row by row.
  Ticket Push(uint32_t table, std::span<const uint64_t> keys, std::span<const float> grads,
              Callback done = nullptr);
  // out receives keys.size() * width floats, row by row.
  Ticket Pull(uint32_t table, std::span<const uint64_t> keys, std::span<float> out,
              Callback done = nullptr);
  // Dense tables: rows [rows.begin, rows.end). `pulled_versions` (by server id, from the
  // RequestInfo of the pull the gradient was computed from) overrides the versions of the
  // last pull answered; empty: the last pull's.
  Ticket PushRange(uint32_t table, RowRange rows, std::span<const float> grads,
                   Callback done = nullptr, std::span<const uint64_t> pulled_versions = {});
  // `clock` >= 0 tags the pull with that clock instead of the current one: a pull issued
  // ahead for the next step (prefetch) carries clock() + 1, so that the servers' staleness
  // gate checks the clock its rows will be used at.
  Ticket PullRange(uint32_t table, RowRange rows, std::span<float> out, Callback done = nullptr,
                   int64_t clock = -1);

  // Completes the current clock (one step) on every server; pulls after it carry the new
  // clock. Returns a ticket for the servers' acknowledgements.
  Ticket Clock(Callback done = nullptr);
  // Takes this worker out of every server's clock table, so that nobody waits on it (it is
  // done, or waiting for data).
  Ticket Leave(Callback done = nullptr);
  // Puts a worker that left back into the clock table; its clock moves up to the slowest
  // live worker's, so that nobody waits on the clocks it skipped.
  Ticket Rejoin(Callback done = nullptr);
  int64_t clock() const { return clock_.load(); }
  // How many batches one clock of this worker covers (sent with every tick, so that the
  // servers' lr schedule and n-softsync count batches): an all-reduce group's leader sets its
  // group's size, and 1 again when the group breaks. Default 1.
  void SetBatchesPerClock(uint32_t batches) { batches_per_clock_.store(std::max(batches, 1u)); }

  // Requests made between Cork() and Uncork() (calls may nest) are sent together when the
  // last Uncork comes: those to one server travel as one message (a batch,
  // common/transport.h) and are answered as one, so that a step's pulls (or pushes and its
  // clock tick) over several tables cost one round trip per server, not one per table.
  // Order and semantics are those of separate requests. Prefer the Corked guard.
  void Cork();
  void Uncork();
  class Corked {
   public:
    explicit Corked(KVClient& c) : c_(c) { c_.Cork(); }
    ~Corked() { c_.Uncork(); }
    Corked(const Corked&) = delete;
    Corked& operator=(const Corked&) = delete;

   private:
    KVClient& c_;
  };

  // Blocks until the request completes; returns its outcome and forgets the ticket.
  Status Wait(Ticket ticket, RequestInfo* info = nullptr);

  // Server `server`'s shards are now served at `endpoint` (a failover): reconnects and
  // resends the parts not yet answered, on the I/O thread. Redirecting to the endpoint
  // already in use does nothing, so a caller may repeat it.
  void Redirect(int server, const std::string& endpoint);

  KVClientStats stats() const;
  // How the pulls issued from now on travel (KVClientOptions::pull_dtype); e.g. fp32 for an
  // evaluation of a job that trains on 16-bit pulls. Any thread.
  void set_pull_dtype(WireDtype dtype) { pull_dtype_.store(dtype); }
  WireDtype pull_dtype() const { return pull_dtype_.load(); }
  // The request id the next request part will carry (for tests).
  uint64_t next_request_id() const { return next_request_id_.load(); }

 private:
  // What a request part carries, and so how its reply is read.
  enum class Kind { kPush, kPull, kClock };
  // The clock message SendClock sends to every server.
  enum class ClockTick {
    kAdvance,  // the worker completed a clock (Clock)
    kLeave,    // out of the clock table (Leave)
    kRejoin,   // back in, adopting the servers' slowest clock (Rejoin)
  };
  // One Push, Pull, PushRange or PullRange call, as Submit takes it.
  struct Call {
    Kind kind = Kind::kPull;  // kPush or kPull
    uint32_t table = 0;
    std::span<const uint64_t> keys = {};             // key-list calls
    std::optional<RowRange> range = {};              // range calls (dense tables)
    std::span<const float> grads = {};               // pushes: rows x width
    std::span<float> out = {};                       // pulls: rows x width
    int64_t pull_clock = -1;                         // pulls: their clock; -1: clock()
    std::span<const uint64_t> pulled_versions = {};  // pushes: PushRange's, by server
    Callback done = nullptr;
  };
  struct Part;        // one server's share of a request (or one chunk of it)
  struct Request;     // one ticket
  struct Submission;  // one call on its way out: what all its parts share
  struct Outgoing {
    int server;
    Frames frames;
  };

  KVClient(const JobConfig& config, const KVClientOptions& options);
  Status Start(Transport* transport, const std::vector<std::string>& endpoints);
  Ticket Submit(Call call);
  // NotFound or InvalidArgument for a call that addresses rows outside its table or whose
  // buffer does not match the rows.
  Status CheckCall(const Call& call) const;
  // A range call: each server's share in row chunks (see Chunks above), registered first and
  // then built and queued one by one.
  Ticket SubmitRange(const Submission& s);
  // A key-list call: each server's keys in chunks, registered first and then built and
  // queued one by one.
  Ticket SubmitKeys(const Submission& s);
  Ticket Fail(const Status& status, Callback done);
  // A payload frame for a request to `server` (ClientSocket::NewFrame). Any thread.
  zmq::message_t NewPayload(int server, size_t bytes);
  Ticket SendClock(ClockTick tick, Callback done);
  // Registers a request of `parts` (with their request ids) and queues their frames.
  Ticket Enqueue(std::shared_ptr<Request> request, std::vector<std::shared_ptr<Part>> parts,
                 std::vector<uint64_t> request_ids, std::vector<Outgoing> outgoing);
  // Registers a request whose parts' frames are queued later, one by one (Queue), so that
  // the first chunks travel while the later ones are built. Completes an empty one at once.
  Ticket Register(const std::shared_ptr<Request>& request,
                  const std::vector<std::shared_ptr<Part>>& parts,
                  const std::vector<uint64_t>& request_ids);
  void Queue(Part& part, Outgoing o);
  // Whether parts keep their frames for retries and failover resends.
  bool KeepFrames() const;
  // Records one part's outcome; the last part completes the ticket. REQUIRES: mu_ not held.
  void Complete(Ticket ticket, const Status& status);
  // Counts a Push/Pull call (kind kPush or kPull) in stats_ (takes mu_).
  void CountRequest(Kind kind, uint64_t payload_bytes);
  void IoLoop();
  // Sends `outbox` (emptied) with one batch per server (I/O thread).
  void SendBatched(std::vector<Outgoing>& outbox);
  void OnReply(int server, Frames frames);
  // Copies a pull reply's rows (`src`, part.rows x width values of `dtype`) to where the
  // part's rows go in its request's output, widened to fp32.
  static void ScatterPull(const Part& part, const char* src, WireDtype dtype);
  // Raises clock_ to at least `to` (a rejoin adopts the servers' slowest clock).
  void RaiseClock(int64_t to);
  void Wake();

  const JobConfig config_;
  const KVClientOptions options_;
  std::atomic<WireDtype> pull_dtype_;  // options_.pull_dtype until set_pull_dtype
  const ShardMap shard_map_;

  // Applies the redirects queued by Redirect (I/O thread).
  void ApplyRedirects(std::vector<zmq::pollitem_t>& items);

  Transport* transport_ = nullptr;
  // Owned by the I/O thread after Start; others only call NewFrame, under sockets_mu_,
  // which the I/O thread takes to replace a socket (Redirect).
  std::mutex sockets_mu_;
  std::vector<std::unique_ptr<ClientSocket>> sockets_;
  std::vector<std::string> endpoints_;                  // by server; owned by the I/O thread
  std::vector<std::pair<int, std::string>> redirects_;  // queued by Redirect; guarded by mu_
  int wake_fd_ = -1;
  std::thread io_thread_;
  std::atomic<bool> stopping_{false};
  std::atomic<uint64_t> next_request_id_;  // random start (see Retries above)
  std::atomic<int64_t> clock_{0};
  std::atomic<uint32_t> batches_per_clock_{1};
  std::atomic<bool> in_clock_table_{true};  // false after Leave, until Clock or Rejoin
  std::atomic<int> corks_{0};               // outstanding Cork() calls

  mutable std::mutex mu_;
  std::condition_variable cv_;
  Ticket next_ticket_ = 1;                                         // guarded by mu_
  std::vector<Outgoing> outbox_;                                   // guarded by mu_
  std::unordered_map<Ticket, std::shared_ptr<Request>> requests_;  // guarded by mu_
  std::unordered_map<uint64_t, std::shared_ptr<Part>> parts_;      // request id -> part; mu_
  KVClientStats stats_;                                            // guarded by mu_
  // Shard version of the last pull, by table then server; sent back with pushes.
  std::vector<std::vector<uint64_t>> pulled_version_;  // guarded by mu_
};

}  // namespace ps
