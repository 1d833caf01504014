// Fuzzes header decoding: bytes -> DecodedHeader::Decode, then every field of whatever
// body the header carries, read the way the processes that receive it read it.
//
// Decode validates the message's framing and the root; Cap'n Proto checks the rest lazily,
// as each pointer is followed, and reports a bad one by throwing kj::Exception. The
// processes catch kj::Exception around their handling and turn it into an error, so the
// same here: a kj::Exception is a handled rejection; a crash or a sanitizer report is a bug.
#include <capnp/message.h>
#include <kj/exception.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <zmq.hpp>

#include "common/job_config.h"
#include "common/protocol.capnp.h"
#include "common/wire.h"
#include "tests/fuzz/fuzz_util.h"

namespace ps::fuzz {
namespace {

// Elements read of each list. The decode limits let a header of a few hundred bytes
// declare about a million empty list elements (each counts one word of the traversal
// limit); walking them all takes about a second here and starves the fuzzer, while every
// element after the first few runs the same code.
constexpr unsigned kMaxListElements = 4096;

template <typename List>
unsigned Walked(List list) {
  return list.size() < kMaxListElements ? list.size() : kMaxListElements;
}

void WalkText(capnp::Text::Reader text) {
  // cStr() is what the consumers call; it relies on the NUL that the reader checked.
  Consume(std::string_view(text.cStr(), text.size()));
}

void WalkKeys(wire::Keys::Reader keys) {
  switch (keys.which()) {
    case wire::Keys::RANGE:
      Consume(keys.getRange().getBegin());
      Consume(keys.getRange().getEnd());
      break;
    case wire::Keys::LIST_COUNT:
      Consume(keys.getListCount());
      break;
  }
}

// The coordinator parses worker reports and totals as JSON, without exceptions.
void WalkJson(capnp::Text::Reader text) {
  nlohmann::json j = nlohmann::json::parse(text.cStr(), nullptr, /*allow_exceptions=*/false);
  Consume(j.is_discarded() ? 0 : j.size());
}

void WalkRegisterReply(wire::RegisterReply::Reader r) {
  Consume(r.getId());
  // What registration does with the config: a flag map, parsed by JobConfig.
  std::map<std::string, std::string> flags;
  auto config = r.getConfig();
  for (unsigned i = 0; i < Walked(config); ++i) {
    auto kv = config[i];
    WalkText(kv.getKey());
    WalkText(kv.getValue());
    flags[kv.getKey().cStr()] = kv.getValue().cStr();
  }
  Result<JobConfig> parsed = JobConfig::FromFlagMap(flags);
  Consume(parsed.ok() ? parsed->table_specs.size() : 0);
  auto map = r.getShardMap();
  Consume(map.getVersion());
  auto servers = map.getServers();
  for (unsigned i = 0; i < Walked(servers); ++i) {
    Consume(servers[i].getId());
    WalkText(servers[i].getEndpoint());
  }
}

void WalkServerStats(wire::ServerStats::Reader s) {
  Consume(s.getPushesApplied());
  Consume(s.getPushesRejected());
  Consume(s.getPullsServed());
  Consume(s.getBytesPushed());
  Consume(s.getBytesPulled());
  Consume(s.getRowsHeld());
  Consume(s.getPushesDropped());
  Consume(s.getPullsHeld());
  Consume(static_cast<uint64_t>(s.getMaxClockLag()));
  auto histogram = s.getStalenessHistogram();
  for (unsigned i = 0; i < Walked(histogram); ++i) Consume(histogram[i]);
  Consume(s.getStalenessSum());
  Consume(s.getStalenessMax());
}

void WalkLeaseReply(wire::LeaseReply::Reader r) {
  switch (r.which()) {
    case wire::LeaseReply::CHUNK: {
      auto c = r.getChunk();
      Consume(static_cast<uint64_t>(c.getEpoch()));
      Consume(c.getIndex());
      Consume(c.getBegin());
      Consume(c.getEnd());
      break;
    }
    case wire::LeaseReply::WAIT:
    case wire::LeaseReply::FINISHED:
      break;
  }
  Consume(r.getBatchSize());
  Consume(static_cast<uint64_t>(r.getEvaluateEpoch()));
}

// Every arm of Header::Body, field by field.
void WalkHeader(wire::Header::Reader h) {
  Consume(h.getProtocolVersion());
  Consume(h.getRequestId());
  Consume(static_cast<uint64_t>(h.getSenderId()));
  Consume(CheckProtocolVersion(h).ok());
  auto body = h.getBody();
  switch (body.which()) {
    case wire::Header::Body::REGISTER: {
      auto r = body.getRegister();
      Consume(static_cast<uint64_t>(r.getRole()));
      WalkText(r.getEndpoint());
      WalkText(r.getDevice());
      WalkText(r.getHost());
      Consume(r.getPid());
      Consume(static_cast<uint64_t>(r.getRequestedId()));
      break;
    }
    case wire::Header::Body::REGISTER_REPLY:
      WalkRegisterReply(body.getRegisterReply());
      break;
    case wire::Header::Body::PUSH: {
      auto p = body.getPush();
      Consume(p.getTableId());
      WalkKeys(p.getKeys());
      Consume(static_cast<uint64_t>(p.getClock()));
      Consume(p.getPulledVersion());
      break;
    }
    case wire::Header::Body::PUSH_REPLY: {
      auto r = body.getPushReply();
      Consume(r.getRowsApplied());
      Consume(r.getStaleness());
      Consume(static_cast<uint64_t>(r.getLearningRate() > 0));
      Consume(r.getDropped());
      break;
    }
    case wire::Header::Body::PULL: {
      auto p = body.getPull();
      Consume(p.getTableId());
      WalkKeys(p.getKeys());
      Consume(static_cast<uint64_t>(p.getClock()));
      break;
    }
    case wire::Header::Body::PULL_REPLY: {
      auto r = body.getPullReply();
      Consume(r.getRows());
      Consume(r.getVersion());
      Consume(static_cast<uint64_t>(r.getClockLag()));
      Consume(r.getHeldMicros());
      break;
    }
    case wire::Header::Body::ERROR: {
      auto e = body.getError();
      Consume(static_cast<uint64_t>(e.getCode()));
      WalkText(e.getMessage());
      // Callers turn an error body into a Status; it must never read as OK.
      Status s = StatusFromError(e);
      if (s.ok()) __builtin_trap();
      Consume(s.message());
      break;
    }
    case wire::Header::Body::REPORT:
      WalkText(body.getReport().getJson());
      WalkJson(body.getReport().getJson());
      break;
    case wire::Header::Body::DONE: {
      auto d = body.getDone();
      WalkText(d.getJson());
      WalkJson(d.getJson());
      Consume(d.getFailed());
      WalkText(d.getMessage());
      break;
    }
    case wire::Header::Body::SHUTDOWN_REPLY:
      WalkServerStats(body.getShutdownReply());
      break;
    case wire::Header::Body::CLOCK: {
      auto c = body.getClock();
      Consume(static_cast<uint64_t>(c.getClock()));
      Consume(c.getLeave());
      break;
    }
    case wire::Header::Body::CLOCK_REPLY:
      Consume(static_cast<uint64_t>(body.getClockReply().getMinClock()));
      break;
    case wire::Header::Body::LEASE: {
      auto l = body.getLease();
      Consume(l.getDatasetSize());
      Consume(static_cast<uint64_t>(l.getCompletedEpoch()));
      Consume(l.getCompletedChunk());
      Consume(static_cast<uint64_t>(l.getExamplesPerSec() > 0));
      Consume(l.getWait());
      break;
    }
    case wire::Header::Body::LEASE_REPLY:
      WalkLeaseReply(body.getLeaseReply());
      break;
    case wire::Header::Body::REPORT_REPLY:
    case wire::Header::Body::DONE_REPLY:
    case wire::Header::Body::SHUTDOWN:
    case wire::Header::Body::HEARTBEAT:
    case wire::Header::Body::HEARTBEAT_REPLY:
      break;
    default:
      // A union tag this build does not know (a newer peer): readers answer with an error.
      Consume(static_cast<uint64_t>(body.which()));
      break;
  }
}

}  // namespace
}  // namespace ps::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  zmq::message_t frame(data, size);
  ps::Result<ps::DecodedHeader> decoded = ps::DecodedHeader::Decode(frame);
  if (!decoded.ok()) {
    // Errors must say what was wrong.
    if (decoded.status().message().empty()) __builtin_trap();
    return 0;
  }
  try {
    ps::fuzz::WalkHeader(decoded->get());
  } catch (const kj::Exception& e) {
    ps::fuzz::Consume(std::string_view(e.getDescription().cStr()));
  }
  return 0;
}
