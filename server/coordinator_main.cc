// ps_coordinator: reads the job flagfile, assembles the job, reports progress and writes
// the run summary. Job settings are flags here (use --flagfile=configs/NAME.flags); servers
// and workers receive them from the coordinator.
#include <gflags/gflags.h>
#include <glog/logging.h>

#include <csignal>
#include <ctime>

#include "common/data_check.h"
#include "common/job_config.h"
#include "common/metrics.h"
#include "common/security_flags.h"
#include "server/coordinator.h"

namespace {
const ps::JobConfig kDefaults;
}

// ---- job settings (see common/job_config.h for what each does) ----
DEFINE_string(model, kDefaults.model, "mlp | sparse_lr | network | wide_deep | none");
DEFINE_string(train_data, kDefaults.train_data,
              "sparse_lr: LIBSVM training file; wide_deep: CTR file");
DEFINE_string(test_data, kDefaults.test_data, "sparse_lr: LIBSVM test file; wide_deep: CTR file");
DEFINE_bool(hash_features, kDefaults.hash_features, "sparse_lr: hash feature ids (xxHash)");
DEFINE_string(mlp_layers, kDefaults.mlp_layers, "MLP layer widths, input first");
DEFINE_string(
    network, kDefaults.network,
    "--model=network or wide_deep: layers input:CxHxW,...,softmax_ce (common/network_config.h)");
DEFINE_string(tables, kDefaults.tables,
              "extra tables: NAME:ROWS:WIDTH[:INIT[:SCALE]],... (ROWS a count or 'sparse')");
DEFINE_int32(num_servers, kDefaults.num_servers, "servers in the job");
DEFINE_int32(num_workers, kDefaults.num_workers, "workers in the job");
DEFINE_int32(replicas, kDefaults.replicas,
             "copies of each shard: 1, or 2 (a backup on the next server; see README)");
DEFINE_int32(staleness, kDefaults.staleness,
             "clocks a worker may run ahead of the slowest: 0 BSP, s>0 SSP, -1 ASP");
DEFINE_string(table_staleness, kDefaults.table_staleness, "per-table bounds: NAME:S,...");
DEFINE_int32(max_grad_staleness, kDefaults.max_grad_staleness,
             "ASP: reject gradients staler than this many versions (-1: apply all)");
DEFINE_double(staleness_wait_seconds, kDefaults.staleness_wait_seconds,
              "how long a server holds a blocked pull before failing it");
DEFINE_int32(epochs, kDefaults.epochs, "passes over the training data");
DEFINE_string(batch_size, std::to_string(kDefaults.batch_size),
              "examples per worker step, or 'auto': each worker's batch follows its throughput");
DEFINE_int32(
    global_batch_size, kDefaults.global_batch_size,
    "when > 0, the job's batch per clock: each worker's batch is this / --num_workers, and "
    "the lr schedule counts global batches");
DEFINE_int32(chunk_examples, kDefaults.chunk_examples, "examples per data lease");
DEFINE_string(optimizer, kDefaults.optimizer, "sgd | momentum | nesterov | adagrad | adam | adamw");
DEFINE_double(momentum, kDefaults.momentum, "momentum, nesterov: in [0, 1)");
DEFINE_double(beta1, kDefaults.beta1, "adam, adamw: first-moment decay in [0, 1)");
DEFINE_double(beta2, kDefaults.beta2, "adam, adamw: second-moment decay in [0, 1)");
DEFINE_double(epsilon, kDefaults.epsilon, "adagrad, adam, adamw: denominator guard");
DEFINE_double(weight_decay, kDefaults.weight_decay, "L2 penalty (adamw: decoupled weight decay)");
DEFINE_double(clip_grad_norm, kDefaults.clip_grad_norm,
              "clip each row's gradient to this L2 norm (0: off)");
DEFINE_double(base_lr, kDefaults.base_lr, "learning rate");
DEFINE_string(lr_policy, kDefaults.lr_policy,
              "fixed | step | multistep | exp | inv | poly | cosine (Caffe's policies + cosine)");
DEFINE_double(gamma, kDefaults.gamma, "step, multistep, exp, inv");
DEFINE_int64(stepsize, kDefaults.stepsize, "step: iterations between decays");
DEFINE_string(stepvalue, kDefaults.stepvalue, "multistep: increasing iterations, comma-separated");
DEFINE_double(power, kDefaults.power, "inv, poly");
DEFINE_int64(max_iter, kDefaults.max_iter,
             "poly, cosine: where the schedule ends (0: with the job, from the data set's size)");
DEFINE_int64(warmup_iters, kDefaults.warmup_iters, "linear warmup iterations (0: none)");
DEFINE_string(staleness_lr, kDefaults.staleness_lr,
              "none | inverse | sqrt: weight each gradient by 1 / (1 + its staleness) (or the "
              "root)");
DEFINE_double(pull_lookahead, kDefaults.pull_lookahead,
              "pulls of momentum/nesterov tables return where the velocity carries the rows "
              "over this many times the mean staleness in updates (0: the stored values)");
DEFINE_int32(local_steps, kDefaults.local_steps,
             "mlp, network: steps a worker takes on its own copy (SGD at the servers' rate) "
             "before it pushes their summed gradient as one update; clocks count pushes");
DEFINE_int32(softsync, kDefaults.softsync,
             "n-softsync: servers apply the mean of this many pushes as one update (1: each "
             "push at once; 0: the number of workers)");
DEFINE_double(divergence_loss_ratio, kDefaults.divergence_loss_ratio,
              "stop the job as diverged when a mean training loss exceeds this many times the "
              "first reported one (0: only non-finite losses and gradients)");
DEFINE_uint64(seed, kDefaults.seed, "seed of initializers and data order");
DEFINE_string(data_dir, kDefaults.data_dir, "directory of the IDX data files");
DEFINE_double(report_every_seconds, kDefaults.report_every_seconds,
              "seconds between a worker's training reports");
DEFINE_int32(group_size, kDefaults.group_size,
             "workers per all-reduce group (1: none); the leader alone pushes the group's sum");
DEFINE_double(group_timeout_seconds, kDefaults.group_timeout_seconds,
              "how long a group member waits for another before the group dissolves");
DEFINE_string(memory_budget, std::to_string(kDefaults.memory_budget),
              "bytes each server's rows may take in memory (512MB, 4GB; 0: no limit); colder "
              "sparse rows spill to RocksDB");
DEFINE_string(checkpoint_every, std::to_string(kDefaults.checkpoint_every),
              "servers checkpoint every N clocks (training steps) of the slowest worker (500), or "
              "every N seconds (30s: the coordinator picks each set's clock); 0: never; also "
              "on SIGTERM");
DEFINE_string(checkpoint_dir, kDefaults.checkpoint_dir,
              "where servers write checkpoints (empty: none)");
DEFINE_string(
    restore, kDefaults.restore,
    "resume from a checkpoint: latest (the latest set recorded in "
    "--checkpoint_dir/checkpoints.json) or a clock-C directory; weights, optimizer state, "
    "clock, epoch and LR schedule continue from there");
DEFINE_double(heartbeat_timeout, kDefaults.heartbeat_timeout,
              "seconds without a heartbeat after which a worker is declared dead");
DEFINE_double(coordinator_restart_timeout, kDefaults.coordinator_restart_timeout,
              "seconds servers and workers wait for a dead coordinator to be restarted "
              "(--resume) before they stop (after 3 heartbeat timeouts of silence)");
DEFINE_bool(resume, false,
            "resume the job journaled in --run_dir (DIR/coordinator.db): a coordinator "
            "restarted after it died, at the same --listen endpoint, with the same flags");

// ---- this process ----
DEFINE_string(listen, "tcp://127.0.0.1:7000", "where to listen; port * picks a free one");
DEFINE_string(run_dir, "", "run directory (default runs/<time>)");
DEFINE_string(endpoint_file, "", "write the bound endpoint to this file once listening");
DEFINE_int32(stop_checkpoint_timeout_ms, 30000,
             "on SIGTERM with a --checkpoint_dir: train on for up to this long until a last "
             "checkpoint set is written and recorded, then stop (0: stop at once)");
DEFINE_int32(register_timeout_ms, 120000, "how long to wait for every process to register");
DEFINE_double(progress_every_seconds, 5, "seconds between progress lines (0: per epoch only)");
DEFINE_int32(metrics_port, 0,
             "serve Prometheus metrics at http://METRICS_HOST:PORT/metrics (0: off)");
DEFINE_string(metrics_host, "127.0.0.1", "the address the metrics endpoint binds to");

namespace {
std::atomic<bool> g_stop{false};
void OnSignal(int) { g_stop.store(true); }

std::string DefaultRunDir() {
  char buf[64];
  std::time_t t = std::time(nullptr);
  std::strftime(buf, sizeof(buf), "runs/%Y%m%d-%H%M%S", std::localtime(&t));
  return buf;
}
}  // namespace

int main(int argc, char** argv) {
  gflags::SetUsageMessage(
      "ps_coordinator --flagfile=configs/fashion_mnist_mlp.flags [--run_dir=DIR]");
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  FLAGS_logtostderr = true;
  google::InitGoogleLogging(argv[0]);

  if (ps::Status f = ps::CheckFlagfiles(); !f.ok()) {
    LOG(ERROR) << "bad flagfile: " << f.message();
    return 2;
  }
  // Only the settings the command line or a flagfile gave: the others keep JobConfig's
  // defaults (the flags' own), and FromFlagMap can tell a --batch_size that was asked for
  // from one that was not (--global_batch_size).
  std::map<std::string, std::string> flags;
  for (const std::string& name : ps::JobConfig::FlagNames()) {
    gflags::CommandLineFlagInfo info;
    if (!gflags::GetCommandLineFlagInfo(name.c_str(), &info)) {
      LOG(ERROR) << "internal: job setting --" << name << " has no flag";
      return 2;
    }
    if (!info.is_default) flags[name] = info.current_value;
  }
  ps::Result<ps::JobConfig> config = ps::JobConfig::FromFlagMap(flags);
  if (!config.ok()) {
    LOG(ERROR) << "bad job config: " << config.status().message();
    return 2;
  }
  if (ps::Status data = ps::CheckJobData(config.value()); !data.ok()) {
    LOG(ERROR) << "job data: " << data.message();
    return 2;
  }
  if (ps::Status end = ps::ResolveWholeJobMaxIter(&config.value()); !end.ok()) {
    LOG(ERROR) << "bad job config: " << end.message();
    return 2;
  }
  std::signal(SIGTERM, OnSignal);
  std::signal(SIGINT, OnSignal);

  ps::CoordinatorOptions options;
  options.listen = FLAGS_listen;
  options.run_dir = FLAGS_run_dir.empty() ? DefaultRunDir() : FLAGS_run_dir;
  options.endpoint_file = FLAGS_endpoint_file;
  options.register_timeout = std::chrono::milliseconds(FLAGS_register_timeout_ms);
  options.progress_every_seconds = FLAGS_progress_every_seconds;
  options.stop_checkpoint_timeout = std::chrono::milliseconds(FLAGS_stop_checkpoint_timeout_ms);
  options.resume = FLAGS_resume;
  auto metrics = ps::StartProcessMetrics("coordinator", -1, FLAGS_metrics_host, FLAGS_metrics_port);
  if (!metrics.ok()) {
    LOG(ERROR) << "ps_coordinator: " << metrics.status().ToString();
    return 2;
  }
  options.metrics = metrics->get();
  ps::TransportOptions topt;
  if (ps::Status sec =
          ps::InstallSecurityFromFlags(ps::SecurityRole::kCoordinator, {FLAGS_listen}, &topt);
      !sec.ok()) {
    LOG(ERROR) << "ps_coordinator: " << sec.message();
    return 2;
  }
  ps::Transport transport(topt);
  ps::Status s = ps::RunCoordinator(config.value(), options, &transport, g_stop);
  if (!s.ok()) {
    LOG(ERROR) << "ps_coordinator: " << s.ToString();
    return 1;
  }
  return 0;
}
