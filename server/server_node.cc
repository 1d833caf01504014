#include "server/server_node.h"

#include <glog/logging.h>

#include "common/registration.h"
#include "common/wire.h"

namespace ps {

Status ServeUntilShutdown(ServerSocket& socket, ServerCore& core, const std::atomic<bool>& stop,
                          std::chrono::milliseconds poll_interval) {
  std::vector<Outgoing> out;
  while (!stop.load(std::memory_order_relaxed)) {
    Result<Incoming> in = socket.Recv(poll_interval);
    ServerCore::After after = ServerCore::After::kContinue;
    out.clear();
    if (in.ok() && in->too_many_frames) {
      out.push_back(Outgoing{in->peer, ErrorReply(0, core.server_id(),
                                                  InvalidArgument("message has too many frames "
                                                                  "(see --max_frames)"))});
    } else if (in.ok()) {
      core.Handle(in->peer, in->frames, &out, &after);
    } else if (in.status().code() != StatusCode::kDeadlineExceeded) {
      return in.status();
    }
    core.ExpireHeldPulls(ServerCore::Clock::now(), &out);
    for (Outgoing& o : out) {
      Status sent = socket.Send(o.peer, std::move(o.frames));
      if (!sent.ok()) {
        // The peer left before its reply; nothing to do for it, keep serving the others.
        LOG(WARNING) << "server " << core.server_id() << ": " << sent.ToString();
      }
    }
    if (after == ServerCore::After::kShutdown) {
      LOG(INFO) << "server " << core.server_id() << ": shutdown requested";
      return Status::Ok();
    }
  }
  return Aborted("server stopped by signal");
}

Status RunServer(const ServerOptions& options, Transport* transport,
                 const std::atomic<bool>& stop) {
  PS_ASSIGN_OR_RETURN(std::unique_ptr<ServerSocket> socket, transport->Listen(options.listen));
  LOG(INFO) << "server listening on " << socket->BoundEndpoint();
  RegisterRequest req;
  req.is_server = true;
  req.endpoint = socket->BoundEndpoint();
  req.requested_id = options.requested_id;
  PS_ASSIGN_OR_RETURN(Registration reg, RegisterWithCoordinator(transport, options.coordinator, req,
                                                                options.register_timeout));
  LOG(INFO) << "registered as server " << reg.id << " of " << reg.config.num_servers;
  PS_ASSIGN_OR_RETURN(std::unique_ptr<ServerCore> core, ServerCore::Create(reg.config, reg.id));
  core->set_limits(options.limits);
  Status s = ServeUntilShutdown(*socket, *core, stop, options.poll_interval);
  ServerStats st = core->stats();
  LOG(INFO) << "server " << reg.id << " done: pushes applied " << st.pushes_applied << ", rejected "
            << st.pushes_rejected << ", pulls " << st.pulls_served << ", rows held "
            << st.rows_held;
  return s;
}

}  // namespace ps
