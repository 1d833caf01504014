#include "common/transport.h"

#include <algorithm>
#include <optional>

namespace ps {
namespace {

Status FromZmq(const zmq::error_t& e, const std::string& what) {
  if (e.num() == EHOSTUNREACH) return Unavailable(what + ": peer is gone");
  if (e.num() == ETERM) return Aborted(what + ": transport is shutting down");
  return Unavailable(what + ": " + e.what());
}

void Configure(zmq::socket_t& s, const TransportOptions& o) {
  s.set(zmq::sockopt::linger, static_cast<int>(o.linger.count()));
  if (o.socket_buffer_bytes > 0) {
    s.set(zmq::sockopt::sndbuf, o.socket_buffer_bytes);
    s.set(zmq::sockopt::rcvbuf, o.socket_buffer_bytes);
  }
  // Never drop messages on a high-water mark: flow control is the protocol's job.
  s.set(zmq::sockopt::sndhwm, 0);
  s.set(zmq::sockopt::rcvhwm, 0);
}

// Receives the remaining parts of a multipart message whose first part is `first`.
// More than `max_frames` parts: the rest are received and dropped, and `*too_many` is set.
Frames RecvRest(zmq::socket_t& s, zmq::message_t first, size_t max_frames = SIZE_MAX,
                bool* too_many = nullptr) {
  Frames frames;
  bool more = first.more();
  frames.push_back(std::move(first));
  while (more) {
    zmq::message_t part;
    (void)s.recv(part, zmq::recv_flags::none);  // parts of one message arrive together
    more = part.more();
    if (frames.size() < max_frames) {
      frames.push_back(std::move(part));
    } else if (too_many != nullptr) {
      *too_many = true;
    }
  }
  return frames;
}

Status SendFrames(zmq::socket_t& s, Frames& frames, const std::string& what) {
  try {
    for (size_t i = 0; i < frames.size(); ++i) {
      auto flags = i + 1 < frames.size() ? zmq::send_flags::sndmore : zmq::send_flags::none;
      (void)s.send(frames[i], flags);
    }
  } catch (const zmq::error_t& e) {
    return FromZmq(e, what);
  }
  return Status::Ok();
}

bool WaitReadable(zmq::socket_t& s, std::chrono::milliseconds timeout) {
  zmq::pollitem_t item{s.handle(), 0, ZMQ_POLLIN, 0};
  return zmq::poll(&item, 1, timeout) > 0;
}

class ZmqServerSocket final : public ServerSocket {
 public:
  ZmqServerSocket(zmq::socket_t s, std::string bound, size_t max_frames)
      : s_(std::move(s)), bound_(std::move(bound)), max_frames_(max_frames) {}
  std::string BoundEndpoint() const override { return bound_; }

  Result<Incoming> Recv(std::chrono::milliseconds timeout) override {
    try {
      if (!WaitReadable(s_, timeout)) return DeadlineExceeded("no message within timeout");
      zmq::message_t id;
      (void)s_.recv(id, zmq::recv_flags::none);
      Incoming in;
      in.peer = id.to_string();
      if (!id.more()) return in;  // an empty message; the caller rejects it
      zmq::message_t first;
      (void)s_.recv(first, zmq::recv_flags::none);
      bool too_many = false;
      in.frames = RecvRest(s_, std::move(first), max_frames_, &too_many);
      if (too_many) {
        // The caller answers the peer with this error; the frames kept are not decoded.
        in.frames.clear();
        in.too_many_frames = true;
      }
      return in;
    } catch (const zmq::error_t& e) {
      return FromZmq(e, "recv on " + bound_);
    }
  }

  Status Send(const std::string& peer, Frames frames) override {
    try {
      (void)s_.send(zmq::buffer(peer), zmq::send_flags::sndmore);
    } catch (const zmq::error_t& e) {
      return FromZmq(e, "send on " + bound_);
    }
    return SendFrames(s_, frames, "send on " + bound_);
  }

  zmq::socket_ref PollHandle() override { return s_; }

 private:
  zmq::socket_t s_;
  std::string bound_;
  size_t max_frames_;
};

class ZmqClientSocket final : public ClientSocket {
 public:
  ZmqClientSocket(zmq::socket_t s, std::string endpoint)
      : s_(std::move(s)), endpoint_(std::move(endpoint)) {}
  const std::string& Endpoint() const override { return endpoint_; }

  Status Send(Frames frames) override { return SendFrames(s_, frames, "send to " + endpoint_); }

  Result<Frames> Recv(std::chrono::milliseconds timeout) override {
    try {
      if (!WaitReadable(s_, timeout)) {
        return DeadlineExceeded("no reply from " + endpoint_ + " within " +
                                std::to_string(timeout.count()) + " ms");
      }
      zmq::message_t first;
      (void)s_.recv(first, zmq::recv_flags::none);
      return RecvRest(s_, std::move(first));
    } catch (const zmq::error_t& e) {
      return FromZmq(e, "recv from " + endpoint_);
    }
  }

  Result<std::optional<Frames>> TryRecv() override {
    try {
      zmq::message_t first;
      if (!s_.recv(first, zmq::recv_flags::dontwait)) return std::optional<Frames>();
      return std::optional<Frames>(RecvRest(s_, std::move(first)));
    } catch (const zmq::error_t& e) {
      return FromZmq(e, "recv from " + endpoint_);
    }
  }

  zmq::socket_ref PollHandle() override { return s_; }

 private:
  zmq::socket_t s_;
  std::string endpoint_;
};

}  // namespace

Status ValidateEndpoint(const std::string& endpoint) {
  for (const char* scheme : {"tcp://", "ipc://", "inproc://"}) {
    if (endpoint.rfind(scheme, 0) == 0 && endpoint.size() > std::string(scheme).size()) {
      return Status::Ok();
    }
  }
  return InvalidArgument("endpoint '" + endpoint +
                         "' is not a ZeroMQ address: expected tcp://HOST:PORT, ipc:///PATH or "
                         "inproc://NAME");
}

zmq::message_t CopyFrame(const void* data, size_t bytes) { return zmq::message_t(data, bytes); }

Frames ShareFrames(Frames& frames) {
  Frames shared;
  shared.reserve(frames.size());
  for (zmq::message_t& f : frames) {
    zmq::message_t c;
    c.copy(f);
    shared.push_back(std::move(c));
  }
  return shared;
}

Transport::Transport(TransportOptions options) : options_(options), context_(options.io_threads) {}

Transport::~Transport() {
  // The ZAP handler's thread blocks in recv until the context shuts down. Callers close
  // their sockets before the Transport goes (see the header), so this ends only the handler.
  std::lock_guard<std::mutex> l(zap_mu_);
  if (zap_) {
    context_.shutdown();
    zap_.reset();
  }
}

uint64_t Transport::RejectedPeers() const {
  std::lock_guard<std::mutex> l(const_cast<std::mutex&>(zap_mu_));
  return zap_ ? zap_->rejected() : 0;
}

Status Transport::ApplySecurity(zmq::socket_t& s, const std::string& endpoint, bool listener) {
  const SecurityOptions& sec = options_.security;
  if (endpoint.rfind("inproc://", 0) == 0) return Status::Ok();  // never leaves the process
  if (!sec.curve) {
    if (!sec.allow_insecure_remote && !IsLocalEndpoint(endpoint)) {
      return FailedPrecondition("refusing plain (--insecure) traffic on " + endpoint +
                                ", which other hosts can reach: use keys, or "
                                "--allow_insecure_remote");
    }
    return Status::Ok();
  }
  if (listener) {
    {
      std::lock_guard<std::mutex> l(zap_mu_);
      if (!zap_) {
        PS_ASSIGN_OR_RETURN(zap_, ZapHandler::Start(&context_, sec.allowed_clients));
      }
    }
    s.set(zmq::sockopt::zap_domain, "ps");
    s.set(zmq::sockopt::curve_server, 1);
    s.set(zmq::sockopt::curve_secretkey, sec.own.secret_key);
  } else {
    s.set(zmq::sockopt::curve_serverkey, sec.server_public_key);
    s.set(zmq::sockopt::curve_publickey, sec.own.public_key);
    s.set(zmq::sockopt::curve_secretkey, sec.own.secret_key);
  }
  return Status::Ok();
}

Result<std::unique_ptr<ServerSocket>> Transport::Listen(const std::string& endpoint) {
  PS_RETURN_IF_ERROR(ValidateEndpoint(endpoint));
  try {
    zmq::socket_t s(context_, zmq::socket_type::router);
    Configure(s, options_);
    // Fail a send to a vanished peer instead of dropping it silently.
    s.set(zmq::sockopt::router_mandatory, 1);
    if (options_.max_frame_bytes > 0) s.set(zmq::sockopt::maxmsgsize, options_.max_frame_bytes);
    s.set(zmq::sockopt::rcvhwm, options_.receive_hwm);
    PS_RETURN_IF_ERROR(ApplySecurity(s, endpoint, /*listener=*/true));
    s.bind(endpoint);
    std::string bound = s.get(zmq::sockopt::last_endpoint);
    return std::unique_ptr<ServerSocket>(
        new ZmqServerSocket(std::move(s), bound, std::max<size_t>(options_.max_frames, 1)));
  } catch (const zmq::error_t& e) {
    return Unavailable("cannot listen on " + endpoint + ": " + e.what());
  }
}

Result<std::unique_ptr<ClientSocket>> Transport::Connect(const std::string& endpoint) {
  PS_RETURN_IF_ERROR(ValidateEndpoint(endpoint));
  try {
    zmq::socket_t s(context_, zmq::socket_type::dealer);
    Configure(s, options_);
    PS_RETURN_IF_ERROR(ApplySecurity(s, endpoint, /*listener=*/false));
    s.connect(endpoint);
    return std::unique_ptr<ClientSocket>(new ZmqClientSocket(std::move(s), endpoint));
  } catch (const zmq::error_t& e) {
    return Unavailable("cannot connect to " + endpoint + ": " + e.what());
  }
}

}  // namespace ps
