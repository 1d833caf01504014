// The run summary (summary.json, common/run_summary.h) as a function of what the job
// knows at its end (BuildSummary: no I/O, no clock; the coordinator gathers the inputs),
// and its writer.
//
// Thread model: free functions; BuildSummary is pure.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "common/job_config.h"
#include "common/run_summary.h"
#include "common/status.h"
#include "server/coord_membership.h"

namespace ps {

struct SummaryInputs {
  Status outcome;                         // the job's
  std::optional<Divergence> divergence;   // set: the job stopped because the model diverged
  const JobConfig* config = nullptr;      // required
  double wall_seconds = 0;                // since the coordinator started
  double train_seconds = 0;               // since the job was assembled (0: it never was)
  double train_start_time = 0;            // Unix seconds at assembly
  double cpu_seconds = 0;                 // the coordinator's CPU time
  uint64_t messages_during_training = 0;  // requests from workers while they trained
  std::optional<EvalLine> eval;           // the final evaluation, else the last one
  // Checkpoints: where a restored job started, the sets recorded and the latest's clock.
  std::optional<RestoredFrom> restored;
  uint64_t checkpoints_recorded = 0;
  int64_t recorded_clock = 0;
  std::vector<Member> workers;  // with their results (totals: as the worker sent them)
  std::vector<ServerSummary> servers;
  std::vector<uint64_t> examples_per_epoch;  // of completed chunks
  nlohmann::json failures = nlohmann::json::array();
  nlohmann::json joins = nlohmann::json::array();
  // Pushes restarted servers rolled back; estimated: some server was restarted.
  uint64_t pushes_rolled_back = 0;
  bool rollback_estimated = false;
};

RunSummary BuildSummary(const SummaryInputs& in);

// Writes `summary` to RUN_DIR/summary.json and prints its line on stdout.
Status WriteRunSummary(const RunSummary& summary, const std::string& run_dir);

// This process's CPU time so far, user and system, in seconds.
double ProcessCpuSeconds();

// The index at which `histogram`'s cumulative count reaches 99% of its total.
uint64_t P99Index(const std::vector<uint64_t>& histogram);

}  // namespace ps
