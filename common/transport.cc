#include "common/transport.h"

#include <glog/logging.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <deque>
#include <map>
#include <optional>

#include "common/shm_ring.h"

namespace ps {

struct Transport::ShmShared {
  std::atomic<uint64_t> frames_sent{0};
  std::atomic<uint64_t> bytes_sent{0};
  std::atomic<uint64_t> frames_built{0};
  std::atomic<uint64_t> frames_inline{0};
  std::atomic<uint64_t> frames_received{0};
  std::atomic<uint64_t> bad_descriptors{0};
  std::atomic<bool> warned{false};  // a ring could not be made (logged once)

  // Rings of closed sockets whose frames a receiver still holds (or that may still be in
  // flight): unlinked once free, or when the Transport goes.
  void Retire(std::shared_ptr<ShmRing> ring) {
    std::lock_guard<std::mutex> l(mu);
    std::erase_if(closed, [](const std::shared_ptr<ShmRing>& r) { return r->Reclaim() == 0; });
    if (ring->Reclaim() > 0) closed.push_back(std::move(ring));
  }

  std::mutex mu;
  std::vector<std::shared_ptr<ShmRing>> closed;  // guarded by mu
};

// Declared in transport.h.
int PollSockets(zmq::pollitem_t* items, size_t count, std::chrono::milliseconds timeout) {
  try {
    return zmq::poll(items, count, timeout);
  } catch (const zmq::error_t& e) {
    if (e.num() == EINTR) return 0;  // a signal: the caller looks at its stop flag
    throw;
  }
}

namespace {

bool IsIpc(const std::string& endpoint) { return endpoint.rfind("ipc://", 0) == 0; }

// The sending side of the shared-memory path for one socket: a ring per peer ("" for a
// client socket's one server), made when the first large frame goes to that peer. NewFrame
// may run on any thread (a client's callers build pushes in the ring); the rest runs on the
// socket's thread. mu_ guards the ring map; each ring locks itself.
class ShmSender {
 public:
  ShmSender(const TransportOptions& o, std::shared_ptr<Transport::ShmShared> shared)
      : min_frame_bytes_(o.shm_min_frame_bytes), shared_(std::move(shared)) {
    ring_options_.data_bytes = o.shm_ring_bytes;
    ring_options_.num_slots = o.shm_ring_slots;
  }
  ~ShmSender() {
    for (auto& [peer, ring] : rings_) shared_->Retire(std::move(ring));
  }

  // A frame in `peer`'s ring (see ServerSocket::NewFrame), or an ordinary one.
  zmq::message_t NewFrame(const std::string& peer, size_t bytes) {
    if (bytes >= min_frame_bytes_) {
      if (std::shared_ptr<ShmRing> ring = RingFor(peer)) {
        if (std::optional<zmq::message_t> f = ring->Reserve(bytes)) return std::move(*f);
      }
    }
    return zmq::message_t(bytes);
  }

  // Takes back the descriptors Substitute put into `frames` that were not sent.
  void Cancel(const std::string& peer, const Frames& frames) {
    std::shared_ptr<ShmRing> ring;
    {
      std::lock_guard<std::mutex> l(mu_);
      auto it = rings_.find(peer);
      if (it == rings_.end()) return;
      ring = it->second;
    }
    for (const zmq::message_t& f : frames) (void)ring->Cancel(f);
  }

  // Replaces each large frame of `frames` by a descriptor of its copy in `peer`'s ring.
  void Substitute(const std::string& peer, Frames& frames) {
    std::shared_ptr<ShmRing> ring;
    for (zmq::message_t& f : frames) {
      if (f.size() < min_frame_bytes_) continue;
      if (!ring) ring = RingFor(peer);
      if (!ring) return;
      // Built in the ring (a retry of such a frame too, while the sender holds it): no copy.
      std::optional<zmq::message_t> d = ring->Commit(f);
      if (d) {
        shared_->frames_built.fetch_add(1, std::memory_order_relaxed);
      } else if (ring->Contains(f.data())) {
        // Points into this ring without the sender's hold (not a frame Reserve made): the
        // receiver may free its slot, and Put could then reuse the bytes it copies from.
        f = CopyFrame(f.data(), f.size());
      }
      // A frame of another ring (a resend after a redirect) is copied from the slot its
      // sender still holds.
      if (!d) d = ring->Put(f.data(), f.size());
      if (!d) {
        shared_->frames_inline.fetch_add(1, std::memory_order_relaxed);
        continue;
      }
      shared_->frames_sent.fetch_add(1, std::memory_order_relaxed);
      shared_->bytes_sent.fetch_add(f.size(), std::memory_order_relaxed);
      f = std::move(*d);
    }
  }

 private:
  // Peers of a listener come and go (a reconnecting client has a new identity): past this
  // many rings, those with nothing held are dropped.
  static constexpr size_t kMaxRings = 64;

  std::shared_ptr<ShmRing> RingFor(const std::string& peer) {
    std::lock_guard<std::mutex> l(mu_);
    auto it = rings_.find(peer);
    if (it != rings_.end()) return it->second;
    if (failed_) return nullptr;
    if (rings_.size() >= kMaxRings) {
      std::erase_if(rings_, [](const auto& kv) { return kv.second->Reclaim() == 0; });
      if (rings_.size() >= kMaxRings) return nullptr;
    }
    Result<std::shared_ptr<ShmRing>> ring = ShmRing::Create(ring_options_);
    if (!ring.ok()) {
      failed_ = true;  // this socket sends inline from now on
      if (!shared_->warned.exchange(true)) {
        LOG(WARNING) << "shared-memory path off, frames go inline: " << ring.status().ToString();
      }
      return nullptr;
    }
    return rings_[peer] = std::move(ring).value();
  }

  size_t min_frame_bytes_;
  ShmRingOptions ring_options_;
  std::shared_ptr<Transport::ShmShared> shared_;
  std::mutex mu_;
  std::map<std::string, std::shared_ptr<ShmRing>> rings_;  // guarded by mu_
  bool failed_ = false;                                    // guarded by mu_
};

// The receiving side: turns descriptors back into frames. Only for ipc:// sockets.
class ShmReceiver {
 public:
  explicit ShmReceiver(std::shared_ptr<Transport::ShmShared> shared) : shared_(std::move(shared)) {}
  Status Resolve(Frames& frames) {
    for (zmq::message_t& f : frames) {
      if (!LooksLikeShmDescriptor(f)) continue;
      Result<zmq::message_t> m = mapper_.Resolve(f);
      if (!m.ok()) {
        shared_->bad_descriptors.fetch_add(1, std::memory_order_relaxed);
        return m.status();
      }
      shared_->frames_received.fetch_add(1, std::memory_order_relaxed);
      f = std::move(m).value();
    }
    return Status::Ok();
  }

 private:
  std::shared_ptr<Transport::ShmShared> shared_;
  ShmMapper mapper_;
};

// What a socket of `endpoint` gets of the shared-memory path (nullptr: none).
struct ShmParts {
  std::unique_ptr<ShmSender> sender;
  std::unique_ptr<ShmReceiver> receiver;
};

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
  return PollSockets(&item, 1, timeout) > 0;
}

class ZmqServerSocket final : public ServerSocket {
 public:
  ZmqServerSocket(zmq::socket_t s, std::string bound, size_t max_frames, ShmParts shm)
      : s_(std::move(s)), bound_(std::move(bound)), max_frames_(max_frames), shm_(std::move(shm)) {}
  ~ZmqServerSocket() override {
    s_.close();  // before the rings: retiring one sees what the socket still holds
  }
  std::string BoundEndpoint() const override { return bound_; }

  Result<Incoming> Recv(std::chrono::milliseconds timeout) override {
    if (!queued_.empty()) {
      Incoming in = std::move(queued_.front());
      queued_.pop_front();
      return in;
    }
    if (Status s = Flush(); !s.ok()) LOG(WARNING) << s.ToString();
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
      } else if (shm_.receiver) {
        if (Status s = shm_.receiver->Resolve(in.frames); !s.ok()) {
          in.frames.clear();
          in.bad_frame = s;
        }
      }
      if (!in.frames.empty() && LooksLikeBatch(in.frames[0])) return Split(std::move(in));
      return in;
    } catch (const zmq::error_t& e) {
      return FromZmq(e, "recv on " + bound_);
    }
  }

  Status Send(const std::string& peer, Frames frames) override {
    if (peer == batch_peer_ && (!queued_.empty() || !held_.empty())) {
      // A reply to a batch: held until the batch's last message has been handled.
      held_.push_back(std::move(frames));
      return queued_.empty() ? Flush() : Status::Ok();
    }
    return SendNow(peer, std::move(frames));
  }

  bool HasQueued() const override { return !queued_.empty(); }

  Status Flush() override {
    if (!queued_.empty() || held_.empty()) return Status::Ok();
    std::vector<Frames> replies;
    replies.swap(held_);
    if (replies.size() == 1) return SendNow(batch_peer_, std::move(replies[0]));
    return SendNow(batch_peer_, PackBatch(std::move(replies)));
  }

  zmq::message_t NewFrame(const std::string& peer, size_t bytes) override {
    if (shm_.sender) return shm_.sender->NewFrame(peer, bytes);
    return zmq::message_t(bytes);
  }

  zmq::socket_ref PollHandle() override { return s_; }

 private:
  // Returns a batch's first message and queues the others.
  Result<Incoming> Split(Incoming in) {
    Result<std::vector<Frames>> messages = UnpackBatch(std::move(in.frames));
    in.frames.clear();
    if (!messages.ok()) {
      in.bad_frame = messages.status();
      return in;
    }
    // Replies still held for an earlier batch go first.
    if (Status s = Flush(); !s.ok()) LOG(WARNING) << s.ToString();
    batch_peer_ = in.peer;
    for (size_t i = 1; i < messages->size(); ++i) {
      queued_.push_back(Incoming{in.peer, std::move((*messages)[i]), false, Status::Ok()});
    }
    in.frames = std::move((*messages)[0]);
    return in;
  }

  Status SendNow(const std::string& peer, Frames frames) {
    if (shm_.sender) shm_.sender->Substitute(peer, frames);
    try {
      (void)s_.send(zmq::buffer(peer), zmq::send_flags::sndmore);
    } catch (const zmq::error_t& e) {
      // The peer is gone (router_mandatory): nothing was sent, so no one will free the slots.
      if (shm_.sender) shm_.sender->Cancel(peer, frames);
      return FromZmq(e, "send on " + bound_);
    }
    return SendFrames(s_, frames, "send on " + bound_);
  }

  zmq::socket_t s_;
  std::string bound_;
  size_t max_frames_;
  ShmParts shm_;
  std::deque<Incoming> queued_;  // the rest of the batch being handled
  std::string batch_peer_;       // who sent it
  std::vector<Frames> held_;     // replies to batch_peer_ not sent yet
};

class ZmqClientSocket final : public ClientSocket {
 public:
  ZmqClientSocket(zmq::socket_t s, std::string endpoint, ShmParts shm)
      : s_(std::move(s)), endpoint_(std::move(endpoint)), shm_(std::move(shm)) {}
  ~ZmqClientSocket() override { s_.close(); }
  const std::string& Endpoint() const override { return endpoint_; }

  Status Send(Frames frames) override {
    if (shm_.sender) shm_.sender->Substitute("", frames);
    return SendFrames(s_, frames, "send to " + endpoint_);
  }

  zmq::message_t NewFrame(size_t bytes) override {
    if (shm_.sender) return shm_.sender->NewFrame("", bytes);
    return zmq::message_t(bytes);
  }

  Result<Frames> Recv(std::chrono::milliseconds timeout) override {
    if (!queued_.empty()) {
      Frames f = std::move(queued_.front());
      queued_.pop_front();
      return f;
    }
    try {
      if (!WaitReadable(s_, timeout)) {
        return DeadlineExceeded("no reply from " + endpoint_ + " within " +
                                std::to_string(timeout.count()) + " ms");
      }
      zmq::message_t first;
      (void)s_.recv(first, zmq::recv_flags::none);
      return Resolve(RecvRest(s_, std::move(first)));
    } catch (const zmq::error_t& e) {
      return FromZmq(e, "recv from " + endpoint_);
    }
  }

  Result<std::optional<Frames>> TryRecv() override {
    if (!queued_.empty()) {
      Frames f = std::move(queued_.front());
      queued_.pop_front();
      return std::optional<Frames>(std::move(f));
    }
    try {
      zmq::message_t first;
      if (!s_.recv(first, zmq::recv_flags::dontwait)) return std::optional<Frames>();
      PS_ASSIGN_OR_RETURN(Frames frames, Resolve(RecvRest(s_, std::move(first))));
      return std::optional<Frames>(std::move(frames));
    } catch (const zmq::error_t& e) {
      return FromZmq(e, "recv from " + endpoint_);
    }
  }

  zmq::socket_ref PollHandle() override { return s_; }

 private:
  // The message received, or a batch's first message (the others are queued).
  Result<Frames> Resolve(Frames frames) {
    if (shm_.receiver) PS_RETURN_IF_ERROR(shm_.receiver->Resolve(frames));
    if (frames.empty() || !LooksLikeBatch(frames[0])) return frames;
    PS_ASSIGN_OR_RETURN(std::vector<Frames> messages, UnpackBatch(std::move(frames)));
    for (size_t i = 1; i < messages.size(); ++i) queued_.push_back(std::move(messages[i]));
    return std::move(messages[0]);
  }

  zmq::socket_t s_;
  std::string endpoint_;
  ShmParts shm_;
  std::deque<Frames> queued_;  // the rest of a batched reply
};

ShmParts MakeShmParts(const std::string& endpoint, const TransportOptions& o,
                      const std::shared_ptr<Transport::ShmShared>& shared) {
  ShmParts parts;
  if (!IsIpc(endpoint)) return parts;
  parts.receiver = std::make_unique<ShmReceiver>(shared);
  if (o.shm == ShmMode::kAuto) parts.sender = std::make_unique<ShmSender>(o, shared);
  return parts;
}

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

namespace {
// "ps-batch" twice, so that a batch header is told from a Cap'n Proto header frame (whose
// first word is a segment count) and from a shared-memory descriptor.
constexpr uint64_t kBatchMagic[2] = {0x6863746162'2d7370ULL, 0x6863746162'2d7370ULL};
constexpr size_t kBatchHeaderFixed = sizeof(kBatchMagic) + sizeof(uint32_t);
}  // namespace

Frames PackBatch(std::vector<Frames> messages) {
  CHECK_GE(messages.size(), 2u) << "a batch has at least two messages";
  zmq::message_t header(kBatchHeaderFixed + messages.size() * sizeof(uint32_t));
  char* p = static_cast<char*>(header.data());
  std::memcpy(p, kBatchMagic, sizeof(kBatchMagic));
  const uint32_t count = static_cast<uint32_t>(messages.size());
  std::memcpy(p + sizeof(kBatchMagic), &count, sizeof(count));
  for (size_t i = 0; i < messages.size(); ++i) {
    CHECK(!messages[i].empty()) << "a batched message has no frames";
    const uint32_t n = static_cast<uint32_t>(messages[i].size());
    std::memcpy(p + kBatchHeaderFixed + i * sizeof(uint32_t), &n, sizeof(n));
  }
  // Filled before it moves: a small zmq message keeps its bytes inside the object.
  Frames out;
  out.push_back(std::move(header));
  for (Frames& m : messages) {
    for (zmq::message_t& f : m) out.push_back(std::move(f));
  }
  return out;
}

bool LooksLikeBatch(const zmq::message_t& first) {
  return first.size() >= kBatchHeaderFixed &&
         std::memcmp(first.data(), kBatchMagic, sizeof(kBatchMagic)) == 0;
}

Result<std::vector<Frames>> UnpackBatch(Frames frames) {
  if (frames.empty() || !LooksLikeBatch(frames[0])) {
    return InvalidArgument("not a batch: the first frame is not a batch header");
  }
  const char* p = static_cast<const char*>(frames[0].data());
  uint32_t count = 0;
  std::memcpy(&count, p + sizeof(kBatchMagic), sizeof(count));
  if (count < 2 || frames[0].size() != kBatchHeaderFixed + uint64_t{count} * sizeof(uint32_t)) {
    return InvalidArgument("batch header of " + std::to_string(frames[0].size()) + " bytes names " +
                           std::to_string(count) +
                           " messages; expected at least 2 and 20 + 4 bytes per message");
  }
  std::vector<uint32_t> sizes(count);
  std::memcpy(sizes.data(), p + kBatchHeaderFixed, count * sizeof(uint32_t));
  uint64_t total = 0;
  for (uint32_t i = 0; i < count; ++i) {
    if (sizes[i] == 0) {
      return InvalidArgument("batch message " + std::to_string(i) + " has 0 frames, expected >= 1");
    }
    total += sizes[i];
  }
  if (total != frames.size() - 1) {
    return InvalidArgument("batch header counts " + std::to_string(total) + " frames, but " +
                           std::to_string(frames.size() - 1) + " follow it");
  }
  std::vector<Frames> messages(count);
  size_t next = 1;
  for (uint32_t i = 0; i < count; ++i) {
    for (uint32_t j = 0; j < sizes[i]; ++j) messages[i].push_back(std::move(frames[next++]));
  }
  return messages;
}

Status ClientSocket::SendBatch(std::vector<Frames> messages) {
  CHECK(!messages.empty()) << "SendBatch of no messages";
  if (messages.size() == 1) return Send(std::move(messages[0]));
  return Send(PackBatch(std::move(messages)));
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

Transport::Transport(TransportOptions options)
    : options_(options), shm_(std::make_shared<ShmShared>()), context_(options.io_threads) {}

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

ShmStats Transport::shm_stats() const {
  ShmStats s;
  s.frames_sent = shm_->frames_sent.load();
  s.bytes_sent = shm_->bytes_sent.load();
  s.frames_built = shm_->frames_built.load();
  s.frames_inline = shm_->frames_inline.load();
  s.frames_received = shm_->frames_received.load();
  s.bad_descriptors = shm_->bad_descriptors.load();
  return s;
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
        new ZmqServerSocket(std::move(s), bound, std::max<size_t>(options_.max_frames, 1),
                            MakeShmParts(bound, options_, shm_)));
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
    return std::unique_ptr<ClientSocket>(
        new ZmqClientSocket(std::move(s), endpoint, MakeShmParts(endpoint, options_, shm_)));
  } catch (const zmq::error_t& e) {
    return Unavailable("cannot connect to " + endpoint + ": " + e.what());
  }
}

}  // namespace ps
