# The wire schema: every message between coordinator, servers and workers.
#
# A message is a ZeroMQ multipart message. Frame 0 is a Cap'n Proto `Header`; bulk data
# (keys as little-endian uint64, values as float32) travel as their own frames after it, so
# they are never copied into or out of a Cap'n Proto segment. Each body below says which
# frames follow it.
@0xc2d49dee592cdb3b;

using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("ps::wire");

# Bumped on any incompatible change. Checked at registration and on every request; a peer
# with another version gets an error of code versionMismatch.
const protocolVersion :UInt32 = 1;

enum Role {
  unknown @0;
  server @1;
  worker @2;
}

enum ErrorCode {
  ok @0;
  invalidArgument @1;
  notFound @2;
  failedPrecondition @3;
  unavailable @4;
  deadlineExceeded @5;
  internal @6;
  versionMismatch @7;
  aborted @8;
}

struct KeyValue {
  key @0 :Text;
  value @1 :Text;
}

struct ServerInfo {
  id @0 :UInt32;
  endpoint @1 :Text;   # where the server's ROUTER socket listens
}

struct ShardMap {
  version @0 :UInt64;
  servers @1 :List(ServerInfo);   # ordered by id
}

# The keys of a request: a contiguous range of rows (dense tables), or an explicit list that
# travels as the first payload frame (uint64[count]).
struct Keys {
  union {
    range :group {
      begin @0 :UInt64;
      end @1 :UInt64;      # exclusive
    }
    listCount @2 :UInt64;
  }
}

struct Header {
  protocolVersion @0 :UInt32;
  requestId @1 :UInt64;      # chosen by the requester, echoed in the reply
  senderId @2 :Int32;        # the sender's id within its role; -1 before registration
  body :union {
    register @3 :Register;
    registerReply @4 :RegisterReply;
    push @5 :Push;              # frames: [keys if list] values float[n * width]
    pushReply @6 :PushReply;
    pull @7 :Pull;              # frames: [keys if list]
    pullReply @8 :PullReply;    # frames: values float[n * width]
    error @9 :Error;
    report @10 :Report;
    reportReply @11 :ReportReply;
    done @12 :Done;
    doneReply @13 :Void;
    shutdown @14 :Void;
    shutdownReply @15 :ServerStats;
    heartbeat @16 :Void;
    heartbeatReply @17 :Void;
    clock @18 :ClockTick;       # worker -> every server, after the clock's pushes
    clockReply @19 :ClockReply;
    lease @20 :LeaseRequest;    # worker -> coordinator
    leaseReply @21 :LeaseReply;
    status @22 :Void;           # anyone (ps_status) -> coordinator: how is the job doing?
    statusReply @23 :Report;    # the job's live status, one JSON object (see ps_status)
    alive @24 :Alive;           # heartbeat: any process -> coordinator, on its own connection
    aliveReply @25 :AliveReply;
    evict @26 :Evict;           # coordinator -> server: a worker is gone
    evictReply @27 :Void;
    evaluateFinal @28 :Void;    # answer to done: the barrier passed and this worker (not 0,
                                # which died) evaluates the final model
    replicate @29 :Replicate;   # primary -> its backup: frames: the request, as the primary
                                # got it (server/replication.h)
    replicateReply @30 :Void;   # the backup applied it
    promote @31 :Promote;       # coordinator -> the backup of a dead primary: serve its shards
    promoteReply @32 :Void;
    seed @34 :Seed;             # a whole copy of a primary's shards: frames: the snapshot
                                # (ServerCore::SaveReplica); see server/replication.h
    seedReply @35 :Void;
    rereplicate @36 :Rereplicate;   # coordinator -> a server: send a copy of shards
    rereplicateReply @37 :RereplicateReply;
  }
  # The server whose shards a request is for; -1: the receiver's own. After a failover a
  # server also serves its dead predecessor's shards, and this field says which core a
  # request goes to (server/replication.h).
  targetServer @33 :Int32 = -1;
}

# A heartbeat, every --heartbeat_timeout / 4 (common/heartbeat.h).
struct Alive {
  role @0 :Role;
  id @1 :Int32;
  pid @2 :UInt32;     # the sender's process id (0: unknown): a server replaced by another
                      # process (--replicas=1) is told it is evicted, and stops
}

struct AliveReply {
  evicted @0 :Bool;   # the coordinator declared this worker dead: it must stop
  redirects @1 :List(ServerInfo);   # dead servers and where their shards are served now
  incarnation @2 :UInt64;   # the coordinator process's start (Unix ns): a new value says that
                            # it was restarted, and requests it had not answered are resent
  jobStopping @3 :Bool;     # the job stops (SIGTERM to the coordinator): a worker leaves now,
                            # as on its own SIGTERM, instead of waiting on a coordinator that
                            # will be gone
}

# Primary server `primary` is dead: its backup serves the shadow copy of its shards from now
# on (requests whose targetServer is `primary`), without a backup of its own.
struct Promote {
  primary @0 :Int32;
}

# The coordinator declared worker `worker` dead: drop it from the clock table (nobody waits
# on it) and refuse its requests from now on.
struct Evict {
  worker @0 :Int32;
}

# A state-changing request (push, clock tick, evict) that primary server `primary` applied,
# for its backup to apply to its copy of that primary's shards in the same order.
struct Replicate {
  primary @0 :Int32;
}

# A server whose shards lost their second copy makes a new one (server/replication.h).
# handBack: the receiver serves dead server `primary`'s shards (it was promoted); it sends
# them to the restarted server at `endpoint`, which serves them from now on, and keeps its
# copy as that server's backup again. Otherwise `primary` is the receiver itself: it sends
# its own shards to its backup, restarted at `endpoint`, and forwards to it from now on.
struct Rereplicate {
  primary @0 :Int32;
  endpoint @1 :Text;
  handBack @2 :Bool;
}

struct RereplicateReply {
  bytes @0 :UInt64;       # the snapshot's size
  seconds @1 :Float64;    # how long the receiver paused serving those shards to make it
}

# A whole copy of `primary`'s shards. To a server itself (primary = its id): it serves
# them from now on (a hand back). Forwarded inside a `replicate` message: the backup's copy
# is replaced by it.
struct Seed {
  primary @0 :Int32;
}

struct ClockReply {
  minClock @0 :Int64;   # the slowest live worker's clock (a rejoining worker starts there)
}

# A worker asks for its next chunk of training data, reporting the one it finished.
struct LeaseRequest {
  datasetSize @0 :UInt64;       # training examples the worker has (all must agree)
  completedEpoch @1 :Int32;     # 0: none finished
  completedChunk @2 :UInt64;
  examplesPerSec @3 :Float64;   # the worker's compute throughput, for --batch_size=auto
  wait @4 :Bool;                # hold the answer until there is work or the job is over
  leave @5 :Bool;               # the worker leaves the job (SIGTERM): record the completed
                                # chunk, return any other, answer `finished`
  clock @6 :Int64;              # the worker's clock when it asks (maps epochs to clocks for
                                # the checkpoint record, server/checkpoint.h)
}

struct LeaseReply {
  union {
    chunk :group {
      epoch @0 :Int32;
      index @1 :UInt64;
      begin @2 :UInt64;         # positions in the epoch's example order
      end @3 :UInt64;
    }
    wait @4 :Void;              # nothing to hand out now; ask again with wait = true
    finished @5 :Void;          # every epoch is done
  }
  batchSize @6 :UInt32;         # the batch this worker should use (--batch_size=auto)
  evaluateEpoch @7 :Int32;      # worker 0: evaluate the model now for this epoch (0: no)
}

# A worker finished clock `clock` (it has completed that many steps), or leaves the clock
# table for good (it finished its epochs). Sent on the same connection as its pushes, after
# them, so a server that sees the tick has applied every push of the clocks before it.
struct ClockTick {
  clock @0 :Int64;
  leave @1 :Bool;
  # Batches of --batch_size that one clock of this worker covers: an all-reduce group's
  # leader pushes its members' batches summed, so its clock is the group's size. 0 = 1.
  batches @2 :UInt32;
}

struct Register {
  role @0 :Role;
  endpoint @1 :Text;     # servers: where they listen
  device @2 :Text;       # workers: e.g. "cpu: 2 threads"
  host @3 :Text;
  pid @4 :UInt32;
  requestedId @5 :Int32 = -1;   # the id a launcher gave this process; -1: arrival order
  group @6 :Text;        # workers: an all-reduce group to join by name (empty: --group_size)
}

struct RegisterReply {
  id @0 :UInt32;                  # this process's id within its role
  config @1 :List(KeyValue);      # the job config, flag name -> value
  shardMap @2 :ShardMap;
  group @3 :GroupAssignment;      # workers: the all-reduce group (size 0 or 1: none)
  startClock @4 :Int64;           # a job restored from a checkpoint: the clock workers start at
  startEpoch @5 :Int32;           # ... and the epoch training resumes at (0: none restored)
  # Servers: this one replaces a dead server (--replicas=1) in the running job. It loads
  # restoreSet (a recorded checkpoint set directory; empty: none, start from the initial
  # values), drops evictedWorkers from its clock table and refuses their requests, and takes
  # idleWorkers (done with training) out of the table; the other workers enter it again at
  # their current clocks with the tick they send when redirected (worker/kv_client.h).
  replacement @6 :Bool;
  restoreSet @7 :Text;
  evictedWorkers @8 :List(UInt32);
  idleWorkers @9 :List(UInt32);
  # Servers, --replicas=2: this one restarts a dead server whose shards its backup serves.
  # It starts empty; the backup sends it the shards (`seed`), then it serves them again and
  # the backup holds the copy (server/replication.h).
  rejoin @10 :Bool;
}

# A worker's place in an all-reduce group (worker/group_comm.h), formed by the coordinator.
struct GroupAssignment {
  name @0 :Text;
  rank @1 :UInt32;                # 0 is the leader (the lowest worker id of the group)
  size @2 :UInt32;
  leaderEndpoint @3 :Text;        # where the leader's group socket listens (ipc://)
  memberIds @4 :List(UInt32);     # worker ids by rank
}

struct Push {
  tableId @0 :UInt32;
  keys @1 :Keys;
  clock @2 :Int64;            # the pushing worker's clock (x num_workers: the schedule's iteration)
  pulledVersion @3 :UInt64;   # the shard version the gradient was computed from
  gradDtype @4 :UInt8;        # the values frame's type: 0 fp32, 1 bf16, 2 fp16 (common/wire_dtype.h)
  moreChunks @5 :Bool;        # a chunk of a larger push (KVClientOptions::chunk_bytes) that is
                              # not its last: applied, but the shard's version and push count
                              # move only with the last chunk (false: a whole push, or the last)
}

struct PushReply {
  rowsApplied @0 :UInt64;
  staleness @1 :UInt64;       # shard versions applied since pulledVersion
  learningRate @2 :Float64;   # the rate this push was applied with
  dropped @3 :Bool;           # rejected as too stale (--max_grad_staleness); nothing applied
}

struct Pull {
  tableId @0 :UInt32;
  keys @1 :Keys;
  clock @2 :Int64;            # the pulling worker's clock, for the staleness bound
  valueDtype @3 :UInt8;       # how the reply's values travel: 0 fp32, 1 bf16, 2 fp16
}

struct PullReply {
  rows @0 :UInt64;
  version @1 :UInt64;         # the shard's version: pushes applied to this table here
  clockLag @2 :Int64;         # the puller's clock minus the slowest live worker's
  heldMicros @3 :UInt64;      # how long the staleness bound held the pull
  valueDtype @4 :UInt8;       # the values frame's type (the pull's valueDtype)
}

struct Error {
  code @0 :ErrorCode;
  message @1 :Text;
}

# A worker's progress, one JSON object (a line of metrics.jsonl).
struct Report {
  json @0 :Text;
}

# The coordinator's answer to a report. To a server, with --checkpoint_every=<N>s, it names
# the clock at which every server writes the next checkpoint (so that the set is whole);
# -1: none asked.
struct ReportReply {
  checkpointAt @0 :Int64 = -1;
}

# A worker finished its epochs. The coordinator answers doneReply once every worker is done
# (a barrier), so that the final evaluation sees the final model.
struct Done {
  json @0 :Text;       # the worker's totals: examples, device, seconds
  failed @1 :Bool;     # true if the worker stopped on an error
  message @2 :Text;
}

struct ServerStats {
  pushesApplied @0 :UInt64;
  pushesRejected @1 :UInt64;
  pullsServed @2 :UInt64;
  bytesPushed @3 :UInt64;
  bytesPulled @4 :UInt64;
  rowsHeld @5 :UInt64;
  pushesDropped @6 :UInt64;        # too stale (--max_grad_staleness)
  pullsHeld @7 :UInt64;            # pulls the staleness bound made wait
  maxClockLag @8 :Int64;
  stalenessHistogram @9 :List(UInt64);  # count of applied pushes by staleness; last = overflow
  stalenessSum @10 :UInt64;
  stalenessMax @11 :UInt64;
  # The spill tier (server/row_store.h), summed over sparse tables.
  rowsInMemory @12 :UInt64;
  rowsSpilled @13 :UInt64;
  cacheHits @14 :UInt64;
  cacheMisses @15 :UInt64;         # rows read back from RocksDB
  spillBytesRead @16 :UInt64;
  spillBytesWritten @17 :UInt64;
  peakRssBytes @18 :UInt64;        # the server process's VmHWM
  pushesDuplicate @19 :UInt64;     # retried pushes answered again without applying them
  workersEvicted @20 :UInt64;      # workers the coordinator declared dead
}
