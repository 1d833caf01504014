// The files of a run directory that several components write: metrics.jsonl (one JSON
// object a line) and summary.json. JSON through nlohmann::json.
//
// Thread safety: MetricsLog serializes appends with a mutex.
#pragma once

#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>

#include "common/status.h"

namespace ps {

// Creates `dir` and its parents if missing.
Status MakeDirs(const std::string& dir);

// Seconds since the Unix epoch, as a double (the "time" field of every metrics line).
double UnixSeconds();

class MetricsLog {
 public:
  // Opens (appends to) `path`.
  static Result<std::unique_ptr<MetricsLog>> Open(const std::string& path);
  // Appends one line; adds "time" when the object has none.
  void Append(nlohmann::json line);

 private:
  std::mutex mu_;
  std::ofstream out_;  // guarded by mu_
};

// Writes `value` to `path` atomically (a temp file renamed over it), pretty-printed.
Status WriteJsonFile(const std::string& path, const nlohmann::json& value);

}  // namespace ps
