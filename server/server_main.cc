// ps_server: holds shards of the model's tables and applies pushes through the optimizer.
#include <gflags/gflags.h>
#include <glog/logging.h>

#include <algorithm>
#include <csignal>

#include "common/security_flags.h"
#include "server/server_node.h"

DEFINE_string(coordinator, "", "the coordinator's endpoint, e.g. tcp://127.0.0.1:7000 (required)");
DEFINE_string(listen, "tcp://127.0.0.1:*", "where to listen for workers; port * picks a free one");
DEFINE_int32(
    id, -1, "this process's id within its role, as a launcher numbers it (-1: registration order)");
DEFINE_int32(register_timeout_ms, 120000, "how long to wait for the job to assemble");
DEFINE_int32(io_threads, 1, "ZeroMQ I/O threads");
DEFINE_int64(max_frame_mb, 1024,
             "largest frame accepted, MB; a peer sending a larger one is disconnected");
DEFINE_int32(max_frames, 64, "most frames in one request; a longer one gets an error");
DEFINE_int32(receive_hwm, 1000,
             "requests queued per peer before its connection stops being read (backpressure)");
DEFINE_uint64(max_request_rows, ps::RequestLimits().max_rows, "rows one push or pull may address");
DEFINE_uint64(max_request_mb, ps::RequestLimits().max_value_bytes >> 20,
              "MB of values one push may carry or one pull return");

namespace {
std::atomic<bool> g_stop{false};
void OnSignal(int) { g_stop.store(true); }
}  // namespace

int main(int argc, char** argv) {
  gflags::SetUsageMessage("ps_server --coordinator=tcp://HOST:PORT [--listen=ENDPOINT]");
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  FLAGS_logtostderr = true;
  google::InitGoogleLogging(argv[0]);
  if (FLAGS_coordinator.empty()) {
    LOG(ERROR) << "--coordinator is required (e.g. --coordinator=tcp://127.0.0.1:7000)";
    return 2;
  }
  std::signal(SIGTERM, OnSignal);
  std::signal(SIGINT, OnSignal);
  ps::ServerOptions options;
  options.coordinator = FLAGS_coordinator;
  options.listen = FLAGS_listen;
  options.register_timeout = std::chrono::milliseconds(FLAGS_register_timeout_ms);
  options.requested_id = FLAGS_id;
  ps::TransportOptions topt;
  topt.io_threads = FLAGS_io_threads;
  topt.max_frame_bytes = FLAGS_max_frame_mb << 20;
  topt.max_frames = static_cast<size_t>(std::max(FLAGS_max_frames, 1));
  topt.receive_hwm = FLAGS_receive_hwm;
  options.limits.max_rows = FLAGS_max_request_rows;
  options.limits.max_value_bytes = FLAGS_max_request_mb << 20;
  if (ps::Status sec = ps::InstallSecurityFromFlags(ps::SecurityRole::kServer,
                                                    {FLAGS_listen, FLAGS_coordinator}, &topt);
      !sec.ok()) {
    LOG(ERROR) << "ps_server: " << sec.message();
    return 2;
  }
  ps::Transport transport(topt);
  ps::Status s = ps::RunServer(options, &transport, g_stop);
  if (!s.ok()) {
    LOG(ERROR) << "ps_server: " << s.ToString();
    return 1;
  }
  return 0;
}
