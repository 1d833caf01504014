#include "common/wire.h"

#include <kj/exception.h>

#include <cstring>

namespace ps {

Result<DecodedHeader> DecodedHeader::Decode(const zmq::message_t& frame,
                                            const DecodeLimits& limits) {
  if (frame.size() == 0) return InvalidArgument("empty header frame");
  if (frame.size() > limits.max_header_bytes) {
    return InvalidArgument("header frame of " + std::to_string(frame.size()) +
                           " bytes exceeds the limit of " +
                           std::to_string(limits.max_header_bytes));
  }
  if (frame.size() % sizeof(capnp::word) != 0) {
    return InvalidArgument("header frame of " + std::to_string(frame.size()) +
                           " bytes is not a whole number of 8-byte words (truncated?)");
  }
  DecodedHeader h;
  size_t n = frame.size() / sizeof(capnp::word);
  h.words_ = std::make_unique<capnp::word[]>(n);
  std::memcpy(h.words_.get(), frame.data(), frame.size());
  capnp::ReaderOptions options;
  options.traversalLimitInWords = limits.traversal_limit_words;
  options.nestingLimit = limits.nesting_limit;
  try {
    h.reader_ = std::make_unique<capnp::FlatArrayMessageReader>(
        kj::ArrayPtr<const capnp::word>(h.words_.get(), n), options);
    h.root_ = h.reader_->getRoot<wire::Header>();
    // Touch the union tag so that a malformed pointer fails here, not in the handler.
    (void)h.root_.getBody().which();
  } catch (const kj::Exception& e) {
    return InvalidArgument(std::string("malformed header: ") + e.getDescription().cStr());
  }
  return h;
}

void AlignPayloadFrames(Frames& frames, size_t first) {
  for (size_t i = first; i < frames.size(); ++i) {
    if (reinterpret_cast<uintptr_t>(frames[i].data()) % 8 == 0) continue;
    zmq::message_t copy(frames[i].data(), frames[i].size());  // malloc'd: 16-byte aligned
    frames[i].move(copy);
  }
}

Status CheckProtocolVersion(wire::Header::Reader header) {
  uint32_t version = header.getProtocolVersion();
  if (version == wire::PROTOCOL_VERSION) return Status::Ok();
  return Status(StatusCode::kVersionMismatch,
                "protocol version " + std::to_string(version) +
                    " is not supported; this process speaks version " +
                    std::to_string(wire::PROTOCOL_VERSION));
}

zmq::message_t EncodeFrame(capnp::MessageBuilder& builder) {
  kj::Array<capnp::word> words = capnp::messageToFlatArray(builder);
  kj::ArrayPtr<const kj::byte> bytes = words.asBytes();
  return zmq::message_t(bytes.begin(), bytes.size());
}

wire::Header::Builder NewHeader(capnp::MessageBuilder& builder, uint64_t request_id,
                                int32_t sender_id) {
  auto h = builder.initRoot<wire::Header>();
  h.setProtocolVersion(wire::PROTOCOL_VERSION);
  h.setRequestId(request_id);
  h.setSenderId(sender_id);
  return h;
}

wire::ErrorCode ToWire(StatusCode code) {
  switch (code) {
    case StatusCode::kOk:
      return wire::ErrorCode::OK;
    case StatusCode::kInvalidArgument:
      return wire::ErrorCode::INVALID_ARGUMENT;
    case StatusCode::kNotFound:
      return wire::ErrorCode::NOT_FOUND;
    case StatusCode::kFailedPrecondition:
      return wire::ErrorCode::FAILED_PRECONDITION;
    case StatusCode::kUnavailable:
      return wire::ErrorCode::UNAVAILABLE;
    case StatusCode::kDeadlineExceeded:
      return wire::ErrorCode::DEADLINE_EXCEEDED;
    case StatusCode::kInternal:
      return wire::ErrorCode::INTERNAL;
    case StatusCode::kVersionMismatch:
      return wire::ErrorCode::VERSION_MISMATCH;
    case StatusCode::kAborted:
      return wire::ErrorCode::ABORTED;
  }
  return wire::ErrorCode::INTERNAL;
}

StatusCode FromWire(wire::ErrorCode code) {
  switch (code) {
    case wire::ErrorCode::OK:
      return StatusCode::kOk;
    case wire::ErrorCode::INVALID_ARGUMENT:
      return StatusCode::kInvalidArgument;
    case wire::ErrorCode::NOT_FOUND:
      return StatusCode::kNotFound;
    case wire::ErrorCode::FAILED_PRECONDITION:
      return StatusCode::kFailedPrecondition;
    case wire::ErrorCode::UNAVAILABLE:
      return StatusCode::kUnavailable;
    case wire::ErrorCode::DEADLINE_EXCEEDED:
      return StatusCode::kDeadlineExceeded;
    case wire::ErrorCode::INTERNAL:
      return StatusCode::kInternal;
    case wire::ErrorCode::VERSION_MISMATCH:
      return StatusCode::kVersionMismatch;
    case wire::ErrorCode::ABORTED:
      return StatusCode::kAborted;
  }
  return StatusCode::kInternal;
}

Frames ErrorReply(uint64_t request_id, int32_t sender_id, const Status& status) {
  capnp::MallocMessageBuilder b;
  auto h = NewHeader(b, request_id, sender_id);
  auto e = h.getBody().initError();
  e.setCode(ToWire(status.code()));
  e.setMessage(status.message());
  Frames f;
  f.push_back(EncodeFrame(b));
  return f;
}

Status StatusFromError(wire::Error::Reader error) {
  StatusCode code = FromWire(error.getCode());
  if (code == StatusCode::kOk) code = StatusCode::kInternal;  // an error must not read as OK
  return Status(code, error.getMessage().cStr());
}

Result<CallReply> Call(ClientSocket& socket, Frames request, std::chrono::milliseconds timeout) {
  PS_RETURN_IF_ERROR(socket.Send(std::move(request)));
  PS_ASSIGN_OR_RETURN(Frames frames, socket.Recv(timeout));
  if (frames.empty()) return InvalidArgument("empty reply from " + socket.Endpoint());
  PS_ASSIGN_OR_RETURN(DecodedHeader header, DecodedHeader::Decode(frames[0]));
  try {
    PS_RETURN_IF_ERROR(CheckProtocolVersion(header.get()));
    if (header.get().getBody().which() == wire::Header::Body::ERROR) {
      return StatusFromError(header.get().getBody().getError());
    }
  } catch (const kj::Exception& e) {
    return InvalidArgument(std::string("malformed reply: ") + e.getDescription().cStr());
  }
  return CallReply{std::move(header), std::move(frames)};
}

}  // namespace ps
