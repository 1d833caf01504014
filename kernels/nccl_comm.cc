// The NCCL communicator (see nccl_comm.h). Compiled where CUDA and nccl.h are found.
//
// libnccl is opened at first use (dlopen), not linked: it is 200+ MB, many GPU machines
// and every CPU-only one lack it, and a link-time dependency would keep ps_worker from
// starting there at all, groups or not. Without it the calls fail with a clear error.
#include "kernels/nccl_comm.h"

#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <nccl.h>

#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <type_traits>

namespace ps {
namespace {

// The NCCL entry points this file uses, from the loaded library.
struct NcclApi {
  decltype(&::ncclGetUniqueId) GetUniqueId = nullptr;
  decltype(&::ncclCommInitRankConfig) CommInitRankConfig = nullptr;
  decltype(&::ncclCommGetAsyncError) CommGetAsyncError = nullptr;
  decltype(&::ncclCommAbort) CommAbort = nullptr;
  decltype(&::ncclCommDestroy) CommDestroy = nullptr;
  decltype(&::ncclReduce) Reduce = nullptr;
  decltype(&::ncclBroadcast) Broadcast = nullptr;
  decltype(&::ncclAllReduce) AllReduce = nullptr;
  decltype(&::ncclGetErrorString) GetErrorString = nullptr;
};

// Loads libnccl once; null (with *error set) when it is not there.
const NcclApi* Nccl(std::string* error = nullptr) {
  static NcclApi api;
  static std::string load_error;
  static std::once_flag once;
  std::call_once(once, [] {
    void* h = nullptr;
    for (const char* name : {"libnccl.so.2", "/usr/local/cuda/lib64/libnccl.so.2"}) {
      h = dlopen(name, RTLD_NOW | RTLD_LOCAL);
      if (h != nullptr) break;
    }
    if (h == nullptr) {
      load_error = std::string("libnccl.so.2 is not installed here: ") + dlerror();
      return;
    }
    bool ok = true;
    auto sym = [&](auto* fn, const char* name) {
      *fn = reinterpret_cast<std::remove_pointer_t<decltype(fn)>>(dlsym(h, name));
      ok &= *fn != nullptr;
    };
    sym(&api.GetUniqueId, "ncclGetUniqueId");
    sym(&api.CommInitRankConfig, "ncclCommInitRankConfig");
    sym(&api.CommGetAsyncError, "ncclCommGetAsyncError");
    sym(&api.CommAbort, "ncclCommAbort");
    sym(&api.CommDestroy, "ncclCommDestroy");
    sym(&api.Reduce, "ncclReduce");
    sym(&api.Broadcast, "ncclBroadcast");
    sym(&api.AllReduce, "ncclAllReduce");
    sym(&api.GetErrorString, "ncclGetErrorString");
    if (!ok) load_error = "libnccl.so.2 lacks an entry point this build needs (NCCL < 2.14?)";
  });
  if (!load_error.empty()) {
    if (error != nullptr) *error = load_error;
    return nullptr;
  }
  return &api;
}

using SteadyClock = std::chrono::steady_clock;

Status CudaError(cudaError_t e, const char* what) {
  return Internal(std::string(what) + ": " + cudaGetErrorString(e));
}

Status NcclError(ncclResult_t r, const char* what) {
  return Internal(std::string(what) + ": " + Nccl()->GetErrorString(r));
}

#define PS_CUDA_RETURN(expr)                            \
  do {                                                  \
    cudaError_t e_ = (expr);                            \
    if (e_ != cudaSuccess) return CudaError(e_, #expr); \
  } while (0)

#define PS_NCCL_RETURN(expr)                                                    \
  do {                                                                          \
    ncclResult_t r_ = (expr);                                                   \
    if (r_ != ncclSuccess && r_ != ncclInProgress) return NcclError(r_, #expr); \
  } while (0)

class NcclCommImpl final : public NcclComm {
 public:
  NcclCommImpl(int device, int rank) : device_(device), rank_(rank) {}

  ~NcclCommImpl() override {
    cudaSetDevice(device_);
    if (comm_ != nullptr) {
      if (aborted_) {
        // Already torn down by ncclCommAbort.
      } else {
        Nccl()->CommDestroy(comm_);
      }
    }
    if (buf_ != nullptr) cudaFree(buf_);
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }

  Status Init(std::span<const char> unique_id, int size, std::chrono::milliseconds timeout) {
    if (unique_id.size() != sizeof(ncclUniqueId)) {
      return InvalidArgument("an NCCL unique id has " + std::to_string(sizeof(ncclUniqueId)) +
                             " bytes, got " + std::to_string(unique_id.size()));
    }
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || device_ < 0 || device_ >= count) {
      return FailedPrecondition("GPU " + std::to_string(device_) + " is not present (" +
                                std::to_string(count) + " visible)");
    }
    PS_CUDA_RETURN(cudaSetDevice(device_));
    PS_CUDA_RETURN(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    ncclUniqueId id;
    std::memcpy(&id, unique_id.data(), sizeof(id));
    // Non-blocking init, so that a rank that never comes does not hang this one forever.
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    PS_NCCL_RETURN(Nccl()->CommInitRankConfig(&comm_, size, id, rank_, &config));
    return WaitComm(timeout, "joining the NCCL communicator");
  }

  Status ReduceSumHost(float* data, size_t n, std::chrono::milliseconds timeout) override {
    PS_RETURN_IF_ERROR(Stage(data, n));
    PS_NCCL_RETURN(Nccl()->Reduce(buf_, buf_, n, ncclFloat32, ncclSum, 0, comm_, stream_));
    PS_RETURN_IF_ERROR(Finish(timeout, "ncclReduce"));
    if (rank_ == 0) return CopyBack(data, n);
    return Status::Ok();
  }

  Status BroadcastHost(float* data, size_t n, std::chrono::milliseconds timeout) override {
    PS_RETURN_IF_ERROR(Stage(data, n));
    PS_NCCL_RETURN(Nccl()->Broadcast(buf_, buf_, n, ncclFloat32, 0, comm_, stream_));
    PS_RETURN_IF_ERROR(Finish(timeout, "ncclBroadcast"));
    return CopyBack(data, n);
  }

  Status AllReduceSumHost(float* data, size_t n, std::chrono::milliseconds timeout) override {
    PS_RETURN_IF_ERROR(Stage(data, n));
    PS_NCCL_RETURN(Nccl()->AllReduce(buf_, buf_, n, ncclFloat32, ncclSum, comm_, stream_));
    PS_RETURN_IF_ERROR(Finish(timeout, "ncclAllReduce"));
    return CopyBack(data, n);
  }

 private:
  Status Usable() const {
    if (aborted_) return FailedPrecondition("the NCCL communicator was aborted after a timeout");
    return Status::Ok();
  }

  Status Stage(const float* data, size_t n) {
    PS_RETURN_IF_ERROR(Usable());
    PS_CUDA_RETURN(cudaSetDevice(device_));
    if (n > cap_) {
      if (buf_ != nullptr) PS_CUDA_RETURN(cudaFree(buf_));
      buf_ = nullptr;
      PS_CUDA_RETURN(cudaMalloc(&buf_, n * sizeof(float)));
      cap_ = n;
    }
    PS_CUDA_RETURN(cudaMemcpyAsync(buf_, data, n * sizeof(float), cudaMemcpyHostToDevice, stream_));
    return Status::Ok();
  }

  Status CopyBack(float* data, size_t n) {
    PS_CUDA_RETURN(cudaMemcpyAsync(data, buf_, n * sizeof(float), cudaMemcpyDeviceToHost, stream_));
    PS_CUDA_RETURN(cudaStreamSynchronize(stream_));
    return Status::Ok();
  }

  // Waits for the stream with a deadline. NCCL offers no blocking wait with a timeout, so
  // this polls the stream and the communicator's async error, yielding between looks.
  Status Finish(std::chrono::milliseconds timeout, const char* what) {
    const auto deadline = SteadyClock::now() + timeout;
    while (true) {
      // A non-blocking communicator may still be enqueueing (ncclInProgress): only once it
      // reports success does the stream tell whether the collective ran.
      ncclResult_t async = ncclSuccess;
      Nccl()->CommGetAsyncError(comm_, &async);
      if (async != ncclSuccess && async != ncclInProgress) {
        Abort();
        return NcclError(async, what);
      }
      if (async == ncclSuccess) {
        cudaError_t q = cudaStreamQuery(stream_);
        if (q == cudaSuccess) return Status::Ok();
        if (q != cudaErrorNotReady) return CudaError(q, what);
      }
      if (SteadyClock::now() > deadline) {
        Abort();
        return DeadlineExceeded(std::string(what) + " did not complete within " +
                                std::to_string(timeout.count()) +
                                " ms (a peer is gone?); the communicator is aborted");
      }
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }

  Status WaitComm(std::chrono::milliseconds timeout, const char* what) {
    const auto deadline = SteadyClock::now() + timeout;
    while (true) {
      ncclResult_t state = ncclInProgress;
      Nccl()->CommGetAsyncError(comm_, &state);
      if (state == ncclSuccess) return Status::Ok();
      if (state != ncclInProgress) {
        Abort();
        return NcclError(state, what);
      }
      if (SteadyClock::now() > deadline) {
        Abort();
        return DeadlineExceeded(std::string(what) + " did not complete within " +
                                std::to_string(timeout.count()) + " ms");
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }

  void Abort() {
    if (comm_ != nullptr && !aborted_) Nccl()->CommAbort(comm_);
    aborted_ = true;
  }

  const int device_;
  const int rank_;
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  float* buf_ = nullptr;
  size_t cap_ = 0;
  bool aborted_ = false;
};

}  // namespace

bool NcclBuiltIn() { return Nccl() != nullptr; }

Result<std::vector<char>> NcclNewUniqueId() {
  std::string error;
  if (Nccl(&error) == nullptr) return FailedPrecondition(error);
  ncclUniqueId id;
  ncclResult_t r = Nccl()->GetUniqueId(&id);
  if (r != ncclSuccess) return NcclError(r, "ncclGetUniqueId");
  static_assert(sizeof(id) == kNcclUniqueIdBytes);
  std::vector<char> out(sizeof(id));
  std::memcpy(out.data(), &id, sizeof(id));
  return out;
}

Result<std::unique_ptr<NcclComm>> NcclComm::Create(std::span<const char> unique_id, int rank,
                                                   int size, int device,
                                                   std::chrono::milliseconds timeout) {
  if (size < 1 || rank < 0 || rank >= size) {
    return InvalidArgument("NCCL rank " + std::to_string(rank) + " of size " +
                           std::to_string(size) + ": expected 0 <= rank < size");
  }
  std::string error;
  if (Nccl(&error) == nullptr) return FailedPrecondition(error);
  auto comm = std::make_unique<NcclCommImpl>(device, rank);
  PS_RETURN_IF_ERROR(comm->Init(unique_id, size, timeout));
  return std::unique_ptr<NcclComm>(std::move(comm));
}

}  // namespace ps
