// The shared-memory payload path for same-host (ipc://) peers, used by common/transport.cc.
//
// A sender owns one ShmRing per connection (per peer for a listener): a file under /dev/shm
// (created 0600, named ps_shm_<pid>_<random>) holding a header, a table of slots and a
// data area. A large frame is copied into the data area and a small descriptor frame
// (ShmDescriptor: segment name, slot, generation, offset, length) travels on the socket in
// its place. A frame can also be built in the ring (Reserve) and sent without a copy
// (Commit). The receiver maps the segment once (ShmMapper) and hands the layers above a
// zmq::message_t over the mapped bytes, whose free function drops its use of the slot in the
// header (an atomic). The sender reclaims freed slots before each frame and places the next
// one in the first gap that fits (a slot the receiver never frees costs only its own bytes);
// when the ring is full (or /dev/shm is) it says so and the caller sends the frame inline.
//
// Layout of a segment: ShmHeader at 0, then num_slots ShmSlot entries, then the data area at
// data_offset (page aligned). Data pages are committed (fallocate) as the ring first uses
// them, so a segment costs the bytes in flight at its peak, not its capacity; first fit
// from offset 0 keeps a request/reply stream on the same warm pages.
//
// Lifetime: the sender unlinks the segment when the ring is destroyed; the receiver's
// mapping (and the bytes of messages it still holds) stays valid until it is unmapped. A
// process killed while it owns segments leaves them behind: CleanStaleShmSegments(), run by
// the first ring a process creates, unlinks those whose owner pid is gone.
//
// Trust: the descriptor comes from the network. ShmMapper checks the name pattern, that the
// file is a regular file of this user, the header, the slot index, generation, bounds and
// length; a bad descriptor is an error Status naming the value, never a crash. A peer of
// the same user can still change bytes under a receiver (it can also ptrace it): the path is
// for peers that trust each other as much as two processes of one job do.
//
// Slot state (an atomic word in the slot table): bit 0 = the sender holds the slot (a frame
// Reserve made is alive, copies included: it may be sent again), the bits above count the
// receiver's uses (descriptors committed and not yet released). A slot is free, and may be
// reused with the next generation, only when the word is 0: never while a receiver may
// read it or while the sender may send it again. So a frame built in the ring and kept for
// a resend (KVClient's retries) stays valid after the receiver released its first use, and
// a resend on the same ring is another descriptor of the same bytes (no copy).
//
// Thread model: Reserve, Put, Commit, Cancel and Reclaim take the ring's mutex, so a frame
// may be built in the ring on a caller's thread (KVClient::Submit encodes gradients
// straight into it) while the socket's I/O thread sends others. The alternative, moving the
// encode to the I/O thread, would either make Push wait for that thread (to keep the
// promise that the caller may reuse its buffer at once) or add a copy; the lock is held
// only for the slot bookkeeping, never during a copy into the slot. A ShmMapper is used by
// its socket's thread; the messages it makes may be released on any thread (the free
// function only updates an atomic and drops a shared_ptr).
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>
#include <zmq.hpp>

#include "common/status.h"

namespace ps {

// The frame that replaces a payload frame on the wire. Fixed size; starts with a 128-bit
// magic so that a receiver tells it from an ordinary frame (an ordinary frame of exactly
// this size starting with these 16 bytes would be taken for a descriptor; it then fails
// validation with an error, it is never read as shared memory it does not name).
struct ShmDescriptor {
  uint64_t magic[2];
  char name[40];  // NUL-terminated segment name, without the leading '/'
  uint32_t slot;
  uint32_t generation;
  uint64_t offset;  // into the data area
  uint64_t length;
};
static_assert(sizeof(ShmDescriptor) == 80);

// True when `frame` has a descriptor's size and magic.
bool LooksLikeShmDescriptor(const zmq::message_t& frame);

// Unlinks /dev/shm/ps_shm_<pid>_* segments of this user whose owner process is gone.
// Returns how many were removed.
int CleanStaleShmSegments();

struct ShmRingOptions {
  // Capacity of the data area. Virtual: pages are committed as first used.
  uint64_t data_bytes = uint64_t{256} << 20;
  // Frames that may be in flight at once.
  uint32_t num_slots = 256;
};

class ShmRing : public std::enable_shared_from_this<ShmRing> {
 public:
  // Creates and maps a new segment. Unavailable when /dev/shm cannot hold it.
  static Result<std::shared_ptr<ShmRing>> Create(ShmRingOptions options = {});
  ~ShmRing();  // unmaps and unlinks
  ShmRing(const ShmRing&) = delete;
  ShmRing& operator=(const ShmRing&) = delete;

  // Copies `data` into a free slot and returns the descriptor frame to send in its place;
  // nullopt when the ring (or /dev/shm) has no room: the caller sends the frame inline.
  std::optional<zmq::message_t> Put(const void* data, size_t bytes);

  // A frame of `bytes` bytes in a reserved slot, for the caller to fill and send on this
  // ring's socket: Commit then turns it into a descriptor without copying. The sender's
  // hold on the slot lasts while the frame (or a copy of it, ShareFrames) lives; the slot
  // is freed when that hold and every receiver's use are gone. It keeps the ring mapped
  // while it lives. nullopt when there is no room. REQUIRES: the ring is owned by a
  // shared_ptr (Reserve uses shared_from_this).
  std::optional<zmq::message_t> Reserve(size_t bytes);
  // The descriptor for `frame` when it is a frame Reserve made of this ring (or a copy of
  // one) that the sender still holds; each call adds a receiver use, so the same frame may
  // be sent again (a retry). nullopt otherwise (the caller then Puts a copy).
  std::optional<zmq::message_t> Commit(const zmq::message_t& frame);

  // Whether `p` points into this ring's data area.
  bool Contains(const void* p) const;

  // Takes back the receiver use of a descriptor this ring made whose message was never
  // sent. False when `descriptor` is not one of this ring's (then nothing changes).
  bool Cancel(const zmq::message_t& descriptor);

  // Takes back the slots the receiver released; returns how many are still held.
  size_t Reclaim();
  const std::string& name() const { return name_; }
  uint64_t capacity() const { return options_.data_bytes; }

 private:
  struct Held {
    uint32_t slot;
    uint64_t bytes;  // rounded up to the allocation unit
  };
  ShmRing(ShmRingOptions options, std::string name, int fd, void* base, size_t mapped);
  // A free slot and `bytes` of data committed for it; nullopt when there is no room.
  std::optional<std::pair<uint32_t, uint64_t>> Take(uint64_t bytes);
  zmq::message_t Descriptor(uint32_t slot) const;
  std::optional<uint64_t> Allocate(uint64_t bytes);
  size_t ReclaimLocked();

  ShmRingOptions options_;
  std::string name_;
  int fd_;
  char* base_;
  size_t mapped_;
  std::mutex mu_;                     // guards the three below
  uint64_t committed_ = 0;            // data bytes backed by fallocate so far
  std::vector<uint32_t> free_slots_;  // slot indices not held
  std::map<uint64_t, Held> held_;     // by data offset
};

// Receiver side: maps segments named by descriptors (once each) and turns descriptors into
// frames over the mapped bytes.
class ShmMapper {
 public:
  ShmMapper() = default;
  ~ShmMapper();
  // A frame over the bytes `descriptor` names; releasing it drops its use of the slot.
  // InvalidArgument naming the bad field for a malformed descriptor, NotFound for a segment that is
  // gone.
  Result<zmq::message_t> Resolve(const zmq::message_t& descriptor);

  struct Mapping;

 private:
  Result<std::shared_ptr<Mapping>> Map(const std::string& name);
  std::map<std::string, std::shared_ptr<Mapping>> mappings_;
};

}  // namespace ps
