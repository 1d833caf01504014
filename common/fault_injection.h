// Message-level fault injection for tests (as LevelDB's fault-injection Env does for
// files): a ServerSocket wrapper that drops, duplicates and delays (so reorders) the
// requests it receives and drops and duplicates the replies it sends, each with a given
// probability drawn from a seeded random source, so that a failing run can be replayed.
// Serving code takes it where it takes a ServerSocket (e.g. ServeUntilShutdown).
//
// Thread model: like any socket, used by one thread at a time.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <random>
#include <string>

#include "common/transport.h"

namespace ps {

struct FaultOptions {
  uint64_t seed = 1;
  // Probabilities per received request.
  double drop_request = 0;       // never handed to the server
  double duplicate_request = 0;  // handed over twice
  double delay_request = 0;      // held up to max_delay; later requests overtake it
  // Probabilities per sent reply.
  double drop_reply = 0;
  double duplicate_reply = 0;
  std::chrono::milliseconds max_delay{30};
};

struct FaultStats {
  uint64_t requests = 0;
  uint64_t dropped_requests = 0;
  uint64_t duplicated_requests = 0;
  uint64_t delayed_requests = 0;
  uint64_t dropped_replies = 0;
  uint64_t duplicated_replies = 0;
};

class FaultyServerSocket final : public ServerSocket {
 public:
  FaultyServerSocket(std::unique_ptr<ServerSocket> inner, const FaultOptions& options);

  std::string BoundEndpoint() const override { return inner_->BoundEndpoint(); }
  // A request that was dropped or is being delayed reads as no request (DeadlineExceeded).
  Result<Incoming> Recv(std::chrono::milliseconds timeout) override;
  Status Send(const std::string& peer, Frames frames) override;
  zmq::message_t NewFrame(const std::string& peer, size_t bytes) override {
    return inner_->NewFrame(peer, bytes);
  }
  zmq::socket_ref PollHandle() override { return inner_->PollHandle(); }
  bool HasQueued() const override { return inner_->HasQueued(); }
  Status Flush() override { return inner_->Flush(); }

  const FaultStats& stats() const { return stats_; }

 private:
  using Clock = std::chrono::steady_clock;
  struct Held {
    Clock::time_point ready;
    Incoming message;
  };
  bool Roll(double p) { return p > 0 && coin_(rng_) < p; }
  static Incoming Copy(Incoming& m);

  std::unique_ptr<ServerSocket> inner_;
  const FaultOptions options_;
  std::mt19937_64 rng_;
  std::uniform_real_distribution<double> coin_{0.0, 1.0};
  std::deque<Held> held_;  // delayed and duplicated requests, by ready time
  FaultStats stats_;
};

}  // namespace ps
