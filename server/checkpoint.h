// Checkpoint files: a server's shard of the model at a clock, written so that a file that
// exists under its final name is complete, and a damaged one is detected.
//
// Layout of DIR/clock-<C, 12 digits>/server-<id>.ckpt (little-endian):
//   "PSCKPT02" (or "PSCKPT01", the format before, still read), then the body the server
//   writes through CheckpointWriter::Append, then the CRC-32 (zlib) of everything before it
//   (u32) and "PSCKEND!".
// Written to "<name>.tmp", fsynced, renamed, and the directory fsynced: a crash leaves
// either no file or a whole one; a truncated or altered file fails its CRC.
// A checkpoint set (one clock) is complete when every server's file is there and valid;
// restore uses the latest complete set, so one cut short is ignored.
//
// Thread model: plain objects, one thread each.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "common/status.h"

namespace ps {

class CheckpointWriter {
 public:
  // Starts DIR/clock-<C>/server-<id>.ckpt (the directories are created).
  static Result<CheckpointWriter> Start(const std::string& dir, int64_t clock, int server_id);
  CheckpointWriter(CheckpointWriter&& o) noexcept;
  ~CheckpointWriter();
  Status Append(const void* data, size_t bytes);
  template <typename T>
  Status Put(const T& v) {
    return Append(&v, sizeof(T));
  }
  // Writes the trailer, fsyncs and renames into place.
  Status Commit();
  const std::string& path() const { return path_; }

 private:
  CheckpointWriter() = default;
  std::FILE* f_ = nullptr;
  std::string path_, tmp_;
  uint32_t crc_ = 0;
  bool failed_ = false;
};

class CheckpointReader {
 public:
  // Opens a file and checks its magic, length and CRC (one pass over it).
  static Result<CheckpointReader> Open(const std::string& path);
  CheckpointReader(CheckpointReader&& o) noexcept;
  ~CheckpointReader();
  Status Read(void* data, size_t bytes);
  template <typename T>
  Status Get(T* v) {
    return Read(v, sizeof(T));
  }
  // The file's format: 2 (written now) or 1 (whose body lacks what 2 added).
  int format() const { return format_; }

 private:
  CheckpointReader() = default;
  std::FILE* f_ = nullptr;
  std::string path_;
  uint64_t body_end_ = 0;  // offset of the CRC
  int format_ = 2;
};

std::string CheckpointFile(const std::string& dir, int64_t clock, int server_id);
// The directory of the set at `clock`: DIR/clock-<C, 12 digits>.
std::string CheckpointSetDir(const std::string& dir, int64_t clock);
// OK when every one of `num_servers` files of the set is there and valid.
Status ValidateCheckpointSet(const std::string& set_dir, int num_servers);

// The coordinator's record of complete sets, DIR/checkpoints.json (written atomically):
//   {"sets": [{"clock": C, "set": "DIR/clock-<C>", "epoch": E, "epochs_completed": E - 1,
//              "lr_iteration": C * num_workers, "learning_rate": ..., ...}, ...]}
// oldest first. A set is recorded once every server said it committed its file, so a
// recorded set is whole; "epoch" is where training resumes (see server/coordinator.h).
std::string CheckpointRecordFile(const std::string& dir);

// The directory of the latest complete checkpoint set under `dir` (every one of
// `num_servers` files valid), or NotFound naming what was skipped and why.
Result<std::string> LatestCompleteCheckpoint(const std::string& dir, int num_servers);

}  // namespace ps
