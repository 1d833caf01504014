// NCCL is not in this build (no CUDA toolkit, or no libnccl): every call says so.
#include "kernels/nccl_comm.h"

namespace ps {

bool NcclBuiltIn() { return false; }

Result<std::vector<char>> NcclNewUniqueId() {
  return FailedPrecondition("this build has no NCCL (built without CUDA or libnccl)");
}

Result<std::unique_ptr<NcclComm>> NcclComm::Create(std::span<const char>, int, int, int,
                                                   std::chrono::milliseconds) {
  return FailedPrecondition("this build has no NCCL (built without CUDA or libnccl)");
}

}  // namespace ps
