// ps_worker: trains the job's model on its share of the data, on a CPU or a GPU.
#include <gflags/gflags.h>
#include <glog/logging.h>
#include <pthread.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <string>
#include <thread>

#include "common/metrics.h"
#include "common/security_flags.h"
#include "kernels/blas_core.h"
#include "kernels/kernels.h"
#include "worker/standalone.h"
#include "worker/trainer.h"

DEFINE_string(coordinator, "", "the coordinator's endpoint, e.g. tcp://127.0.0.1:7000 (required)");
DEFINE_string(device, "cpu",
              "cpu | cuda | cuda:N | auto (a GPU when one is visible, else the CPU)");
DEFINE_int32(
    id, -1, "this process's id within its role, as a launcher numbers it (-1: registration order)");
DEFINE_int32(register_timeout_ms, 120000, "how long to wait for the job to assemble");
DEFINE_int32(request_timeout_ms, 600000,
             "how long a push or pull may take (more than the job's staleness_wait_seconds)");
DEFINE_double(slowdown, 1,
              "make this worker this many times slower (a straggler, for experiments)");
DEFINE_int32(
    batch_size, 0,
    "this worker's batch size (0: the job's, or the coordinator's with --batch_size=auto)");

DEFINE_int32(metrics_port, 0,
             "serve Prometheus metrics at http://METRICS_HOST:PORT/metrics (0: off)");
DEFINE_string(metrics_host, "127.0.0.1", "the address the metrics endpoint binds to");
DEFINE_string(group, "",
              "join the all-reduce group of this name (workers on one host, one kind of "
              "device); empty: the job's --group_size");
DEFINE_int32(drain_timeout_ms, 10000,
             "on SIGTERM: finish or return the current chunk, flush pushes and leave the job "
             "within this time (after it the process exits with status 3)");
DEFINE_int32(retry_ms, 10000,
             "resend a push or pull not answered within this time, same request id (0: never)");
DEFINE_bool(prefetch, false,
            "pull the next step's parameters while this step computes (never under BSP); the "
            "worker's own last update then arrives one step late (staleness >= 1)");
DEFINE_string(wire_dtype, "fp32",
              "how pushed gradients travel: fp32 | bf16 | fp16 (16-bit halves the bytes)");
DEFINE_string(pull_dtype, "fp32",
              "how pulled parameters travel: fp32 | bf16 | fp16 (rounded on the server, widened "
              "here: half the bytes; evaluations pull fp32)");
DEFINE_bool(standalone, false,
            "train the job's model in this process alone (no coordinator, no servers), with "
            "the job settings of --job_flagfile and --job_flags: the single-process baseline");
DEFINE_string(job_flagfile, "configs/fashion_mnist_mlp.flags",
              "--standalone: the job's flagfile (as ps_coordinator reads it)");
DEFINE_string(job_flags, "",
              "--standalone: job setting overrides, space-separated, e.g. \"--epochs=1\"");
DEFINE_string(run_dir, "", "--standalone: run directory (default runs/<time>-standalone)");

namespace {
std::atomic<bool> g_stop{false};

// --standalone stops at the next step on SIGTERM/SIGINT (it has no job to drain from).
void OnSignal(int) { g_stop.store(true); }

// Leaving the job (SIGTERM or SIGINT, or the job ending under this worker) is told to
// the drain thread through this pipe: a signal handler may only store and write().
int g_leave_pipe[2] = {-1, -1};
std::atomic<int> g_leave_reason{0};  // the signal; 0: the job ends (heartbeat thread)

void BeginLeaving(int reason) {
  g_stop.store(true);
  g_leave_reason.store(reason);
  const char byte = 1;
  [[maybe_unused]] ssize_t n = write(g_leave_pipe[1], &byte, 1);
}

void OnLeaveSignal(int sig) { BeginLeaving(sig); }

// Waits until the worker is to leave; it drains (pushes acknowledged, chunk returned) and,
// should draining take longer than --drain_timeout_ms, this ends the process.
//
// The signals run a handler instead of being taken by sigwait: OpenBLAS starts its
// threads before main() (a signal mask set here does not reach them), and a SIGTERM the
// kernel hands to one of those would, with no handler, end the process on the spot.
// Every thread started here blocks them but this one, so that a transport's blocking call
// is not interrupted (EINTR) where a BLAS thread is not there to take them.
void DrainThread(std::chrono::milliseconds drain_timeout) {
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_UNBLOCK, &signals, nullptr);
  char byte = 0;
  while (read(g_leave_pipe[0], &byte, 1) < 0 && errno == EINTR) {
  }
  const int reason = g_leave_reason.load();
  LOG(WARNING) << (reason != 0 ? "signal " + std::to_string(reason) : std::string("job ending"))
               << ": leaving the job within " << drain_timeout.count() << " ms";
  std::this_thread::sleep_for(drain_timeout);
  LOG(ERROR) << "draining took longer than --drain_timeout_ms=" << drain_timeout.count()
             << "; exiting now";
  std::_Exit(3);
}

std::string DefaultStandaloneRunDir() {
  char buf[64];
  std::time_t t = std::time(nullptr);
  std::strftime(buf, sizeof(buf), "runs/%Y%m%d-%H%M%S-standalone", std::localtime(&t));
  return buf;
}

// --standalone: the job's settings from --job_flagfile and --job_flags, trained here.
int StandaloneMain() {
  std::signal(SIGTERM, OnSignal);
  std::signal(SIGINT, OnSignal);
  ps::EnableFlushToZero();
  ps::Result<ps::JobConfig> config =
      ps::JobConfig::FromFlagfile(FLAGS_job_flagfile, FLAGS_job_flags);
  if (!config.ok()) {
    LOG(ERROR) << "ps_worker --standalone: bad job config: " << config.status().ToString();
    return 2;
  }
  ps::StandaloneOptions options;
  options.device = FLAGS_device;
  options.run_dir = FLAGS_run_dir.empty() ? DefaultStandaloneRunDir() : FLAGS_run_dir;
  ps::Status s = ps::RunStandalone(config.value(), options, g_stop, nullptr);
  if (!s.ok()) {
    LOG(ERROR) << "ps_worker --standalone: " << s.ToString();
    return 1;
  }
  return 0;
}

// The worker's options from its flags; `metrics` is borrowed (nullptr: none).
ps::WorkerOptions WorkerOptionsFromFlags(ps::Metrics* metrics) {
  ps::WorkerOptions options;
  options.coordinator = FLAGS_coordinator;
  options.device = FLAGS_device;
  options.register_timeout = std::chrono::milliseconds(FLAGS_register_timeout_ms);
  options.requested_id = FLAGS_id;
  options.request_timeout = std::chrono::milliseconds(FLAGS_request_timeout_ms);
  options.slowdown = FLAGS_slowdown;
  options.batch_size = FLAGS_batch_size;
  options.metrics = metrics;
  options.group = FLAGS_group;
  options.drain_timeout = std::chrono::milliseconds(FLAGS_drain_timeout_ms);
  // The job stops, or its coordinator died: leave as on a preemption notice.
  options.on_job_ending = [] { BeginLeaving(0); };
  options.retry_interval = std::chrono::milliseconds(FLAGS_retry_ms);
  options.prefetch = FLAGS_prefetch;
  options.wire_dtype = FLAGS_wire_dtype;
  options.pull_dtype = FLAGS_pull_dtype;
  return options;
}
}  // namespace

int main(int argc, char** argv) {
  // First: a restart must happen before any thread or file exists (kernels/blas_core.h).
  if (ps::Status s = ps::RestartWithBestBlasCore(argv); !s.ok()) {
    std::fprintf(stderr, "%s; going on with OpenBLAS's choice\n", s.ToString().c_str());
  }
  gflags::SetUsageMessage("ps_worker --coordinator=tcp://HOST:PORT [--device=cpu|cuda|cuda:N]");
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  FLAGS_logtostderr = true;
  google::InitGoogleLogging(argv[0]);
  if (FLAGS_standalone) return StandaloneMain();
  if (FLAGS_coordinator.empty()) {
    LOG(ERROR) << "--coordinator is required (e.g. --coordinator=tcp://127.0.0.1:7000)";
    return 2;
  }
  if (FLAGS_drain_timeout_ms <= 0 || FLAGS_retry_ms < 0) {
    LOG(ERROR) << "--drain_timeout_ms=" << FLAGS_drain_timeout_ms
               << " --retry_ms=" << FLAGS_retry_ms
               << ": expected a positive drain timeout and a retry interval >= 0";
    return 2;
  }
  if (pipe(g_leave_pipe) != 0) {
    PLOG(ERROR) << "ps_worker: pipe";
    return 2;
  }
  struct sigaction leave = {};
  leave.sa_handler = OnLeaveSignal;
  leave.sa_flags = SA_RESTART;
  sigemptyset(&leave.sa_mask);
  sigaction(SIGTERM, &leave, nullptr);
  sigaction(SIGINT, &leave, nullptr);
  // Before any other thread of ours starts, so that every one inherits the mask.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  std::thread(DrainThread, std::chrono::milliseconds(FLAGS_drain_timeout_ms)).detach();
  ps::EnableFlushToZero();
  auto metrics =
      ps::StartProcessMetrics("worker", FLAGS_id, FLAGS_metrics_host, FLAGS_metrics_port);
  if (!metrics.ok()) {
    LOG(ERROR) << "ps_worker: " << metrics.status().ToString();
    return 2;
  }
  const ps::WorkerOptions options = WorkerOptionsFromFlags(metrics->get());
  ps::TransportOptions topt;
  if (ps::Status sec =
          ps::InstallSecurityFromFlags(ps::SecurityRole::kWorker, {FLAGS_coordinator}, &topt);
      !sec.ok()) {
    LOG(ERROR) << "ps_worker: " << sec.message();
    return 2;
  }
  ps::Transport transport(topt);
  ps::Status s = ps::RunWorker(options, &transport, g_stop);
  if (!s.ok()) {
    LOG(ERROR) << "ps_worker: " << s.ToString();
    return 1;
  }
  return 0;
}
