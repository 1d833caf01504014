#include "common/data_check.h"

#include <unistd.h>
#include <zlib.h>

#include <array>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <string>
#include <system_error>

#include "common/network_config.h"

namespace ps {
namespace {

namespace fs = std::filesystem;

// scripts/make_sparse_data.sh writes train.svm and test.svm into its --out directory,
// data/sparse_lr by default (configs/sparse_lr.flags reads them there).
constexpr char kMakeSparseData[] = "scripts/make_sparse_data.sh";
constexpr char kSparseDataDir[] = "data/sparse_lr";

// The IDX files an mlp job reads from data_dir (worker/idx_reader.h: NAME.gz, else NAME).
constexpr const char* kIdxFiles[] = {"train-images-idx3-ubyte", "train-labels-idx1-ubyte",
                                     "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"};

// Says where a relative path was looked for.
std::string Where(const std::string& path) {
  std::error_code ec;
  if (fs::path(path).is_absolute()) return "";
  const fs::path cwd = fs::current_path(ec);
  return ec ? "" : " (relative to " + cwd.string() + ")";
}

// What makes the LIBSVM file `path`: the generator when the name is one it writes.
std::string LibsvmHint(const std::string& path) {
  const fs::path p = fs::path(path).lexically_normal();
  const std::string name = p.filename().string();
  if (name != "train.svm" && name != "test.svm") {
    return "check the path (synthetic data: " + std::string(kMakeSparseData) + " --out DIR)";
  }
  const fs::path dir = p.parent_path();
  if (dir == kSparseDataDir) {
    return "make the generated sparse set with " + std::string(kMakeSparseData) +
           " (from the repository root)";
  }
  return "make a generated sparse set there with " + std::string(kMakeSparseData) + " --out " +
         dir.string();
}

// What makes the CTR file `path` (scripts/make_sparse_data.sh --ctr writes data/ctr/).
std::string CtrHint(const std::string& path) {
  const fs::path dir = fs::path(path).lexically_normal().parent_path();
  if (dir == "data/ctr") {
    return "make the generated CTR set with " + std::string(kMakeSparseData) +
           " --ctr (from the repository root)";
  }
  return "make a generated CTR set there with " + std::string(kMakeSparseData) + " --ctr --out " +
         dir.string();
}

// The path a worker opens for IDX file `name` of `data_dir` (worker/idx_reader.h): NAME.gz,
// else NAME.
std::string IdxPath(const std::string& data_dir, const std::string& name) {
  const std::string plain = (fs::path(data_dir) / name).string();
  std::error_code ec;
  return fs::exists(plain, ec) && !fs::exists(plain + ".gz", ec) ? plain : plain + ".gz";
}

std::string IdxHint(const std::string& data_dir) {
  if (data_dir == JobConfig{}.data_dir) {
    return "Debian's dataset-fashion-mnist package installs it: scripts/install_deps.sh";
  }
  return "--data_dir names a directory of IDX files: train-images-idx3-ubyte, "
         "train-labels-idx1-ubyte, t10k-images-idx3-ubyte and t10k-labels-idx1-ubyte, each "
         "gzipped (.gz) or plain";
}

// OK when `path` is a readable file. `setting` is the flag that names it, `what` the kind of
// file and `hint` what makes it, for the message.
Status CheckFile(const std::string& path, const std::string& setting, const std::string& what,
                 const std::string& hint) {
  if (path.empty()) return InvalidArgument("--" + setting + " is empty: it names a " + what);
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  const std::string head = "--" + setting + ": " + what + " " + path;
  if (!fs::exists(st)) return NotFound(head + " does not exist" + Where(path) + "; " + hint);
  if (fs::is_directory(st)) return FailedPrecondition(head + " is a directory, not a file");
  if (access(path.c_str(), R_OK) != 0) {
    return FailedPrecondition(head + " is not readable: " + std::strerror(errno));
  }
  return Status::Ok();
}

Status CheckIdxDir(const std::string& data_dir) {
  std::error_code ec;
  const fs::file_status st = fs::status(data_dir, ec);
  const std::string head = "--data_dir: directory " + data_dir;
  if (!fs::exists(st)) {
    return NotFound(head + " does not exist" + Where(data_dir) + "; " + IdxHint(data_dir));
  }
  if (!fs::is_directory(st)) return FailedPrecondition(head + " is not a directory");
  for (const char* name : kIdxFiles) {
    const std::string path = IdxPath(data_dir, name);
    if (Status s = CheckFile(path, "data_dir", "IDX file", IdxHint(data_dir)); !s.ok()) return s;
  }
  return Status::Ok();
}

// --train_data and, when set, --test_data: files of `kind`, `hint(path)` saying what makes one.
Status CheckTrainAndTest(const JobConfig& config, const char* kind,
                         std::string (*hint)(const std::string&)) {
  PS_RETURN_IF_ERROR(CheckFile(config.train_data, "train_data", kind, hint(config.train_data)));
  if (config.test_data.empty()) return Status::Ok();
  return CheckFile(config.test_data, "test_data", kind, hint(config.test_data));
}

// The example count in the header of IDX file `path` (gzipped or plain: gzread reads both):
// a big-endian magic whose last byte is the number of dimensions, then the first dimension.
Result<uint64_t> IdxCount(const std::string& path) {
  gzFile f = gzopen(path.c_str(), "rb");
  if (f == nullptr) return NotFound("cannot open " + path + ": " + std::strerror(errno));
  std::array<unsigned char, 8> h{};
  const int got = gzread(f, h.data(), static_cast<unsigned>(h.size()));
  gzclose(f);
  if (got != static_cast<int>(h.size()) || h[0] != 0 || h[1] != 0 || h[3] < 1) {
    return InvalidArgument(path + " does not start with an IDX header");
  }
  return (uint64_t{h[4]} << 24) | (uint64_t{h[5]} << 16) | (uint64_t{h[6]} << 8) | h[7];
}

}  // namespace

Status ResolveWholeJobMaxIter(JobConfig* config) {
  if (config->max_iter != 0 || (config->lr_policy != "poly" && config->lr_policy != "cosine")) {
    return Status::Ok();
  }
  if (config->model != "mlp" && config->model != "network") {
    return InvalidArgument(
        "--max_iter=0 (the end of the job) is worked out only for IDX data "
        "(--model=mlp, network); --model=" +
        config->model +
        " needs --max_iter=N, the iteration where --lr_policy=" + config->lr_policy + " ends");
  }
  PS_ASSIGN_OR_RETURN(uint64_t examples,
                      IdxCount(IdxPath(config->data_dir, "train-labels-idx1-ubyte")));
  config->SetWholeJobMaxIter(examples);
  return Status::Ok();
}

Status CheckJobData(const JobConfig& config) {
  if (config.model == "mlp" || config.model == "network") return CheckIdxDir(config.data_dir);
  if (config.model == "sparse_lr") return CheckTrainAndTest(config, "LIBSVM file", LibsvmHint);
  if (config.model == "wide_deep") {
    // input:sparse reads LIBSVM rows; an input with fields, CTR lines.
    const Result<NetworkSpec> net = ParseNetwork(config.network);
    if (net.ok() && net->sparse_input) {
      return CheckTrainAndTest(config, "LIBSVM file", LibsvmHint);
    }
    return CheckTrainAndTest(config, "CTR file", CtrHint);
  }
  return Status::Ok();
}

}  // namespace ps
