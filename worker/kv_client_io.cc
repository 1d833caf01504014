// KVClient's I/O thread (see the thread model in worker/kv_client.h): sends what callers
// queued, batched per server; reads replies into their requests; resends unanswered parts
// and expires them; applies failover redirects.
#include <glog/logging.h>
#include <kj/exception.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "common/wire.h"
#include "worker/kv_client.h"
#include "worker/kv_client_internal.h"

namespace ps {
namespace {

// The type of a pull reply's values, when it is one: a pull reply with one values frame of
// rows x width values of a known type (common/wire_dtype.h).
Result<WireDtype> PullReplyDtype(wire::Header::Body::Reader body, const Frames& frames, size_t rows,
                                 size_t width) {
  if (body.which() != wire::Header::Body::PULL_REPLY || frames.size() != 2) {
    return InvalidArgument("not a pull reply with one values frame");
  }
  PS_ASSIGN_OR_RETURN(WireDtype dtype, WireDtypeFromWire(body.getPullReply().getValueDtype()));
  if (frames[1].size() != rows * width * WireDtypeBytes(dtype)) {
    return InvalidArgument("the values frame does not hold the part's rows");
  }
  return dtype;
}

}  // namespace

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
    } else if (part->kind == Kind::kClock) {
      if (body.which() != wire::Header::Body::CLOCK_REPLY) {
        status = Internal(who + " answered a clock tick with another type");
      } else if (part->rejoin) {
        RaiseClock(body.getClockReply().getMinClock());
      }
    } else if (part->kind == Kind::kPush) {
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
    } else if (Result<WireDtype> dtype = PullReplyDtype(body, frames, part->rows, part->width);
               !dtype.ok()) {
      status = Internal(who + " sent a malformed pull reply");
    } else {
      auto r = body.getPullReply();
      // Scatter outside the lock: the caller does not touch `out` until completion.
      ScatterPull(*part, static_cast<const char*>(frames[1].data()), *dtype);
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

void KVClient::ScatterPull(const Part& part, const char* src, WireDtype dtype) {
  // The frame may sit at any byte offset: copy bytes (DecodeFloats does too), never read it
  // as float*.
  float* out = part.request->out.data();
  const size_t w = part.width;
  const size_t row_bytes = w * WireDtypeBytes(dtype);
  if (part.is_range) {
    DecodeFloats(src, dtype, std::span<float>(out + part.out_row * w, part.rows * w));
    return;
  }
  for (size_t i = 0; i < part.positions.size(); ++i) {
    DecodeFloats(src + i * row_bytes, dtype,
                 std::span<float>(out + static_cast<size_t>(part.positions[i]) * w, w));
  }
}

void KVClient::RaiseClock(int64_t to) {
  int64_t mine = clock_.load();
  while (mine < to && !clock_.compare_exchange_weak(mine, to)) {
  }
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
    tick.setBatches(batches_per_clock_.load());
    tick.setLeave(!in_table);
    Frames frames;
    frames.push_back(EncodeFrame(b));
    Status sent = sockets_[s]->Send(std::move(frames));
    if (!sent.ok()) LOG(WARNING) << "clock to server " << server << ": " << sent.ToString();
  }
}

}  // namespace ps
