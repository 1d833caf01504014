#include "worker/group_comm.h"

#include <glog/logging.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "kernels/nccl_comm.h"

namespace ps {
namespace {

using SteadyClock = std::chrono::steady_clock;

// The group channel is private to one group of one job (same build, same host), so its
// messages are a fixed binary header frame instead of a Cap'n Proto one: {kind, seq, rank}
// as int64, then one frame per tensor (or the control words).
enum Kind : int64_t { kHello = 1, kReduce = 2, kBroadcast = 3, kControl = 4, kDissolve = 5 };
constexpr size_t kHeaderWords = 3;
constexpr size_t kMaxControlWords = 64;

struct Header {
  int64_t kind = 0;
  int64_t seq = 0;
  int64_t rank = 0;
};

zmq::message_t HeaderFrame(Kind kind, int64_t seq, int rank) {
  int64_t words[kHeaderWords] = {kind, seq, rank};
  return CopyFrame(words, sizeof(words));
}

Result<Header> ParseHeader(const Frames& frames) {
  if (frames.empty() || frames[0].size() != kHeaderWords * sizeof(int64_t)) {
    return InvalidArgument("malformed group message: the header frame is missing or has " +
                           std::to_string(frames.empty() ? 0 : frames[0].size()) +
                           " bytes, expected " + std::to_string(kHeaderWords * sizeof(int64_t)));
  }
  int64_t words[kHeaderWords];
  std::memcpy(words, frames[0].data(), sizeof(words));
  return Header{words[0], words[1], words[2]};
}

// Checks that frames[1..] match the tensors' sizes.
Status CheckSizes(const Frames& frames, const std::vector<std::span<float>>& tensors, int rank) {
  if (frames.size() != tensors.size() + 1) {
    return InvalidArgument("rank " + std::to_string(rank) + " sent " +
                           std::to_string(frames.size() - 1) + " tensors, expected " +
                           std::to_string(tensors.size()));
  }
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (frames[i + 1].size() != tensors[i].size_bytes()) {
      return InvalidArgument("rank " + std::to_string(rank) + " sent " +
                             std::to_string(frames[i + 1].size()) + " bytes for tensor " +
                             std::to_string(i) + ", expected " +
                             std::to_string(tensors[i].size_bytes()));
    }
  }
  return Status::Ok();
}

// dst += the floats of `frame` (which may not be 4-byte aligned when ZeroMQ kept it inline).
void AddFrame(std::span<float> dst, const zmq::message_t& frame) {
  const auto* src = static_cast<const unsigned char*>(frame.data());
  if (reinterpret_cast<uintptr_t>(src) % alignof(float) == 0) {
    const float* f = reinterpret_cast<const float*>(src);
    for (size_t i = 0; i < dst.size(); ++i) dst[i] += f[i];
  } else {
    for (size_t i = 0; i < dst.size(); ++i) {
      float v;
      std::memcpy(&v, src + i * sizeof(float), sizeof(float));
      dst[i] += v;
    }
  }
}

std::chrono::milliseconds Remaining(SteadyClock::time_point deadline) {
  return std::max(
      std::chrono::milliseconds(0),
      std::chrono::duration_cast<std::chrono::milliseconds>(deadline - SteadyClock::now()));
}

std::string RankList(const std::vector<bool>& have) {
  std::string s;
  for (size_t r = 1; r < have.size(); ++r) {
    if (!have[r]) s += (s.empty() ? "" : ", ") + std::to_string(r);
  }
  return s;
}

// ---- the cpu backend: the leader's ROUTER, one DEALER per member ----

class CpuGroupComm final : public GroupComm {
 public:
  explicit CpuGroupComm(const GroupCommOptions& options)
      : GroupComm(options.rank, options.size), options_(options) {}

  ~CpuGroupComm() override {
    server_.reset();
    // ZeroMQ leaves the socket file of an ipc endpoint behind; a group's path is used once.
    const std::string scheme = "ipc://";
    if (leader() && options_.leader_endpoint.rfind(scheme, 0) == 0) {
      unlink(options_.leader_endpoint.c_str() + scheme.size());
    }
  }

  std::string backend() const override { return "cpu"; }

  Status Join(Transport* job_transport) {
    const auto deadline = SteadyClock::now() + options_.timeout;
    // With CURVE on, the group's channel has a transport of its own: the leader listens
    // with the workers' key pair and admits only that key, so only the job's workers join
    // (the servers' secret key, which the job's listeners share, is not a worker's).
    Transport* transport = job_transport;
    if (job_transport->options().security.curve) {
      TransportOptions topt = job_transport->options();
      topt.security.server_public_key = topt.security.own.public_key;
      topt.security.allowed_clients = {{topt.security.own.public_key, "worker"}};
      own_transport_ = std::make_unique<Transport>(topt);
      transport = own_transport_.get();
    }
    if (leader()) {
      PS_ASSIGN_OR_RETURN(server_, transport->Listen(options_.leader_endpoint));
      peers_.assign(static_cast<size_t>(size()), std::string());
      std::vector<bool> have(static_cast<size_t>(size()), false);
      have[0] = true;
      int missing = size() - 1;
      while (missing > 0) {
        Result<Incoming> in = server_->Recv(Remaining(deadline));
        if (!in.ok()) {
          if (in.status().code() == StatusCode::kDeadlineExceeded) {
            return DeadlineExceeded("group members " + RankList(have) + " did not join within " +
                                    std::to_string(options_.timeout.count()) + " ms");
          }
          return in.status();
        }
        Result<Header> h = ParseHeader(in->frames);
        if (!h.ok() || h->kind != kHello || h->rank < 1 || h->rank >= size() ||
            have[static_cast<size_t>(h->rank)]) {
          LOG(WARNING) << "group leader: ignoring an unexpected message while members join";
          continue;
        }
        have[static_cast<size_t>(h->rank)] = true;
        peers_[static_cast<size_t>(h->rank)] = in->peer;
        --missing;
      }
      // Everyone is here: a welcome releases the members, so that no member's first
      // collective reaches the leader while it still waits for hellos.
      Frames none;
      return SendToMembers(kHello, 0, none);
    }
    PS_ASSIGN_OR_RETURN(client_, transport->Connect(options_.leader_endpoint));
    Frames f;
    f.push_back(HeaderFrame(kHello, 0, rank()));
    PS_RETURN_IF_ERROR(client_->Send(std::move(f)));
    Result<Frames> welcome = RecvFromLeader(kHello, 0);
    if (!welcome.ok()) return welcome.status().WithContext("joining the group");
    return Status::Ok();
  }

  Status ReduceSum(const std::vector<std::span<float>>& tensors) override {
    const int64_t seq = ++seq_;
    if (!leader()) {
      Frames f;
      f.push_back(HeaderFrame(kReduce, seq, rank()));
      for (const auto& t : tensors) f.push_back(CopyFrame(t.data(), t.size_bytes()));
      return client_->Send(std::move(f));
    }
    // Collect every member's tensors first, then add in rank order: the leader's tensors
    // change only once the whole sum is known.
    std::vector<Frames> got(static_cast<size_t>(size()));
    std::vector<bool> have(static_cast<size_t>(size()), false);
    have[0] = true;
    PS_RETURN_IF_ERROR(Gather(kReduce, seq, &got, &have, [&](const Frames& frames, int r) {
      return CheckSizes(frames, tensors, r);
    }));
    for (int r = 1; r < size(); ++r) {
      const Frames& frames = got[static_cast<size_t>(r)];
      for (size_t i = 0; i < tensors.size(); ++i) AddFrame(tensors[i], frames[i + 1]);
    }
    return Status::Ok();
  }

  Status Broadcast(const std::vector<std::span<float>>& tensors) override {
    const int64_t seq = ++seq_;
    if (leader()) {
      Frames proto;
      for (const auto& t : tensors) proto.push_back(CopyFrame(t.data(), t.size_bytes()));
      return SendToMembers(kBroadcast, seq, proto);
    }
    PS_ASSIGN_OR_RETURN(Frames frames, RecvFromLeader(kBroadcast, seq));
    PS_RETURN_IF_ERROR(CheckSizes(frames, tensors, 0));
    for (size_t i = 0; i < tensors.size(); ++i) {
      std::memcpy(tensors[i].data(), frames[i + 1].data(), tensors[i].size_bytes());
    }
    return Status::Ok();
  }

  void Dissolve() override {
    if (!leader()) return;
    Frames none;
    Status s = SendToMembers(kDissolve, ++seq_, none);
    if (!s.ok()) LOG(WARNING) << "dissolving the group: " << s.ToString();
  }

  Status BroadcastControl(std::vector<int64_t>* words, std::chrono::milliseconds timeout) override {
    const int64_t seq = ++seq_;
    if (leader()) {
      if (words->size() > kMaxControlWords) {
        return InvalidArgument("a group control message holds at most 64 words");
      }
      Frames proto;
      proto.push_back(CopyFrame(words->data(), words->size() * sizeof(int64_t)));
      return SendToMembers(kControl, seq, proto);
    }
    Result<Frames> got = RecvFromLeader(kControl, seq, timeout);
    if (!got.ok()) {
      if (got.status().code() == StatusCode::kDeadlineExceeded) --seq_;  // may be asked again
      return got.status();
    }
    Frames frames = std::move(got).value();
    if (frames.size() != 2 || frames[1].size() % sizeof(int64_t) != 0 ||
        frames[1].size() > kMaxControlWords * sizeof(int64_t)) {
      return InvalidArgument("malformed group control message from the leader");
    }
    words->resize(frames[1].size() / sizeof(int64_t));
    std::memcpy(words->data(), frames[1].data(), frames[1].size());
    return Status::Ok();
  }

 private:
  // Leader: the same frames to every member. Frames are shared (zmq copy is a reference
  // count), not copied, per member.
  Status SendToMembers(Kind kind, int64_t seq, Frames& proto) {
    Status first;
    for (int r = 1; r < size(); ++r) {
      Frames f;
      f.push_back(HeaderFrame(kind, seq, 0));
      for (auto& frame : proto) {
        zmq::message_t m;
        m.copy(frame);
        f.push_back(std::move(m));
      }
      Status s = server_->Send(peers_[static_cast<size_t>(r)], std::move(f));
      if (!s.ok() && first.ok()) {
        first = Unavailable("group member " + std::to_string(r) + " is gone: " + s.message());
      }
    }
    return first;
  }

  // Leader: one message of `kind` and `seq` from every member not in *have.
  template <typename Check>
  Status Gather(Kind kind, int64_t seq, std::vector<Frames>* got, std::vector<bool>* have,
                Check check) {
    const auto deadline = SteadyClock::now() + options_.timeout;
    int missing = static_cast<int>(std::count(have->begin(), have->end(), false));
    while (missing > 0) {
      Result<Incoming> in = server_->Recv(Remaining(deadline));
      if (!in.ok()) {
        if (in.status().code() == StatusCode::kDeadlineExceeded) {
          return DeadlineExceeded("group members " + RankList(*have) + " sent nothing for step " +
                                  std::to_string(seq) + " within " +
                                  std::to_string(options_.timeout.count()) +
                                  " ms; nothing of this step is summed");
        }
        return in.status();
      }
      PS_ASSIGN_OR_RETURN(Header h, ParseHeader(in->frames));
      if (h.rank < 1 || h.rank >= size() || in->peer != peers_[static_cast<size_t>(h.rank)]) {
        return InvalidArgument("a group message claims rank " + std::to_string(h.rank) +
                               " from a peer that is not that member");
      }
      if (h.seq < seq) continue;  // left over from a call that already failed
      if (h.kind != kind || h.seq != seq || (*have)[static_cast<size_t>(h.rank)]) {
        return Internal("group member " + std::to_string(h.rank) + " is out of step: message " +
                        std::to_string(h.kind) + " of call " + std::to_string(h.seq) +
                        " during call " + std::to_string(seq));
      }
      PS_RETURN_IF_ERROR(check(in->frames, static_cast<int>(h.rank)));
      (*got)[static_cast<size_t>(h.rank)] = std::move(in->frames);
      (*have)[static_cast<size_t>(h.rank)] = true;
      --missing;
    }
    return Status::Ok();
  }

  // Member: the leader's message of `kind` and `seq`.
  Result<Frames> RecvFromLeader(Kind kind, int64_t seq, std::chrono::milliseconds timeout = {}) {
    if (timeout.count() <= 0) timeout = options_.timeout;
    const auto deadline = SteadyClock::now() + timeout;
    while (true) {
      Result<Frames> frames = client_->Recv(Remaining(deadline));
      if (!frames.ok()) {
        if (frames.status().code() == StatusCode::kDeadlineExceeded) {
          return DeadlineExceeded("the group leader sent nothing for call " + std::to_string(seq) +
                                  " within " + std::to_string(timeout.count()) + " ms");
        }
        return frames.status();
      }
      PS_ASSIGN_OR_RETURN(Header h, ParseHeader(*frames));
      if (h.kind == kDissolve) return Aborted("the group leader dissolved the group");
      if (h.seq < seq) continue;
      if (h.kind != kind || h.seq != seq) {
        return Internal("the group leader is out of step: message " + std::to_string(h.kind) +
                        " of call " + std::to_string(h.seq) + " during call " +
                        std::to_string(seq));
      }
      return std::move(frames).value();
    }
  }

  const GroupCommOptions options_;
  std::unique_ptr<Transport> own_transport_;  // with CURVE only; outlives the sockets
  std::unique_ptr<ServerSocket> server_;      // leader
  std::vector<std::string> peers_;            // leader: routing identity by rank
  std::unique_ptr<ClientSocket> client_;      // members
  int64_t seq_ = 0;                           // collective calls so far, the same on every rank
};

// ---- the nccl backend: NCCL moves the floats, the cpu channel the rest ----

class NcclGroupComm final : public GroupComm {
 public:
  NcclGroupComm(const GroupCommOptions& options, std::unique_ptr<GroupComm> control,
                std::unique_ptr<NcclComm> nccl)
      : GroupComm(options.rank, options.size),
        options_(options),
        control_(std::move(control)),
        nccl_(std::move(nccl)) {}

  std::string backend() const override { return "nccl"; }

  Status ReduceSum(const std::vector<std::span<float>>& tensors) override {
    // NCCL sums in place at the root; keep the leader's tensors until every tensor's sum is
    // in, so that a failure leaves them as they were (no partial sum).
    std::vector<std::vector<float>> sums;
    for (const auto& t : tensors) {
      std::vector<float> buf(t.begin(), t.end());
      PS_RETURN_IF_ERROR(nccl_->ReduceSumHost(buf.data(), buf.size(), options_.timeout));
      sums.push_back(std::move(buf));
    }
    if (leader()) {
      for (size_t i = 0; i < tensors.size(); ++i) {
        std::copy(sums[i].begin(), sums[i].end(), tensors[i].begin());
      }
    }
    return Status::Ok();
  }

  Status Broadcast(const std::vector<std::span<float>>& tensors) override {
    for (const auto& t : tensors) {
      PS_RETURN_IF_ERROR(nccl_->BroadcastHost(t.data(), t.size(), options_.timeout));
    }
    return Status::Ok();
  }

  Status BroadcastControl(std::vector<int64_t>* words, std::chrono::milliseconds timeout) override {
    return control_->BroadcastControl(words, timeout);
  }
  void Dissolve() override { control_->Dissolve(); }

 private:
  const GroupCommOptions options_;
  std::unique_ptr<GroupComm> control_;
  std::unique_ptr<NcclComm> nccl_;
};

Status CheckOptions(const GroupCommOptions& o) {
  if (o.size < 1 || o.rank < 0 || o.rank >= o.size) {
    return InvalidArgument("group rank " + std::to_string(o.rank) + " of size " +
                           std::to_string(o.size) + ": expected 0 <= rank < size");
  }
  if (o.size > 1) PS_RETURN_IF_ERROR(ValidateEndpoint(o.leader_endpoint));
  if (o.timeout.count() <= 0) return InvalidArgument("the group timeout must be positive");
  return Status::Ok();
}

}  // namespace

Status GroupComm::AllReduceSum(const std::vector<std::span<float>>& tensors) {
  PS_RETURN_IF_ERROR(ReduceSum(tensors));
  return Broadcast(tensors);
}

Result<std::unique_ptr<GroupComm>> JoinCpuGroup(Transport* transport,
                                                const GroupCommOptions& options) {
  PS_RETURN_IF_ERROR(CheckOptions(options));
  auto comm = std::make_unique<CpuGroupComm>(options);
  if (options.size > 1) PS_RETURN_IF_ERROR(comm->Join(transport));
  return std::unique_ptr<GroupComm>(std::move(comm));
}

Result<std::unique_ptr<GroupComm>> JoinGroup(Transport* transport,
                                             const GroupCommOptions& options) {
  PS_RETURN_IF_ERROR(CheckOptions(options));
  if (options.device == "cpu" || options.device.rfind("cpu:", 0) == 0) {
    return JoinCpuGroup(transport, options);
  }
  if (options.device.rfind("cuda", 0) != 0) {
    return InvalidArgument("group device '" + options.device + "': expected cpu or cuda:N");
  }
  int gpu = 0;
  if (options.device.size() > 5 && options.device[4] == ':') {
    gpu = std::atoi(options.device.c_str() + 5);
  }
  // The unique id's bootstrap root lives in the process that makes it, so the leader makes
  // it and hands it over the cpu channel (the coordinator told everyone where that is).
  PS_ASSIGN_OR_RETURN(std::unique_ptr<GroupComm> control, JoinCpuGroup(transport, options));
  std::vector<int64_t> words((kNcclUniqueIdBytes + 7) / 8, 0);
  if (options.rank == 0) {
    PS_ASSIGN_OR_RETURN(std::vector<char> id, NcclNewUniqueId());
    std::memcpy(words.data(), id.data(), kNcclUniqueIdBytes);
  }
  PS_RETURN_IF_ERROR(control->BroadcastControl(&words));
  if (words.size() * sizeof(int64_t) < kNcclUniqueIdBytes) {
    return InvalidArgument("the group leader sent a short NCCL unique id");
  }
  std::vector<char> id(kNcclUniqueIdBytes);
  std::memcpy(id.data(), words.data(), kNcclUniqueIdBytes);
  PS_ASSIGN_OR_RETURN(std::unique_ptr<NcclComm> nccl,
                      NcclComm::Create(id, options.rank, options.size, gpu, options.timeout));
  return std::unique_ptr<GroupComm>(
      std::make_unique<NcclGroupComm>(options, std::move(control), std::move(nccl)));
}

}  // namespace ps
