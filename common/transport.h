// The transport moves multipart ZeroMQ messages; it knows nothing of what they mean (see
// common/wire.h for that). Endpoints are ZeroMQ addresses:
//   tcp://HOST:PORT  (PORT "*" binds an ephemeral port; BoundEndpoint() says which)
//   ipc:///path      (same-host processes)
//   inproc://name    (threads of one process: the in-process transport for unit tests)
//
// Sockets:
//   ServerSocket: a ZeroMQ ROUTER. Many peers connect to it; each received message carries
//     the sender's identity so that the reply goes back to it. Servers and the coordinator
//     each own one.
//   ClientSocket: a ZeroMQ DEALER connected to one ServerSocket. Many requests may be in
//     flight; replies come back in the order the server sends them.
//
// Security (common/security.h): with options.security.curve every tcp:// and ipc:// socket
// speaks CURVE; a listener admits only the clients its ZAP handler (one per Transport, started
// with the first listener) allows. inproc:// sockets stay plain: they never leave the process.
//
// Limits: a listener drops (disconnects) a peer that sends a frame over max_frame_bytes
// before the frame is buffered whole, and refuses messages of more than max_frames frames;
// its receive high-water mark makes a flooding peer wait (TCP backpressure) instead of
// growing the server's memory.
//
// Same-host payloads (options.shm): on ipc:// sockets a frame of at least shm_min_frame_bytes
// is copied into a shared-memory ring the sending socket owns (one per connection; one per
// peer for a listener), or built there in the first place (ServerSocket::NewFrame for
// replies, ClientSocket::NewFrame for requests such as pushes), and
// only a small descriptor travels on the socket; the receiving
// socket hands the layers above a frame over the shared bytes (no receive copy), and
// releasing that frame frees the slot. A full ring sends the frame inline. Receiving sockets
// on ipc:// always accept descriptors; tcp:// and inproc:// sockets never send or accept
// them. See common/shm_ring.h for the segment's layout, lifetime and checks.
//
// Batches: several messages to one peer may travel as one ZeroMQ message (PackBatch), so
// that a worker's step costs one round trip per server rather than one per table. The
// receiving socket splits a batch and hands its messages out one by one (Recv/TryRecv), in
// order, exactly as if they had come separately; a ServerSocket then holds the replies to
// that peer until the batch's last message has been handled (or Flush) and sends them
// back as one batch. Only peers that sent a batch get batched replies. A malformed batch
// header (counts not matching the frames) is refused as a bad frame.
//
// Thread model: a socket is used by one thread at a time (ZeroMQ sockets are not
// thread-safe), except ClientSocket::NewFrame (any thread); a Transport (it owns the ZeroMQ
// context) may be shared by all threads.
// All waits take a timeout; nothing blocks forever.
#pragma once

#include <chrono>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>
#include <zmq.hpp>

#include "common/security.h"
#include "common/status.h"

namespace ps {

using Frames = std::vector<zmq::message_t>;

// A message received by a ServerSocket: who sent it and its frames.
struct Incoming {
  std::string peer;  // opaque ZeroMQ routing identity
  Frames frames;
  // The message had more than TransportOptions::max_frames frames; `frames` is then empty
  // and the caller answers with an error.
  bool too_many_frames = false;
  // A frame could not be received whole (a bad shared-memory descriptor): `frames` is then
  // empty and the caller answers with this error.
  Status bad_frame;
};

// Counts of the shared-memory path of one Transport (all its sockets).
struct ShmStats {
  uint64_t frames_sent = 0;  // frames that travelled through a ring
  uint64_t bytes_sent = 0;   // their payload bytes
  // Of frames_sent, those built in the ring by their sender (NewFrame: pull replies,
  // pushes) and sent without a copy; a resend of such a frame counts again.
  uint64_t frames_built = 0;
  uint64_t frames_inline = 0;    // large frames sent inline: ring or /dev/shm full
  uint64_t frames_received = 0;  // descriptors turned into frames
  uint64_t bad_descriptors = 0;  // descriptors refused
};

enum class ShmMode {
  kOff,   // every frame inline
  kAuto,  // large frames through shared memory on ipc:// sockets
};

struct TransportOptions {
  // ZeroMQ I/O threads. One moves ~2 GB/s over loopback TCP; more help with many peers
  // or with CURVE encryption.
  int io_threads = 1;
  // Per-socket kernel buffer sizes in bytes (0 keeps the OS default).
  int socket_buffer_bytes = 4 << 20;
  // How long Close() waits to flush unsent messages.
  std::chrono::milliseconds linger{1000};
  // Authentication and encryption (default: none, for in-process tests; the binaries set it
  // from --keys_dir / --insecure, see common/security_flags.h).
  SecurityOptions security;
  // Listeners: the largest frame accepted; a peer sending a larger one is disconnected by
  // ZeroMQ before it is buffered. Bulk payloads travel in frames of a few MB.
  int64_t max_frame_bytes = int64_t{1} << 30;
  // Listeners: the most frames in one message; a longer one is drained and refused.
  size_t max_frames = 64;
  // Listeners: messages queued per peer before ZeroMQ stops reading that peer's connection
  // (backpressure); 0 for no bound.
  int receive_hwm = 1000;
  // The shared-memory path for ipc:// peers (see above). Off keeps this process's payloads
  // out of shared memory; it still accepts peers' descriptors on ipc:// sockets.
  ShmMode shm = ShmMode::kAuto;
  // Frames smaller than this travel inline: a descriptor and a slot cost more than copying
  // a small frame through the socket.
  size_t shm_min_frame_bytes = 64 << 10;
  // Capacity of one ring's data area. Virtual: pages are committed as first used and reused
  // from the start whenever the ring drains, so a ring costs the bytes in flight at its peak.
  // A frame larger than this travels inline.
  uint64_t shm_ring_bytes = uint64_t{256} << 20;
  // Frames of one ring in flight at once (held by the receiver); more travel inline.
  uint32_t shm_ring_slots = 256;
};

class ServerSocket {
 public:
  virtual ~ServerSocket() = default;
  // The endpoint actually bound (with the port filled in for "tcp://host:*").
  virtual std::string BoundEndpoint() const = 0;
  // Waits up to `timeout` for a message; DeadlineExceeded when none came.
  virtual Result<Incoming> Recv(std::chrono::milliseconds timeout) = 0;
  // Sends `frames` to `peer`. Unavailable when the peer is gone.
  virtual Status Send(const std::string& peer, Frames frames) = 0;
  // A frame of `bytes` bytes for a reply to `peer`, to be filled and then sent on this
  // socket: on the shared-memory path it lies in `peer`'s ring and is sent without a copy;
  // otherwise (or when the ring has no room) it is an ordinary frame. Do not read it after
  // it is sent (the receiver owns the bytes then). Same thread as Send.
  virtual zmq::message_t NewFrame(const std::string& peer, size_t bytes) {
    (void)peer;
    return zmq::message_t(bytes);
  }
  // For polling several sockets together (see PollSockets). A socket may hold messages of
  // a batch already received (HasQueued): poll only when it holds none.
  virtual zmq::socket_ref PollHandle() = 0;
  // Messages of a received batch not yet returned by Recv (which returns them at once).
  virtual bool HasQueued() const { return false; }
  // Sends the replies held for a batch's peer once its batch has been handled (Recv does
  // this too before it waits). Call once per loop turn; does nothing while the batch lasts.
  virtual Status Flush() { return Status::Ok(); }
};

class ClientSocket {
 public:
  virtual ~ClientSocket() = default;
  virtual const std::string& Endpoint() const = 0;
  virtual Status Send(Frames frames) = 0;
  // A frame of `bytes` bytes for a request on this socket, to be filled and then sent
  // (Send): on the shared-memory path it lies in the socket's ring and is sent without a
  // copy; otherwise (or when the ring has no room) it is an ordinary frame. Unlike the rest
  // of the socket, this may be called from any thread while the socket lives. The frame
  // (and copies of it, ShareFrames) keeps its bytes while it lives, so it may be sent again
  // (a retry), or on another socket (which copies it). Do not write it after sending it.
  virtual zmq::message_t NewFrame(size_t bytes) { return zmq::message_t(bytes); }
  // Sends several messages as one batch (see Batches above); one message is sent as is.
  // REQUIRES: `messages` is not empty and each message has at least one frame.
  Status SendBatch(std::vector<Frames> messages);
  // A batched reply is returned message by message: after PollHandle reports input, call
  // TryRecv until it returns nothing.
  virtual Result<Frames> Recv(std::chrono::milliseconds timeout) = 0;
  // Non-blocking receive: an empty optional when nothing is waiting.
  virtual Result<std::optional<Frames>> TryRecv() = 0;
  virtual zmq::socket_ref PollHandle() = 0;
};

class Transport {
 public:
  explicit Transport(TransportOptions options = {});
  ~Transport();
  Transport(const Transport&) = delete;
  Transport& operator=(const Transport&) = delete;

  Result<std::unique_ptr<ServerSocket>> Listen(const std::string& endpoint);
  Result<std::unique_ptr<ClientSocket>> Connect(const std::string& endpoint);

  const TransportOptions& options() const { return options_; }
  // Clients the ZAP handler rejected so far (0 without CURVE or before the first listener).
  uint64_t RejectedPeers() const;
  ShmStats shm_stats() const;

  struct ShmShared;  // stats and the rings of closed sockets with frames still held

 private:
  Status ApplySecurity(zmq::socket_t& s, const std::string& endpoint, bool listener);

  TransportOptions options_;
  // Declared before context_: destroyed after it, once linger has delivered or dropped every
  // message that may name a closed socket's ring.
  std::shared_ptr<ShmShared> shm_;
  zmq::context_t context_;
  std::mutex zap_mu_;
  std::unique_ptr<ZapHandler> zap_;  // guarded by zap_mu_; started by the first listener
};

// zmq::poll over `items`, except that a signal interrupting the wait (EINTR) counts as
// nothing ready instead of an error, so that loops look at their stop flags (SIGTERM) and
// end as asked. Returns how many items are ready; other errors throw zmq::error_t.
int PollSockets(zmq::pollitem_t* items, size_t count, std::chrono::milliseconds timeout);

// The frames of a batch: a header frame (magic, then the frame count of each message),
// then every message's frames in order. REQUIRES: at least two messages, none empty.
Frames PackBatch(std::vector<Frames> messages);
// True when `first` (a message's first frame) is a batch header.
bool LooksLikeBatch(const zmq::message_t& first);
// The messages of a batch made by PackBatch; InvalidArgument naming the bad count when the
// header does not match the frames.
Result<std::vector<Frames>> UnpackBatch(Frames frames);
// The most frames KVClient puts in one batch (header included): below the listeners'
// default max_frames.
inline constexpr size_t kMaxBatchFrames = 48;

// Checks that `endpoint` is a ZeroMQ address this project uses (tcp://, ipc://, inproc://).
Status ValidateEndpoint(const std::string& endpoint);

// Copies `bytes` bytes into a new frame.
zmq::message_t CopyFrame(const void* data, size_t bytes);

// Copies of `frames` that share their payload buffers (zmq_msg_copy: reference counted, no
// bytes copied), for a message sent again or to a second peer. Neither side may write to
// the payloads afterwards. A frame over shared memory is shared the same way: its slot is
// freed when the last copy goes.
Frames ShareFrames(Frames& frames);

}  // namespace ps
