// Fuzzes the server's request handling in process: sequences of requests, each of 1-4
// frames, through ServerCore::Handle (and ExpireHeldPulls), checking after every request
// what must hold whatever a peer sends:
//   - every reply is a decodable header frame;
//   - every stored value of the dense table (and of the sparse rows the input pushed to)
//     is finite: non-finite gradients are refused, never applied;
//   - a request that was not an applied push leaves the dense table exactly as it was.
// A violation traps, so that libFuzzer saves the input.
//
// Input layout (ps::fuzz::ByteReader; reads past the end give zeros):
//   config       u8: which of kConfigs (mod its size)
//   then up to kMaxRequests requests, while input remains:
//     ctrl       u8: bits 0-1 frames - 1; bit 2 frame 0 is a header built from the fields
//                    below (else raw bytes); bit 3 peer "w1" (else "w0"); bit 4 afterwards
//                    expire held pulls as if their wait had run out
//     if built:  kind u8 (push, pull, clock, heartbeat, shutdown, other), flags u8 (bit 0
//                keys as a list, else a range; bit 1 clock tick leaves; bit 2 a wrong
//                protocol version), sender i8, table u8, a u64 (range begin or list
//                count), b u64 (range end), clock i64, pulled version u64
//     frames     each a u16 little-endian length and that many bytes (frame 0 only when
//                not built)
// Built headers get past decoding into the deep code; raw ones test decoding in place.
//
// The core is built afresh for each input (from a config parsed once) so that an input's
// outcome depends on that input alone and every saved crash reproduces by itself.
#include <kj/exception.h>

#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>
#include <zmq.hpp>

#include "common/job_config.h"
#include "common/protocol.capnp.h"
#include "common/wire.h"
#include "server/server_core.h"
#include "tests/fuzz/fuzz_util.h"

namespace ps::fuzz {
namespace {

constexpr size_t kMaxRequests = 8;
constexpr uint32_t kDenseTable = 0;
constexpr uint64_t kDenseRows = 16;
constexpr uint32_t kSparseTable = 1;
constexpr size_t kMaxSparseKeysChecked = 64;

// Small jobs with the same two tables and different optimizers and consistency models, so
// that every update rule and both the bounded and the asynchronous paths are reachable.
struct FuzzJob {
  JobConfig config;
  int server_id;
};

const std::vector<FuzzJob>& Jobs() {
  static const std::vector<FuzzJob> jobs = [] {
    const std::map<std::string, std::string> base = {
        {"model", "none"},    {"tables", "d:16:4:uniform:1,s:sparse:3:normal:0.1"},
        {"num_servers", "1"}, {"num_workers", "2"},
        {"staleness", "1"},   {"optimizer", "adam"},
    };
    const std::vector<std::pair<int, std::map<std::string, std::string>>> variants = {
        {0, {}},
        {0,
         {{"optimizer", "sgd"},
          {"clip_grad_norm", "1"},
          {"weight_decay", "0.01"},
          {"lr_policy", "step"},
          {"stepsize", "3"}}},
        {0,
         {{"optimizer", "adamw"},
          {"weight_decay", "0.1"},
          {"staleness", "-1"},
          {"max_grad_staleness", "2"},
          {"staleness_lr", "inverse"}}},
        {0, {{"optimizer", "nesterov"}, {"staleness", "0"}, {"table_staleness", "s:-1"}}},
        {0,
         {{"optimizer", "adagrad"},
          {"lr_policy", "cosine"},
          {"max_iter", "100"},
          {"warmup_iters", "5"}}},
        // The second of two servers: half the dense rows live elsewhere.
        {1, {{"optimizer", "momentum"}, {"num_servers", "2"}, {"staleness_lr", "sqrt"}}},
    };
    std::vector<FuzzJob> out;
    for (const auto& [server_id, overrides] : variants) {
      std::map<std::string, std::string> flags = base;
      for (const auto& [k, v] : overrides) flags[k] = v;
      Result<JobConfig> config = JobConfig::FromFlagMap(flags);
      if (!config.ok()) {
        std::fprintf(stderr, "fuzz_server_core: bad job config: %s\n",
                     config.status().ToString().c_str());
        std::abort();
      }
      out.push_back(FuzzJob{std::move(config).value(), server_id});
    }
    return out;
  }();
  return jobs;
}

enum class Kind : uint8_t { kPush, kPull, kClock, kHeartbeat, kShutdown, kOther, kCount };

zmq::message_t Frame(std::string_view bytes) { return zmq::message_t(bytes.data(), bytes.size()); }

// A valid header frame with fuzzed field values.
zmq::message_t BuildHeader(ByteReader& in) {
  const auto kind = static_cast<Kind>(in.U8() % static_cast<uint8_t>(Kind::kCount));
  const uint8_t flags = in.U8();
  const auto sender = static_cast<int8_t>(in.U8());
  const uint32_t table = in.U8();
  const uint64_t a = in.U64();
  const uint64_t b = in.U64();
  const auto clock = static_cast<int64_t>(in.U64());
  const uint64_t version = in.U64();

  capnp::MallocMessageBuilder builder;
  auto h = NewHeader(builder, /*request_id=*/a ^ b, sender);
  if (flags & 4) h.setProtocolVersion(wire::PROTOCOL_VERSION + 1);
  auto set_keys = [&](wire::Keys::Builder keys) {
    if (flags & 1) {
      keys.setListCount(a);
    } else {
      keys.initRange().setBegin(a);
      keys.getRange().setEnd(b);
    }
  };
  switch (kind) {
    case Kind::kPush: {
      auto p = h.getBody().initPush();
      p.setTableId(table);
      set_keys(p.initKeys());
      p.setClock(clock);
      p.setPulledVersion(version);
      break;
    }
    case Kind::kPull: {
      auto p = h.getBody().initPull();
      p.setTableId(table);
      set_keys(p.initKeys());
      p.setClock(clock);
      break;
    }
    case Kind::kClock: {
      auto c = h.getBody().initClock();
      c.setClock(clock);
      c.setLeave((flags & 2) != 0);
      break;
    }
    case Kind::kHeartbeat:
      h.getBody().setHeartbeat();
      break;
    case Kind::kShutdown:
      h.getBody().setShutdown();
      break;
    case Kind::kOther:
    case Kind::kCount:
      h.getBody().initReportReply();  // a message type servers do not handle
      break;
  }
  return EncodeFrame(builder);
}

// PS_FUZZ_TRACE=1 prints every reply: for checking by hand what a seed reaches.
bool Tracing() {
  static const bool trace = std::getenv("PS_FUZZ_TRACE") != nullptr;
  return trace;
}

// Every reply must be a header a peer can decode.
void CheckReplies(const std::vector<Outgoing>& out) {
  for (const Outgoing& o : out) {
    if (o.frames.empty()) __builtin_trap();
    Result<DecodedHeader> h = DecodedHeader::Decode(o.frames[0]);
    if (!h.ok()) __builtin_trap();
    if (Tracing()) {
      std::fprintf(stderr, "  -> %s: %s (+%zu frames)\n", o.peer.c_str(), kj::str(h->get()).cStr(),
                   o.frames.size() - 1);
    }
  }
}

// The dense table's values as this server holds them, in row order.
std::vector<float> DenseSnapshot(ServerCore& core) {
  std::vector<float> all;
  for (uint64_t r = 0; r < kDenseRows; ++r) {
    Result<std::vector<float>> row = core.ReadRow(kDenseTable, r);
    if (!row.ok()) continue;  // held by the other server
    all.insert(all.end(), row->begin(), row->end());
  }
  return all;
}

void CheckFinite(const std::vector<float>& values) {
  for (float x : values) {
    if (!std::isfinite(x)) __builtin_trap();
  }
}

// Bitwise, so that -0 vs 0 counts as a change and NaN equals itself.
bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

void RunInput(const uint8_t* data, size_t size) {
  ByteReader in(data, size);
  const std::vector<FuzzJob>& jobs = Jobs();
  const FuzzJob& job = jobs[in.U8() % jobs.size()];
  Result<std::unique_ptr<ServerCore>> created = ServerCore::Create(job.config, job.server_id);
  if (!created.ok()) __builtin_trap();  // the configs above are valid
  ServerCore& core = **created;
  std::vector<uint64_t> sparse_keys;

  for (size_t n = 0; n < kMaxRequests && in.remaining() > 0; ++n) {
    const uint8_t ctrl = in.U8();
    const size_t num_frames = (ctrl & 3) + 1;
    const bool built = (ctrl & 4) != 0;
    const std::string peer = (ctrl & 8) ? "w1" : "w0";

    Frames request;
    bool sparse_list_push = false;
    if (built) request.push_back(BuildHeader(in));
    while (request.size() < num_frames) request.push_back(Frame(in.LengthPrefixed()));
    if (built && num_frames >= 2) {
      Result<DecodedHeader> h = DecodedHeader::Decode(request[0]);
      if (h.ok() && h->get().getBody().isPush() &&
          h->get().getBody().getPush().getTableId() == kSparseTable) {
        sparse_list_push = h->get().getBody().getPush().getKeys().isListCount();
      }
    }
    if (sparse_list_push && request[1].size() % sizeof(uint64_t) == 0) {
      // Keys the push may create or update; checked below.
      const auto* k = static_cast<const uint8_t*>(request[1].data());
      for (size_t i = 0; i + 8 <= request[1].size(); i += 8) {
        if (sparse_keys.size() >= kMaxSparseKeysChecked) break;
        uint64_t key;
        std::memcpy(&key, k + i, sizeof(key));
        sparse_keys.push_back(key);
      }
    }

    const std::vector<float> before = DenseSnapshot(core);
    const uint64_t applied_before = core.stats().pushes_applied;
    std::vector<Outgoing> out;
    ServerCore::After after = ServerCore::After::kContinue;
    core.Handle(peer, request, &out, &after);
    auto now = ServerCore::Clock::now();
    if (ctrl & 16) now += std::chrono::hours(24 * 365);
    core.ExpireHeldPulls(now, &out);
    CheckReplies(out);

    const std::vector<float> after_values = DenseSnapshot(core);
    CheckFinite(after_values);
    if (core.stats().pushes_applied == applied_before && !SameBits(before, after_values)) {
      __builtin_trap();  // the model changed without an applied push
    }
    for (uint64_t key : sparse_keys) {
      Result<std::vector<float>> row = core.ReadRow(kSparseTable, key);
      if (row.ok()) CheckFinite(*row);
    }
  }
  // Whatever is still held gets its (error) answer: that path must hold up too.
  std::vector<Outgoing> out;
  core.ExpireHeldPulls(ServerCore::Clock::now() + std::chrono::hours(24 * 365), &out);
  CheckReplies(out);
  if (core.held_pulls() != 0) __builtin_trap();
}

}  // namespace
}  // namespace ps::fuzz

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  // Quiet: a failed request is the normal case here, and logging each one costs more than
  // handling it.
  FLAGS_minloglevel = 2;
  (void)ps::fuzz::Jobs();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  ps::fuzz::RunInput(data, size);
  return 0;
}
