#include "worker/kv_client.h"

#include <glog/logging.h>
#include <kj/exception.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <random>

#include "common/wire.h"

namespace ps {

using SteadyClock = std::chrono::steady_clock;

struct KVClient::Request {
  int remaining = 0;
  Status status;
  bool done = false;
  Callback callback;
  std::span<float> out;  // pulls only
  RequestInfo info;
  int kind = -1;  // 0 push, 1 pull (for on_request_done); -1 other
  SteadyClock::time_point start;
};

struct KVClient::Part {
  enum class Kind { kPush, kPull, kClock };
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

namespace {
// A random 62-bit start, so that request ids are unique per client (see the header).
uint64_t RandomRequestIdStart() {
  std::random_device rd;
  const uint64_t r = (static_cast<uint64_t>(rd()) << 32) ^ rd();
  return (r & ((uint64_t{1} << 62) - 1)) + 1;
}
}  // namespace

Result<std::unique_ptr<KVClient>> KVClient::Create(Transport* transport, const JobConfig& config,
                                                   const std::vector<std::string>& endpoints,
                                                   const KVClientOptions& options) {
  if (static_cast<int>(endpoints.size()) != config.num_servers) {
    return InvalidArgument("got " + std::to_string(endpoints.size()) +
                           " server endpoints for a job of " + std::to_string(config.num_servers) +
                           " servers");
  }
  std::unique_ptr<KVClient> c(new KVClient(config, options));
  PS_RETURN_IF_ERROR(c->Start(transport, endpoints));
  return c;
}

KVClient::KVClient(const JobConfig& config, const KVClientOptions& options)
    : config_(config),
      options_(options),
      shard_map_(config.table_specs, config.num_servers),
      next_request_id_(RandomRequestIdStart()),
      pulled_version_(config.table_specs.size(),
                      std::vector<uint64_t>(static_cast<size_t>(config.num_servers), 0)) {}

Status KVClient::Start(Transport* transport, const std::vector<std::string>& endpoints) {
  transport_ = transport;
  endpoints_ = endpoints;
  for (const std::string& e : endpoints) {
    PS_ASSIGN_OR_RETURN(std::unique_ptr<ClientSocket> s, transport->Connect(e));
    sockets_.push_back(std::move(s));
  }
  wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (wake_fd_ < 0) return Internal(std::string("eventfd: ") + std::strerror(errno));
  io_thread_ = std::thread([this] { IoLoop(); });
  return Status::Ok();
}

KVClient::~KVClient() {
  stopping_.store(true);
  if (io_thread_.joinable()) {
    Wake();
    io_thread_.join();
  }
  std::vector<Ticket> pending;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [id, part] : parts_) pending.push_back(part->ticket);
    parts_.clear();
  }
  for (Ticket t : pending) Complete(t, Aborted("the client was closed"));
  if (wake_fd_ >= 0) close(wake_fd_);
}

Result<uint32_t> KVClient::FindTable(const std::string& name) const {
  for (const TableSpec& t : config_.table_specs) {
    if (t.name == name) return t.id;
  }
  return NotFound("no table named '" + name + "'");
}

void KVClient::Wake() {
  uint64_t one = 1;
  ssize_t n = write(wake_fd_, &one, sizeof(one));
  (void)n;  // a full counter still wakes the loop
}

Ticket KVClient::Fail(const Status& status, Callback done) {
  std::shared_ptr<Request> r = std::make_shared<Request>();
  r->remaining = 1;
  r->callback = std::move(done);
  Ticket t;
  {
    std::lock_guard<std::mutex> lock(mu_);
    t = next_ticket_++;
    requests_[t] = r;
  }
  Complete(t, status);
  return t;
}

Ticket KVClient::Push(uint32_t table, std::span<const uint64_t> keys, std::span<const float> grads,
                      Callback done) {
  return Submit(true, table, keys, nullptr, grads, {}, std::move(done));
}
Ticket KVClient::Pull(uint32_t table, std::span<const uint64_t> keys, std::span<float> out,
                      Callback done) {
  return Submit(false, table, keys, nullptr, {}, out, std::move(done));
}
Ticket KVClient::PushRange(uint32_t table, RowRange rows, std::span<const float> grads,
                           Callback done, std::span<const uint64_t> pulled_versions) {
  return Submit(true, table, {}, &rows, grads, {}, std::move(done), -1, pulled_versions);
}
Ticket KVClient::PullRange(uint32_t table, RowRange rows, std::span<float> out, Callback done,
                           int64_t clock) {
  return Submit(false, table, {}, &rows, {}, out, std::move(done), clock);
}

Ticket KVClient::Submit(bool push, uint32_t table, std::span<const uint64_t> keys,
                        const RowRange* range, std::span<const float> grads, std::span<float> out,
                        Callback done, int64_t pull_clock,
                        std::span<const uint64_t> pulled_versions) {
  if (table >= config_.table_specs.size()) {
    return Fail(NotFound("table id " + std::to_string(table) + " is unknown"), std::move(done));
  }
  const TableSpec& spec = config_.table_specs[table];
  const size_t width = spec.width;
  size_t rows = keys.size();
  if (range != nullptr) {
    if (!spec.dense()) {
      return Fail(InvalidArgument("table '" + spec.name + "' is sparse: pass keys, not a range"),
                  std::move(done));
    }
    if (range->begin > range->end || range->end > spec.rows) {
      return Fail(InvalidArgument("rows [" + std::to_string(range->begin) + ", " +
                                  std::to_string(range->end) + ") are outside table '" + spec.name +
                                  "' of " + std::to_string(spec.rows) + " rows"),
                  std::move(done));
    }
    rows = range->size();
  } else if (spec.dense()) {
    for (uint64_t k : keys) {
      if (k >= spec.rows) {
        return Fail(InvalidArgument("row " + std::to_string(k) + " is outside table '" + spec.name +
                                    "' of " + std::to_string(spec.rows) + " rows"),
                    std::move(done));
      }
    }
  }
  size_t floats = push ? grads.size() : out.size();
  if (floats != rows * width) {
    return Fail(
        InvalidArgument(std::string(push ? "push" : "pull") + " on table '" + spec.name +
                        "' got a buffer of " + std::to_string(floats) + " floats, expected " +
                        std::to_string(rows) + " rows x " + std::to_string(width)),
        std::move(done));
  }

  auto request = std::make_shared<Request>();
  request->callback = std::move(done);
  request->out = out;
  request->kind = push ? 0 : 1;
  request->start = SteadyClock::now();
  std::vector<std::shared_ptr<Part>> parts;
  std::vector<uint64_t> request_ids;  // parallel to parts
  std::vector<Outgoing> outgoing;
  const auto deadline = SteadyClock::now() + options_.request_timeout;
  const int64_t clock = !push && pull_clock >= 0 ? pull_clock : clock_.load();
  std::vector<uint64_t> pulled_version;
  if (push) {
    std::lock_guard<std::mutex> lock(mu_);
    pulled_version = pulled_version_[table];
  }
  if (push && pulled_versions.size() == pulled_version.size()) {
    pulled_version.assign(pulled_versions.begin(), pulled_versions.end());
  }
  auto header = [&](capnp::MallocMessageBuilder& b, uint64_t rid, int server,
                    bool more_chunks = false) {
    auto h = NewHeader(b, rid, options_.client_id);
    h.setTargetServer(server);
    auto body = h.getBody();
    if (push) {
      auto p = body.initPush();
      p.setTableId(table);
      p.setClock(clock);
      p.setPulledVersion(pulled_version[static_cast<size_t>(server)]);
      p.setGradDtype(static_cast<uint8_t>(options_.wire_dtype));
      p.setMoreChunks(more_chunks);
      return p.getKeys();
    }
    auto p = body.initPull();
    p.setTableId(table);
    p.setClock(clock);
    return p.getKeys();
  };
  uint64_t payload_bytes = 0;
  if (range != nullptr) {
    // Each server's share in row chunks of at most chunk_bytes (see the header).
    const uint64_t row_bytes = width * sizeof(float);
    const uint64_t chunk_rows = options_.chunk_bytes == 0
                                    ? std::numeric_limits<uint64_t>::max()
                                    : std::max<uint64_t>(1, options_.chunk_bytes / row_bytes);
    struct Chunk {
      int server;
      RowRange rows;
      bool more;  // not the share's last chunk
    };
    std::vector<Chunk> chunks;
    for (const RangeSlice& slice : shard_map_.SplitRange(table, *range)) {
      uint64_t begin = slice.rows.begin;
      do {
        const uint64_t end =
            slice.rows.end - begin > chunk_rows ? begin + chunk_rows : slice.rows.end;
        chunks.push_back(Chunk{slice.server, RowRange{begin, end}, end < slice.rows.end});
        begin = end;
      } while (begin < slice.rows.end);
    }
    for (const Chunk& c : chunks) {
      auto part = std::make_shared<Part>();
      part->kind = push ? Part::Kind::kPush : Part::Kind::kPull;
      part->table = table;
      part->width = width;
      part->deadline = deadline;
      part->is_range = true;
      part->out_row = c.rows.begin - range->begin;
      part->rows = c.rows.size();
      part->server = c.server;
      part->more_chunks = push && c.more;
      parts.push_back(std::move(part));
      request_ids.push_back(next_request_id_.fetch_add(1));
      if (push) payload_bytes += c.rows.size() * width * WireDtypeBytes(options_.wire_dtype);
    }
    CountRequest(push, payload_bytes);
    // Registered first, then built and queued chunk by chunk: the I/O thread sends chunk k
    // (and the server applies it) while this thread encodes chunk k+1.
    const Ticket ticket = Register(request, parts, request_ids);
    for (size_t i = 0; i < chunks.size(); ++i) {
      const Chunk& c = chunks[i];
      capnp::MallocMessageBuilder b;
      auto k = header(b, request_ids[i], c.server, push && c.more);
      k.initRange().setBegin(c.rows.begin);
      k.getRange().setEnd(c.rows.end);
      Outgoing o{c.server, {}};
      o.frames.push_back(EncodeFrame(b));
      if (push) {
        const size_t first = c.rows.begin - range->begin;
        const size_t n = c.rows.size() * width;
        zmq::message_t values = NewPayload(c.server, n * WireDtypeBytes(options_.wire_dtype));
        EncodeFloats(grads.subspan(first * width, n), options_.wire_dtype, values.data());
        o.frames.push_back(std::move(values));
      }
      Queue(*parts[i], std::move(o));
    }
    return ticket;
  } else {
    for (KeySlice& slice : shard_map_.SplitKeys(table, keys)) {
      auto part = std::make_shared<Part>();
      uint64_t rid = next_request_id_.fetch_add(1);
      capnp::MallocMessageBuilder b;
      header(b, rid, slice.server).setListCount(slice.positions.size());
      Outgoing o{slice.server, {}};
      o.frames.push_back(EncodeFrame(b));
      zmq::message_t key_frame(slice.positions.size() * sizeof(uint64_t));
      uint64_t* kp = static_cast<uint64_t*>(key_frame.data());
      for (size_t i = 0; i < slice.positions.size(); ++i) kp[i] = keys[slice.positions[i]];
      o.frames.push_back(std::move(key_frame));
      if (push) {
        const size_t row_bytes = width * WireDtypeBytes(options_.wire_dtype);
        zmq::message_t values = NewPayload(slice.server, slice.positions.size() * row_bytes);
        char* vp = static_cast<char*>(values.data());
        for (size_t i = 0; i < slice.positions.size(); ++i) {
          EncodeFloats(grads.subspan(slice.positions[i] * width, width), options_.wire_dtype,
                       vp + i * row_bytes);
        }
        payload_bytes += values.size();
        o.frames.push_back(std::move(values));
      }
      part->rows = slice.positions.size();
      part->positions = std::move(slice.positions);
      part->server = slice.server;
      parts.push_back(part);
      request_ids.push_back(rid);
      outgoing.push_back(std::move(o));
    }
  }

  for (auto& part : parts) {
    part->kind = push ? Part::Kind::kPush : Part::Kind::kPull;
    part->table = table;
    part->width = width;
    part->deadline = deadline;
  }
  CountRequest(push, payload_bytes);
  return Enqueue(std::move(request), std::move(parts), std::move(request_ids), std::move(outgoing));
}

zmq::message_t KVClient::NewPayload(int server, size_t bytes) {
  std::lock_guard<std::mutex> lock(sockets_mu_);
  return sockets_[static_cast<size_t>(server)]->NewFrame(bytes);
}

bool KVClient::KeepFrames() const {
  // The frames are kept for retries, and for a resend after a failover (with replicas, or
  // to a server restarted from a checkpoint).
  return options_.retry_interval.count() > 0 || config_.replicas >= 2 ||
         !config_.checkpoint_dir.empty();
}

Ticket KVClient::Register(const std::shared_ptr<Request>& request,
                          const std::vector<std::shared_ptr<Part>>& parts,
                          const std::vector<uint64_t>& request_ids) {
  Ticket ticket;
  {
    std::lock_guard<std::mutex> lock(mu_);
    ticket = next_ticket_++;
    // An empty request (zero rows) completes at once, below.
    request->remaining = std::max<int>(1, static_cast<int>(parts.size()));
    requests_[ticket] = request;
    for (size_t i = 0; i < parts.size(); ++i) {
      parts[i]->ticket = ticket;
      parts[i]->request = request;
      parts_[request_ids[i]] = parts[i];
    }
  }
  if (parts.empty()) Complete(ticket, Status::Ok());
  return ticket;
}

void KVClient::Queue(Part& part, Outgoing o) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (KeepFrames()) {
      part.frames = ShareFrames(o.frames);
      part.next_retry = SteadyClock::now() + options_.retry_interval;
    }
    outbox_.push_back(std::move(o));
  }
  if (corks_.load() == 0) Wake();
}

Ticket KVClient::Enqueue(std::shared_ptr<Request> request, std::vector<std::shared_ptr<Part>> parts,
                         std::vector<uint64_t> request_ids, std::vector<Outgoing> outgoing) {
  const Ticket ticket = Register(request, parts, request_ids);
  for (size_t i = 0; i < parts.size(); ++i) Queue(*parts[i], std::move(outgoing[i]));
  return ticket;
}

void KVClient::CountRequest(bool push, uint64_t payload_bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  if (push) {
    ++stats_.pushes;
    stats_.bytes_pushed += payload_bytes;
  } else {
    ++stats_.pulls;
  }
}

void KVClient::Cork() { corks_.fetch_add(1); }

void KVClient::Uncork() {
  const int before = corks_.fetch_sub(1);
  CHECK_GT(before, 0) << "KVClient::Uncork without Cork";
  if (before == 1) Wake();
}

Ticket KVClient::Clock(Callback done) {
  in_clock_table_.store(true);
  clock_.fetch_add(1);
  return SendClock(false, false, std::move(done));
}

Ticket KVClient::Leave(Callback done) {
  in_clock_table_.store(false);
  return SendClock(true, false, std::move(done));
}

Ticket KVClient::Rejoin(Callback done) {
  in_clock_table_.store(true);
  return SendClock(false, true, std::move(done));
}

Ticket KVClient::SendClock(bool leave, bool rejoin, Callback done) {
  auto request = std::make_shared<Request>();
  request->callback = std::move(done);
  std::vector<std::shared_ptr<Part>> parts;
  std::vector<uint64_t> request_ids;
  std::vector<Outgoing> outgoing;
  const auto deadline = SteadyClock::now() + options_.request_timeout;
  for (int s = 0; s < config_.num_servers; ++s) {
    uint64_t rid = next_request_id_.fetch_add(1);
    capnp::MallocMessageBuilder b;
    auto h = NewHeader(b, rid, options_.client_id);
    h.setTargetServer(s);
    auto tick = h.getBody().initClock();
    tick.setClock(clock_.load());
    tick.setLeave(leave);
    Outgoing o{s, {}};
    o.frames.push_back(EncodeFrame(b));
    auto part = std::make_shared<Part>();
    part->kind = Part::Kind::kClock;
    part->rejoin = rejoin;
    part->server = s;
    part->deadline = deadline;
    parts.push_back(part);
    request_ids.push_back(rid);
    outgoing.push_back(std::move(o));
  }
  return Enqueue(std::move(request), std::move(parts), std::move(request_ids), std::move(outgoing));
}

void KVClient::Complete(Ticket ticket, const Status& status) {
  Callback callback;
  Status final_status;
  int kind = -1;
  bool ok = false;
  SteadyClock::time_point start;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = requests_.find(ticket);
    if (it == requests_.end()) return;
    Request& r = *it->second;
    if (!status.ok() && r.status.ok()) r.status = status;
    if (--r.remaining > 0) return;
    r.done = true;
    kind = r.kind;
    ok = r.status.ok();
    start = r.start;
    if (r.callback) {
      callback = std::move(r.callback);
      final_status = r.status;
      requests_.erase(it);
    }
  }
  if (kind >= 0 && options_.on_request_done) {
    options_.on_request_done(kind == 0,
                             std::chrono::duration<double>(SteadyClock::now() - start).count(), ok);
  }
  if (callback) {
    callback(final_status);
  } else {
    cv_.notify_all();
  }
}

Status KVClient::Wait(Ticket ticket, RequestInfo* info) {
  std::unique_lock<std::mutex> lock(mu_);
  auto it = requests_.find(ticket);
  if (it == requests_.end()) {
    return NotFound("ticket " + std::to_string(ticket) + " is unknown or already waited on");
  }
  std::shared_ptr<Request> r = it->second;
  // Parts expire on the I/O thread at request_timeout; this bound is only a backstop.
  bool done = cv_.wait_for(lock, options_.request_timeout * 2 + std::chrono::seconds(1),
                           [&] { return r->done; });
  requests_.erase(ticket);
  if (!done) return DeadlineExceeded("request " + std::to_string(ticket) + " never completed");
  if (info != nullptr) *info = r->info;
  return r->status;
}

KVClientStats KVClient::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

void KVClient::OnReply(int server, Frames frames) {
  if (frames.empty()) return;
  Result<DecodedHeader> h = DecodedHeader::Decode(frames[0]);
  if (!h.ok()) {
    LOG(WARNING) << "dropping an undecodable reply from server " << server << ": "
                 << h.status().ToString();
    return;
  }
  std::shared_ptr<Part> part;
  Status status;
  try {
    auto header = h->get();
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = parts_.find(header.getRequestId());
      if (it == parts_.end()) return;  // answered after it timed out
      part = it->second;
      parts_.erase(it);
    }
    status = CheckProtocolVersion(header);
    auto body = header.getBody();
    const std::string who = "server " + std::to_string(server);
    if (!status.ok()) {
    } else if (body.which() == wire::Header::Body::ERROR) {
      status = StatusFromError(body.getError());
    } else if (part->kind == Part::Kind::kClock) {
      if (body.which() != wire::Header::Body::CLOCK_REPLY) {
        status = Internal(who + " answered a clock tick with another type");
      } else if (part->rejoin) {
        const int64_t min_clock = body.getClockReply().getMinClock();
        int64_t mine = clock_.load();
        while (mine < min_clock && !clock_.compare_exchange_weak(mine, min_clock)) {
        }
      }
    } else if (part->kind == Part::Kind::kPush) {
      if (body.which() != wire::Header::Body::PUSH_REPLY) {
        status = Internal(who + " answered a push with another type");
      } else {
        auto r = body.getPushReply();
        std::lock_guard<std::mutex> lock(mu_);
        if (part->more_chunks) {
          // Counted once per part, from its last chunk's answer (see Chunks in the header).
        } else if (r.getDropped()) {
          ++stats_.pushes_dropped;
        } else {
          ++stats_.staleness_count;
          stats_.staleness_sum += r.getStaleness();
          stats_.staleness_max = std::max<uint64_t>(stats_.staleness_max, r.getStaleness());
          stats_.last_learning_rate = r.getLearningRate();
        }
      }
    } else if (body.which() != wire::Header::Body::PULL_REPLY || frames.size() != 2 ||
               frames[1].size() != part->rows * part->width * sizeof(float)) {
      status = Internal(who + " sent a malformed pull reply");
    } else {
      // Scatter outside the lock: the caller does not touch `out` until completion.
      // The frame may sit at any byte offset: copy bytes, never read it as float*.
      const char* src = static_cast<const char*>(frames[1].data());
      float* out = part->request->out.data();
      const size_t w = part->width;
      const size_t row_bytes = w * sizeof(float);
      if (part->is_range) {
        std::memcpy(out + part->out_row * w, src, part->rows * row_bytes);
      } else {
        for (size_t i = 0; i < part->positions.size(); ++i) {
          std::memcpy(out + static_cast<size_t>(part->positions[i]) * w, src + i * row_bytes,
                      row_bytes);
        }
      }
      auto r = body.getPullReply();
      std::lock_guard<std::mutex> lock(mu_);
      stats_.bytes_pulled += frames[1].size();
      stats_.max_clock_lag = std::max(stats_.max_clock_lag, r.getClockLag());
      pulled_version_[part->table][static_cast<size_t>(server)] = r.getVersion();
      RequestInfo& info = part->request->info;
      info.held_seconds = std::max(info.held_seconds, r.getHeldMicros() / 1e6);
      info.clock_lag = std::max(info.clock_lag, r.getClockLag());
      if (info.versions.empty()) info.versions.assign(pulled_version_[part->table].size(), 0);
      info.versions[static_cast<size_t>(server)] = r.getVersion();
    }
  } catch (const kj::Exception& e) {
    status = Internal(std::string("malformed reply: ") + e.getDescription().cStr());
  }
  if (part) Complete(part->ticket, status.WithContext("server " + std::to_string(server)));
}

void KVClient::SendBatched(std::vector<Outgoing>& outbox) {
  // Per server, in call order: each server's messages go as one batch (several when they
  // pass kMaxBatchFrames), so a step's requests to a server cost one round trip.
  std::vector<std::vector<Frames>> batch(sockets_.size());
  std::vector<size_t> frames(sockets_.size(), 1);  // the batch header
  auto send = [&](size_t server) {
    if (batch[server].empty()) return;
    Status s = sockets_[server]->SendBatch(std::move(batch[server]));
    // A failed send leaves the parts to time out (or to their retry).
    if (!s.ok()) LOG(WARNING) << "send to server " << server << ": " << s.ToString();
    batch[server].clear();
    frames[server] = 1;
  };
  for (Outgoing& o : outbox) {
    const size_t server = static_cast<size_t>(o.server);
    if (frames[server] + o.frames.size() > kMaxBatchFrames) send(server);
    frames[server] += o.frames.size();
    batch[server].push_back(std::move(o.frames));
  }
  for (size_t server = 0; server < batch.size(); ++server) send(server);
  outbox.clear();
}

void KVClient::IoLoop() {
  std::vector<zmq::pollitem_t> items;
  for (auto& s : sockets_) items.push_back({s->PollHandle().handle(), 0, ZMQ_POLLIN, 0});
  items.push_back({nullptr, wake_fd_, ZMQ_POLLIN, 0});
  const size_t wake_index = items.size() - 1;
  // Expiry is checked at this period: requests time out within request_timeout + this.
  const auto expiry_period = std::chrono::milliseconds(100);
  auto next_expiry_check = SteadyClock::now() + expiry_period;
  while (true) {
    try {
      PollSockets(items.data(), items.size(), expiry_period);
    } catch (const zmq::error_t& e) {
      if (e.num() == ETERM) break;
      LOG(ERROR) << "client poll: " << e.what();
      break;
    }
    if (items[wake_index].revents & ZMQ_POLLIN) {
      uint64_t n;
      ssize_t r = read(wake_fd_, &n, sizeof(n));
      (void)r;
    }
    if (stopping_.load()) break;
    ApplyRedirects(items);
    std::vector<Outgoing> outbox;
    if (corks_.load() == 0) {
      std::lock_guard<std::mutex> lock(mu_);
      outbox.swap(outbox_);
    }
    SendBatched(outbox);
    for (size_t i = 0; i < sockets_.size(); ++i) {
      if (!(items[i].revents & ZMQ_POLLIN)) continue;
      while (true) {
        Result<std::optional<Frames>> f = sockets_[i]->TryRecv();
        if (!f.ok() || !f->has_value()) break;
        OnReply(static_cast<int>(i), std::move(**f));
      }
    }
    auto now = SteadyClock::now();
    if (now >= next_expiry_check) {
      next_expiry_check = now + expiry_period;
      std::vector<std::pair<Ticket, int>> expired;
      std::vector<Outgoing> resend;
      {
        std::lock_guard<std::mutex> lock(mu_);
        for (auto it = parts_.begin(); it != parts_.end();) {
          Part& p = *it->second;
          if (p.deadline <= now) {
            expired.emplace_back(p.ticket, p.server);
            it = parts_.erase(it);
            continue;
          }
          if (!p.frames.empty() && options_.retry_interval.count() > 0 && p.next_retry <= now) {
            // No reply yet: the same request (same id) again.
            resend.push_back(Outgoing{p.server, ShareFrames(p.frames)});
            p.next_retry = now + options_.retry_interval;
            ++stats_.retries;
          }
          ++it;
        }
      }
      for (Outgoing& o : resend) {
        Status sent = sockets_[static_cast<size_t>(o.server)]->Send(std::move(o.frames));
        if (!sent.ok()) LOG(WARNING) << "resend to server " << o.server << ": " << sent.ToString();
      }
      for (auto [t, server] : expired) {
        Complete(t,
                 DeadlineExceeded("server " + std::to_string(server) + " did not answer within " +
                                  std::to_string(options_.request_timeout.count()) + " ms"));
      }
    }
  }
}

void KVClient::Redirect(int server, const std::string& endpoint) {
  if (server < 0 || server >= config_.num_servers) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    redirects_.emplace_back(server, endpoint);
  }
  Wake();
}

void KVClient::ApplyRedirects(std::vector<zmq::pollitem_t>& items) {
  std::vector<std::pair<int, std::string>> redirects;
  {
    std::lock_guard<std::mutex> lock(mu_);
    redirects.swap(redirects_);
  }
  for (auto& [server, endpoint] : redirects) {
    const size_t s = static_cast<size_t>(server);
    if (endpoints_[s] == endpoint) continue;
    Result<std::unique_ptr<ClientSocket>> socket = transport_->Connect(endpoint);
    if (!socket.ok()) {
      // Parts to that server time out as they would have; a later redirect may succeed.
      LOG(ERROR) << "redirect of server " << server << " to " << endpoint << ": "
                 << socket.status().ToString();
      continue;
    }
    LOG(WARNING) << "server " << server << " failed over: its shards are served at " << endpoint
                 << " now; resending what it had not answered";
    std::unique_ptr<ClientSocket> old = std::move(socket).value();
    {
      // Callers building payloads (NewPayload) read sockets_[s] under this lock. Frames
      // already built in the old socket's ring keep it mapped and are copied on resend.
      std::lock_guard<std::mutex> lock(sockets_mu_);
      sockets_[s].swap(old);
    }
    old.reset();
    endpoints_[s] = endpoint;
    items[s] = {sockets_[s]->PollHandle().handle(), 0, ZMQ_POLLIN, 0};
    // Where this worker stands, read before the parts are: every push of the clocks
    // before `clock` is among them (or answered).
    const int64_t clock = clock_.load();
    const bool in_table = in_clock_table_.load();
    // Everything the dead server had not answered, in request-id order (the order it was
    // sent in), with the same ids: a push it applied is answered again, not applied twice.
    std::vector<std::pair<uint64_t, Frames>> resend;
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (auto& [rid, part] : parts_) {
        if (part->server != server || part->frames.empty()) continue;
        resend.emplace_back(rid, ShareFrames(part->frames));
        part->next_retry = SteadyClock::now() + options_.retry_interval;
      }
      // Parts queued but not yet sent go out below, to the new socket.
    }
    std::sort(resend.begin(), resend.end(),
              [](const auto& a, const auto& b) { return a.first < b.first; });
    for (auto& [rid, frames] : resend) {
      Status sent = sockets_[s]->Send(std::move(frames));
      if (!sent.ok()) LOG(WARNING) << "resend to server " << server << ": " << sent.ToString();
    }
    // Then this worker's clock (or that it is out of the clock table), after its pushes: a
    // server restarted from a checkpoint (--replicas=1) knows only the checkpoint's clocks
    // and would hold pulls on them. Its reply answers no part and is dropped; a promoted
    // backup already has this clock, and a repeated tick changes nothing.
    capnp::MallocMessageBuilder b;
    auto h = NewHeader(b, next_request_id_.fetch_add(1), options_.client_id);
    h.setTargetServer(server);
    auto tick = h.getBody().initClock();
    tick.setClock(clock);
    tick.setLeave(!in_table);
    Frames frames;
    frames.push_back(EncodeFrame(b));
    Status sent = sockets_[s]->Send(std::move(frames));
    if (!sent.ok()) LOG(WARNING) << "clock to server " << server << ": " << sent.ToString();
  }
}

}  // namespace ps
