// The protocol on top of the transport: building and reading `Header` frames
// (common/protocol.capnp) and the payload frames that follow them.
//
// Decoding never trusts its input: a frame that is not a valid Cap'n Proto message or that
// exceeds the traversal or nesting limits comes back as an error Status, never as an
// exception or a crash.
#pragma once

#include <capnp/message.h>
#include <capnp/serialize.h>

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <zmq.hpp>

#include "common/protocol.capnp.h"
#include "common/status.h"
#include "common/transport.h"

namespace ps {

// Limits applied to every decoded header. Headers are small (bulk data travels in its own
// frames), so tight limits cost nothing and bound what a hostile peer can make us walk.
struct DecodeLimits {
  // Headers hold no bulk data: 64k words (512 KB) is far above any real one, and bounds
  // how many (empty) list elements a small hostile header can make a reader walk.
  uint64_t traversal_limit_words = 1 << 16;
  int nesting_limit = 16;
  size_t max_header_bytes = 1 << 20;
};

// A decoded header frame. Owns an aligned copy of the bytes, so it outlives the frame.
class DecodedHeader {
 public:
  static Result<DecodedHeader> Decode(const zmq::message_t& frame, const DecodeLimits& limits = {});
  wire::Header::Reader get() const { return root_; }

 private:
  std::unique_ptr<capnp::word[]> words_;
  std::unique_ptr<capnp::FlatArrayMessageReader> reader_;
  wire::Header::Reader root_;
};

// VersionMismatch unless the header carries this build's protocol version. Separate from
// Decode so that the error reply can still echo the request id.
Status CheckProtocolVersion(wire::Header::Reader header);

// Serializes a built message into one frame.
zmq::message_t EncodeFrame(capnp::MessageBuilder& builder);

// Starts a header with the protocol version, request id and sender filled in.
wire::Header::Builder NewHeader(capnp::MessageBuilder& builder, uint64_t request_id,
                                int32_t sender_id);

// An error reply to `request_id`.
Frames ErrorReply(uint64_t request_id, int32_t sender_id, const Status& status);

// Converts between Status codes and the wire's ErrorCode.
wire::ErrorCode ToWire(StatusCode code);
StatusCode FromWire(wire::ErrorCode code);

// The Status carried by an `error` body.
Status StatusFromError(wire::Error::Reader error);

// ZeroMQ may hand over a received frame at any byte offset (small and medium messages
// are sliced out of its receive buffer). Replaces every frame from `first` on whose data
// is not 8-byte aligned by an aligned copy, so that FrameAs can view it.
void AlignPayloadFrames(Frames& frames, size_t first = 1);

// Views a payload frame as a typed array. Fails when the frame's size is not a multiple of
// sizeof(T) or its data is not aligned for T (ZeroMQ frames are 8-byte aligned in practice;
// a misaligned one is copied by the caller).
template <typename T>
Result<std::span<const T>> FrameAs(const zmq::message_t& frame) {
  if (frame.size() % sizeof(T) != 0) {
    return InvalidArgument("payload frame of " + std::to_string(frame.size()) +
                           " bytes is not a whole number of " + std::to_string(sizeof(T)) +
                           "-byte elements");
  }
  if (reinterpret_cast<uintptr_t>(frame.data()) % alignof(T) != 0) {
    return InvalidArgument("payload frame is not aligned");
  }
  return std::span<const T>(static_cast<const T*>(frame.data()), frame.size() / sizeof(T));
}

// A synchronous request/reply on a socket with nothing else in flight: sends `request`
// and waits up to `timeout` for the reply. An `error` body becomes its Status.
struct CallReply {
  DecodedHeader header;
  Frames frames;
};
Result<CallReply> Call(ClientSocket& socket, Frames request, std::chrono::milliseconds timeout);

}  // namespace ps
