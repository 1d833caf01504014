// A server's request handling, without sockets: one request's frames in, the reply's
// frames out. Keeping it free of I/O makes it testable in process and fuzzable.
//
// Every request is checked completely before anything changes: a malformed header, an
// unknown table, a key this server does not hold, a payload of the wrong length, or a
// NaN/Inf gradient gets an error reply and leaves the model exactly as it was.
//
// Thread model: not thread-safe; the server's request loop (ServerLoop) owns it.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "common/job_config.h"
#include "common/shard_map.h"
#include "common/status.h"
#include "common/transport.h"
#include "common/wire.h"
#include "server/optimizer.h"
#include "server/table.h"

namespace ps {

struct ServerStats {
  uint64_t pushes_applied = 0;
  uint64_t pushes_rejected = 0;  // bad pushes answered with an error
  uint64_t pulls_served = 0;
  uint64_t bad_requests = 0;     // every request answered with an error
  uint64_t bytes_pushed = 0;     // gradient payload bytes applied
  uint64_t bytes_pulled = 0;     // value payload bytes sent
  uint64_t rows_held = 0;
};

class ServerCore {
 public:
  static Result<std::unique_ptr<ServerCore>> Create(const JobConfig& config, int server_id);

  // What the request loop should do after sending the reply.
  enum class After { kContinue, kShutdown };

  // Handles one request. Never throws; *after tells whether the server should stop.
  Frames Handle(Frames& request, After* after);

  ServerStats stats() const;
  int server_id() const { return server_id_; }
  const ShardMap& shard_map() const { return shard_map_; }
  // For tests: the stored values of one row (width floats), or NotFound.
  Result<std::vector<float>> ReadRow(uint32_t table, uint64_t key);

 private:
  ServerCore(const JobConfig& config, int server_id, std::unique_ptr<Optimizer> optimizer);
  // The rows a push or pull addresses, validated against the table and the frames.
  struct Addressed {
    Table* table = nullptr;
    bool is_range = false;
    RowRange range;
    std::span<const uint64_t> keys;
    size_t rows = 0;
    size_t next_frame = 1;  // index of the first frame after the keys
  };
  Result<Addressed> Address(uint32_t table_id, wire::Keys::Reader keys, const Frames& request);
  Result<Frames> HandlePush(wire::Header::Reader h, const Frames& request);
  Result<Frames> HandlePull(wire::Header::Reader h, const Frames& request);

  JobConfig config_;
  int server_id_;
  ShardMap shard_map_;
  std::unique_ptr<Optimizer> optimizer_;
  std::vector<Table> tables_;
  ServerStats stats_;
};

}  // namespace ps
