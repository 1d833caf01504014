// Exactly-once pushes: the request ids a server recently answered, per worker, with the
// reply it sent. A push retried by a client (its reply did not come in time) carries the
// same request id; the server finds it here and sends the same reply again without
// applying the gradient a second time.
//
// Bounded: the last `capacity_per_worker` requests of each worker (FIFO), and at most
// `total_capacity` over all workers (oldest first), so that a peer sending pushes under
// many sender ids cannot make the server's memory grow without bound. A client has at
// most a few dozen requests in flight to one server, so a retry of an evicted id would
// need thousands of newer requests from that worker in between. Request ids are chosen by
// the client and unique per client (a random start, see worker/kv_client.h), so an id
// reused by a rejoined worker with the same sender id is not mistaken for a retry.
//
// Thread model: not thread-safe; the server's request loop owns it.
#pragma once

#include <cstdint>
#include <deque>
#include <string>
#include <unordered_map>
#include <utility>

namespace ps {

class RecentRequests {
 public:
  explicit RecentRequests(size_t capacity_per_worker = 4096, size_t total_capacity = 1 << 18)
      : capacity_(capacity_per_worker), total_capacity_(total_capacity) {}

  // The reply recorded for (worker, request_id), or nullptr when it is not a retry.
  const std::string* Find(int worker, uint64_t request_id) const {
    auto w = workers_.find(worker);
    if (w == workers_.end()) return nullptr;
    auto it = w->second.replies.find(request_id);
    return it == w->second.replies.end() ? nullptr : &it->second;
  }

  // Records the reply (its header frame's bytes) to a request; forgets the worker's oldest
  // request past the capacity. A request id recorded before keeps its first reply.
  void Insert(int worker, uint64_t request_id, std::string reply) {
    PerWorker& w = workers_[worker];
    if (!w.replies.emplace(request_id, std::move(reply)).second) return;
    ++total_;
    w.order.push_back(request_id);
    all_.emplace_back(worker, request_id);
    while (w.order.size() > capacity_) {
      total_ -= w.replies.erase(w.order.front());
      w.order.pop_front();
    }
    // Past the total, forget the oldest of anyone's; entries already forgotten through a
    // worker's own bound are skipped (and trimmed, so that all_ stays bounded too).
    while (total_ > total_capacity_ || all_.size() > 2 * total_capacity_) {
      auto [wk, id] = all_.front();
      all_.pop_front();
      auto it = workers_.find(wk);
      if (it != workers_.end()) total_ -= it->second.replies.erase(id);
    }
  }

  // Requests remembered for `worker`.
  size_t size(int worker) const {
    auto w = workers_.find(worker);
    return w == workers_.end() ? 0 : w->second.replies.size();
  }
  size_t total() const { return total_; }

  // Calls fn(worker, request_id, reply) for every remembered request, each worker's oldest
  // first: inserting them in this order into an empty table rebuilds this one.
  template <typename Fn>
  void ForEach(Fn fn) const {
    for (const auto& [worker, w] : workers_) {
      for (uint64_t id : w.order) {
        auto it = w.replies.find(id);
        if (it != w.replies.end()) fn(worker, id, it->second);
      }
    }
  }
  size_t capacity() const { return capacity_; }

 private:
  struct PerWorker {
    std::unordered_map<uint64_t, std::string> replies;
    std::deque<uint64_t> order;  // oldest first
  };
  size_t capacity_;
  size_t total_capacity_;
  size_t total_ = 0;  // replies held, over all workers
  std::unordered_map<int, PerWorker> workers_;
  std::deque<std::pair<int, uint64_t>> all_;  // (worker, request id), oldest first
};

}  // namespace ps
