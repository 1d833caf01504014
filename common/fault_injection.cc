#include "common/fault_injection.h"

#include <algorithm>

namespace ps {

FaultyServerSocket::FaultyServerSocket(std::unique_ptr<ServerSocket> inner,
                                       const FaultOptions& options)
    : inner_(std::move(inner)), options_(options), rng_(options.seed) {}

Incoming FaultyServerSocket::Copy(Incoming& m) {
  Incoming c;
  c.peer = m.peer;
  c.frames = ShareFrames(m.frames);
  c.too_many_frames = m.too_many_frames;
  c.bad_frame = m.bad_frame;
  return c;
}

Result<Incoming> FaultyServerSocket::Recv(std::chrono::milliseconds timeout) {
  auto now = Clock::now();
  if (!held_.empty() && held_.front().ready <= now) {
    Incoming m = std::move(held_.front().message);
    held_.pop_front();
    return m;
  }
  // Wake up in time for the next held request.
  if (!held_.empty()) {
    auto until = std::chrono::duration_cast<std::chrono::milliseconds>(held_.front().ready - now);
    timeout = std::clamp(until, std::chrono::milliseconds(0), timeout);
  }
  PS_ASSIGN_OR_RETURN(Incoming m, inner_->Recv(timeout));
  ++stats_.requests;
  now = Clock::now();
  auto hold = [&](Incoming message, Clock::time_point ready) {
    auto at = std::upper_bound(held_.begin(), held_.end(), ready,
                               [](Clock::time_point t, const Held& h) { return t < h.ready; });
    held_.insert(at, Held{ready, std::move(message)});
  };
  if (Roll(options_.drop_request)) {
    ++stats_.dropped_requests;
    return DeadlineExceeded("request dropped (fault injection)");
  }
  if (Roll(options_.duplicate_request)) {
    ++stats_.duplicated_requests;
    hold(Copy(m), now);
  }
  if (Roll(options_.delay_request)) {
    ++stats_.delayed_requests;
    std::uniform_int_distribution<int64_t> ms(1, std::max<int64_t>(1, options_.max_delay.count()));
    hold(std::move(m), now + std::chrono::milliseconds(ms(rng_)));
    return DeadlineExceeded("request delayed (fault injection)");
  }
  return m;
}

Status FaultyServerSocket::Send(const std::string& peer, Frames frames) {
  if (Roll(options_.drop_reply)) {
    ++stats_.dropped_replies;
    return Status::Ok();
  }
  if (Roll(options_.duplicate_reply)) {
    ++stats_.duplicated_replies;
    Incoming copy;
    copy.peer = peer;
    copy.frames = std::move(frames);
    Incoming again = Copy(copy);
    PS_RETURN_IF_ERROR(inner_->Send(peer, std::move(copy.frames)));
    return inner_->Send(peer, std::move(again.frames));
  }
  return inner_->Send(peer, std::move(frames));
}

}  // namespace ps
