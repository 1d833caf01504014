// KVClient's request records, shared by its caller side (kv_client.cc) and its I/O thread
// (kv_client_io.cc). Not part of the API: include worker/kv_client.h.
//
// Thread model: a Request and its Parts are built by the calling thread; once Register
// publishes them, a Part's description (server, kind, rows, where its rows go) is read-only;
// its frames and next_retry, and the Request's status, remaining, done and info, are guarded
// by KVClient::mu_. A pull's `out` rows are written by the I/O thread alone, outside the lock.
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "worker/kv_client.h"

namespace ps {

using SteadyClock = std::chrono::steady_clock;

struct KVClient::Request {
  int remaining = 0;
  Status status;
  bool done = false;
  Callback callback;
  std::span<float> out;  // pulls only
  RequestInfo info;
  // Push and Pull calls (kPush, kPull) are reported to on_request_done; clock ticks and
  // calls refused at once (Fail) have none.
  std::optional<Kind> kind;
  SteadyClock::time_point start;
};

struct KVClient::Part {
  bool rejoin = false;       // clock parts: adopt the server's minimum clock
  bool more_chunks = false;  // push chunks but the last of a server's share: no stats
  Ticket ticket = 0;
  std::shared_ptr<Request> request;
  int server = 0;
  Kind kind = Kind::kPull;
  uint32_t table = 0;
  size_t width = 0;
  size_t rows = 0;
  // Where this part's rows go in the request's output: a range part starts at row
  // `out_row`; a key-list part scatters to `positions`.
  bool is_range = false;
  size_t out_row = 0;
  std::vector<uint32_t> positions;
  SteadyClock::time_point deadline;
  // For retries: the request's frames (sharing the payload buffers) and when to resend.
  Frames frames;
  SteadyClock::time_point next_retry;
};

}  // namespace ps
