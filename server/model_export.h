// One safetensors file for the whole model (ps_export): the servers' shards assembled.
//   dense table:  "<name>"         F32 [rows, width]
//   sparse table: "<name>.ids"     U64 [n] ascending and "<name>.values" F32 [n, width]
// Values only (no optimizer state). Sources: the per-server files ps_server --export_dir
// writes at the end of a job, or a checkpoint set, whose job settings come from the
// coordinator's record next to it (DIR/checkpoints.json, server/checkpoint.h): each
// server's shard is loaded as a restoring server would load it, then exported.
//
// Thread model: plain functions, one thread.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "common/status.h"
#include "server/export.h"

namespace ps {

// A safetensors file read back: its tensors and its metadata.
struct SafetensorsFile {
  std::vector<SafeTensor> tensors;
  std::map<std::string, std::string> metadata;
  const SafeTensor* Find(const std::string& name) const;
};
Result<SafetensorsFile> ReadSafetensors(const std::string& path);

// Assembles the per-server export files (server-<id>.safetensors, every server's) into `out`.
Status MergeServerExports(const std::vector<std::string>& files, const std::string& out);

// Exports checkpoint set `set_dir` (DIR/clock-<C>) into `out`; `out`.parts holds the
// per-server files meanwhile (created, then removed).
Status ExportCheckpointSet(const std::string& set_dir, const std::string& out);

}  // namespace ps
