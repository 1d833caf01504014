#include "server/export.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>

namespace ps {
namespace {

Status WriteAll(int fd, const char* p, size_t n, const std::string& path) {
  while (n > 0) {
    ssize_t w = ::write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return Internal("write " + path + ": " + std::strerror(errno));
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
  return Status::Ok();
}

}  // namespace

Status WriteSafetensors(const std::string& path, const std::vector<SafeTensor>& tensors,
                        const std::vector<std::pair<std::string, std::string>>& metadata) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) {
    nlohmann::ordered_json meta = nlohmann::ordered_json::object();
    for (const auto& [k, v] : metadata) meta[k] = v;
    header["__metadata__"] = meta;
  }
  // The format allows no holes between tensors, so alignment comes from the order: 8-byte
  // types first, then the rest, keeps every tensor aligned to its element (readers that
  // map the file, and a cast of the bytes to uint64_t, need that).
  std::vector<const SafeTensor*> order;
  for (const SafeTensor& t : tensors) order.push_back(&t);
  auto wide = [](const SafeTensor* t) {
    return t->dtype == "U64" || t->dtype == "I64" || t->dtype == "F64";
  };
  std::stable_partition(order.begin(), order.end(), wide);
  uint64_t offset = 0;
  for (const SafeTensor* t : order) {
    header[t->name] = {{"dtype", t->dtype},
                       {"shape", t->shape},
                       {"data_offsets", {offset, offset + t->data.size()}}};
    offset += t->data.size();
  }
  std::string text = header.dump();
  // The data starts 8-aligned: pad the header with spaces (allowed by the format).
  while ((8 + text.size()) % 8 != 0) text.push_back(' ');
  char len[8];
  uint64_t n = text.size();
  for (int i = 0; i < 8; ++i) len[i] = static_cast<char>((n >> (8 * i)) & 0xff);

  const std::string tmp = path + ".tmp";
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return Internal("cannot create " + tmp + ": " + std::strerror(errno));
  Status s = WriteAll(fd, len, 8, tmp);
  if (s.ok()) s = WriteAll(fd, text.data(), text.size(), tmp);
  for (const SafeTensor* t : order) {
    if (s.ok()) s = WriteAll(fd, t->data.data(), t->data.size(), tmp);
  }
  if (s.ok() && ::fsync(fd) != 0) s = Internal("fsync " + tmp + ": " + std::strerror(errno));
  ::close(fd);
  if (s.ok() && std::rename(tmp.c_str(), path.c_str()) != 0) {
    s = Internal("rename " + tmp + " to " + path + ": " + std::strerror(errno));
  }
  if (!s.ok()) ::unlink(tmp.c_str());
  return s;
}

}  // namespace ps
