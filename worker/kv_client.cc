#include "worker/kv_client.h"

#include <glog/logging.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <random>

#include "common/wire.h"
#include "worker/kv_client_internal.h"

namespace ps {

struct KVClient::Submission {
  const Call& call;
  size_t width = 0;
  std::shared_ptr<Request> request;
  SteadyClock::time_point deadline;
  int64_t clock = 0;                          // every part's header carries it
  std::vector<uint64_t> pulled_version = {};  // pushes: by server, for the headers
  int32_t client_id = 0;
  WireDtype wire_dtype = WireDtype::kFp32;  // a push's gradients, or a pull's values

  bool push() const { return call.kind == Kind::kPush; }
  // A part of the call to `server`, of no rows yet.
  std::shared_ptr<Part> NewPart(int server) const {
    auto part = std::make_shared<Part>();
    part->kind = call.kind;
    part->table = call.table;
    part->width = width;
    part->deadline = deadline;
    part->server = server;
    return part;
  }
  // Writes the header of the part to `server` with id `request_id`; returns its keys, for
  // the caller to fill. `more_chunks`: a push chunk but the last of the server's share.
  wire::Keys::Builder EncodeHeader(capnp::MallocMessageBuilder& b, uint64_t request_id, int server,
                                   bool more_chunks) const {
    auto h = NewHeader(b, request_id, client_id);
    h.setTargetServer(server);
    auto body = h.getBody();
    if (push()) {
      auto p = body.initPush();
      p.setTableId(call.table);
      p.setClock(clock);
      p.setPulledVersion(pulled_version[static_cast<size_t>(server)]);
      p.setGradDtype(static_cast<uint8_t>(wire_dtype));
      p.setMoreChunks(more_chunks);
      return p.getKeys();
    }
    auto p = body.initPull();
    p.setTableId(call.table);
    p.setClock(clock);
    p.setValueDtype(static_cast<uint8_t>(wire_dtype));
    return p.getKeys();
  }
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
      pull_dtype_(options.pull_dtype),
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
  return Submit(
      {.kind = Kind::kPush, .table = table, .keys = keys, .grads = grads, .done = std::move(done)});
}
Ticket KVClient::Pull(uint32_t table, std::span<const uint64_t> keys, std::span<float> out,
                      Callback done) {
  return Submit(
      {.kind = Kind::kPull, .table = table, .keys = keys, .out = out, .done = std::move(done)});
}
Ticket KVClient::PushRange(uint32_t table, RowRange rows, std::span<const float> grads,
                           Callback done, std::span<const uint64_t> pulled_versions) {
  return Submit({.kind = Kind::kPush,
                 .table = table,
                 .range = rows,
                 .grads = grads,
                 .pulled_versions = pulled_versions,
                 .done = std::move(done)});
}
Ticket KVClient::PullRange(uint32_t table, RowRange rows, std::span<float> out, Callback done,
                           int64_t clock) {
  return Submit({.kind = Kind::kPull,
                 .table = table,
                 .range = rows,
                 .out = out,
                 .pull_clock = clock,
                 .done = std::move(done)});
}

Status KVClient::CheckCall(const Call& call) const {
  if (call.table >= config_.table_specs.size()) {
    return NotFound("table id " + std::to_string(call.table) + " is unknown");
  }
  const TableSpec& spec = config_.table_specs[call.table];
  size_t rows = call.keys.size();
  if (call.range) {
    const RowRange& range = *call.range;
    if (!spec.dense()) {
      return InvalidArgument("table '" + spec.name + "' is sparse: pass keys, not a range");
    }
    if (range.begin > range.end || range.end > spec.rows) {
      return InvalidArgument("rows [" + std::to_string(range.begin) + ", " +
                             std::to_string(range.end) + ") are outside table '" + spec.name +
                             "' of " + std::to_string(spec.rows) + " rows");
    }
    rows = range.size();
  } else if (spec.dense()) {
    for (uint64_t k : call.keys) {
      if (k >= spec.rows) {
        return InvalidArgument("row " + std::to_string(k) + " is outside table '" + spec.name +
                               "' of " + std::to_string(spec.rows) + " rows");
      }
    }
  }
  const bool push = call.kind == Kind::kPush;
  const size_t floats = push ? call.grads.size() : call.out.size();
  if (floats != rows * spec.width) {
    return InvalidArgument(std::string(push ? "push" : "pull") + " on table '" + spec.name +
                           "' got a buffer of " + std::to_string(floats) + " floats, expected " +
                           std::to_string(rows) + " rows x " + std::to_string(spec.width));
  }
  return Status::Ok();
}

Ticket KVClient::Submit(Call call) {
  if (Status s = CheckCall(call); !s.ok()) return Fail(s, std::move(call.done));
  auto request = std::make_shared<Request>();
  request->callback = std::move(call.done);
  request->out = call.out;
  request->kind = call.kind;
  request->start = SteadyClock::now();
  Submission s{
      .call = call,
      .width = config_.table_specs[call.table].width,
      .request = std::move(request),
      .deadline = SteadyClock::now() + options_.request_timeout,
      .clock = call.kind == Kind::kPull && call.pull_clock >= 0 ? call.pull_clock : clock_.load(),
      .client_id = options_.client_id,
      .wire_dtype = call.kind == Kind::kPull ? pull_dtype_.load() : options_.wire_dtype};
  if (s.push()) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      s.pulled_version = pulled_version_[call.table];
    }
    if (call.pulled_versions.size() == s.pulled_version.size()) {
      s.pulled_version.assign(call.pulled_versions.begin(), call.pulled_versions.end());
    }
  }
  return call.range ? SubmitRange(s) : SubmitKeys(s);
}

namespace {

// A row chunk of one server's share of a range request.
struct Chunk {
  int server;
  RowRange rows;
  bool more;  // not the share's last chunk
};

// `range` split by server, each server's share in chunks of at most `chunk_rows` rows.
std::vector<Chunk> SplitIntoChunks(const ShardMap& shard_map, uint32_t table, RowRange range,
                                   uint64_t chunk_rows) {
  std::vector<Chunk> chunks;
  for (const RangeSlice& slice : shard_map.SplitRange(table, range)) {
    uint64_t begin = slice.rows.begin;
    do {
      const uint64_t end =
          slice.rows.end - begin > chunk_rows ? begin + chunk_rows : slice.rows.end;
      chunks.push_back(Chunk{slice.server, RowRange{begin, end}, end < slice.rows.end});
      begin = end;
    } while (begin < slice.rows.end);
  }
  return chunks;
}

}  // namespace

Ticket KVClient::SubmitRange(const Submission& s) {
  const RowRange& range = *s.call.range;
  const bool push = s.push();
  const size_t width = s.width;
  // Each server's share in row chunks of at most chunk_bytes (see the header).
  const uint64_t row_bytes = width * sizeof(float);
  const uint64_t chunk_rows = options_.chunk_bytes == 0
                                  ? std::numeric_limits<uint64_t>::max()
                                  : std::max<uint64_t>(1, options_.chunk_bytes / row_bytes);
  const std::vector<Chunk> chunks = SplitIntoChunks(shard_map_, s.call.table, range, chunk_rows);
  std::vector<std::shared_ptr<Part>> parts;
  std::vector<uint64_t> request_ids;  // parallel to parts
  uint64_t payload_bytes = 0;
  for (const Chunk& c : chunks) {
    auto part = s.NewPart(c.server);
    part->is_range = true;
    part->out_row = c.rows.begin - range.begin;
    part->rows = c.rows.size();
    part->more_chunks = push && c.more;
    parts.push_back(std::move(part));
    request_ids.push_back(next_request_id_.fetch_add(1));
    if (push) payload_bytes += c.rows.size() * width * WireDtypeBytes(options_.wire_dtype);
  }
  CountRequest(s.call.kind, payload_bytes);
  // Registered first, then built and queued chunk by chunk: the I/O thread sends chunk k
  // (and the server applies it) while this thread encodes chunk k+1.
  const Ticket ticket = Register(s.request, parts, request_ids);
  for (size_t i = 0; i < chunks.size(); ++i) {
    const Chunk& c = chunks[i];
    capnp::MallocMessageBuilder b;
    auto k = s.EncodeHeader(b, request_ids[i], c.server, push && c.more);
    k.initRange().setBegin(c.rows.begin);
    k.getRange().setEnd(c.rows.end);
    Outgoing o{c.server, {}};
    o.frames.push_back(EncodeFrame(b));
    if (push) {
      const size_t first = c.rows.begin - range.begin;
      const size_t n = c.rows.size() * width;
      zmq::message_t values = NewPayload(c.server, n * WireDtypeBytes(options_.wire_dtype));
      EncodeFloats(s.call.grads.subspan(first * width, n), options_.wire_dtype, values.data());
      o.frames.push_back(std::move(values));
    }
    Queue(*parts[i], std::move(o));
  }
  return ticket;
}

Ticket KVClient::SubmitKeys(const Submission& s) {
  const std::span<const uint64_t> keys = s.call.keys;
  const bool push = s.push();
  const size_t width = s.width;
  // Each server's keys in chunks of at most chunk_bytes of fp32 rows, as range requests.
  const uint64_t chunk_keys = options_.chunk_bytes == 0
                                  ? std::numeric_limits<uint64_t>::max()
                                  : std::max<uint64_t>(1, options_.chunk_bytes / (width * 4));
  std::vector<std::shared_ptr<Part>> parts;
  std::vector<uint64_t> request_ids;  // parallel to parts
  uint64_t payload_bytes = 0;
  for (KeySlice& slice : shard_map_.SplitKeys(s.call.table, keys)) {
    const size_t n = slice.positions.size();
    for (size_t begin = 0; begin < n; begin += chunk_keys) {
      const size_t end = n - begin > chunk_keys ? begin + chunk_keys : n;
      auto part = s.NewPart(slice.server);
      part->rows = end - begin;
      part->more_chunks = push && end < n;
      part->positions.assign(slice.positions.begin() + static_cast<std::ptrdiff_t>(begin),
                             slice.positions.begin() + static_cast<std::ptrdiff_t>(end));
      if (push) payload_bytes += part->rows * width * WireDtypeBytes(options_.wire_dtype);
      parts.push_back(std::move(part));
      request_ids.push_back(next_request_id_.fetch_add(1));
    }
  }
  CountRequest(s.call.kind, payload_bytes);
  // Registered first, then built and queued chunk by chunk (as SubmitRange).
  const Ticket ticket = Register(s.request, parts, request_ids);
  for (size_t i = 0; i < parts.size(); ++i) {
    const Part& part = *parts[i];
    capnp::MallocMessageBuilder b;
    s.EncodeHeader(b, request_ids[i], part.server, part.more_chunks)
        .setListCount(part.positions.size());
    Outgoing o{part.server, {}};
    o.frames.push_back(EncodeFrame(b));
    zmq::message_t key_frame(part.positions.size() * sizeof(uint64_t));
    uint64_t* kp = static_cast<uint64_t*>(key_frame.data());
    for (size_t k = 0; k < part.positions.size(); ++k) kp[k] = keys[part.positions[k]];
    o.frames.push_back(std::move(key_frame));
    if (push) {
      const size_t row_bytes = width * WireDtypeBytes(options_.wire_dtype);
      zmq::message_t values = NewPayload(part.server, part.positions.size() * row_bytes);
      char* vp = static_cast<char*>(values.data());
      for (size_t k = 0; k < part.positions.size(); ++k) {
        EncodeFloats(s.call.grads.subspan(part.positions[k] * width, width), options_.wire_dtype,
                     vp + k * row_bytes);
      }
      o.frames.push_back(std::move(values));
    }
    Queue(*parts[i], std::move(o));
  }
  return ticket;
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

void KVClient::CountRequest(Kind kind, uint64_t payload_bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  if (kind == Kind::kPush) {
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
  return SendClock(ClockTick::kAdvance, std::move(done));
}

Ticket KVClient::Leave(Callback done) {
  in_clock_table_.store(false);
  return SendClock(ClockTick::kLeave, std::move(done));
}

Ticket KVClient::Rejoin(Callback done) {
  in_clock_table_.store(true);
  return SendClock(ClockTick::kRejoin, std::move(done));
}

Ticket KVClient::SendClock(ClockTick tick, Callback done) {
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
    auto clock = h.getBody().initClock();
    clock.setClock(clock_.load());
    clock.setBatches(batches_per_clock_.load());
    clock.setLeave(tick == ClockTick::kLeave);
    Outgoing o{s, {}};
    o.frames.push_back(EncodeFrame(b));
    auto part = std::make_shared<Part>();
    part->kind = Kind::kClock;
    part->rejoin = tick == ClockTick::kRejoin;
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
  std::optional<Kind> kind;
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
  if (kind && options_.on_request_done) {
    options_.on_request_done(*kind == Kind::kPush,
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

}  // namespace ps
