#include "common/run_files.h"

#include <chrono>
#include <cstdio>
#include <filesystem>

namespace ps {

Status MakeDirs(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return Unavailable("cannot create directory " + dir + ": " + ec.message());
  return Status::Ok();
}

double UnixSeconds() {
  using namespace std::chrono;
  return duration<double>(system_clock::now().time_since_epoch()).count();
}

Result<std::unique_ptr<MetricsLog>> MetricsLog::Open(const std::string& path) {
  auto log = std::make_unique<MetricsLog>();
  log->out_.open(path, std::ios::app);
  if (!log->out_) return Unavailable("cannot open " + path + " for appending");
  return log;
}

void MetricsLog::Append(nlohmann::json line) {
  if (!line.contains("time")) line["time"] = UnixSeconds();
  std::string text = line.dump();
  std::lock_guard<std::mutex> lock(mu_);
  out_ << text << '\n';
  out_.flush();  // plots and tests read the file while the job runs
}

Status WriteJsonFile(const std::string& path, const nlohmann::json& value) {
  std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    if (!out) return Unavailable("cannot write " + tmp);
    out << value.dump(2) << '\n';
    if (!out.flush()) return Unavailable("cannot write " + tmp);
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    return Unavailable("cannot rename " + tmp + " to " + path);
  }
  return Status::Ok();
}

}  // namespace ps
