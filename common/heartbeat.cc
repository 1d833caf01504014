#include "common/heartbeat.h"

#include <glog/logging.h>
#include <kj/exception.h>
#include <unistd.h>

#include "common/wire.h"

namespace ps {

Result<std::unique_ptr<HeartbeatSender>> HeartbeatSender::Start(Transport* transport,
                                                                const HeartbeatOptions& options) {
  if (options.interval.count() <= 0) {
    return InvalidArgument("heartbeat interval of " + std::to_string(options.interval.count()) +
                           " ms: expected a positive time");
  }
  PS_ASSIGN_OR_RETURN(std::unique_ptr<ClientSocket> socket,
                      transport->Connect(options.coordinator));
  std::unique_ptr<HeartbeatSender> h(new HeartbeatSender(options, std::move(socket)));
  h->thread_ = std::thread([p = h.get()] { p->Loop(); });
  return h;
}

HeartbeatSender::HeartbeatSender(const HeartbeatOptions& options,
                                 std::unique_ptr<ClientSocket> socket)
    : options_(options), socket_(std::move(socket)) {}

HeartbeatSender::~HeartbeatSender() { Stop(); }

void HeartbeatSender::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable() && thread_.get_id() != std::this_thread::get_id()) thread_.join();
}

void HeartbeatSender::SetRedirectHandler(std::function<void(int, const std::string&)> handler) {
  std::lock_guard<std::mutex> lock(handler_mu_);
  redirect_handler_ = std::move(handler);
}

void HeartbeatSender::NoteIncarnation(uint64_t seen) {
  if (seen == 0) return;
  const uint64_t before = incarnation_.exchange(seen);
  if (before != 0 && before != seen) {
    LOG(WARNING) << "the coordinator was restarted (incarnation " << before << " -> " << seen
                 << "); unanswered requests to it are sent again";
  }
}

void HeartbeatSender::Loop() {
  const auto now = [this] {
    return options_.now ? options_.now() : std::chrono::steady_clock::now();
  };
  uint64_t request_id = 0;
  auto last_answer = now();
  bool lost_reported = false;
  bool stopping_reported = false;
  std::unique_lock<std::mutex> lock(mu_);
  while (!stopping_) {
    lock.unlock();
    capnp::MallocMessageBuilder b;
    auto alive = NewHeader(b, ++request_id, options_.id).getBody().initAlive();
    alive.setRole(options_.is_server ? wire::Role::SERVER : wire::Role::WORKER);
    alive.setId(options_.id);
    alive.setPid(static_cast<uint32_t>(getpid()));
    Frames f;
    f.push_back(EncodeFrame(b));
    Status sent = socket_->Send(std::move(f));
    if (sent.ok()) {
      beats_.fetch_add(1);
    } else {
      LOG(WARNING) << "heartbeat: " << sent.ToString();
    }
    // Replies of earlier beats: read what is there, never wait for them (a slow
    // coordinator must not delay the next beat).
    while (true) {
      Result<std::optional<Frames>> reply = socket_->TryRecv();
      if (!reply.ok() || !reply->has_value() || (*reply)->empty()) break;
      last_answer = now();
      Result<DecodedHeader> h = DecodedHeader::Decode((**reply)[0]);
      if (!h.ok()) continue;
      try {
        auto body = h->get().getBody();
        if (body.which() == wire::Header::Body::ALIVE_REPLY)
          NoteIncarnation(body.getAliveReply().getIncarnation());
        if (body.which() == wire::Header::Body::ALIVE_REPLY && body.getAliveReply().getEvicted()) {
          if (!evicted_.exchange(true)) {
            LOG(ERROR) << "the coordinator declared this worker dead (it was silent too long)";
          }
        }
        if (body.which() == wire::Header::Body::ALIVE_REPLY &&
            body.getAliveReply().getJobStopping() && !stopping_reported) {
          stopping_reported = true;
          LOG(WARNING) << "the coordinator says that the job stops: leaving it";
          if (options_.on_job_stopping) options_.on_job_stopping();
        }
        if (body.which() == wire::Header::Body::ALIVE_REPLY &&
            body.getAliveReply().hasRedirects()) {
          std::lock_guard<std::mutex> handler_lock(handler_mu_);
          if (redirect_handler_) {
            for (auto r : body.getAliveReply().getRedirects()) {
              redirect_handler_(static_cast<int>(r.getId()), r.getEndpoint().cStr());
            }
          }
        }
      } catch (const kj::Exception&) {
        // A malformed reply says nothing about liveness; the next beat goes anyway.
      }
    }
    const auto silent = now() - last_answer;
    if (!lost_reported && options_.coordinator_timeout.count() > 0 &&
        silent > options_.coordinator_timeout) {
      lost_reported = true;
      LOG(ERROR) << "the coordinator answered no heartbeat for "
                 << std::chrono::duration_cast<std::chrono::milliseconds>(silent).count()
                 << " ms: the job is gone";
      if (options_.on_coordinator_lost) options_.on_coordinator_lost();
    }
    lock.lock();
    cv_.wait_for(lock, options_.interval, [this] { return stopping_; });
  }
}

}  // namespace ps
