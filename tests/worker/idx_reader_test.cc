// IDX reading: small files written here, gzip and plain, and every way a file can be bad;
// plus the real Fashion-MNIST files where the machine has them.
#include "worker/idx_reader.h"

#include <gtest/gtest.h>
#include <sys/resource.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

namespace ps {
namespace {

namespace fs = std::filesystem;

void PutU32(std::vector<uint8_t>* out, uint32_t v) {
  out->push_back(static_cast<uint8_t>(v >> 24));
  out->push_back(static_cast<uint8_t>(v >> 16));
  out->push_back(static_cast<uint8_t>(v >> 8));
  out->push_back(static_cast<uint8_t>(v));
}

std::vector<uint8_t> ImagesFile(uint32_t count, uint32_t rows, uint32_t cols,
                                const std::vector<uint8_t>& pixels, uint32_t magic = 0x803) {
  std::vector<uint8_t> f;
  PutU32(&f, magic);
  PutU32(&f, count);
  PutU32(&f, rows);
  PutU32(&f, cols);
  f.insert(f.end(), pixels.begin(), pixels.end());
  return f;
}

std::vector<uint8_t> LabelsFile(uint32_t count, const std::vector<uint8_t>& labels,
                                uint32_t magic = 0x801) {
  std::vector<uint8_t> f;
  PutU32(&f, magic);
  PutU32(&f, count);
  f.insert(f.end(), labels.begin(), labels.end());
  return f;
}

class IdxReaderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() /
           ("idx_reader_test_" + std::to_string(getpid()) + "_" + info->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string WritePlain(const std::string& name, const std::vector<uint8_t>& bytes) {
    const std::string path = (dir_ / name).string();
    std::ofstream out(path, std::ios::binary);
    out.write(reinterpret_cast<const char*>(bytes.data()),
              static_cast<std::streamsize>(bytes.size()));
    EXPECT_TRUE(out.good()) << path;
    return path;
  }
  std::string WriteGz(const std::string& name, const std::vector<uint8_t>& bytes) {
    const std::string path = (dir_ / name).string();
    gzFile f = gzopen(path.c_str(), "wb");
    EXPECT_NE(f, nullptr) << path;
    if (f == nullptr) return path;
    if (!bytes.empty()) {
      EXPECT_EQ(gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size())),
                static_cast<int>(bytes.size()));
    }
    EXPECT_EQ(gzclose(f), Z_OK);
    return path;
  }

  // 5 images of 3 x 4 pixels covering 0 and 255, labels including one above 9.
  void SmallData(std::vector<uint8_t>* pixels, std::vector<uint8_t>* labels) {
    pixels->resize(5 * 3 * 4);
    for (size_t i = 0; i < pixels->size(); ++i) (*pixels)[i] = static_cast<uint8_t>(i * 37 % 256);
    (*pixels)[0] = 0;
    (*pixels)[1] = 255;
    *labels = {3, 0, 9, 200, 1};
  }

  void ExpectSmallData(const ImageDataset& ds, const std::vector<uint8_t>& pixels,
                       const std::vector<uint8_t>& labels) {
    EXPECT_EQ(ds.count, 5);
    EXPECT_EQ(ds.rows, 3);
    EXPECT_EQ(ds.cols, 4);
    ASSERT_EQ(ds.pixels.size(), pixels.size());
    for (size_t i = 0; i < pixels.size(); ++i) EXPECT_EQ(ds.pixels[i], pixels[i] / 255.0f) << i;
    EXPECT_EQ(ds.pixels[0], 0.0f);
    EXPECT_EQ(ds.pixels[1], 1.0f);
    ASSERT_EQ(ds.labels.size(), labels.size());
    for (size_t i = 0; i < labels.size(); ++i) EXPECT_EQ(ds.labels[i], labels[i]);
  }

  fs::path dir_;
};

TEST_F(IdxReaderTest, RoundTripGzip) {
  std::vector<uint8_t> pixels, labels;
  SmallData(&pixels, &labels);
  const std::string img = WriteGz("img.gz", ImagesFile(5, 3, 4, pixels));
  const std::string lab = WriteGz("lab.gz", LabelsFile(5, labels));
  Result<ImageDataset> ds = LoadIdxFiles(img, lab);
  ASSERT_TRUE(ds.ok()) << ds.status().ToString();
  ExpectSmallData(*ds, pixels, labels);
}

TEST_F(IdxReaderTest, RoundTripPlain) {
  std::vector<uint8_t> pixels, labels;
  SmallData(&pixels, &labels);
  const std::string img = WritePlain("img", ImagesFile(5, 3, 4, pixels));
  const std::string lab = WritePlain("lab", LabelsFile(5, labels));
  Result<ImageDataset> ds = LoadIdxFiles(img, lab);
  ASSERT_TRUE(ds.ok()) << ds.status().ToString();
  ExpectSmallData(*ds, pixels, labels);
}

TEST_F(IdxReaderTest, EmptyDataset) {
  const std::string img = WriteGz("img.gz", ImagesFile(0, 28, 28, {}));
  const std::string lab = WriteGz("lab.gz", LabelsFile(0, {}));
  Result<ImageDataset> ds = LoadIdxFiles(img, lab);
  ASSERT_TRUE(ds.ok()) << ds.status().ToString();
  EXPECT_EQ(ds->count, 0);
  EXPECT_TRUE(ds->pixels.empty());
  EXPECT_TRUE(ds->labels.empty());
}

TEST_F(IdxReaderTest, LoadDatasetByPrefixGzipOrPlain) {
  std::vector<uint8_t> pixels, labels;
  SmallData(&pixels, &labels);
  WriteGz("train-images-idx3-ubyte.gz", ImagesFile(5, 3, 4, pixels));
  WriteGz("train-labels-idx1-ubyte.gz", LabelsFile(5, labels));
  // t10k only uncompressed: the reader falls back to the name without .gz.
  WritePlain("t10k-images-idx3-ubyte", ImagesFile(5, 3, 4, pixels));
  WritePlain("t10k-labels-idx1-ubyte", LabelsFile(5, labels));
  for (const char* prefix : {"train", "t10k"}) {
    Result<ImageDataset> ds = LoadIdxDataset(dir_.string(), prefix);
    ASSERT_TRUE(ds.ok()) << prefix << ": " << ds.status().ToString();
    ExpectSmallData(*ds, pixels, labels);
  }
}

// The inflated copies in an IdxCache: made on first use, read after, replaced when the
// source changes; a damaged copy is dropped and the source read.
TEST_F(IdxReaderTest, TheCacheKeepsAnInflatedCopyForTheNextLoad) {
  std::vector<uint8_t> pixels, labels;
  SmallData(&pixels, &labels);
  WriteGz("train-images-idx3-ubyte.gz", ImagesFile(5, 3, 4, pixels));
  WriteGz("train-labels-idx1-ubyte.gz", LabelsFile(5, labels));
  const IdxCache cache{(dir_ / "cache" / "idx").string()};

  IdxCacheReport first;
  Result<ImageDataset> ds = LoadIdxDataset(dir_.string(), "train", cache, &first);
  ASSERT_TRUE(ds.ok()) << ds.status().ToString();
  ExpectSmallData(*ds, pixels, labels);
  EXPECT_EQ(first.files_cached, 2);
  EXPECT_EQ(first.files_from_cache, 0);
  EXPECT_EQ(first.error, "");
  std::vector<fs::path> copies;
  for (const auto& e : fs::directory_iterator(cache.dir)) copies.push_back(e.path());
  ASSERT_EQ(copies.size(), 2u) << "one inflated copy per file, no temporary left";
  for (const fs::path& p : copies) {
    EXPECT_EQ(p.filename().string().find(".gz"), std::string::npos) << p;
    EXPECT_EQ(p.filename().string().find(".tmp"), std::string::npos) << p;
  }

  IdxCacheReport second;
  ds = LoadIdxDataset(dir_.string(), "train", cache, &second);
  ASSERT_TRUE(ds.ok()) << ds.status().ToString();
  ExpectSmallData(*ds, pixels, labels);
  EXPECT_EQ(second.files_from_cache, 2);
  EXPECT_EQ(second.files_cached, 0);

  // A new source (other labels, so another size): another copy, the new data.
  std::vector<uint8_t> other_labels = {1, 2, 3, 4, 5, 6};
  std::vector<uint8_t> other_pixels(6 * 3 * 4, 7);
  WriteGz("train-images-idx3-ubyte.gz", ImagesFile(6, 3, 4, other_pixels));
  WriteGz("train-labels-idx1-ubyte.gz", LabelsFile(6, other_labels));
  IdxCacheReport third;
  ds = LoadIdxDataset(dir_.string(), "train", cache, &third);
  ASSERT_TRUE(ds.ok()) << ds.status().ToString();
  EXPECT_EQ(ds->count, 6);
  EXPECT_EQ(ds->labels[5], 6);
  EXPECT_EQ(third.files_cached, 2);

  // Damage the copies: the load reads the sources instead and says why.
  for (const auto& e : fs::directory_iterator(cache.dir)) fs::resize_file(e.path(), 3);
  IdxCacheReport fourth;
  ds = LoadIdxDataset(dir_.string(), "train", cache, &fourth);
  ASSERT_TRUE(ds.ok()) << ds.status().ToString();
  EXPECT_EQ(ds->count, 6);
  EXPECT_NE(fourth.error.find("cached copy unreadable"), std::string::npos) << fourth.error;
}

TEST_F(IdxReaderTest, ACacheThatCannotBeWrittenIsSkippedNotAnError) {
  std::vector<uint8_t> pixels, labels;
  SmallData(&pixels, &labels);
  WriteGz("t10k-images-idx3-ubyte.gz", ImagesFile(5, 3, 4, pixels));
  WriteGz("t10k-labels-idx1-ubyte.gz", LabelsFile(5, labels));
  // A cache "directory" under a regular file cannot be created, even by root.
  const std::string file = WritePlain("not-a-dir", {1});
  IdxCacheReport report;
  Result<ImageDataset> ds = LoadIdxDataset(dir_.string(), "t10k", IdxCache{file + "/idx"}, &report);
  ASSERT_TRUE(ds.ok()) << ds.status().ToString();
  ExpectSmallData(*ds, pixels, labels);
  EXPECT_EQ(report.files_cached, 0);
  EXPECT_NE(report.error.find(file), std::string::npos) << report.error;
}

TEST_F(IdxReaderTest, AFileInflatingPastTheLimitIsReadFromItsSourceAndNotCached) {
  std::vector<uint8_t> pixels, labels;
  SmallData(&pixels, &labels);
  WriteGz("train-images-idx3-ubyte.gz", ImagesFile(5, 3, 4, pixels));  // 76 bytes
  WriteGz("train-labels-idx1-ubyte.gz", LabelsFile(5, labels));        // 13 bytes
  IdxCache cache{(dir_ / "cache").string()};
  cache.max_inflated_bytes = 40;
  IdxCacheReport report;
  Result<ImageDataset> ds = LoadIdxDataset(dir_.string(), "train", cache, &report);
  ASSERT_TRUE(ds.ok()) << ds.status().ToString();
  ExpectSmallData(*ds, pixels, labels);
  EXPECT_EQ(report.files_cached, 1) << "the labels";
  EXPECT_NE(report.error.find("inflates to more than 40 bytes"), std::string::npos) << report.error;
  int files = 0;
  for (const auto& e : fs::directory_iterator(cache.dir)) {
    EXPECT_NE(e.path().filename().string().find("labels"), std::string::npos) << e.path();
    ++files;
  }
  EXPECT_EQ(files, 1) << "no copy of the images, and no temporary left";
}

TEST(IdxCacheTest, TheEnvironmentNamesTheDirectory) {
  const char* saved[] = {std::getenv("PS_CACHE_DIR"), std::getenv("XDG_CACHE_HOME"),
                         std::getenv("HOME")};
  const std::string keep[] = {saved[0] ? saved[0] : "", saved[1] ? saved[1] : "",
                              saved[2] ? saved[2] : ""};
  setenv("PS_CACHE_DIR", "/c", 1);
  setenv("XDG_CACHE_HOME", "/x", 1);
  setenv("HOME", "/h", 1);
  EXPECT_EQ(IdxCache::FromEnvironment().dir, "/c/idx");
  setenv("PS_CACHE_DIR", "off", 1);
  EXPECT_EQ(IdxCache::FromEnvironment().dir, "");
  unsetenv("PS_CACHE_DIR");
  EXPECT_EQ(IdxCache::FromEnvironment().dir, "/x/ps/idx");
  unsetenv("XDG_CACHE_HOME");
  EXPECT_EQ(IdxCache::FromEnvironment().dir, "/h/.cache/ps/idx");
  unsetenv("HOME");
  EXPECT_EQ(IdxCache::FromEnvironment().dir, "");
  const char* names[] = {"PS_CACHE_DIR", "XDG_CACHE_HOME", "HOME"};
  for (int i = 0; i < 3; ++i) {
    if (saved[i] != nullptr) setenv(names[i], keep[i].c_str(), 1);
  }
}

TEST_F(IdxReaderTest, MissingFileIsNotFoundNamingThePath) {
  const std::string lab = WriteGz("lab.gz", LabelsFile(0, {}));
  const std::string missing = (dir_ / "nope.gz").string();
  Result<ImageDataset> ds = LoadIdxFiles(missing, lab);
  ASSERT_FALSE(ds.ok());
  EXPECT_EQ(ds.status().code(), StatusCode::kNotFound);
  EXPECT_NE(ds.status().message().find(missing), std::string::npos) << ds.status().message();

  Result<ImageDataset> by_prefix = LoadIdxDataset(dir_.string(), "train");
  ASSERT_FALSE(by_prefix.ok());
  EXPECT_EQ(by_prefix.status().code(), StatusCode::kNotFound);
  EXPECT_NE(by_prefix.status().message().find("train-images-idx3-ubyte.gz"), std::string::npos)
      << by_prefix.status().message();
}

TEST_F(IdxReaderTest, BadMagicNamesFileFoundAndExpected) {
  std::vector<uint8_t> pixels, labels;
  SmallData(&pixels, &labels);
  // The two files swapped: a classic mistake.
  const std::string img = WriteGz("img.gz", ImagesFile(5, 3, 4, pixels));
  const std::string lab = WriteGz("lab.gz", LabelsFile(5, labels));
  Result<ImageDataset> ds = LoadIdxFiles(lab, img);
  ASSERT_FALSE(ds.ok());
  EXPECT_EQ(ds.status().code(), StatusCode::kInvalidArgument);
  const std::string& msg = ds.status().message();
  EXPECT_NE(msg.find(lab), std::string::npos) << msg;
  EXPECT_NE(msg.find("0x00000801"), std::string::npos) << msg;
  EXPECT_NE(msg.find("0x00000803"), std::string::npos) << msg;

  // A good images file with a bad labels file: the error is about the labels file.
  const std::string bad_lab = WriteGz("bad_lab.gz", LabelsFile(5, labels, 0x12345678));
  ds = LoadIdxFiles(img, bad_lab);
  ASSERT_FALSE(ds.ok());
  EXPECT_NE(ds.status().message().find(bad_lab), std::string::npos) << ds.status().message();
  EXPECT_NE(ds.status().message().find("0x12345678"), std::string::npos);
}

TEST_F(IdxReaderTest, TruncatedFilesSayExpectedAndGot) {
  std::vector<uint8_t> pixels, labels;
  SmallData(&pixels, &labels);
  std::vector<uint8_t> short_pixels(pixels.begin(), pixels.end() - 10);
  const std::string img = WriteGz("img.gz", ImagesFile(5, 3, 4, short_pixels));
  const std::string lab = WriteGz("lab.gz", LabelsFile(5, labels));
  Result<ImageDataset> ds = LoadIdxFiles(img, lab);
  ASSERT_FALSE(ds.ok());
  EXPECT_EQ(ds.status().code(), StatusCode::kInvalidArgument);
  const std::string& msg = ds.status().message();
  EXPECT_NE(msg.find(img), std::string::npos) << msg;
  EXPECT_NE(msg.find("truncated"), std::string::npos) << msg;
  EXPECT_NE(msg.find("expected 60 bytes"), std::string::npos) << msg;
  EXPECT_NE(msg.find("got 50"), std::string::npos) << msg;

  // Labels cut short, uncompressed.
  const std::string good_img = WritePlain("good_img", ImagesFile(5, 3, 4, pixels));
  const std::string short_lab = WritePlain("short_lab", LabelsFile(5, {1, 2}));
  ds = LoadIdxFiles(good_img, short_lab);
  ASSERT_FALSE(ds.ok());
  EXPECT_NE(ds.status().message().find(short_lab), std::string::npos) << ds.status().message();
  EXPECT_NE(ds.status().message().find("expected 5 bytes of labels, got 2"), std::string::npos)
      << ds.status().message();

  // A header cut in the middle.
  std::vector<uint8_t> header = ImagesFile(5, 3, 4, {});
  header.resize(9);
  const std::string cut = WritePlain("cut", header);
  ds = LoadIdxFiles(cut, lab);
  ASSERT_FALSE(ds.ok());
  EXPECT_NE(ds.status().message().find(cut), std::string::npos) << ds.status().message();
  EXPECT_NE(ds.status().message().find("truncated"), std::string::npos);

  // A gzip stream cut short (a download interrupted).
  const std::string whole = WriteGz("whole.gz", ImagesFile(5, 3, 4, pixels));
  std::ifstream in(whole, std::ios::binary);
  std::vector<uint8_t> gz((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  gz.resize(gz.size() / 2);
  const std::string cut_gz = WritePlain("cut.gz", gz);
  ds = LoadIdxFiles(cut_gz, lab);
  ASSERT_FALSE(ds.ok());
  EXPECT_EQ(ds.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(ds.status().message().find(cut_gz), std::string::npos) << ds.status().message();
}

TEST_F(IdxReaderTest, TrailingBytesAreAnError) {
  std::vector<uint8_t> pixels, labels;
  SmallData(&pixels, &labels);
  std::vector<uint8_t> img_bytes = ImagesFile(5, 3, 4, pixels);
  img_bytes.push_back(7);
  const std::string img = WriteGz("img.gz", img_bytes);
  const std::string lab = WriteGz("lab.gz", LabelsFile(5, labels));
  Result<ImageDataset> ds = LoadIdxFiles(img, lab);
  ASSERT_FALSE(ds.ok());
  EXPECT_NE(ds.status().message().find("trailing"), std::string::npos) << ds.status().message();
}

TEST_F(IdxReaderTest, CountMismatchNamesBothCounts) {
  std::vector<uint8_t> pixels, labels;
  SmallData(&pixels, &labels);
  const std::string img = WriteGz("img.gz", ImagesFile(5, 3, 4, pixels));
  const std::string lab = WriteGz("lab.gz", LabelsFile(4, {1, 2, 3, 4}));
  Result<ImageDataset> ds = LoadIdxFiles(img, lab);
  ASSERT_FALSE(ds.ok());
  EXPECT_EQ(ds.status().code(), StatusCode::kInvalidArgument);
  const std::string& msg = ds.status().message();
  EXPECT_NE(msg.find("5 images"), std::string::npos) << msg;
  EXPECT_NE(msg.find("4 labels"), std::string::npos) << msg;
}

TEST_F(IdxReaderTest, AbsurdHeaderSizesAreRejectedBeforeAllocating) {
  const std::string lab = WriteGz("lab.gz", LabelsFile(0, {}));
  // 200 million images: the limit is 100 million.
  std::string img = WriteGz("huge_count.gz", ImagesFile(200'000'000, 28, 28, {}));
  Result<ImageDataset> ds = LoadIdxFiles(img, lab);
  ASSERT_FALSE(ds.ok());
  EXPECT_EQ(ds.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(ds.status().message().find("200000000"), std::string::npos) << ds.status().message();
  // Zero-sized or gigantic images.
  for (auto [rows, cols] : {std::pair<uint32_t, uint32_t>{0, 28}, {28, 0}, {100000, 28}}) {
    img = WriteGz("bad_side.gz", ImagesFile(1, rows, cols, {}));
    ds = LoadIdxFiles(img, lab);
    ASSERT_FALSE(ds.ok());
    EXPECT_EQ(ds.status().code(), StatusCode::kInvalidArgument) << ds.status().ToString();
  }
  // Each limit alone passes but the product is too large (10^8 images of 200 x 200).
  img = WriteGz("too_many_pixels.gz", ImagesFile(100'000'000, 200, 200, {}));
  ds = LoadIdxFiles(img, lab);
  ASSERT_FALSE(ds.ok());
  EXPECT_NE(ds.status().message().find("pixels"), std::string::npos) << ds.status().message();
}

// Found by fuzz_idx: a 26-byte pair claiming 16 x 16384 x 16384 pixels (within every
// limit) is a truncation error, found without first allocating the 4 GiB it claims.
TEST_F(IdxReaderTest, AHugeClaimOverATinyFileIsATruncationError) {
  const std::string lab = WriteGz("lab.gz", LabelsFile(16, std::vector<uint8_t>(16, 1)));
  const std::string img = WriteGz("img.gz", ImagesFile(16, 16384, 16384, {1, 2}));
  struct rusage before {};
  getrusage(RUSAGE_SELF, &before);
  Result<ImageDataset> ds = LoadIdxFiles(img, lab);
  struct rusage after {};
  getrusage(RUSAGE_SELF, &after);
  ASSERT_FALSE(ds.ok());
  EXPECT_EQ(ds.status().code(), StatusCode::kInvalidArgument) << ds.status().ToString();
  // Peak RSS grew by far less than the claimed 4 GiB (ru_maxrss is in KiB).
  EXPECT_LT(after.ru_maxrss - before.ru_maxrss, 256 * 1024);
}

TEST(IdxReaderRealDataTest, FashionMnistLoads) {
  const std::string dir = "/usr/share/datasets/fashion-mnist";
  if (!fs::exists(dir + "/train-images-idx3-ubyte.gz")) {
    GTEST_SKIP() << "no Fashion-MNIST at " << dir;
  }
  for (const auto& [prefix, count] :
       {std::pair<const char*, int64_t>{"train", 60000}, {"t10k", 10000}}) {
    Result<ImageDataset> ds = LoadIdxDataset(dir, prefix);
    ASSERT_TRUE(ds.ok()) << ds.status().ToString();
    EXPECT_EQ(ds->count, count);
    EXPECT_EQ(ds->rows, 28);
    EXPECT_EQ(ds->cols, 28);
    ASSERT_EQ(ds->pixels.size(), static_cast<size_t>(count) * 28 * 28);
    ASSERT_EQ(ds->labels.size(), static_cast<size_t>(count));
    std::vector<int64_t> per_class(10);
    for (int32_t l : ds->labels) {
      ASSERT_GE(l, 0);
      ASSERT_LT(l, 10);
      ++per_class[l];
    }
    // Fashion-MNIST is balanced: count / 10 of each class.
    for (int64_t c : per_class) EXPECT_EQ(c, count / 10);
    float lo = 1, hi = 0;
    for (float p : ds->pixels) {
      lo = std::min(lo, p);
      hi = std::max(hi, p);
    }
    EXPECT_EQ(lo, 0.0f);
    EXPECT_EQ(hi, 1.0f);
  }
}

}  // namespace
}  // namespace ps
