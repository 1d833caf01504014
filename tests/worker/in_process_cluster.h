// Servers of one job serving on ZeroMQ inproc endpoints from threads of the test process.
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "server/server_core.h"
#include "server/server_node.h"

namespace ps::testing {

// N servers serving on inproc endpoints from their own threads.
class InProcessCluster {
 public:
  InProcessCluster(Transport* t, const JobConfig& config) : config_(config) {
    static std::atomic<int> next{0};  // unique endpoint names across clusters
    int base = next.fetch_add(config.num_servers);
    for (int s = 0; s < config.num_servers; ++s) {
      cores_.push_back(ServerCore::Create(config, s).value());
      sockets_.push_back(t->Listen("inproc://test_cluster_" + std::to_string(base + s)).value());
      endpoints_.push_back(sockets_.back()->BoundEndpoint());
    }
    for (int s = 0; s < config.num_servers; ++s) {
      threads_.emplace_back([this, s] {
        (void)ServeUntilShutdown(*sockets_[s], *cores_[s], stop_,
                                 {.poll_interval = std::chrono::milliseconds(20)});
      });
    }
  }
  ~InProcessCluster() {
    stop_ = true;
    for (auto& t : threads_) t.join();
  }
  const std::vector<std::string>& endpoints() const { return endpoints_; }
  ServerCore& core(int s) { return *cores_[s]; }

 private:
  JobConfig config_;
  std::vector<std::unique_ptr<ServerCore>> cores_;
  std::vector<std::unique_ptr<ServerSocket>> sockets_;
  std::vector<std::string> endpoints_;
  std::vector<std::thread> threads_;
  std::atomic<bool> stop_{false};
};

}  // namespace ps::testing
