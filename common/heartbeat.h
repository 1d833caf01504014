// Heartbeats: every process of a running job tells the coordinator it is alive, every
// heartbeat_timeout / 4 (the job's --heartbeat_timeout), so that a process silent for
// longer than the timeout can be declared dead (server/coordinator.h says what follows).
//
// The sender owns its own connection to the coordinator: a worker's registration socket
// may be blocked for minutes in a lease request or the end-of-job barrier, and a
// heartbeat must not wait behind it. A coordinator that answers no beat for
// options.coordinator_timeout is reported lost, once (a worker then leaves as on SIGTERM,
// instead of waiting minutes in calls to a job that is gone). The timeout covers a
// coordinator restart (the job's --coordinator_restart_timeout): beats keep going to the
// same endpoint, and a restarted coordinator answers them with a new incarnation. Replies are read
// without waiting; a reply saying that the coordinator evicted this process (a worker silent too
// long, e.g. stopped with SIGSTOP, whose work went to others; or a server declared dead and
// replaced by another process) sets evicted(), and the owner should stop. A reply saying
// that the job stops runs on_job_stopping once. A reply that
// lists redirects (a dead server's shards are served by its promoted backup, --replicas=2)
// is passed to the redirect handler, on every beat: the handler must be idempotent.
//
// Thread model: one internal thread sends the beats and owns the socket; the public
// methods are thread-safe. Stop() (or the destructor) ends the thread within a moment.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "common/status.h"
#include "common/transport.h"

namespace ps {

struct HeartbeatOptions {
  // The coordinator's endpoint. Required.
  std::string coordinator;
  bool is_server = false;
  // This process's id within its role.
  int id = 0;
  // Time between beats: the job's heartbeat_timeout / 4.
  std::chrono::milliseconds interval{1000};
  // When no beat has been answered for this long, the coordinator is taken to be gone (the
  // job stopped, or it died) and on_coordinator_lost runs once, on the heartbeat thread.
  // 0: never.
  std::chrono::milliseconds coordinator_timeout{0};
  std::function<void()> on_coordinator_lost;
  // A reply said that the job stops (its coordinator got SIGTERM and will soon be gone):
  // runs once, on the heartbeat thread. nullptr: nothing (a server is shut down by the
  // coordinator itself).
  std::function<void()> on_job_stopping;
  // The clock that coordinator_timeout is measured on; nullptr: steady_clock::now. Tests
  // set a fake one to decide when the coordinator has been silent too long. The interval
  // between beats is always real time.
  std::function<std::chrono::steady_clock::time_point()> now;
};

class HeartbeatSender {
 public:
  // Connects and starts beating (the first beat goes at once).
  static Result<std::unique_ptr<HeartbeatSender>> Start(Transport* transport,
                                                        const HeartbeatOptions& options);
  ~HeartbeatSender();
  HeartbeatSender(const HeartbeatSender&) = delete;
  HeartbeatSender& operator=(const HeartbeatSender&) = delete;

  // Stops beating (the coordinator will declare this process dead unless it says it left).
  void Stop();
  // The coordinator answered that it evicted this worker (or replaced this server).
  bool evicted() const { return evicted_.load(); }
  // The incarnation (server/coordinator.h) of the coordinator that answered the latest
  // beat; 0 before the first answer. A change means the coordinator was restarted: a
  // request to it that is still unanswered must be sent again (worker/coordinator_call.h).
  uint64_t coordinator_incarnation() const { return incarnation_.load(); }
  uint64_t beats_sent() const { return beats_.load(); }
  // Called from the heartbeat thread with (server, endpoint) for each redirect in a reply;
  // nullptr: none. Once this returns, the previous handler is not running and will not be
  // called again, so that its owner may go away.
  void SetRedirectHandler(std::function<void(int, const std::string&)> handler);

 private:
  HeartbeatSender(const HeartbeatOptions& options, std::unique_ptr<ClientSocket> socket);
  void Loop();
  void NoteIncarnation(uint64_t seen);

  const HeartbeatOptions options_;
  std::unique_ptr<ClientSocket> socket_;  // owned by the thread
  std::atomic<bool> evicted_{false};
  std::atomic<uint64_t> incarnation_{0};
  std::atomic<uint64_t> beats_{0};
  std::mutex handler_mu_;
  std::function<void(int, const std::string&)> redirect_handler_;  // guarded by handler_mu_
  std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;  // guarded by mu_
  std::thread thread_;
};

}  // namespace ps
