#include "worker/coordinator_call.h"

#include <glog/logging.h>
#include <kj/exception.h>

namespace ps {
namespace {

Frames CopyOf(const Frames& frames) {
  Frames copy;
  for (const zmq::message_t& f : frames) copy.emplace_back(f.data(), f.size());
  return copy;
}

}  // namespace

Result<CallReply> CallCoordinator(ClientSocket& socket, Frames request, uint64_t request_id,
                                  const CoordinatorCallOptions& options) {
  const auto deadline = std::chrono::steady_clock::now() + options.timeout;
  const auto incarnation = [&options]() -> uint64_t {
    return options.heartbeat != nullptr ? options.heartbeat->coordinator_incarnation() : 0;
  };
  uint64_t sent_to = incarnation();
  PS_RETURN_IF_ERROR(socket.Send(CopyOf(request)));
  while (true) {
    if (options.stop != nullptr && options.stop->load()) {
      return Aborted("stopped while waiting for the coordinator");
    }
    const auto now = std::chrono::steady_clock::now();
    if (now >= deadline) {
      return DeadlineExceeded("the coordinator did not answer request " +
                              std::to_string(request_id) + " within " +
                              std::to_string(options.timeout.count()) + " ms");
    }
    const auto wait = std::min<std::chrono::milliseconds>(
        options.slice, std::chrono::duration_cast<std::chrono::milliseconds>(deadline - now) +
                           std::chrono::milliseconds(1));
    Result<Frames> frames = socket.Recv(wait);
    if (!frames.ok()) {
      if (frames.status().code() != StatusCode::kDeadlineExceeded) return frames.status();
      const uint64_t now_at = incarnation();
      if (sent_to == 0) {
        sent_to = now_at;  // the first answer of a beat: the coordinator it went to
      } else if (now_at != 0 && now_at != sent_to) {
        LOG(WARNING) << "the coordinator was restarted; sending request " << request_id << " again";
        sent_to = now_at;
        PS_RETURN_IF_ERROR(socket.Send(CopyOf(request)));
      }
      continue;
    }
    if (frames->empty()) continue;
    Result<DecodedHeader> header = DecodedHeader::Decode((*frames)[0]);
    if (!header.ok()) return header.status();
    try {
      if (header->get().getRequestId() != request_id) continue;  // an earlier request's
      PS_RETURN_IF_ERROR(CheckProtocolVersion(header->get()));
      if (header->get().getBody().which() == wire::Header::Body::ERROR) {
        return StatusFromError(header->get().getBody().getError());
      }
    } catch (const kj::Exception& e) {
      return InvalidArgument(std::string("malformed reply from the coordinator: ") +
                             e.getDescription().cStr());
    }
    return CallReply{std::move(header).value(), std::move(frames).value()};
  }
}

}  // namespace ps
