// ps_worker: trains the job's model on its share of the data, on a CPU or a GPU.
#include <gflags/gflags.h>
#include <glog/logging.h>

#include <csignal>

#include "common/security_flags.h"
#include "kernels/kernels.h"
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

namespace {
std::atomic<bool> g_stop{false};
void OnSignal(int) { g_stop.store(true); }
}  // namespace

int main(int argc, char** argv) {
  gflags::SetUsageMessage("ps_worker --coordinator=tcp://HOST:PORT [--device=cpu|cuda|cuda:N]");
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  FLAGS_logtostderr = true;
  google::InitGoogleLogging(argv[0]);
  if (FLAGS_coordinator.empty()) {
    LOG(ERROR) << "--coordinator is required (e.g. --coordinator=tcp://127.0.0.1:7000)";
    return 2;
  }
  std::signal(SIGTERM, OnSignal);
  std::signal(SIGINT, OnSignal);
  ps::EnableFlushToZero();
  ps::WorkerOptions options;
  options.coordinator = FLAGS_coordinator;
  options.device = FLAGS_device;
  options.register_timeout = std::chrono::milliseconds(FLAGS_register_timeout_ms);
  options.requested_id = FLAGS_id;
  options.request_timeout = std::chrono::milliseconds(FLAGS_request_timeout_ms);
  options.slowdown = FLAGS_slowdown;
  options.batch_size = FLAGS_batch_size;
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
