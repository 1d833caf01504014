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
// this process may run on (sched_getaffinity) capped at kMaxAutoServerThreads; for
// kSharedServerThreads (ps_server's default), SharedServerThreads of those cores.
// InvalidArgument for N < -1 or N > kMaxServerThreads.
inline constexpr int kMaxAutoServerThreads = 16;
inline constexpr int kMaxServerThreads = 256;
inline constexpr int kSharedServerThreads = -1;
Result<int> ResolveServerThreads(int requested);

// A server's share of `cores` when it shares its host with other servers and workers, as a
// local job or a small cluster does: a quarter of them, at least 1, at most 8. On 16 idle
// cores 4-8 threads gave 1.3-3.1x on pushes and 2.7-6.3x on pulls (issue 22); on 2 busy
// cores a second thread gave nothing (README, Server threads), and this gives 1.
int SharedServerThreads(int cores);

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
