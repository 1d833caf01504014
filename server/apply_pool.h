// A small fixed pool of threads that a server's request thread hands the per-row work of
// one request to (the optimizer's Apply of a push, the copy of a pull), fork-join.
//
// Thread model: the pool has parts 0..threads()-1. Run(fn) runs fn(part) once for every
// part: part 0 on the calling thread, each other part on a pool thread of its own (always
// the same thread for the same part), and returns when every part has returned. Only one
// thread (the server's request thread) calls Run, never concurrently with itself; fn must
// not call Run. The rows a part touches are the caller's business: ServerCore gives every
// row to exactly one part (server/server_core.h), so parts need no lock between them, and
// Run's return orders everything the parts wrote before what the caller does next (the
// pool's mutex is the happens-before edge both ways).
//
// Waking the threads costs a few microseconds per Run, so callers run small requests
// inline instead (StoreOptions::parallel_min_bytes).
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "common/status.h"

namespace ps {

// The number of threads --server_threads=N asks for: N itself for N >= 1; for 0, the cores
// this process may run on (sched_getaffinity) capped at kMaxAutoServerThreads.
// InvalidArgument for N < 0 or N > kMaxServerThreads.
inline constexpr int kMaxAutoServerThreads = 16;
inline constexpr int kMaxServerThreads = 256;
Result<int> ResolveServerThreads(int requested);

// The part (in [0, parts)) that owns sparse key `key`: a hash of the key, so that
// consecutive ids spread over the parts and a key always lands on the same one.
inline size_t SparseKeyPart(uint64_t key, size_t parts) {
  // splitmix64's finalizer: every bit of the key moves the high bits used below.
  key ^= key >> 30;
  key *= 0xbf58476d1ce4e5b9ULL;
  key ^= key >> 27;
  key *= 0x94d049bb133111ebULL;
  key ^= key >> 31;
  // Multiply-shift maps the hash onto [0, parts) without a division.
  return static_cast<size_t>((static_cast<unsigned __int128>(key) * parts) >> 64);
}

class ApplyPool {
 public:
  // REQUIRES: threads >= 1 (1: no pool thread, Run calls fn(0) inline).
  explicit ApplyPool(int threads);
  ~ApplyPool();
  ApplyPool(const ApplyPool&) = delete;
  ApplyPool& operator=(const ApplyPool&) = delete;

  size_t threads() const { return parts_; }
  // Runs fn(part) for every part in [0, threads()) and returns when all have returned.
  void Run(const std::function<void(size_t part)>& fn);

 private:
  void Loop(size_t part);

  const size_t parts_;
  std::mutex mu_;
  std::condition_variable start_;                     // a new Run (or the stop) is posted
  std::condition_variable done_;                      // the last part of a Run returned
  const std::function<void(size_t)>* job_ = nullptr;  // guarded by mu_
  uint64_t generation_ = 0;                           // guarded by mu_; bumped per Run
  size_t pending_ = 0;                                // guarded by mu_; pool parts still running
  bool stop_ = false;                                 // guarded by mu_
  std::vector<std::thread> threads_;
};

}  // namespace ps
