// Writes a server's shard of the model as a safetensors file
// (https://huggingface.co/docs/safetensors), which PyTorch (safetensors.torch.load_file) and
// NumPy (safetensors.numpy.load_file) read directly. Per table:
//   dense:  "<name>"         F32 [rows held here, width], rows from metadata "<name>.row_begin"
//   sparse: "<name>.ids"     U64 [n] and "<name>.values" F32 [n, width], ids ascending
// Only the values are written, not the optimizer's state. The file is written to a temp
// name, fsynced and renamed, so a reader never sees half of one.
//
// Thread model: call from the thread that owns the ServerCore.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

namespace ps {

struct SafeTensor {
  std::string name;
  std::string dtype;  // "F32" | "U64"
  std::vector<uint64_t> shape;
  std::vector<char> data;  // little-endian, row-major
};

Status WriteSafetensors(const std::string& path, const std::vector<SafeTensor>& tensors,
                        const std::vector<std::pair<std::string, std::string>>& metadata);

}  // namespace ps
