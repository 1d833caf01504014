// Helpers shared by the fuzz targets: a reader that cuts a fuzz input into fields, a
// per-process scratch file for the readers that take a path, and the sanitizer defaults.
//
// Each fuzz target includes this header from its one source file, so the definitions
// below appear once per binary.
#pragma once

#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

// A UBSan report is a bug like any other: stop at the first one so that libFuzzer saves
// the input, even when the fuzzer is run by hand without UBSAN_OPTIONS.
extern "C" const char* __ubsan_default_options() { return "halt_on_error=1:print_stacktrace=1"; }

namespace ps::fuzz {

// Consumes a fuzz input from the front. Reads past the end give zeros / empty, so that
// every input, however short, maps to some well-formed sequence of fields and the layout
// of an input stays readable (a seed written by hand is its fields in order).
class ByteReader {
 public:
  ByteReader(const uint8_t* data, size_t size) : data_(data), size_(size) {}

  size_t remaining() const { return size_ - pos_; }

  uint8_t U8() { return pos_ < size_ ? data_[pos_++] : 0; }

  uint16_t U16() {
    uint16_t lo = U8();
    return static_cast<uint16_t>(lo | (uint16_t{U8()} << 8));
  }

  // Little-endian, like the wire's payload frames.
  uint64_t U64() {
    uint64_t v = 0;
    for (int i = 0; i < 8; ++i) v |= uint64_t{U8()} << (8 * i);
    return v;
  }

  // Up to n bytes (fewer at the end of the input).
  std::string_view Bytes(size_t n) {
    n = n < remaining() ? n : remaining();
    std::string_view out(reinterpret_cast<const char*>(data_ + pos_), n);
    pos_ += n;
    return out;
  }

  // A 2-byte little-endian length, then that many bytes.
  std::string_view LengthPrefixed() { return Bytes(U16()); }

  std::string_view Rest() { return Bytes(remaining()); }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
};

// A scratch file in /tmp named after the process and `tag`, overwritten by each input, so
// that parallel fuzzer processes (-jobs, -workers) never share one. Returns its path, or
// "" when the file cannot be written (not the code under test's fault: the caller skips).
// The files are removed when the process exits normally.
inline std::string WriteScratchFile(const std::string& tag, std::string_view bytes) {
  std::string path = "/tmp/ps_fuzz_" + std::to_string(getpid()) + "_" + tag;
  static std::vector<std::string> written;
  static const struct Remover {
    ~Remover() {
      for (const std::string& p : written) std::remove(p.c_str());
    }
  } remover;
  bool known = false;
  for (const std::string& p : written) known |= p == path;
  if (!known) written.push_back(path);
  FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) return "";
  bool ok = std::fwrite(bytes.data(), 1, bytes.size(), f) == bytes.size();
  ok &= std::fclose(f) == 0;
  return ok ? path : "";
}

// Keeps the compiler from dropping reads whose results are otherwise unused: the point of
// reading a field is to make the sanitizers check the memory behind it.
inline void Consume(uint64_t v) {
  static volatile uint64_t sink;
  sink = sink + v;
}

inline void Consume(std::string_view s) {
  uint64_t h = s.size();
  for (char c : s) h = h * 131 + static_cast<unsigned char>(c);
  Consume(h);
}

}  // namespace ps::fuzz
