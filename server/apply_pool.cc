#include "server/apply_pool.h"

#include <sched.h>

#include <algorithm>
#include <string>

namespace ps {

int SharedServerThreads(int cores) { return std::clamp(cores / 4, 1, 8); }

Result<int> ResolveServerThreads(int requested) {
  if (requested < kSharedServerThreads || requested > kMaxServerThreads) {
    return InvalidArgument("--server_threads=" + std::to_string(requested) + " is outside [-1, " +
                           std::to_string(kMaxServerThreads) +
                           "] (-1: a quarter of the cores this process may use, at most 8; 0: "
                           "one per core, at most " +
                           std::to_string(kMaxAutoServerThreads) + ")");
  }
  if (requested > 0) return requested;
  cpu_set_t set;
  CPU_ZERO(&set);
  int cores = 1;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) cores = std::max(1, CPU_COUNT(&set));
  if (requested == kSharedServerThreads) return SharedServerThreads(cores);
  return std::min(cores, kMaxAutoServerThreads);
}

ApplyPool::ApplyPool(int threads) : parts_(static_cast<size_t>(std::max(threads, 1))) {
  threads_.reserve(parts_ - 1);
  for (size_t part = 1; part < parts_; ++part) threads_.emplace_back([this, part] { Loop(part); });
}

ApplyPool::~ApplyPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  start_.notify_all();
  for (std::thread& t : threads_) t.join();
}

void ApplyPool::Run(const std::function<void(size_t part)>& fn) {
  if (parts_ == 1) {
    fn(0);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    job_ = &fn;
    pending_ = parts_ - 1;
    ++generation_;
  }
  start_.notify_all();
  fn(0);
  std::unique_lock<std::mutex> lock(mu_);
  done_.wait(lock, [&] { return pending_ == 0; });
  job_ = nullptr;
}

void ApplyPool::Loop(size_t part) {
  uint64_t seen = 0;
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    start_.wait(lock, [&] { return stop_ || generation_ != seen; });
    if (stop_) return;
    seen = generation_;
    const std::function<void(size_t)>* job = job_;
    lock.unlock();
    (*job)(part);
    lock.lock();
    if (--pending_ == 0) done_.notify_one();
  }
}

}  // namespace ps
