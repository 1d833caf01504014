#include "common/shm_ring.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <random>

namespace ps {
namespace {

constexpr uint64_t kDescriptorMagic0 = 0x9a3c5e17d2b4f681ULL;
constexpr uint64_t kDescriptorMagic1 = 0x5053484d52494e47ULL;  // "PSHMRING"
constexpr uint64_t kHeaderMagic = 0x50535f53484d3031ULL;       // "PS_SHM01"
constexpr uint32_t kVersion = 2;  // 2: the state word counts receiver uses
constexpr uint64_t kUnit = 4096;  // allocations start on a page
constexpr const char* kPrefix = "ps_shm_";
constexpr size_t kMaxMappings = 256;

// The slot's state word (see the header): 0 free, bit 0 the sender's hold, and a count of
// the receiver's uses in units of kReceiverUse.
constexpr uint32_t kFree = 0;
constexpr uint32_t kSenderHold = 1;
constexpr uint32_t kReceiverUse = 2;

struct ShmSlot {
  std::atomic<uint32_t> state;
  std::atomic<uint32_t> generation;  // atomic: a reserved frame's release reads it anywhere
  uint64_t offset;
  uint64_t length;
};
static_assert(sizeof(ShmSlot) == 24);
static_assert(std::atomic<uint32_t>::is_always_lock_free);
static_assert(sizeof(std::atomic<uint32_t>) == sizeof(uint32_t));

struct ShmHeader {
  uint64_t magic;
  uint32_t version;
  uint32_t num_slots;
  uint64_t data_offset;
  uint64_t data_bytes;
  int64_t owner_pid;
  uint64_t reserved[3];
};
static_assert(sizeof(ShmHeader) == 64);

uint64_t RoundUp(uint64_t v, uint64_t unit) { return (v + unit - 1) / unit * unit; }

uint64_t DataOffset(uint32_t num_slots) {
  return RoundUp(sizeof(ShmHeader) + uint64_t{num_slots} * sizeof(ShmSlot), kUnit);
}

ShmSlot* Slots(char* base) { return reinterpret_cast<ShmSlot*>(base + sizeof(ShmHeader)); }

std::string Errno(const std::string& what) { return what + ": " + std::strerror(errno); }

// ps_shm_<decimal pid>_<16 hex digits>: the only names a receiver opens.
bool ValidName(const std::string& name, int64_t* pid) {
  if (name.rfind(kPrefix, 0) != 0) return false;
  size_t i = std::strlen(kPrefix), digits = 0;
  int64_t p = 0;
  while (i < name.size() && name[i] >= '0' && name[i] <= '9' && digits < 10) {
    p = p * 10 + (name[i] - '0');
    ++i;
    ++digits;
  }
  if (digits == 0 || i >= name.size() || name[i] != '_') return false;
  ++i;
  if (name.size() - i != 16) return false;
  for (; i < name.size(); ++i) {
    if (!std::isxdigit(static_cast<unsigned char>(name[i]))) return false;
  }
  if (pid != nullptr) *pid = p;
  return true;
}

}  // namespace

bool LooksLikeShmDescriptor(const zmq::message_t& frame) {
  if (frame.size() != sizeof(ShmDescriptor)) return false;
  uint64_t magic[2];
  std::memcpy(magic, frame.data(), sizeof(magic));
  return magic[0] == kDescriptorMagic0 && magic[1] == kDescriptorMagic1;
}

int CleanStaleShmSegments() {
  DIR* dir = opendir("/dev/shm");
  if (dir == nullptr) return 0;
  int removed = 0;
  const uid_t me = geteuid();
  while (dirent* e = readdir(dir)) {
    const std::string name = e->d_name;
    int64_t pid = 0;
    if (!ValidName(name, &pid)) continue;
    struct stat st;
    if (fstatat(dirfd(dir), name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) continue;
    if (st.st_uid != me || !S_ISREG(st.st_mode)) continue;
    if (pid <= 0 || pid == getpid()) continue;
    if (kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH) continue;  // alive (or not ours)
    if (shm_unlink(("/" + name).c_str()) == 0) ++removed;
  }
  closedir(dir);
  return removed;
}

// ---- sender ----

Result<std::shared_ptr<ShmRing>> ShmRing::Create(ShmRingOptions options) {
  static std::once_flag cleaned;
  std::call_once(cleaned, [] { (void)CleanStaleShmSegments(); });
  if (options.num_slots == 0 || options.data_bytes < kUnit) {
    return InvalidArgument("shm ring: needs at least one slot and one page of data");
  }
  options.data_bytes = RoundUp(options.data_bytes, kUnit);
  static std::atomic<uint64_t> counter{0};
  std::random_device rd;
  const uint64_t salt = (uint64_t{rd()} << 32) ^ rd() ^ counter.fetch_add(1);
  char name[40];
  std::snprintf(name, sizeof(name), "%s%d_%016llx", kPrefix, static_cast<int>(getpid()),
                static_cast<unsigned long long>(salt));
  const std::string path = std::string("/") + name;
  int fd = shm_open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) return Unavailable(Errno("shm_open " + path));
  const uint64_t data_offset = DataOffset(options.num_slots);
  const size_t total = data_offset + options.data_bytes;
  auto fail = [&](const std::string& what) {
    Status s = Unavailable(Errno(what + " " + path));
    close(fd);
    shm_unlink(path.c_str());
    return s;
  };
  if (ftruncate(fd, static_cast<off_t>(total)) != 0) return fail("ftruncate");
  // The header and slot table now; data pages as the ring first reaches them (Put).
  if (int e = posix_fallocate(fd, 0, static_cast<off_t>(data_offset)); e != 0) {
    errno = e;
    return fail("fallocate");
  }
  void* base = mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (base == MAP_FAILED) return fail("mmap");
  auto* h = static_cast<ShmHeader*>(base);
  h->magic = kHeaderMagic;
  h->version = kVersion;
  h->num_slots = options.num_slots;
  h->data_offset = data_offset;
  h->data_bytes = options.data_bytes;
  h->owner_pid = getpid();
  ShmSlot* slots = Slots(static_cast<char*>(base));
  for (uint32_t i = 0; i < options.num_slots; ++i) {
    new (&slots[i].state) std::atomic<uint32_t>(kFree);
    new (&slots[i].generation) std::atomic<uint32_t>(0);
    slots[i].offset = 0;
    slots[i].length = 0;
  }
  return std::shared_ptr<ShmRing>(new ShmRing(options, name, fd, base, total));
}

ShmRing::ShmRing(ShmRingOptions options, std::string name, int fd, void* base, size_t mapped)
    : options_(options),
      name_(std::move(name)),
      fd_(fd),
      base_(static_cast<char*>(base)),
      mapped_(mapped) {
  // Handed out from the back: slot 0 first.
  for (uint32_t i = options_.num_slots; i > 0; --i) free_slots_.push_back(i - 1);
}

ShmRing::~ShmRing() {
  munmap(base_, mapped_);
  close(fd_);
  shm_unlink(("/" + name_).c_str());
}

size_t ShmRing::Reclaim() {
  std::lock_guard<std::mutex> l(mu_);
  return ReclaimLocked();
}

size_t ShmRing::ReclaimLocked() {
  ShmSlot* slots = Slots(base_);
  for (auto it = held_.begin(); it != held_.end();) {
    if (slots[it->second.slot].state.load(std::memory_order_acquire) == kFree) {
      free_slots_.push_back(it->second.slot);
      it = held_.erase(it);
    } else {
      ++it;
    }
  }
  return held_.size();
}

std::optional<uint64_t> ShmRing::Allocate(uint64_t bytes) {
  uint64_t start = 0;
  for (const auto& [offset, h] : held_) {
    if (offset - start >= bytes) return start;
    start = offset + h.bytes;
  }
  if (options_.data_bytes - start >= bytes) return start;
  return std::nullopt;
}

std::optional<std::pair<uint32_t, uint64_t>> ShmRing::Take(uint64_t bytes) {
  ReclaimLocked();
  if (free_slots_.empty()) return std::nullopt;
  const uint64_t rounded = RoundUp(std::max<uint64_t>(bytes, 1), kUnit);
  if (rounded > options_.data_bytes) return std::nullopt;
  std::optional<uint64_t> offset = Allocate(rounded);
  if (!offset) return std::nullopt;
  const uint64_t data_offset = DataOffset(options_.num_slots);
  if (*offset + rounded > committed_) {
    // Commit the pages first: writing a page tmpfs cannot supply would be a SIGBUS.
    if (posix_fallocate(fd_, static_cast<off_t>(data_offset + committed_),
                        static_cast<off_t>(*offset + rounded - committed_)) != 0) {
      return std::nullopt;
    }
    committed_ = *offset + rounded;
  }
  const uint32_t slot = free_slots_.back();
  free_slots_.pop_back();
  ShmSlot& s = Slots(base_)[slot];
  s.generation.store(s.generation.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
  s.offset = *offset;
  s.length = bytes;
  held_[*offset] = Held{slot, rounded};
  return std::make_pair(slot, *offset);
}

zmq::message_t ShmRing::Descriptor(uint32_t slot) const {
  const ShmSlot& s = Slots(base_)[slot];
  ShmDescriptor d{};
  d.magic[0] = kDescriptorMagic0;
  d.magic[1] = kDescriptorMagic1;
  std::snprintf(d.name, sizeof(d.name), "%s", name_.c_str());
  d.slot = slot;
  d.generation = s.generation.load(std::memory_order_relaxed);
  d.offset = s.offset;
  d.length = s.length;
  return zmq::message_t(&d, sizeof(d));
}

std::optional<zmq::message_t> ShmRing::Put(const void* data, size_t bytes) {
  std::optional<std::pair<uint32_t, uint64_t>> taken;
  {
    std::lock_guard<std::mutex> l(mu_);
    taken = Take(bytes);
    if (!taken) return std::nullopt;
    // Held by the sender while it copies: Reclaim (another thread) must not free it.
    Slots(base_)[taken->first].state.store(kSenderHold, std::memory_order_relaxed);
  }
  const auto [slot, offset] = *taken;
  std::memcpy(base_ + DataOffset(options_.num_slots) + offset, data, bytes);
  // The receiver's use, then the copy's hold goes: one store, so the slot is never 0.
  Slots(base_)[slot].state.store(kReceiverUse, std::memory_order_release);
  return Descriptor(slot);
}

namespace {

struct Reservation {
  std::shared_ptr<ShmRing> ring;  // keeps the mapping
  std::atomic<uint32_t>* state;
};

// The last copy of a reserved frame released: the sender's hold goes. The slot is free once
// the receiver's uses are gone too (it cannot have been reused meanwhile: the hold kept it).
void ReleaseReserved(void* /*data*/, void* hint) {
  auto* r = static_cast<Reservation*>(hint);
  r->state->fetch_and(~kSenderHold, std::memory_order_acq_rel);
  delete r;
}

}  // namespace

std::optional<zmq::message_t> ShmRing::Reserve(size_t bytes) {
  std::lock_guard<std::mutex> l(mu_);
  std::optional<std::pair<uint32_t, uint64_t>> taken = Take(bytes);
  if (!taken) return std::nullopt;
  const auto [slot, offset] = *taken;
  ShmSlot& s = Slots(base_)[slot];
  s.state.store(kSenderHold, std::memory_order_release);
  auto* r = new Reservation{shared_from_this(), &s.state};
  return zmq::message_t(base_ + DataOffset(options_.num_slots) + offset, bytes, &ReleaseReserved,
                        r);
}

std::optional<zmq::message_t> ShmRing::Commit(const zmq::message_t& frame) {
  const char* data = static_cast<const char*>(frame.data());
  const char* begin = base_ + DataOffset(options_.num_slots);
  if (data < begin || data >= begin + options_.data_bytes) return std::nullopt;
  std::lock_guard<std::mutex> l(mu_);
  auto it = held_.find(static_cast<uint64_t>(data - begin));
  if (it == held_.end()) return std::nullopt;
  ShmSlot& s = Slots(base_)[it->second.slot];
  if (s.length != frame.size()) return std::nullopt;
  // The sender's hold (the frame is alive, so it is still set unless this is not a frame
  // Reserve made) keeps the slot from being freed or reused while the use is added.
  if ((s.state.load(std::memory_order_acquire) & kSenderHold) == 0) return std::nullopt;
  s.state.fetch_add(kReceiverUse, std::memory_order_acq_rel);
  return Descriptor(it->second.slot);
}

bool ShmRing::Contains(const void* p) const {
  const char* c = static_cast<const char*>(p);
  const char* begin = base_ + DataOffset(options_.num_slots);
  return c >= begin && c < begin + options_.data_bytes;
}

bool ShmRing::Cancel(const zmq::message_t& frame) {
  if (!LooksLikeShmDescriptor(frame)) return false;
  ShmDescriptor d;
  std::memcpy(&d, frame.data(), sizeof(d));
  if (std::strncmp(d.name, name_.c_str(), sizeof(d.name)) != 0 || d.slot >= options_.num_slots) {
    return false;
  }
  std::lock_guard<std::mutex> l(mu_);
  ShmSlot& s = Slots(base_)[d.slot];
  if (s.generation.load(std::memory_order_relaxed) != d.generation) return false;
  uint32_t state = s.state.load(std::memory_order_acquire);
  do {
    if (state < kReceiverUse) return false;  // no use left to take back
  } while (!s.state.compare_exchange_weak(state, state - kReceiverUse, std::memory_order_acq_rel));
  return true;
}

// ---- receiver ----

struct ShmMapper::Mapping {
  std::string name;
  char* base = nullptr;
  size_t size = 0;
  ShmHeader header{};  // a copy, read once: the limits checked against
  ~Mapping() {
    if (base != nullptr) munmap(base, size);
  }
};

namespace {

struct Hold {
  std::shared_ptr<ShmMapper::Mapping> mapping;
  uint32_t slot;
};

void ReleaseSlot(void* /*data*/, void* hint) {
  auto* h = static_cast<Hold*>(hint);
  // Only this use goes: the sender may hold the slot for a resend, or have sent it again.
  std::atomic<uint32_t>& state = Slots(h->mapping->base)[h->slot].state;
  uint32_t v = state.load(std::memory_order_relaxed);
  while (v >= kReceiverUse &&
         !state.compare_exchange_weak(v, v - kReceiverUse, std::memory_order_acq_rel)) {
  }
  delete h;
}

}  // namespace

ShmMapper::~ShmMapper() = default;

Result<std::shared_ptr<ShmMapper::Mapping>> ShmMapper::Map(const std::string& name) {
  auto it = mappings_.find(name);
  if (it != mappings_.end()) return it->second;
  const std::string path = "/" + name;
  int fd = shm_open(path.c_str(), O_RDWR | O_CLOEXEC | O_NOFOLLOW, 0);
  if (fd < 0) return NotFound(Errno("shm descriptor: segment '" + name + "'"));
  struct stat st;
  if (fstat(fd, &st) != 0) {
    Status s = Unavailable(Errno("fstat " + path));
    close(fd);
    return s;
  }
  if (!S_ISREG(st.st_mode) || st.st_uid != geteuid()) {
    close(fd);
    return InvalidArgument("shm descriptor: segment '" + name +
                           "' is not a regular file of this user");
  }
  const size_t size = static_cast<size_t>(st.st_size);
  if (size < sizeof(ShmHeader)) {
    close(fd);
    return InvalidArgument("shm descriptor: segment '" + name + "' has only " +
                           std::to_string(size) + " bytes");
  }
  void* base = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);  // the mapping keeps the segment
  if (base == MAP_FAILED) return Unavailable(Errno("mmap " + path));
  auto m = std::make_shared<Mapping>();
  m->name = name;
  m->base = static_cast<char*>(base);
  m->size = size;
  std::memcpy(&m->header, base, sizeof(ShmHeader));
  const ShmHeader& h = m->header;
  if (h.magic != kHeaderMagic || h.version != kVersion) {
    return InvalidArgument("shm descriptor: segment '" + name + "' has no ring header (version " +
                           std::to_string(h.version) + ")");
  }
  if (h.num_slots == 0 || h.data_offset != DataOffset(h.num_slots) || h.data_offset > size ||
      h.data_bytes != size - h.data_offset) {
    return InvalidArgument("shm descriptor: segment '" + name + "' header (" +
                           std::to_string(h.num_slots) + " slots, data at " +
                           std::to_string(h.data_offset) + ", " + std::to_string(h.data_bytes) +
                           " bytes) does not match its size " + std::to_string(size));
  }
  if (mappings_.size() >= kMaxMappings) mappings_.erase(mappings_.begin());
  mappings_[name] = m;
  return m;
}

Result<zmq::message_t> ShmMapper::Resolve(const zmq::message_t& frame) {
  if (!LooksLikeShmDescriptor(frame)) {
    return InvalidArgument("shm descriptor: a frame of " + std::to_string(frame.size()) +
                           " bytes is not a descriptor");
  }
  ShmDescriptor d;
  std::memcpy(&d, frame.data(), sizeof(d));
  if (std::memchr(d.name, '\0', sizeof(d.name)) == nullptr) {
    return InvalidArgument("shm descriptor: segment name is not terminated");
  }
  const std::string name = d.name;
  if (!ValidName(name, nullptr)) {
    return InvalidArgument("shm descriptor: segment name '" + name +
                           "' is not ps_shm_<pid>_<16 hex digits>");
  }
  PS_ASSIGN_OR_RETURN(std::shared_ptr<Mapping> m, Map(name));
  const ShmHeader& h = m->header;
  if (d.slot >= h.num_slots) {
    return InvalidArgument("shm descriptor: slot " + std::to_string(d.slot) +
                           " is out of range (segment '" + name + "' has " +
                           std::to_string(h.num_slots) + ")");
  }
  if (d.offset > h.data_bytes || d.length > h.data_bytes - d.offset) {
    return InvalidArgument("shm descriptor: offset " + std::to_string(d.offset) + " + length " +
                           std::to_string(d.length) + " is beyond the " +
                           std::to_string(h.data_bytes) + " bytes of segment '" + name + "'");
  }
  ShmSlot& s = Slots(m->base)[d.slot];
  if (s.state.load(std::memory_order_acquire) < kReceiverUse ||
      s.generation.load(std::memory_order_relaxed) != d.generation || s.offset != d.offset ||
      s.length != d.length) {
    return InvalidArgument("shm descriptor: slot " + std::to_string(d.slot) + " generation " +
                           std::to_string(d.generation) + " (offset " + std::to_string(d.offset) +
                           ", length " + std::to_string(d.length) +
                           ") is not the slot's current use in segment '" + name + "'");
  }
  auto* hold = new Hold{m, d.slot};
  return zmq::message_t(m->base + h.data_offset + d.offset, d.length, &ReleaseSlot, hold);
}

}  // namespace ps
