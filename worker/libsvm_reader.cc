#include "worker/libsvm_reader.h"

#include <xxhash.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cfloat>
#include <charconv>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string_view>
#include <system_error>

namespace ps {
namespace {

// Lines are cut out of reads this large; a longer line grows the buffer.
constexpr size_t kReadChunk = size_t{1} << 20;
// Offending text quoted in an error is cut to this many characters.
constexpr size_t kMaxQuoted = 48;

struct GzCloser {
  void operator()(gzFile_s* f) const { gzclose(f); }
};
using GzFile = std::unique_ptr<gzFile_s, GzCloser>;

std::string Quote(std::string_view s) {
  if (s.size() <= kMaxQuoted) return "'" + std::string(s) + "'";
  return "'" + std::string(s.substr(0, kMaxQuoted)) + "...'";
}

bool IsSpace(char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\v' || c == '\f'; }

// Splits a gzip or plain file into lines without copying them: each line is a view into
// the buffer, valid until the next call.
class LineReader {
 public:
  LineReader(std::string path, GzFile file)
      : path_(std::move(path)), file_(std::move(file)), buf_(kReadChunk) {}

  // Sets *line to the next line without its '\n'; false at the end of the file.
  Result<bool> Next(std::string_view* line) {
    while (true) {
      if (const void* nl = std::memchr(buf_.data() + scanned_, '\n', end_ - scanned_)) {
        const size_t pos = static_cast<const char*>(nl) - buf_.data();
        *line = std::string_view(buf_.data() + begin_, pos - begin_);
        begin_ = scanned_ = pos + 1;
        return true;
      }
      scanned_ = end_;
      if (eof_) {
        if (begin_ == end_) return false;
        *line = std::string_view(buf_.data() + begin_, end_ - begin_);  // no final newline
        begin_ = end_;
        return true;
      }
      PS_RETURN_IF_ERROR(Fill());
    }
  }

 private:
  // Moves the partial line to the front and reads more after it.
  Status Fill() {
    const size_t pending = end_ - begin_;
    if (begin_ > 0) {
      std::memmove(buf_.data(), buf_.data() + begin_, pending);
      begin_ = 0;
      scanned_ = end_ = pending;
    }
    if (buf_.size() - end_ < kReadChunk / 2) buf_.resize(buf_.size() * 2);
    // gzread takes an unsigned count and returns an int: stay below INT_MAX.
    const size_t room = std::min(buf_.size() - end_, size_t{1} << 30);
    const int r = gzread(file_.get(), buf_.data() + end_, static_cast<unsigned>(room));
    if (r < 0) {
      int err = Z_OK;
      const char* msg = gzerror(file_.get(), &err);
      std::string detail = msg != nullptr ? msg : "unknown error";
      if (err == Z_ERRNO) detail = std::strerror(errno);
      return InvalidArgument("reading LIBSVM file " + path_ + " failed: " + detail);
    }
    if (r == 0) eof_ = true;
    end_ += static_cast<size_t>(r);
    return Status::Ok();
  }

  std::string path_;
  GzFile file_;
  std::vector<char> buf_;
  size_t begin_ = 0;    // start of the current (unreturned) line
  size_t scanned_ = 0;  // [begin_, scanned_) holds no '\n'
  size_t end_ = 0;      // bytes read into buf_
  bool eof_ = false;
};

// Parses a whole token as a double; from_chars takes no leading '+', LIBSVM files do.
bool ParseDouble(std::string_view s, double* v) {
  if (!s.empty() && s[0] == '+') s.remove_prefix(1);
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), *v);
  return ec == std::errc() && end == s.data() + s.size();
}

class Parser {
 public:
  Parser(const std::string& path, const LibsvmOptions& options, SparseDataset* out)
      : path_(path), options_(options), out_(out) {}

  // Appends the example on `line` (line number `number`) to *out_; false for a line with no
  // example (blank or comment only).
  Result<bool> ParseLine(std::string_view line, int64_t number) {
    if (const size_t hash = line.find('#'); hash != std::string_view::npos) {
      line = line.substr(0, hash);
    }
    size_t pos = 0;
    std::string_view token;
    if (!NextToken(line, &pos, &token)) return false;

    double label = 0;
    if (!ParseDouble(token, &label) || (label != 1 && label != -1 && label != 0)) {
      return Error(number, "a label (+1, 1, -1 or 0)", token);
    }
    while (NextToken(line, &pos, &token)) {
      const size_t colon = token.find(':');
      if (colon == std::string_view::npos) return Error(number, "IDX:VALUE", token);
      const std::string_view idx = token.substr(0, colon);
      uint64_t id = 0;
      const auto [idx_end, idx_ec] = std::from_chars(idx.data(), idx.data() + idx.size(), id);
      if (idx.empty() || idx_ec != std::errc() || idx_end != idx.data() + idx.size()) {
        return Error(number, "IDX:VALUE with IDX an integer in [0, 2^64)", token);
      }
      double value = 0;
      if (!ParseDouble(token.substr(colon + 1), &value)) {
        return Error(number, "IDX:VALUE with VALUE a number", token);
      }
      if (!std::isfinite(value) || std::fabs(value) > FLT_MAX) {
        return Error(number, "IDX:VALUE with VALUE a finite float", token);
      }
      out_->features.push_back(options_.hash_features ? HashFeature(id) : id);
      out_->values.push_back(static_cast<float>(value));
    }
    out_->labels.push_back(label == 1 ? 1 : 0);
    out_->offsets.push_back(static_cast<int64_t>(out_->features.size()));
    ++out_->count;
    return true;
  }

 private:
  static bool NextToken(std::string_view line, size_t* pos, std::string_view* token) {
    size_t p = *pos;
    while (p < line.size() && IsSpace(line[p])) ++p;
    if (p == line.size()) return false;
    const size_t start = p;
    while (p < line.size() && !IsSpace(line[p])) ++p;
    *token = line.substr(start, p - start);
    *pos = p;
    return true;
  }

  Status Error(int64_t number, const std::string& expected, std::string_view got) const {
    return InvalidArgument(path_ + ":" + std::to_string(number) + ": expected " + expected +
                           ", got " + Quote(got));
  }

  const std::string& path_;
  const LibsvmOptions& options_;
  SparseDataset* out_;
};

}  // namespace

uint64_t HashFeature(uint64_t id) {
  // Explicit little-endian bytes: the hash of an id must not depend on the host.
  unsigned char bytes[8];
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<unsigned char>(id >> (8 * i));
  return XXH3_64bits(bytes, sizeof(bytes));
}

Result<SparseDataset> LoadLibsvm(const std::string& path, const LibsvmOptions& options) {
  if (options.max_examples < 0) {
    return InvalidArgument("LoadLibsvm: max_examples must be >= 0 (0 reads all), got " +
                           std::to_string(options.max_examples));
  }
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) {
    return NotFound("LIBSVM file " + path + " does not exist");
  }
  if (std::filesystem::is_directory(path, ec)) {
    return InvalidArgument("LIBSVM file " + path + " is a directory");
  }
  errno = 0;
  gzFile f = gzopen(path.c_str(), "rb");
  if (f == nullptr) {
    return NotFound("cannot open LIBSVM file " + path + ": " +
                    (errno != 0 ? std::strerror(errno) : "out of memory"));
  }
  // Large reads: the default 8 KiB buffer makes inflate slow on big files.
  gzbuffer(f, 1 << 17);
  LineReader reader(path, GzFile(f));

  SparseDataset ds;
  ds.offsets.push_back(0);
  Parser parser(path, options, &ds);
  std::string_view line;
  for (int64_t number = 1; options.max_examples == 0 || ds.count < options.max_examples; ++number) {
    PS_ASSIGN_OR_RETURN(const bool more, reader.Next(&line));
    if (!more) break;
    PS_RETURN_IF_ERROR(parser.ParseLine(line, number).status());
  }
  return ds;
}

}  // namespace ps
