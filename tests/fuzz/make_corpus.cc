// Writes the binary seed inputs of the fuzz targets: valid headers of every message type
// (fuzz_wire_decode), request sequences that reach pushes, pulls, held pulls and clock
// ticks (fuzz_server_core) and a tiny IDX pair, plain and gzip (fuzz_idx). The text seeds
// (fuzz_job_config, fuzz_libsvm) are kept by hand.
//
//   build-fuzz/fuzz/ps_fuzz_make_corpus tests/fuzz/corpus
//
// Rerun it after a change to common/protocol.capnp or to the input layout of a target, and
// commit what changed. Output is deterministic.
#include <zlib.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "common/protocol.capnp.h"
#include "common/wire.h"

namespace ps::fuzz {
namespace {

using Bytes = std::vector<uint8_t>;

void Write(const std::filesystem::path& path, const Bytes& bytes) {
  std::filesystem::create_directories(path.parent_path());
  FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr || std::fwrite(bytes.data(), 1, bytes.size(), f) != bytes.size() ||
      std::fclose(f) != 0) {
    std::fprintf(stderr, "make_corpus: cannot write %s\n", path.c_str());
    std::exit(1);
  }
}

Bytes Encode(capnp::MallocMessageBuilder& b) {
  zmq::message_t frame = EncodeFrame(b);
  const auto* p = static_cast<const uint8_t*>(frame.data());
  return Bytes(p, p + frame.size());
}

void Append(Bytes& out, const Bytes& more) { out.insert(out.end(), more.begin(), more.end()); }

void AppendLe(Bytes& out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<uint8_t>(v >> (8 * i)));
}

// A gzip stream (what gzopen reads), level 9, no name or time: the same bytes every run.
Bytes Gzip(const Bytes& in) {
  z_stream z{};
  if (deflateInit2(&z, 9, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY) != Z_OK) std::exit(1);
  Bytes out(deflateBound(&z, in.size()) + 32);
  z.next_in = const_cast<Bytes::value_type*>(in.data());
  z.avail_in = static_cast<uInt>(in.size());
  z.next_out = out.data();
  z.avail_out = static_cast<uInt>(out.size());
  if (deflate(&z, Z_FINISH) != Z_STREAM_END) std::exit(1);
  out.resize(z.total_out);
  deflateEnd(&z);
  return out;
}

// ---- fuzz_wire_decode: one valid header per message type ----

void WireSeeds(const std::filesystem::path& dir) {
  auto emit = [&](const std::string& name, auto fill) {
    capnp::MallocMessageBuilder b;
    auto h = NewHeader(b, 42, 1);
    fill(h.getBody());
    Write(dir / name, Encode(b));
  };
  emit("register", [](auto body) {
    auto r = body.initRegister();
    r.setRole(wire::Role::WORKER);
    r.setEndpoint("tcp://127.0.0.1:7001");
    r.setDevice("cpu: 2 threads");
    r.setHost("host");
    r.setPid(1234);
    r.setRequestedId(1);
  });
  emit("register_reply", [](auto body) {
    auto r = body.initRegisterReply();
    r.setId(1);
    auto config = r.initConfig(4);
    const char* kv[4][2] = {{"model", "none"},
                            {"tables", "d:16:4:uniform:1,s:sparse:3:normal:0.1"},
                            {"num_servers", "2"},
                            {"staleness", "1"}};
    for (unsigned i = 0; i < 4; ++i) {
      config[i].setKey(kv[i][0]);
      config[i].setValue(kv[i][1]);
    }
    auto map = r.initShardMap();
    map.setVersion(3);
    auto servers = map.initServers(2);
    servers[0].setId(0);
    servers[0].setEndpoint("tcp://127.0.0.1:7100");
    servers[1].setId(1);
    servers[1].setEndpoint("tcp://127.0.0.1:7101");
  });
  emit("push_range", [](auto body) {
    auto p = body.initPush();
    p.setTableId(0);
    p.getKeys().initRange().setBegin(0);
    p.getKeys().getRange().setEnd(16);
    p.setClock(3);
    p.setPulledVersion(2);
  });
  emit("push_list", [](auto body) {
    auto p = body.initPush();
    p.setTableId(1);
    p.getKeys().setListCount(5);
    p.setClock(1);
  });
  emit("push_reply", [](auto body) {
    auto r = body.initPushReply();
    r.setRowsApplied(16);
    r.setStaleness(1);
    r.setLearningRate(0.1);
  });
  emit("pull", [](auto body) {
    auto p = body.initPull();
    p.setTableId(0);
    p.getKeys().initRange().setBegin(2);
    p.getKeys().getRange().setEnd(9);
    p.setClock(4);
  });
  emit("pull_reply", [](auto body) {
    auto r = body.initPullReply();
    r.setRows(7);
    r.setVersion(5);
    r.setClockLag(1);
    r.setHeldMicros(250);
  });
  emit("error", [](auto body) {
    auto e = body.initError();
    e.setCode(wire::ErrorCode::NOT_FOUND);
    e.setMessage("table id 7 is unknown: the job has 2 tables");
  });
  emit("report", [](auto body) {
    body.initReport().setJson(R"({"kind":"train","epoch":1,"loss":0.5,"examples":640})");
  });
  emit("done", [](auto body) {
    auto d = body.initDone();
    d.setJson(R"({"examples":60000,"device":"cpu","seconds":12.5})");
    d.setFailed(true);
    d.setMessage("out of data");
  });
  emit("shutdown_reply", [](auto body) {
    auto s = body.initShutdownReply();
    s.setPushesApplied(10);
    s.setPullsServed(12);
    s.setMaxClockLag(2);
    auto hist = s.initStalenessHistogram(3);
    hist.set(0, 4);
    hist.set(1, 5);
    hist.set(2, 1);
    s.setStalenessSum(7);
    s.setStalenessMax(2);
  });
  emit("clock", [](auto body) { body.initClock().setClock(7); });
  emit("clock_reply", [](auto body) { body.initClockReply().setMinClock(6); });
  emit("lease", [](auto body) {
    auto l = body.initLease();
    l.setDatasetSize(60000);
    l.setCompletedEpoch(1);
    l.setCompletedChunk(3);
    l.setExamplesPerSec(8000);
    l.setWait(true);
  });
  emit("lease_reply", [](auto body) {
    auto r = body.initLeaseReply();
    auto c = r.initChunk();
    c.setEpoch(2);
    c.setIndex(4);
    c.setBegin(8192);
    c.setEnd(10240);
    r.setBatchSize(64);
    r.setEvaluateEpoch(1);
  });
  emit("heartbeat", [](auto body) { body.setHeartbeat(); });
}

// ---- fuzz_server_core: request sequences in the layout of fuzz_server_core.cc ----

enum Kind : uint8_t { kPush = 0, kPull = 1, kClock = 2, kHeartbeat = 3, kShutdown = 4 };
enum Flags : uint8_t { kList = 1, kLeave = 2 };

// A built request: ctrl (frames - 1, built), the header's fields, then payload frames.
void Built(Bytes& out, Kind kind, uint8_t flags, int8_t sender, uint8_t table, uint64_t a,
           uint64_t b, int64_t clock, uint64_t version, const std::vector<Bytes>& payload) {
  out.push_back(static_cast<uint8_t>(payload.size() | 4));
  out.push_back(kind);
  out.push_back(flags);
  out.push_back(static_cast<uint8_t>(sender));
  out.push_back(table);
  AppendLe(out, a, 8);
  AppendLe(out, b, 8);
  AppendLe(out, static_cast<uint64_t>(clock), 8);
  AppendLe(out, version, 8);
  for (const Bytes& p : payload) {
    AppendLe(out, p.size(), 2);
    Append(out, p);
  }
}

Bytes Floats(size_t n, float start, float step) {
  Bytes out;
  for (size_t i = 0; i < n; ++i) {
    float x = start + step * static_cast<float>(i);
    uint32_t bits;
    std::memcpy(&bits, &x, sizeof(bits));
    AppendLe(out, bits, 4);
  }
  return out;
}

Bytes Keys(const std::vector<uint64_t>& keys) {
  Bytes out;
  for (uint64_t k : keys) AppendLe(out, k, 8);
  return out;
}

void ServerCoreSeeds(const std::filesystem::path& dir) {
  // Table 0: dense, 16 rows x 4; table 1: sparse, width 3. Config 0: adam, staleness 1.
  {
    Bytes s = {0};
    Built(s, kPull, 0, 0, 0, 0, 16, 0, 0, {});
    Built(s, kPush, 0, 0, 0, 0, 16, 0, 0, {Floats(64, -0.5f, 0.015625f)});
    Built(s, kPull, 0, 1, 0, 4, 8, 0, 0, {});
    // Refused: a NaN among the gradients.
    Bytes nan_grads = Floats(8, 0.0f, 1.0f);
    nan_grads[14] = 0xc0;
    nan_grads[15] = 0x7f;
    Built(s, kPush, 0, 0, 0, 2, 4, 0, 0, {nan_grads});
    Write(dir / "dense_pull_push", s);
  }
  {
    Bytes s = {0};
    Built(s, kPush, kList, 1, 1, 2, 0, 0, 0, {Keys({3, 1ull << 63}), Floats(6, 0.25f, -0.1f)});
    Built(s, kPull, kList, 1, 1, 3, 0, 0, 0, {Keys({3, 77, 1ull << 63})});
    Built(s, kPush, kList, 0, 0, 2, 0, 0, 0, {Keys({15, 0}), Floats(8, 1.0f, 0.5f)});
    Write(dir / "list_push_pull", s);
  }
  {
    // A pull beyond the bound is held, then released by the other worker's tick.
    Bytes s = {0};
    Built(s, kPull, 0, 0, 0, 0, 16, 2, 0, {});
    Built(s, kClock, 0, 0, 0, 0, 0, 2, 0, {});
    Built(s, kClock, 0, 1, 0, 0, 0, 1, 0, {});
    Built(s, kClock, kLeave, 1, 0, 0, 0, 0, 0, {});
    Write(dir / "held_pull_released", s);
  }
  {
    // Held, then expired: ctrl bit 4 moves the clock past --staleness_wait_seconds.
    Bytes s = {0};
    Built(s, kPull, 0, 1, 0, 0, 4, 5, 0, {});
    s.push_back(4 | 16);  // a heartbeat, then expire
    s.push_back(kHeartbeat);
    for (int i = 0; i < 35; ++i) s.push_back(0);
    Write(dir / "held_pull_expired", s);
  }
  {
    // Config 2: asynchronous, adamw, gradients more than 2 versions stale dropped.
    Bytes s = {2};
    for (int i = 0; i < 4; ++i) {
      Built(s, kPush, 0, static_cast<int8_t>(i % 2), 0, 0, 16, i, 0,
            {Floats(64, 0.1f * static_cast<float>(i), 0.01f)});
    }
    Write(dir / "async_stale_drop", s);
  }
  {
    // Config 5: server 1 of 2 holds dense rows [8, 16).
    Bytes s = {5};
    Built(s, kPush, 0, 0, 0, 8, 16, 0, 0, {Floats(32, -1.0f, 0.0625f)});
    Built(s, kPush, 0, 0, 0, 0, 8, 0, 0, {Floats(32, -1.0f, 0.0625f)});
    Built(s, kPull, kList, 0, 0, 2, 0, 0, 0, {Keys({9, 15})});
    Write(dir / "second_server", s);
  }
  {
    // Configs 1, 3, 4: sgd with clipping, nesterov (BSP), adagrad on a cosine schedule.
    for (uint8_t config : {1, 3, 4}) {
      Bytes s = {config};
      Built(s, kPush, 0, 0, 0, 0, 16, 0, 0, {Floats(64, 2.0f, -0.0625f)});
      Built(s, kClock, 0, 0, 0, 0, 0, 1, 0, {});
      Built(s, kPush, 0, 0, 0, 0, 16, 1, 1, {Floats(64, -1.0f, 0.03125f)});
      Write(dir / ("optimizer_config_" + std::to_string(config)), s);
    }
  }
  {
    // A raw header frame (a heartbeat), then a shutdown.
    capnp::MallocMessageBuilder b;
    NewHeader(b, 9, 0).getBody().setHeartbeat();
    Bytes frame = Encode(b);
    Bytes s = {0, 0};
    AppendLe(s, frame.size(), 2);
    Append(s, frame);
    Built(s, kShutdown, 0, 0, 0, 0, 0, 0, 0, {});
    Write(dir / "raw_heartbeat_shutdown", s);
  }
}

// ---- fuzz_idx: images length u16, images file, labels file ----

void IdxSeeds(const std::filesystem::path& dir) {
  Bytes images;
  AppendLe(images, 0, 2);  // magic 0x00000803, big-endian
  images.push_back(0x08);
  images.push_back(0x03);
  for (uint32_t dim : {2u, 2u, 3u}) {
    for (int shift = 24; shift >= 0; shift -= 8)
      images.push_back(static_cast<uint8_t>(dim >> shift));
  }
  for (uint8_t p : {0, 17, 255, 128, 3, 64, 200, 1, 99, 250, 0, 255}) images.push_back(p);
  Bytes labels = {0, 0, 0x08, 0x01, 0, 0, 0, 2, 7, 3};
  auto pair = [](const Bytes& im, const Bytes& lb) {
    Bytes s;
    AppendLe(s, im.size(), 2);
    Append(s, im);
    Append(s, lb);
    return s;
  };
  Write(dir / "plain_pair", pair(images, labels));
  Write(dir / "gzip_pair", pair(Gzip(images), Gzip(labels)));
}

}  // namespace
}  // namespace ps::fuzz

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s CORPUS_DIR (e.g. tests/fuzz/corpus)\n", argv[0]);
    return 2;
  }
  const std::filesystem::path root = argv[1];
  ps::fuzz::WireSeeds(root / "fuzz_wire_decode");
  ps::fuzz::ServerCoreSeeds(root / "fuzz_server_core");
  ps::fuzz::IdxSeeds(root / "fuzz_idx");
  return 0;
}
