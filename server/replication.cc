#include "server/replication.h"

#include <glog/logging.h>

#include <optional>

#include "common/wire.h"

namespace ps {

int BackupOf(const JobConfig& config, int primary) {
  if (config.replicas < 2 || config.num_servers < 2) return -1;
  return (primary + 1) % config.num_servers;
}

RequestKind Classify(const Frames& request) {
  if (request.empty()) return RequestKind::kOther;
  Result<DecodedHeader> h = DecodedHeader::Decode(request[0]);
  if (!h.ok()) return RequestKind::kOther;
  try {
    switch (h->get().getBody().which()) {
      case wire::Header::Body::PUSH:
      case wire::Header::Body::CLOCK:
      case wire::Header::Body::EVICT:
        return RequestKind::kChangesState;
      case wire::Header::Body::REPLICATE:
        return RequestKind::kReplicate;
      case wire::Header::Body::PROMOTE:
        return RequestKind::kPromote;
      case wire::Header::Body::REREPLICATE:
        return RequestKind::kRereplicate;
      case wire::Header::Body::SEED:
        return RequestKind::kSeed;
      default:
        return RequestKind::kOther;
    }
  } catch (const std::exception&) {
    return RequestKind::kOther;
  }
}

bool IsShardRequest(const Frames& request) {
  if (request.empty()) return false;
  Result<DecodedHeader> h = DecodedHeader::Decode(request[0]);
  if (!h.ok()) return false;
  try {
    const auto which = h->get().getBody().which();
    return which == wire::Header::Body::PUSH || which == wire::Header::Body::PULL ||
           which == wire::Header::Body::CLOCK;
  } catch (const std::exception&) {
    return false;
  }
}

int TargetServer(const Frames& request) {
  if (request.empty()) return -1;
  Result<DecodedHeader> h = DecodedHeader::Decode(request[0]);
  if (!h.ok()) return -1;
  try {
    return h->get().getTargetServer();
  } catch (const std::exception&) {
    return -1;
  }
}

Frames WrapForBackup(int primary, uint64_t request_id, Frames request) {
  capnp::MallocMessageBuilder b;
  NewHeader(b, request_id, primary).getBody().initReplicate().setPrimary(primary);
  Frames f;
  f.reserve(request.size() + 1);
  f.push_back(EncodeFrame(b));
  for (zmq::message_t& m : request) f.push_back(std::move(m));
  return f;
}

Result<Frames> SeedMessage(ServerCore& core, uint64_t request_id, size_t* bytes) {
  std::string snapshot;
  PS_RETURN_IF_ERROR(core.SaveReplica(&snapshot));
  *bytes = snapshot.size();
  capnp::MallocMessageBuilder b;
  NewHeader(b, request_id, core.server_id()).getBody().initSeed().setPrimary(core.server_id());
  Frames f;
  f.push_back(EncodeFrame(b));
  f.emplace_back(snapshot.data(), snapshot.size());
  return f;
}

Frames LoadSeed(ServerCore& core, int self, const Frames& message) {
  uint64_t request_id = 0;
  Status s;
  if (message.size() != 2) {
    s = InvalidArgument("a seed message has a header and the snapshot; this one has " +
                        std::to_string(message.size()) + " frames");
  } else {
    Result<DecodedHeader> h = DecodedHeader::Decode(message[0]);
    s = h.status();
    try {
      if (h.ok()) {
        request_id = h->get().getRequestId();
        const int primary = h->get().getBody().getSeed().getPrimary();
        if (primary != core.server_id()) {
          s = InvalidArgument("a seed of server " + std::to_string(primary) +
                              "'s shards sent to a copy of server " +
                              std::to_string(core.server_id()) + "'s");
        }
      }
    } catch (const std::exception& e) {
      s = InvalidArgument(e.what());
    }
  }
  if (s.ok()) {
    s = core.LoadReplica(
        std::string_view(static_cast<const char*>(message[1].data()), message[1].size()));
  }
  if (!s.ok()) return ErrorReply(request_id, self, s);
  capnp::MallocMessageBuilder b;
  NewHeader(b, request_id, self).getBody().setSeedReply();
  Frames reply;
  reply.push_back(EncodeFrame(b));
  return reply;
}

BackupStore::BackupStore(JobConfig config, int self, StoreOptions store)
    : config_(std::move(config)), self_(self), store_(std::move(store)) {
  // The primary writes its own checkpoints; a copy writing the same files would race it.
  config_.checkpoint_every = 0;
  config_.checkpoint_every_seconds = 0;
}

std::optional<Frames> BackupStore::Address(const Frames& message, wire::Header::Body::Which which,
                                           size_t min_frames, Addressed* to) const {
  const char* what = which == wire::Header::Body::REPLICATE ? "replicate" : "promote";
  if (message.size() < min_frames) {
    return ErrorReply(0, self_, InvalidArgument(std::string("empty ") + what + " message"));
  }
  Result<DecodedHeader> decoded = DecodedHeader::Decode(message[0]);
  if (!decoded.ok()) return ErrorReply(0, self_, decoded.status());
  try {
    wire::Header::Reader h = decoded->get();
    to->request_id = h.getRequestId();
    if (h.getBody().which() != which) {
      return ErrorReply(to->request_id, self_,
                        InvalidArgument(std::string("not a ") + what + " message"));
    }
    to->primary = which == wire::Header::Body::REPLICATE ? h.getBody().getReplicate().getPrimary()
                                                         : h.getBody().getPromote().getPrimary();
  } catch (const std::exception& e) {
    return ErrorReply(to->request_id, self_, InvalidArgument(e.what()));
  }
  if (to->primary < 0 || BackupOf(config_, to->primary) != self_) {
    return ErrorReply(
        to->request_id, self_,
        FailedPrecondition("server " + std::to_string(self_) + " is not the backup of server " +
                           std::to_string(to->primary)));
  }
  return std::nullopt;
}

Result<ServerCore*> BackupStore::Shadow(int primary) {
  std::unique_ptr<ServerCore>& shadow = shadows_[primary];
  if (shadow == nullptr) {
    StoreOptions so = store_;
    if (!so.spill_dir.empty()) so.spill_dir += "/backup-of-" + std::to_string(primary);
    Result<std::unique_ptr<ServerCore>> core = ServerCore::Create(config_, primary, so);
    if (!core.ok()) {
      shadows_.erase(primary);
      return core.status();
    }
    shadow = std::move(core).value();
    LOG(INFO) << "server " << self_ << ": backing up the shards of server " << primary;
  }
  return shadow.get();
}

Frames BackupStore::Handle(Frames& message) {
  Addressed to;
  if (std::optional<Frames> error = Address(message, wire::Header::Body::REPLICATE, 2, &to)) {
    return std::move(*error);
  }
  const uint64_t request_id = to.request_id;
  const int primary = to.primary;
  if (is_promoted(primary)) {
    // Aborted fences the old primary (BackupLink::fenced): it must not acknowledge this.
    return ErrorReply(request_id, self_,
                      Aborted("server " + std::to_string(self_) +
                              " already serves the shards of server " + std::to_string(primary)));
  }
  Frames request(std::make_move_iterator(message.begin() + 1),
                 std::make_move_iterator(message.end()));
  if (Classify(request) == RequestKind::kSeed) {
    Frames reply = Reseed(primary, request_id, request);
    last_seq_[primary] = request_id;
    return reply;
  }
  // A link's forwards are numbered 1, 2, ... and applied in that order; an acknowledgement
  // covers everything before it, so a gap would go unnoticed by the primary: refused, which
  // takes this copy out of the chain (the primary's link goes down, and it logs why).
  auto last = last_seq_.find(primary);
  const uint64_t expected = last == last_seq_.end() ? 1 : last->second + 1;
  if (request_id != expected) {
    return ErrorReply(
        request_id, self_,
        FailedPrecondition("server " + std::to_string(self_) + " got forward " +
                           std::to_string(request_id) + " from server " + std::to_string(primary) +
                           ", expected " + std::to_string(expected) + ": its copy is incomplete"));
  }
  last_seq_[primary] = request_id;
  Result<ServerCore*> shadow = Shadow(primary);
  if (!shadow.ok()) return ErrorReply(request_id, self_, shadow.status());
  std::vector<Outgoing> dropped;
  ServerCore::After after = ServerCore::After::kContinue;
  (*shadow)->Handle("primary", request, &dropped, &after);
  // The copy answers as the primary did (the same request on the same state), so an error
  // here is one the primary sent too, unless the copy has drifted from it: logged, since a
  // drifted copy is found out only when it is promoted.
  for (const Outgoing& o : dropped) {
    Result<DecodedHeader> h = DecodedHeader::Decode(o.frames[0]);
    if (h.ok() && h->get().getBody().which() == wire::Header::Body::ERROR &&
        refusals_logged_ < 20) {
      ++refusals_logged_;
      const ServerStats st = (*shadow)->stats();
      LOG(WARNING) << "server " << self_ << ": its copy of server " << primary
                   << "'s shards refused a forwarded request: "
                   << StatusFromError(h->get().getBody().getError()).ToString()
                   << " (copy: " << st.pushes_applied << " pushes applied, " << st.pushes_duplicate
                   << " retries answered again)";
    }
  }
  capnp::MallocMessageBuilder b;
  NewHeader(b, request_id, self_).getBody().setReplicateReply();
  Frames reply;
  reply.push_back(EncodeFrame(b));
  return reply;
}

Frames BackupStore::Reseed(int primary, uint64_t request_id, const Frames& seed) {
  // The old copy goes first: a new one with a spill directory opens the same one.
  shadows_.erase(primary);
  StoreOptions so = store_;
  if (!so.spill_dir.empty()) so.spill_dir += "/backup-of-" + std::to_string(primary);
  JobConfig fresh = config_;
  fresh.restore.clear();  // the seed has everything; a checkpoint would only cost time
  Result<std::unique_ptr<ServerCore>> core = ServerCore::Create(fresh, primary, so);
  if (!core.ok()) return ErrorReply(request_id, self_, core.status());
  Frames loaded = LoadSeed(**core, self_, seed);
  Result<DecodedHeader> h = DecodedHeader::Decode(loaded[0]);
  if (!h.ok() || h->get().getBody().which() != wire::Header::Body::SEED_REPLY) return loaded;
  shadows_[primary] = std::move(core).value();
  LOG(WARNING) << "server " << self_ << ": backs up the shards of server " << primary
               << " again (a whole copy of " << seed[1].size() << " bytes, table 0 at version "
               << shadows_[primary]->shard_version(0) << ")";
  capnp::MallocMessageBuilder b;
  NewHeader(b, request_id, self_).getBody().setReplicateReply();
  Frames reply;
  reply.push_back(EncodeFrame(b));
  return reply;
}

size_t BackupStore::Unpromote(int primary) {
  auto it = promoted_.find(primary);
  if (it == promoted_.end()) return 0;
  const size_t dropped = it->second->DropHeldPulls();
  promoted_.erase(it);
  last_seq_.erase(primary);  // the restarted primary's link numbers its forwards from 1
  LOG(WARNING) << "server " << self_ << ": handed the shards of server " << primary
               << " back to it; holds their copy again (" << dropped << " held pulls dropped)";
  return dropped;
}

std::vector<int> BackupStore::primaries() const {
  std::vector<int> out;
  for (const auto& [primary, core] : shadows_) out.push_back(primary);
  return out;
}

ServerCore* BackupStore::shadow(int primary) {
  auto it = shadows_.find(primary);
  return it == shadows_.end() ? nullptr : it->second.get();
}

std::unique_ptr<ServerCore> BackupStore::Release(int primary) {
  auto it = shadows_.find(primary);
  if (it == shadows_.end()) return nullptr;
  std::unique_ptr<ServerCore> core = std::move(it->second);
  shadows_.erase(it);
  promoted_.erase(primary);
  return core;
}

void BackupLink::MarkDown(const Status& why) {
  if (down_) return;
  down_ = true;
  LOG(ERROR) << "server " << self_ << ": backup lost (" << why.ToString()
             << "); its shards run without replication from now on";
}

Result<uint64_t> BackupLink::Send(Frames request) {
  if (down_) return Unavailable("the backup of server " + std::to_string(self_) + " is down");
  const uint64_t seq = sent_ + 1;
  Status s = socket_->Send(WrapForBackup(self_, seq, std::move(request)));
  if (!s.ok()) {
    MarkDown(s);
    return s;
  }
  if (sent_ == acked_) oldest_unacked_ = std::chrono::steady_clock::now();
  sent_ = seq;
  return seq;
}

uint64_t BackupLink::Poll(std::chrono::steady_clock::time_point now) {
  while (!down_) {
    Result<std::optional<Frames>> in = socket_->TryRecv();
    if (!in.ok()) {
      MarkDown(in.status());
      break;
    }
    if (!in->has_value()) break;
    Frames& f = **in;
    if (f.empty()) continue;
    Result<DecodedHeader> h = DecodedHeader::Decode(f[0]);
    if (!h.ok()) {
      MarkDown(h.status());
      break;
    }
    try {
      wire::Header::Reader r = h->get();
      if (r.getBody().which() == wire::Header::Body::ERROR) {
        const Status why = StatusFromError(r.getBody().getError());
        if (why.code() == StatusCode::kAborted) fenced_ = true;
        MarkDown(why);
        break;
      }
      const uint64_t seq = r.getRequestId();
      if (seq > acked_ && seq <= sent_) {
        acked_ = seq;
        oldest_unacked_ = now;  // the next unacknowledged one was sent no earlier
      }
    } catch (const kj::Exception& e) {
      MarkDown(InvalidArgument(e.getDescription().cStr()));
      break;
    }
  }
  if (!down_ && sent_ > acked_ && now - oldest_unacked_ > timeout_) {
    MarkDown(
        DeadlineExceeded("no acknowledgement within " + std::to_string(timeout_.count()) + " ms"));
  }
  return acked_;
}

Frames BackupStore::HandlePromote(Frames& message) {
  Addressed to;
  if (std::optional<Frames> error = Address(message, wire::Header::Body::PROMOTE, 1, &to)) {
    return std::move(*error);
  }
  const uint64_t request_id = to.request_id;
  const int primary = to.primary;
  if (!is_promoted(primary)) {
    // A primary that died before it forwarded anything: its shards are as they started.
    Result<ServerCore*> shadow = Shadow(primary);
    if (!shadow.ok()) return ErrorReply(request_id, self_, shadow.status());
    promoted_[primary] = *shadow;
    LOG(WARNING) << "server " << self_ << ": promoted to serve the shards of server " << primary
                 << " (without a backup from now on)";
  }
  capnp::MallocMessageBuilder b;
  NewHeader(b, request_id, self_).getBody().setPromoteReply();
  Frames reply;
  reply.push_back(EncodeFrame(b));
  return reply;
}

ServerCore* BackupStore::promoted(int primary) {
  auto it = promoted_.find(primary);
  return it == promoted_.end() ? nullptr : it->second;
}

std::vector<ServerCore*> BackupStore::promoted_cores() {
  std::vector<ServerCore*> out;
  for (const auto& [primary, core] : promoted_) out.push_back(core);
  return out;
}

int BackupStore::backup_of_self() const { return BackupOf(config_, self_); }

}  // namespace ps
