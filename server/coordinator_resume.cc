// The coordinator's journal and restart (server/coordinator.h, "Restart"): what
// CoordinatorJob keeps in server/coord_journal.h, how a resumed coordinator takes it back,
// and how it learns the peers of the processes that reconnect.
#include <glog/logging.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>

#include "common/run_files.h"
#include "server/coord_messages.h"
#include "server/coord_resume.h"
#include "server/coordinator_job.h"

namespace ps {
namespace {

using nlohmann::json;
constexpr int kJournalFormat = 1;

uint64_t UnixNanos() {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                   std::chrono::system_clock::now().time_since_epoch())
                                   .count());
}

// The job's settings as the journal compares them: --restore resolves to a set's
// directory, which a restarted coordinator resolves again.
json ConfigJson(const JobConfig& config) {
  json j = config.ToFlagMap();
  j.erase("restore");
  return j;
}

std::vector<Member> MembersFrom(const json& list) {
  std::vector<Member> out;
  if (!list.is_array()) return out;
  for (const json& m : list) out.push_back(MemberFromJson(m));
  return out;
}

json MembersJson(const std::vector<Member>& members) {
  json out = json::array();
  for (const Member& m : members) out.push_back(MemberToJson(m));
  return out;
}

}  // namespace

Status CoordinatorJob::OpenJournal() {
  incarnation_ = UnixNanos();
  const std::string path =
      options_.journal.empty() ? options_.run_dir + "/coordinator.db" : options_.journal;
  JournalOptions jopt;
  jopt.sync = options_.journal_sync;
  if (!options_.resume) {
    PS_ASSIGN_OR_RETURN(journal_, CoordJournal::Create(path, jopt));
    return Status::Ok();
  }
  PS_ASSIGN_OR_RETURN(journal_, CoordJournal::Open(path, jopt));
  PS_ASSIGN_OR_RETURN(CoordJournal::Parts parts, journal_->ReadAll());
  if (parts.empty()) {
    // The coordinator died before the job assembled: nothing to resume but registration.
    LOG(WARNING) << "coordinator journal " << path << " is empty: the job had not assembled; "
                 << "waiting for registrations";
    return Status::Ok();
  }
  try {
    return Resume(parts);
  } catch (const json::exception& e) {
    return Internal("coordinator journal " + path + " holds a part of the wrong shape (" +
                    e.what() + "): a damaged journal cannot resume the job");
  }
}

Status CoordinatorJob::Resume(const CoordJournal::Parts& parts) {
  const auto part = [&parts](const char* key) {
    auto it = parts.find(key);
    return it == parts.end() ? json::object() : it->second;
  };
  const json meta = part("meta");
  if (meta.value("format", 0) != kJournalFormat) {
    return FailedPrecondition("coordinator journal " + journal_->path() +
                              " holds no job this coordinator can resume (format " +
                              std::to_string(meta.value("format", 0)) + ")");
  }
  if (meta.value("finished", false)) {
    return FailedPrecondition("the job journaled in " + journal_->path() +
                              " already ended (summary.json is written): nothing to resume");
  }
  if (meta.value("config", json()) != ConfigJson(config_)) {
    return FailedPrecondition("the job journaled in " + journal_->path() +
                              " has other settings than this coordinator's flags: resume it "
                              "with the same flags, or start a new job without --resume");
  }
  const auto now = CoordClock::now();
  const double unix_now = UnixSeconds();
  train_start_unix_ = meta.value("train_start_unix", unix_now);
  train_start_ = now - std::chrono::duration_cast<CoordClock::duration>(
                           std::chrono::duration<double>(unix_now - train_start_unix_));
  job_start_ = now - std::chrono::duration_cast<CoordClock::duration>(std::chrono::duration<double>(
                         unix_now - meta.value("job_start_unix", train_start_unix_)));
  const json members = part("members");
  members_.Restore(MembersFrom(members.value("servers", json::array())),
                   MembersFrom(members.value("workers", json::array())), now);
  const json leases = part("leases");
  PS_ASSIGN_OR_RETURN(LeaseTable::State table, LeaseStateFromJson(leases.value("table", json())));
  PS_RETURN_IF_ERROR(leases_.table().Restore(table));
  leases_.set_evaluations(leases.value("evaluations", std::vector<int>{}));
  for (const json& seen : leases.value("seen", json::array())) {
    LeaseSeen s;
    s.request_id = seen.value("request_id", uint64_t{0});
    if (seen.contains("answer")) s.answer = LeaseAnswerFromJson(seen["answer"]);
    lease_seen_[seen.value("worker", -1)] = std::move(s);
  }
  const json failures = part("failures");
  failures_.RestoreEarlier(failures.value("entries", json::array()),
                           failures.value("joins", json::array()));
  checkpoints_.RestoreState(part("checkpoints"));
  failover_.RestoreState(part("failover"));
  const json progress = part("progress");
  progress_.Assembled(members_.workers().size(), members_.servers().size());
  progress_.StartAtEpoch(progress.value("epoch", 1));
  barrier_released_ = progress.value("barrier_released", false);
  final_evaluator_ = progress.value("final_evaluator", -1);
  messages_during_training_ = progress.value("messages", uint64_t{0});
  for (const auto& [w, rid] : progress.value("reports", std::map<std::string, uint64_t>{})) {
    last_report_[std::stoi(w)] = rid;
  }
  if (barrier_released_) barrier_time_ = now;
  // The final evaluation came before the crash: the job only has to end.
  if (progress.contains("final_eval") && progress["final_eval"].is_object()) {
    progress_.OnEval(EvalLine::FromJson(progress["final_eval"]), Elapsed());
  }
  resumed_ = true;
  FailureEntry e;
  e.kind = FailureKind::kCoordinatorRestart;
  e.pid = static_cast<uint32_t>(getpid());
  e.time = Elapsed();
  e.unix_time = unix_now;
  e.clock = progress.value("clock", int64_t{-1});
  e.down_seconds = unix_now - meta.value("written_unix", unix_now);
  e.recovered = "resumed from " + journal_->path() + ": " +
                std::to_string(members_.servers().size()) + " servers and " +
                std::to_string(members_.workers().size()) + " workers re-attach; " +
                std::to_string(table.outstanding.size()) + " leases stay with their workers";
  LOG(WARNING) << "coordinator restarted: " << e.ToJson().dump();
  std::printf("coordinator restarted: resuming the job at %.1fs (clock %lld)\n", Elapsed(),
              static_cast<long long>(*e.clock));
  std::fflush(stdout);
  progress_.CountFailure();
  failures_.Add(std::move(e));
  return Persist();
}

CoordJournal::Parts CoordinatorJob::Snapshot() const {
  CoordJournal::Parts parts;
  parts["meta"] = {
      {"format", kJournalFormat},
      {"config", ConfigJson(config_)},
      {"job_start_unix",
       train_start_unix_ - std::chrono::duration<double>(train_start_ - job_start_).count()},
      {"train_start_unix", train_start_unix_},
      {"finished", finished_}};
  parts["members"] = {{"servers", MembersJson(members_.servers())},
                      {"workers", MembersJson(members_.workers())}};
  json seen = json::array();
  for (const auto& [w, s] : lease_seen_) {
    json j = {{"worker", w}, {"request_id", s.request_id}};
    if (s.answer) j["answer"] = LeaseAnswerToJson(*s.answer);
    seen.push_back(std::move(j));
  }
  parts["leases"] = {{"table", LeaseStateToJson(leases_.table().Snapshot())},
                     {"evaluations", leases_.evaluations()},
                     {"seen", std::move(seen)}};
  parts["failures"] = {{"entries", failures_.ToJson()}, {"joins", failures_.JoinsJson()}};
  parts["checkpoints"] = checkpoints_.StateJson();
  parts["failover"] = failover_.StateJson();
  json reports = json::object();
  for (const auto& [w, rid] : last_report_) reports[std::to_string(w)] = rid;
  parts["progress"] = {
      {"epoch", progress_.epoch()},
      {"clock", JobClock()},
      {"barrier_released", barrier_released_},
      {"final_evaluator", final_evaluator_},
      {"messages", messages_during_training_},
      {"final_eval", progress_.final_eval() ? progress_.final_eval()->ToJson() : json(nullptr)},
      {"reports", std::move(reports)}};
  return parts;
}

Status CoordinatorJob::Persist() {
  if (journal_ == nullptr || !members_.assembled()) return Status::Ok();
  CoordJournal::Parts parts = Snapshot();
  CoordJournal::Parts changed;
  for (auto& [key, value] : parts) {
    auto it = journaled_.find(key);
    if (it == journaled_.end() || it->second != value) changed[key] = value;
  }
  if (changed.empty()) return Status::Ok();
  // When the last write was made: a restarted coordinator says how long the job was
  // without one (an upper bound of the time from the crash).
  changed["meta"] = parts["meta"];
  changed["meta"]["written_unix"] = UnixSeconds();
  PS_RETURN_IF_ERROR(journal_->Write(changed));
  for (auto& [key, value] : changed) journaled_[key] = std::move(value);
  journaled_["meta"] = parts["meta"];
  return Status::Ok();
}

bool CoordinatorJob::Reattach(const std::string& peer, wire::Header::Reader header) {
  const auto which = header.getBody().which();
  const int id = header.getSenderId();
  if (id < 0) return false;
  bool server = false;
  if (which == wire::Header::Body::REPORT) {
    json report = json::parse(header.getBody().getReport().getJson().cStr(), nullptr, false);
    server = report.is_object() && report.contains("kind") && report["kind"] == "server";
  } else if (which != wire::Header::Body::LEASE && which != wire::Header::Body::DONE &&
             which != wire::Header::Body::HEARTBEAT) {
    return false;
  }
  std::vector<Member>& group = server ? members_.servers() : members_.workers();
  if (static_cast<size_t>(id) >= group.size()) return false;
  Member& m = group[static_cast<size_t>(id)];
  LOG(INFO) << (server ? "server " : "worker ") << id << " re-attached (pid " << m.pid << ")";
  m.peer = peer;
  return true;
}

Result<bool> CoordinatorJob::OnLeaseResent(const std::string& peer, int w, uint64_t rid,
                                           wire::LeaseRequest::Reader req) {
  auto it = lease_seen_.find(w);
  if (it == lease_seen_.end() || it->second.request_id != rid) return false;
  if (it->second.answer) {
    LeaseAnswer a = *it->second.answer;
    a.peer = peer;
    LOG(INFO) << "worker " << w << " asked again for lease request " << rid << ": the same answer";
    capnp::MallocMessageBuilder b;
    SetLeaseReply(NewHeader(b, rid, -1).getBody().initLeaseReply(), a);
    Frames f;
    f.push_back(EncodeFrame(b));
    PS_RETURN_IF_ERROR(socket_->Send(peer, std::move(f)));
    return true;
  }
  // Held when the coordinator died (or a copy is held here): held again, once.
  leases_.DropHeld(w, rid);
  leases_.Hold({peer, rid, w, req.getWait()});
  PS_RETURN_IF_ERROR(AnswerHeldLeases());
  return true;
}

int64_t CoordinatorJob::JobClock() const {
  if (!members_.assembled()) return -1;
  return progress_.FastestLiveClock(members_);
}

}  // namespace ps
