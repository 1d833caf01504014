#include "server/model_export.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "common/job_config.h"
#include "server/checkpoint.h"
#include "server/server_core.h"

namespace ps {

const SafeTensor* SafetensorsFile::Find(const std::string& name) const {
  for (const SafeTensor& t : tensors) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

Result<SafetensorsFile> ReadSafetensors(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return NotFound("cannot open " + path);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  uint64_t n = 0;
  if (bytes.size() < 8) return InvalidArgument(path + " is not a safetensors file");
  std::memcpy(&n, bytes.data(), 8);
  if (n > bytes.size() - 8) return InvalidArgument(path + ": header past the end of the file");
  nlohmann::json header = nlohmann::json::parse(bytes.substr(8, n), nullptr, false);
  if (!header.is_object()) return InvalidArgument(path + ": the header is not a JSON object");
  const size_t base = 8 + n;
  SafetensorsFile f;
  for (const auto& [name, v] : header.items()) {
    if (name == "__metadata__") {
      for (const auto& [k, m] : v.items()) {
        if (m.is_string()) f.metadata[k] = m.get<std::string>();
      }
      continue;
    }
    if (!v.is_object() || !v.contains("dtype") || !v.contains("shape") ||
        !v.contains("data_offsets") || v["data_offsets"].size() != 2) {
      return InvalidArgument(path + ": malformed entry for tensor " + name);
    }
    SafeTensor t;
    t.name = name;
    t.dtype = v["dtype"].get<std::string>();
    for (const auto& d : v["shape"]) t.shape.push_back(d.get<uint64_t>());
    const uint64_t b = v["data_offsets"][0].get<uint64_t>();
    const uint64_t e = v["data_offsets"][1].get<uint64_t>();
    if (b > e || e > bytes.size() - base) return InvalidArgument(path + ": " + name + " overruns");
    t.data.assign(bytes.begin() + static_cast<std::ptrdiff_t>(base + b),
                  bytes.begin() + static_cast<std::ptrdiff_t>(base + e));
    f.tensors.push_back(std::move(t));
  }
  return f;
}

Status MergeServerExports(const std::vector<std::string>& files, const std::string& out) {
  struct Dense {
    uint64_t width = 0;
    std::vector<std::pair<uint64_t, const SafeTensor*>> parts;  // (row_begin, shard)
  };
  struct Sparse {
    uint64_t width = 0;
    std::vector<std::pair<uint64_t, const float*>> rows;
  };
  std::vector<SafetensorsFile> parts;
  for (const std::string& path : files) {
    PS_ASSIGN_OR_RETURN(SafetensorsFile f, ReadSafetensors(path));
    parts.push_back(std::move(f));
  }
  std::map<std::string, Dense> dense;
  std::map<std::string, Sparse> sparse;
  for (const SafetensorsFile& f : parts) {
    for (const SafeTensor& t : f.tensors) {
      const std::string& name = t.name;
      if (name.size() > 4 && name.compare(name.size() - 4, 4, ".ids") == 0) {
        const std::string table = name.substr(0, name.size() - 4);
        const SafeTensor* values = f.Find(table + ".values");
        if (values == nullptr || values->shape.size() != 2 || values->shape[0] != t.shape[0]) {
          return InvalidArgument("sparse table " + table + ": ids without matching values");
        }
        Sparse& s = sparse[table];
        s.width = values->shape[1];
        const auto* ids = reinterpret_cast<const uint64_t*>(t.data.data());
        const auto* v = reinterpret_cast<const float*>(values->data.data());
        for (uint64_t i = 0; i < t.shape[0]; ++i) s.rows.emplace_back(ids[i], v + i * s.width);
      } else if (name.size() > 7 && name.compare(name.size() - 7, 7, ".values") == 0) {
        continue;  // with its ids
      } else {
        auto begin = f.metadata.find(name + ".row_begin");
        if (begin == f.metadata.end() || t.shape.size() != 2) {
          return InvalidArgument("dense table " + name + " without its row_begin");
        }
        Dense& d = dense[name];
        d.width = t.shape[1];
        d.parts.emplace_back(std::stoull(begin->second), &t);
      }
    }
  }
  std::vector<SafeTensor> tensors;
  for (auto& [name, d] : dense) {
    std::sort(d.parts.begin(), d.parts.end());
    SafeTensor t{name, "F32", {0, d.width}, {}};
    for (const auto& [begin, part] : d.parts) {
      if (begin != t.shape[0]) {
        return InvalidArgument("dense table " + name + ": rows from " + std::to_string(t.shape[0]) +
                               " missing (is every server's file there?)");
      }
      t.data.insert(t.data.end(), part->data.begin(), part->data.end());
      t.shape[0] += part->shape[0];
    }
    tensors.push_back(std::move(t));
  }
  for (auto& [name, s] : sparse) {
    std::sort(s.rows.begin(), s.rows.end(),
              [](const auto& a, const auto& b) { return a.first < b.first; });
    SafeTensor ids{name + ".ids", "U64", {s.rows.size()}, {}};
    SafeTensor values{name + ".values", "F32", {s.rows.size(), s.width}, {}};
    for (const auto& [key, row] : s.rows) {
      const char* k = reinterpret_cast<const char*>(&key);
      ids.data.insert(ids.data.end(), k, k + sizeof(key));
      const char* v = reinterpret_cast<const char*>(row);
      values.data.insert(values.data.end(), v, v + s.width * sizeof(float));
    }
    tensors.push_back(std::move(ids));
    tensors.push_back(std::move(values));
  }
  return WriteSafetensors(out, tensors, {{"servers", std::to_string(files.size())}});
}

Status ExportCheckpointSet(const std::string& set_dir, const std::string& out) {
  const std::filesystem::path set = std::filesystem::weakly_canonical(set_dir);
  const std::string record_path = CheckpointRecordFile(set.parent_path().string());
  std::ifstream in(record_path);
  nlohmann::json record = nlohmann::json::parse(in, nullptr, false);
  if (!record.is_object() || !record.contains("config") || !record["config"].is_object()) {
    return NotFound(record_path + " (the coordinator's record, with the job's settings) is " +
                    "missing or has no config");
  }
  std::map<std::string, std::string> flags;
  for (const auto& [k, v] : record["config"].items()) flags[k] = v.get<std::string>();
  flags["restore"] = set.string();
  flags["checkpoint_dir"] = "";
  flags["checkpoint_every"] = "0";  // the export writes no checkpoints of its own
  flags["memory_budget"] = "0";     // the export passes through memory anyway
  PS_ASSIGN_OR_RETURN(JobConfig config, JobConfig::FromFlagMap(flags));
  const std::string parts_dir = out + ".parts";
  std::error_code ec;
  std::filesystem::create_directories(parts_dir, ec);
  if (ec) return Unavailable("cannot create " + parts_dir + ": " + ec.message());
  std::vector<std::string> files;
  Status s;
  for (int id = 0; id < config.num_servers && s.ok(); ++id) {
    Result<std::unique_ptr<ServerCore>> core = ServerCore::Create(config, id);
    if (!core.ok()) {
      s = core.status();
      break;
    }
    files.push_back(parts_dir + "/server-" + std::to_string(id) + ".safetensors");
    s = (*core)->ExportSafetensors(files.back());
  }
  if (s.ok()) s = MergeServerExports(files, out);
  std::filesystem::remove_all(parts_dir, ec);
  return s;
}

}  // namespace ps
