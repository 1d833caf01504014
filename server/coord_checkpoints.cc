#include "server/coord_checkpoints.h"

#include <glog/logging.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "common/lr_policy.h"
#include "common/run_files.h"
#include "server/checkpoint.h"

namespace ps {

using nlohmann::json;

namespace {

// The entry of `record` for the set directory `set` (null when it has none).
json RecordOf(const json& record, const std::string& set) {
  const std::filesystem::path want = std::filesystem::weakly_canonical(set);
  json found;
  for (const json& e : record["sets"]) {
    if (std::filesystem::weakly_canonical(e["set"].get<std::string>()) == want) found = e;
  }
  return found;
}

}  // namespace

// The set to restore: `latest` is the latest recorded set whose files are still whole (an
// unrecorded set, being written or written after the coordinator died, is never used while
// there is one), else the latest complete set on disk; otherwise the named directory.
// *entry: its record (null without one).
Status CheckpointBook::FindRestoreEntry(const json& record, std::string* set, json* entry) const {
  if (config_.restore != "latest") {
    *set = config_.restore;
    *entry = RecordOf(record, *set);
    if (entry->is_null()) {
      // A set of another directory (another run's --checkpoint_dir, or a copy of one): its
      // record lies beside it. A record that cannot be read there is no record.
      std::string beside = std::filesystem::path(*set).parent_path().string();
      if (beside.empty()) beside = ".";
      if (Result<json> other = ReadRecordIn(beside); other.ok()) *entry = RecordOf(*other, *set);
    }
    return ValidateCheckpointSet(*set, config_.num_servers);
  }
  if (config_.checkpoint_dir.empty()) {
    return InvalidArgument("--restore=latest needs --checkpoint_dir");
  }
  for (auto it = record["sets"].rbegin(); it != record["sets"].rend(); ++it) {
    Status whole = ValidateCheckpointSet((*it)["set"].get<std::string>(), config_.num_servers);
    if (whole.ok()) {
      *entry = *it;
      break;
    }
    LOG(WARNING) << "recorded checkpoint " << (*it)["set"]
                 << " is damaged, skipped: " << whole.ToString();
  }
  if (entry->is_null()) {
    PS_ASSIGN_OR_RETURN(*set,
                        LatestCompleteCheckpoint(config_.checkpoint_dir, config_.num_servers));
  } else {
    *set = (*entry)["set"].get<std::string>();
  }
  return Status::Ok();
}

Status CheckpointBook::ResolveRestore() {
  if (config_.restore.empty()) return Status::Ok();
  json record = {{"sets", json::array()}};
  if (!config_.checkpoint_dir.empty()) {
    PS_ASSIGN_OR_RETURN(record, ReadRecord());
  }
  std::string set;
  json entry;
  PS_RETURN_IF_ERROR(FindRestoreEntry(record, &set, &entry));
  if (entry.is_object()) {
    start_clock_ = entry["clock"].get<int64_t>();
    start_epoch_ = entry["epoch"].get<int>();
  } else {
    // No record of the workers' position: the set's clock (from its name), epoch 1.
    const std::string name = std::filesystem::path(set).filename().string();
    if (name.rfind("clock-", 0) != 0) {
      return InvalidArgument("--restore=" + set + " is not a clock-<C> checkpoint directory");
    }
    start_clock_ = std::strtoll(name.c_str() + 6, nullptr, 10);
    start_epoch_ = 1;
    LOG(WARNING) << "no record of checkpoint " << set
                 << " in checkpoints.json: training restarts at epoch 1 from clock "
                 << start_clock_;
  }
  config_.restore = set;
  recorded_clock_ = start_clock_;
  job_sets_.push_back({set, start_clock_});
  restored_ = RestoredFrom{set, start_clock_, start_epoch_, entry.is_object()};
  LOG(INFO) << "restoring " << set << ": workers resume at clock " << start_clock_ << ", epoch "
            << start_epoch_;
  std::printf("restoring %s: clock %lld, epoch %d of %d\n", set.c_str(),
              static_cast<long long>(start_clock_), start_epoch_, config_.epochs);
  return Status::Ok();
}

Result<json> CheckpointBook::ReadRecordIn(const std::string& dir) {
  const std::string path = CheckpointRecordFile(dir);
  json record = {{"sets", json::array()}};
  std::ifstream in(path);
  if (!in) return record;
  json j = json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains("sets") || !j["sets"].is_array()) {
    return InvalidArgument(path + " is not a checkpoint record");
  }
  for (const json& e : j["sets"]) {
    if (!e.is_object() || !e.contains("set") || !e["set"].is_string() || !e.contains("clock") ||
        !e["clock"].is_number_integer() || !e.contains("epoch") ||
        !e["epoch"].is_number_integer()) {
      return InvalidArgument(path + " has a malformed entry: " + e.dump());
    }
  }
  return j;
}

std::optional<JobSet> CheckpointBook::LatestJobSet() const {
  for (auto it = job_sets_.rbegin(); it != job_sets_.rend(); ++it) {
    Status whole = ValidateCheckpointSet(it->set, config_.num_servers);
    if (whole.ok()) return *it;
    LOG(WARNING) << "recorded checkpoint \"" << it->set
                 << "\" is damaged, skipped: " << whole.ToString();
  }
  return std::nullopt;
}

void CheckpointBook::OnLeaseRequest(int w, int64_t clock) {
  if (w < 0) return;
  if (static_cast<size_t>(w) >= lease_clock_.size()) lease_clock_.resize(w + 1, 0);
  lease_clock_[static_cast<size_t>(w)] = std::max(lease_clock_[static_cast<size_t>(w)], clock);
}

void CheckpointBook::OnChunkCompleted(int epoch, int64_t clock) {
  int64_t& last = epoch_last_clock_[epoch];
  last = std::max(last, clock);
}

void CheckpointBook::OnEpochCompleted(int epoch) {
  // Every chunk of the epoch was trained by this clock of its workers.
  epoch_done_clock_[epoch] = epoch_last_clock_[epoch];
}

void CheckpointBook::OnServerCheckpoint(size_t s, size_t num_servers, int64_t clock,
                                        const std::vector<bool>& training) {
  if (config_.checkpoint_dir.empty() || clock <= recorded_clock_) return;
  committed_.resize(num_servers);
  if (s >= committed_.size()) return;
  committed_[s].insert(clock);
  while (committed_[s].size() > 64) committed_[s].erase(committed_[s].begin());
  for (const std::set<int64_t>& c : committed_) {
    if (c.count(clock) == 0) return;
  }
  for (std::set<int64_t>& c : committed_) c.erase(c.begin(), c.upper_bound(clock));
  whole_clock_ = std::max(whole_clock_, clock);
  RecordWholeSet(training);
}

// The first epoch not wholly trained by `clock`. The part of it trained before the
// checkpoint is trained again after a restore (chunks are not tied to clocks); at an epoch
// boundary nothing is.
int CheckpointBook::ResumeEpoch(int64_t clock) const {
  int epoch = start_epoch_;
  while (epoch <= config_.epochs) {
    auto it = epoch_done_clock_.find(epoch);
    if (it == epoch_done_clock_.end() || it->second > clock) break;
    ++epoch;
  }
  return epoch;
}

void CheckpointBook::RecordWholeSet(const std::vector<bool>& training) {
  const int64_t clock = whole_clock_;
  if (clock <= recorded_clock_) return;
  for (size_t w = 0; w < lease_clock_.size() && w < training.size(); ++w) {
    if (training[w] && lease_clock_[w] < clock) return;
  }
  const int epoch = ResumeEpoch(clock);
  const int64_t iteration = config_.ScheduleIteration(clock * config_.num_workers);
  json entry = {{"clock", clock},
                {"set", CheckpointSetDir(config_.checkpoint_dir, clock)},
                {"epoch", epoch},
                {"epochs_completed", epoch - 1},
                {"resume", "at the start of epoch " + std::to_string(epoch)},
                {"lr_iteration", iteration},
                {"num_servers", config_.num_servers},
                {"num_workers", config_.num_workers},
                {"time", UnixSeconds()}};
  if (Result<LrPolicy> lr = LrPolicy::Create(config_); lr.ok()) {
    entry["learning_rate"] = lr->ScheduleRate(iteration);
  }
  Result<json> record = ReadRecord();
  if (!record.ok()) {
    LOG(ERROR) << "checkpoint at clock " << clock
               << " not recorded: " << record.status().ToString();
    return;
  }
  (*record)["sets"].push_back(entry);
  // The job's settings, for ps_export (server/model_export.h) to load the sets.
  (*record)["config"] = config_.ToFlagMap();
  Status w = WriteJsonFile(CheckpointRecordFile(config_.checkpoint_dir), *record);
  if (!w.ok()) {
    LOG(ERROR) << "checkpoint at clock " << clock << " not recorded: " << w.ToString();
    return;
  }
  recorded_clock_ = clock;
  ++checkpoints_recorded_;
  job_sets_.push_back({entry["set"].get<std::string>(), clock});
  LOG(INFO) << "checkpoint set at clock " << clock << " complete (resumes at epoch " << epoch
            << ")";
}

// The named clock must lie ahead of every server's slowest live clock when the answer
// reaches it (up to a report interval later, and then the tick that completes it): the
// fastest server's clock plus this many seconds at the fastest clock rate seen. Two report
// intervals and half a second for the messages on their way, at most 3 s: a lead longer
// than a short job (or than what a stop may wait) names a set the job never reaches.
namespace {
double CheckpointLeadSeconds(const JobConfig& config) {
  return std::min(3.0, 0.5 + 2 * config.report_every_seconds);
}
}  // namespace

void CheckpointBook::MaybeNameClock(double now, const std::vector<ServerLive>& servers) {
  if (config_.checkpoint_dir.empty()) return;
  if (stop_checkpoint_deadline_) {
    // Stopping: only the stop set counts; a refused one is named again at once.
    DropAbandonedSet(now, servers);
    if (abandoned_checkpoint_at_ == stop_checkpoint_at_) {
      NameClock(now, servers);
      stop_checkpoint_at_ = checkpoint_at_;
    }
    return;
  }
  if (config_.checkpoint_every_seconds <= 0) return;
  if (next_checkpoint_time_ < 0) {
    next_checkpoint_time_ = now + config_.checkpoint_every_seconds;
    return;
  }
  DropAbandonedSet(now, servers);
  if (now < next_checkpoint_time_) return;
  // One named clock at a time: a server holds one, and a new name before every server
  // passed the old one would leave the old set half-written.
  for (const ServerLive& live : servers) {
    if (live.clock < checkpoint_at_) return;
  }
  NameClock(now, servers);
}

void CheckpointBook::NameClock(double now, const std::vector<ServerLive>& servers) {
  int64_t fastest = -1;
  double rate = 0;
  for (const ServerLive& live : servers) {
    fastest = std::max(fastest, live.clock);
    rate = std::max(rate, live.clocks_per_sec);
  }
  if (fastest < 0) return;  // nothing before the first server report
  const int64_t at =
      std::max({fastest + 2 + static_cast<int64_t>(rate * CheckpointLeadSeconds(config_)),
                recorded_clock_ + 1, checkpoint_at_ + 1});
  checkpoint_at_ = at;
  next_checkpoint_time_ = now + config_.checkpoint_every_seconds;
  LOG(INFO) << "next checkpoint set at clock " << at << " (servers at up to " << fastest << ", "
            << rate << " clocks/s)";
}

// A named set that some server refused never completes. Once every server is past the
// clock, the half-written directory is removed (so that every set directory on disk is
// whole or still being written), and the next clock is named at once.
void CheckpointBook::DropAbandonedSet(double now, const std::vector<ServerLive>& servers) {
  if (checkpoint_at_ <= 0 || checkpoint_at_ <= recorded_clock_ ||
      checkpoint_at_ == abandoned_checkpoint_at_) {
    return;
  }
  int refused = -1;
  for (size_t s = 0; s < servers.size(); ++s) {
    if (servers[s].clock < checkpoint_at_) return;  // may still write it
    if (servers[s].checkpoint_clock < checkpoint_at_) refused = static_cast<int>(s);
  }
  if (refused < 0) return;  // whole: RecordWholeSet records it
  abandoned_checkpoint_at_ = checkpoint_at_;
  const std::string set = CheckpointSetDir(config_.checkpoint_dir, checkpoint_at_);
  std::error_code ec;
  std::filesystem::remove_all(set, ec);
  LOG(WARNING) << "checkpoint set at clock " << checkpoint_at_ << " abandoned: server " << refused
               << " passed the clock before it was named there; removed " << set
               << (ec ? " (failed: " + ec.message() + ")" : std::string());
  next_checkpoint_time_ = now;
}

Status CheckpointBook::OnStop(CoordClock::time_point now, double elapsed, bool training,
                              std::chrono::milliseconds timeout,
                              const std::vector<ServerLive>& servers) {
  if (config_.checkpoint_dir.empty() || timeout.count() <= 0 || !training) {
    return Aborted("coordinator stopped by signal");
  }
  if (!stop_checkpoint_deadline_) {
    stop_checkpoint_deadline_ = now + timeout;
    // A set already named and not yet passed by every server is the stop set; otherwise
    // name one now, as --checkpoint_every=<N>s would.
    bool pending = checkpoint_at_ > recorded_clock_;
    for (const ServerLive& live : servers) pending &= live.clock < checkpoint_at_;
    if (!pending) NameClock(elapsed, servers);
    stop_checkpoint_at_ = checkpoint_at_;
    std::printf("stopping: training on until the checkpoint set at clock %lld is written\n",
                static_cast<long long>(stop_checkpoint_at_));
    std::fflush(stdout);
  }
  if (stop_checkpoint_at_ > 0 && recorded_clock_ >= stop_checkpoint_at_) {
    std::printf("stopped at the checkpoint set at clock %lld: --restore=latest resumes there\n",
                static_cast<long long>(recorded_clock_));
    std::fflush(stdout);
    return Aborted("coordinator stopped by signal after the checkpoint set at clock " +
                   std::to_string(recorded_clock_));
  }
  if (now > *stop_checkpoint_deadline_) {
    return Aborted("coordinator stopped by signal; the checkpoint set at clock " +
                   std::to_string(stop_checkpoint_at_) + " was not complete within " +
                   std::to_string(timeout.count()) + " ms (the latest recorded set is at clock " +
                   std::to_string(recorded_clock_) + ")");
  }
  return Status::Ok();
}

namespace {

template <typename T>
T Get(const nlohmann::json& j, const char* key, T fallback) {
  if (!j.is_object() || !j.contains(key)) return fallback;
  try {
    return j[key].get<T>();
  } catch (const nlohmann::json::exception&) {
    return fallback;
  }
}

nlohmann::json ClockMap(const std::map<int, int64_t>& m) {
  nlohmann::json j = nlohmann::json::array();
  for (const auto& [epoch, clock] : m) j.push_back({epoch, clock});
  return j;
}

std::map<int, int64_t> ClockMapFrom(const nlohmann::json& j) {
  std::map<int, int64_t> m;
  try {
    for (const auto& [epoch, clock] : j.get<std::vector<std::pair<int, int64_t>>>()) {
      m[epoch] = clock;
    }
  } catch (const nlohmann::json::exception&) {
    m.clear();
  }
  return m;
}

}  // namespace

nlohmann::json CheckpointBook::StateJson() const {
  nlohmann::json sets = nlohmann::json::array();
  for (const JobSet& s : job_sets_) sets.push_back({{"set", s.set}, {"clock", s.clock}});
  return {{"job_sets", sets},
          {"recorded_clock", recorded_clock_},
          {"checkpoints_recorded", checkpoints_recorded_},
          {"whole_clock", whole_clock_},
          {"lease_clock", lease_clock_},
          {"committed", committed_},
          {"epoch_last_clock", ClockMap(epoch_last_clock_)},
          {"epoch_done_clock", ClockMap(epoch_done_clock_)},
          {"checkpoint_at", checkpoint_at_},
          {"abandoned_checkpoint_at", abandoned_checkpoint_at_},
          {"next_checkpoint_time", next_checkpoint_time_}};
}

void CheckpointBook::RestoreState(const nlohmann::json& state) {
  if (!state.is_object()) return;
  job_sets_.clear();
  if (state.contains("job_sets") && state["job_sets"].is_array()) {
    for (const nlohmann::json& s : state["job_sets"]) {
      job_sets_.push_back(JobSet{Get<std::string>(s, "set", ""), Get<int64_t>(s, "clock", 0)});
    }
  }
  recorded_clock_ = Get<int64_t>(state, "recorded_clock", 0);
  checkpoints_recorded_ = Get<uint64_t>(state, "checkpoints_recorded", 0);
  whole_clock_ = Get<int64_t>(state, "whole_clock", 0);
  lease_clock_ = Get(state, "lease_clock", std::vector<int64_t>{});
  committed_ = Get(state, "committed", std::vector<std::set<int64_t>>{});
  epoch_last_clock_ = ClockMapFrom(state.value("epoch_last_clock", nlohmann::json::array()));
  epoch_done_clock_ = ClockMapFrom(state.value("epoch_done_clock", nlohmann::json::array()));
  checkpoint_at_ = Get<int64_t>(state, "checkpoint_at", -1);
  abandoned_checkpoint_at_ = Get<int64_t>(state, "abandoned_checkpoint_at", -1);
  next_checkpoint_time_ = Get<double>(state, "next_checkpoint_time", -1);
}

}  // namespace ps
