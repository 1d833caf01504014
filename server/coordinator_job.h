// The coordinator's job, as its parts see it: the class behind RunCoordinator
// (server/coordinator.h). coordinator.cc holds the event loop and the handlers;
// coordinator_resume.cc the journal and the restart (server/coord_journal.h).
//
// Thread model: one thread (the caller of Run) owns the socket and all state.
#pragma once

#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/divergence.h"
#include "common/job_config.h"
#include "common/run_files.h"
#include "common/status.h"
#include "common/transport.h"
#include "common/wire.h"
#include "server/coord_checkpoints.h"
#include "server/coord_failover.h"
#include "server/coord_failures.h"
#include "server/coord_journal.h"
#include "server/coord_leases.h"
#include "server/coord_membership.h"
#include "server/coord_progress.h"
#include "server/coordinator.h"

namespace ps {

// The job's event loop: owns the socket, decodes each request and hands it to the part
// that owns its state (membership, leases, checkpoints, failover, progress), then sends
// what that part decided.
class CoordinatorJob {
 public:
  CoordinatorJob(const JobConfig& config, const CoordinatorOptions& options, Transport* transport)
      : config_(config),
        options_(options),
        transport_(transport),
        members_(MembershipOptions::ForJob(config)),
        leases_({config.epochs, static_cast<uint64_t>(config.chunk_examples), config.batch_size,
                 config.auto_batch}),
        checkpoints_(config),
        failover_({options.evict_timeout, options.shutdown_timeout}, transport, &members_),
        progress_(
            {config.epochs, config.staleness, options.progress_every_seconds, options.metrics}) {}

  Status Run(const std::atomic<bool>& stop);

 private:
  // ---- the socket ----
  // Ok when the peer has gone (logged); an error only when the transport is shutting down.
  Status Send(const std::string& peer, capnp::MallocMessageBuilder& b);
  void ReplyError(const std::string& peer, uint64_t request_id, const Status& error);
  std::optional<DecodedHeader> Decode(Incoming& in);
  void ReplyStatus(const std::string& peer, uint64_t rid);

  // ---- registration ----
  Status ResolveRestore();
  Status Register(const std::atomic<bool>& stop);
  void OnRegistration(const std::string& peer, wire::Header::Reader header);
  Status Assemble();
  Status ReplyRegistration(const Member& m, uint32_t id, bool original,
                           const GroupPlan* plan = nullptr, int rank = 0);

  // ---- training ----
  Status Train(const std::atomic<bool>& stop);
  Status ServeNext();
  Status Dispatch(const std::string& peer, wire::Header::Reader header);
  Status DispatchWorker(const std::string& peer, int w, wire::Header::Reader header);
  Status OnJoin(const std::string& peer, uint64_t rid, wire::Register::Reader reg);
  Status OnServerJoin(const std::string& peer, uint64_t rid, wire::Register::Reader reg);
  Status AssignWaitingServers();
  void ReplyReplacement(int s, const std::optional<JobSet>& set);
  Status OnAlive(const std::string& peer, uint64_t rid, wire::Alive::Reader alive);
  Status CheckHeartbeats();
  void OnSilentServer(int s, CoordClock::time_point now);
  Status RemoveWorker(int w, bool dead, std::optional<bool> completed_chunk);
  void OnServerReport(int s, const char* text);
  // Server `s` got SIGTERM (--replicas=2): its backup is promoted now, before the server
  // exits (it waited until its backup acknowledged everything it forwarded).
  void OnServerLeaving(int s);
  Status OnWorkerReport(const std::string& peer, int w, uint64_t rid, const char* text);
  Status OnDone(const std::string& peer, int w, uint64_t rid, wire::Done::Reader done);
  Status OnLease(const std::string& peer, int w, uint64_t rid, wire::LeaseRequest::Reader req);
  Status AnswerHeldLeases();
  Status MaybeReleaseBarrier();
  Status OnStopSignal();
  // The job stops (SIGTERM): tells the workers still in it to leave, and waits a bounded
  // time for them to do so, before the servers are shut down.
  void SendWorkersHome();
  // The model diverged (a worker's check, or the loss watch): the job stops at once.
  void OnDiverged(Divergence d);

  // ---- restart (server/coordinator_resume.cc) ----
  // Creates the journal (a new job) or, with options.resume, opens it and takes the job's
  // state back.
  Status OpenJournal();
  Status Resume(const CoordJournal::Parts& parts);
  // The state as journal parts.
  CoordJournal::Parts Snapshot() const;
  // Writes the parts that changed since the last write. Called before a lease answer is
  // sent and after each request, so that what a process was told is in the journal.
  Status Persist();
  // A resumed job: a request from a peer not known yet is from one of the job's processes
  // whose connection was made to the coordinator that died: learns its new identity from
  // the sender id. True when `peer` is now a known worker or server.
  bool Reattach(const std::string& peer, wire::Header::Reader header);
  // A lease request sent again after a restart (same worker and request id as one already
  // handled): answers it as before, or holds it again. True when it was one.
  Result<bool> OnLeaseResent(const std::string& peer, int w, uint64_t rid,
                             wire::LeaseRequest::Reader req);
  // The fastest clock any live worker reached, as the servers and workers last reported.
  int64_t JobClock() const;

  // ---- the end ----
  Status WriteSummary(const Status& outcome, std::vector<ServerSummary> servers);

  double Elapsed() const {
    return std::chrono::duration<double>(CoordClock::now() - train_start_).count();
  }

  JobConfig config_;
  CoordinatorOptions options_;
  Transport* transport_;
  std::unique_ptr<ServerSocket> socket_;
  std::unique_ptr<MetricsLog> metrics_;
  Membership members_;
  LeaseDesk leases_;
  CheckpointBook checkpoints_;
  Failover failover_;
  Progress progress_;
  FailureLog failures_;
  LossWatch loss_watch_{config_.divergence_loss_ratio};
  std::optional<Divergence> divergence_;  // the first sign of divergence; ends Train
  CoordClock::time_point job_start_, train_start_;
  double train_start_unix_ = 0;  // metrics lines' "time" minus this: seconds into training
  uint64_t messages_during_training_ = 0;  // requests from workers while the job ran
  bool barrier_released_ = false;
  bool stop_after_eval_noted_ = false;  // "stopping: training is over" printed
  bool stopping_ = false;  // SendWorkersHome runs: heartbeat replies say that the job stops
  int final_evaluator_ = -1;
  CoordClock::time_point barrier_time_;
  // When CheckHeartbeats last ran: a longer gap than the poll interval is the loop's own
  // stall, forgiven to every process (Membership::ForgiveStall).
  CoordClock::time_point last_heartbeat_check_{};
  // Restart: the journal, the parts as last written, and this process's incarnation
  // (Unix ns at its start; heartbeat replies carry it).
  std::unique_ptr<CoordJournal> journal_;
  CoordJournal::Parts journaled_;
  uint64_t incarnation_ = 0;
  bool resumed_ = false;
  bool finished_ = false;  // summary.json written
  // Per worker: its latest lease request handled (request id) and the answer sent, if any
  // (a request resent after a restart gets the same answer).
  struct LeaseSeen {
    uint64_t request_id = 0;
    std::optional<LeaseAnswer> answer;
  };
  std::map<int, LeaseSeen> lease_seen_;
  std::map<int, uint64_t> last_report_;  // per worker: the latest report's request id
};

}  // namespace ps
