#include "server/checkpoint.h"

#include <fcntl.h>
#include <glog/logging.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>

namespace ps {
namespace {

// The format written: 02 added the clock table's length and the schedule's progress to
// the body (ServerCore); files of format 01 are still read.
constexpr char kMagic[8] = {'P', 'S', 'C', 'K', 'P', 'T', '0', '2'};
constexpr char kMagicV1[8] = {'P', 'S', 'C', 'K', 'P', 'T', '0', '1'};
constexpr char kEnd[8] = {'P', 'S', 'C', 'K', 'E', 'N', 'D', '!'};

uint32_t Crc(uint32_t crc, const void* data, size_t n) {
  const Bytef* p = static_cast<const Bytef*>(data);
  while (n > 0) {
    uInt chunk = static_cast<uInt>(std::min<size_t>(n, 1u << 30));
    crc = static_cast<uint32_t>(crc32(crc, p, chunk));
    p += chunk;
    n -= chunk;
  }
  return crc;
}

void FsyncDir(const std::string& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;
  (void)::fsync(fd);
  ::close(fd);
}

std::string ClockDir(const std::string& dir, int64_t clock) {
  char name[32];
  std::snprintf(name, sizeof(name), "clock-%012lld", static_cast<long long>(clock));
  return dir + "/" + name;
}

}  // namespace

std::string CheckpointFile(const std::string& dir, int64_t clock, int server_id) {
  return ClockDir(dir, clock) + "/server-" + std::to_string(server_id) + ".ckpt";
}

std::string CheckpointSetDir(const std::string& dir, int64_t clock) { return ClockDir(dir, clock); }

std::string CheckpointRecordFile(const std::string& dir) { return dir + "/checkpoints.json"; }

Status ValidateCheckpointSet(const std::string& set_dir, int num_servers) {
  for (int s = 0; s < num_servers; ++s) {
    PS_RETURN_IF_ERROR(
        CheckpointReader::Open(set_dir + "/server-" + std::to_string(s) + ".ckpt").status());
  }
  return Status::Ok();
}

Result<CheckpointWriter> CheckpointWriter::Start(const std::string& dir, int64_t clock,
                                                 int server_id) {
  std::error_code ec;
  std::filesystem::create_directories(ClockDir(dir, clock), ec);
  if (ec) return Internal("cannot create " + ClockDir(dir, clock) + ": " + ec.message());
  CheckpointWriter w;
  w.path_ = CheckpointFile(dir, clock, server_id);
  w.tmp_ = w.path_ + ".tmp";
  w.f_ = std::fopen(w.tmp_.c_str(), "wb");
  if (w.f_ == nullptr) return Internal("cannot create " + w.tmp_ + ": " + std::strerror(errno));
  w.crc_ = Crc(0, nullptr, 0);
  PS_RETURN_IF_ERROR(w.Append(kMagic, sizeof(kMagic)));
  return w;
}

CheckpointWriter::CheckpointWriter(CheckpointWriter&& o) noexcept
    : f_(o.f_),
      path_(std::move(o.path_)),
      tmp_(std::move(o.tmp_)),
      crc_(o.crc_),
      failed_(o.failed_) {
  o.f_ = nullptr;
}

CheckpointWriter::~CheckpointWriter() {
  if (f_ == nullptr) return;
  std::fclose(f_);
  ::unlink(tmp_.c_str());  // not committed: never leave a file that looks complete
}

Status CheckpointWriter::Append(const void* data, size_t bytes) {
  if (bytes == 0) return Status::Ok();
  if (failed_ || std::fwrite(data, 1, bytes, f_) != bytes) {
    failed_ = true;
    return Internal("write " + tmp_ + ": " + std::strerror(errno));
  }
  crc_ = Crc(crc_, data, bytes);
  return Status::Ok();
}

Status CheckpointWriter::Commit() {
  uint32_t crc = crc_;
  PS_RETURN_IF_ERROR(Append(&crc, sizeof(crc)));
  PS_RETURN_IF_ERROR(Append(kEnd, sizeof(kEnd)));
  if (std::fflush(f_) != 0 || ::fsync(fileno(f_)) != 0) {
    return Internal("fsync " + tmp_ + ": " + std::strerror(errno));
  }
  std::fclose(f_);
  f_ = nullptr;
  if (std::rename(tmp_.c_str(), path_.c_str()) != 0) {
    ::unlink(tmp_.c_str());
    return Internal("rename " + tmp_ + ": " + std::strerror(errno));
  }
  FsyncDir(std::filesystem::path(path_).parent_path().string());
  return Status::Ok();
}

Result<CheckpointReader> CheckpointReader::Open(const std::string& path) {
  CheckpointReader r;
  r.path_ = path;
  r.f_ = std::fopen(path.c_str(), "rb");
  if (r.f_ == nullptr) return NotFound("cannot open " + path + ": " + std::strerror(errno));
  std::error_code ec;
  uint64_t size = std::filesystem::file_size(path, ec);
  const uint64_t trailer = sizeof(uint32_t) + sizeof(kEnd);
  if (ec || size < sizeof(kMagic) + trailer) return FailedPrecondition(path + " is too short");
  r.body_end_ = size - trailer;
  // One pass for the CRC.
  uint32_t crc = Crc(0, nullptr, 0);
  std::vector<char> buf(1 << 20);
  uint64_t left = r.body_end_;
  while (left > 0) {
    size_t n = static_cast<size_t>(std::min<uint64_t>(left, buf.size()));
    if (std::fread(buf.data(), 1, n, r.f_) != n) return FailedPrecondition("short read of " + path);
    crc = Crc(crc, buf.data(), n);
    left -= n;
  }
  uint32_t stored = 0;
  char end[8];
  if (std::fread(&stored, 1, 4, r.f_) != 4 || std::fread(end, 1, 8, r.f_) != 8 ||
      std::memcmp(end, kEnd, 8) != 0) {
    return FailedPrecondition(path + " has no end marker (cut short?)");
  }
  if (stored != crc) return FailedPrecondition(path + " fails its CRC (damaged)");
  std::fseek(r.f_, 0, SEEK_SET);
  char magic[8];
  if (std::fread(magic, 1, 8, r.f_) != 8) return FailedPrecondition("short read of " + path);
  if (std::memcmp(magic, kMagic, 8) == 0) {
    r.format_ = 2;
  } else if (std::memcmp(magic, kMagicV1, 8) == 0) {
    r.format_ = 1;
  } else {
    return FailedPrecondition(path + " is not a checkpoint file");
  }
  return r;
}

CheckpointReader::CheckpointReader(CheckpointReader&& o) noexcept
    : f_(o.f_), path_(std::move(o.path_)), body_end_(o.body_end_), format_(o.format_) {
  o.f_ = nullptr;
}

CheckpointReader::~CheckpointReader() {
  if (f_ != nullptr) std::fclose(f_);
}

Status CheckpointReader::Read(void* data, size_t bytes) {
  if (static_cast<uint64_t>(std::ftell(f_)) + bytes > body_end_ ||
      std::fread(data, 1, bytes, f_) != bytes) {
    return FailedPrecondition(path_ + ": read past the end of its body");
  }
  return Status::Ok();
}

Result<std::string> LatestCompleteCheckpoint(const std::string& dir, int num_servers) {
  std::error_code ec;
  std::vector<std::string> sets;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    std::string name = e.path().filename().string();
    if (e.is_directory() && name.rfind("clock-", 0) == 0) sets.push_back(e.path().string());
  }
  if (ec) return NotFound("no checkpoints in " + dir + ": " + ec.message());
  std::sort(sets.rbegin(), sets.rend());  // 12-digit clocks: the latest first
  std::string skipped;
  for (const std::string& set : sets) {
    Status bad = ValidateCheckpointSet(set, num_servers);
    if (bad.ok()) return set;
    LOG(WARNING) << "checkpoint " << set << " is incomplete, skipped: " << bad.message();
    skipped += " " + set + " (" + bad.message() + ")";
  }
  return NotFound("no complete checkpoint set of " + std::to_string(num_servers) + " servers in " +
                  dir + (skipped.empty() ? "" : "; skipped:" + skipped));
}

}  // namespace ps
