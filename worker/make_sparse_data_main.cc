// ps_make_sparse_data: writes a synthetic click-through-rate data set in LIBSVM format, with
// its true weights, for the sparse logistic regression model. See worker/sparse_data_gen.h
// for the distribution.
//
//   ps_make_sparse_data --features=10000000 --examples=1000000 --nnz=20 --out=train.svm
//       --test_out=test.svm --test_examples=100000 --truth=truth.txt
//
// With --ctr it writes Criteo-like click-through data for --model=wide_deep instead
// (CtrDataGenerator in worker/sparse_data_gen.h), and prints the best AUC a model can reach
// on the test set (the AUC of the true probabilities), which also heads the truth file:
//
//   ps_make_sparse_data --ctr --examples=100000 --out=train.tsv --test_out=test.tsv
//       --test_examples=20000 --truth=truth.txt
#include <gflags/gflags.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "worker/sparse_data_gen.h"

DEFINE_int64(features, 1'000'000, "number of feature ids (1..features)");
DEFINE_int64(examples, 100'000, "training examples to write to --out");
DEFINE_int32(nnz, 20, "distinct binary features per example");
DEFINE_uint64(seed, 1, "random seed; the same seed writes the same files");
DEFINE_double(zipf, 1.1, "exponent of the Zipf law of feature popularity; 0 = uniform");
DEFINE_double(nonzero_fraction, 0.2, "share of features with a non-zero true weight");
DEFINE_double(logit_std, 4.0,
              "standard deviation of the true logit over examples; larger is easier "
              "(4 gives a Bayes AUC of 0.92-0.94)");
DEFINE_double(bias, 0.0, "true bias; negative makes positives rarer");
DEFINE_string(out, "", "training file to write (required)");
DEFINE_string(test_out, "", "held-out file to write, from the same distribution (optional)");
DEFINE_int64(test_examples, 0, "examples to write to --test_out");
DEFINE_bool(ctr, false, "write Criteo-like CTR data (--dense, --fields, --*_vocab) instead");
DEFINE_int32(dense, 13, "--ctr: numeric features per example");
DEFINE_int32(fields, 26, "--ctr: categorical fields per example");
DEFINE_int64(min_vocab, 10, "--ctr: ids of the smallest field");
DEFINE_int64(max_vocab, 100'000, "--ctr: ids of the largest field (sizes grow geometrically)");
DEFINE_string(truth, "", "file for the true non-zero weights as 'ID WEIGHT' lines (optional)");

namespace {

int Fail(const std::string& message) {
  std::fprintf(stderr, "ps_make_sparse_data: %s\n", message.c_str());
  return 1;
}

// The LIBSVM set for sparse LR.
int MakeLibsvm() {
  ps::SparseDataGenOptions options;
  options.features = FLAGS_features;
  options.nnz = FLAGS_nnz;
  options.zipf = FLAGS_zipf;
  options.nonzero_fraction = FLAGS_nonzero_fraction;
  options.logit_std = FLAGS_logit_std;
  options.bias = FLAGS_bias;
  options.seed = FLAGS_seed;

  ps::Result<ps::SparseDataGenerator> gen = ps::SparseDataGenerator::Create(options);
  if (!gen.ok()) return Fail(gen.status().message());
  if (ps::Status s = gen->WriteLibsvm(FLAGS_out, FLAGS_examples); !s.ok()) {
    return Fail(s.message());
  }
  if (!FLAGS_test_out.empty()) {
    if (ps::Status s = gen->WriteLibsvm(FLAGS_test_out, FLAGS_test_examples); !s.ok()) {
      return Fail(s.message());
    }
  }
  if (!FLAGS_truth.empty()) {
    if (ps::Status s = gen->WriteTruth(FLAGS_truth); !s.ok()) return Fail(s.message());
  }
  return 0;
}

// --ctr: the train and test files, then the truth with the test set's best AUC.
int MakeCtr() {
  ps::CtrDataGenOptions o;
  o.dense = FLAGS_dense;
  o.fields = FLAGS_fields;
  o.min_vocab = FLAGS_min_vocab;
  o.max_vocab = FLAGS_max_vocab;
  o.zipf = FLAGS_zipf;
  o.seed = FLAGS_seed;
  ps::Result<ps::CtrDataGenerator> gen = ps::CtrDataGenerator::Create(o);
  if (!gen.ok()) return Fail(gen.status().message());
  if (FLAGS_test_out.empty() || FLAGS_test_examples <= 0) {
    return Fail("--ctr needs --test_out and --test_examples > 0 (the best AUC is the test set's)");
  }
  if (ps::Status s = gen->WriteCtr(FLAGS_out, FLAGS_examples, nullptr, nullptr); !s.ok()) {
    return Fail(s.message());
  }
  std::vector<int32_t> labels;
  std::vector<float> probs;
  if (ps::Status s = gen->WriteCtr(FLAGS_test_out, FLAGS_test_examples, &labels, &probs); !s.ok()) {
    return Fail(s.message());
  }
  const double best = ps::CtrDataGenerator::BestAuc(probs, labels);
  if (!FLAGS_truth.empty()) {
    if (ps::Status s = gen->WriteTruth(FLAGS_truth, best); !s.ok()) return Fail(s.message());
  }
  std::printf("ps_make_sparse_data: %lld ids in %d fields; best reachable test AUC %.4f\n",
              static_cast<long long>(gen->total_ids()), o.fields, best);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  gflags::SetUsageMessage("writes a synthetic sparse binary-classification data set");
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  if (FLAGS_out.empty()) return Fail("--out is required");
  if (FLAGS_examples < 0) return Fail("--examples must be >= 0");
  if (FLAGS_test_examples < 0) return Fail("--test_examples must be >= 0");
  if (FLAGS_test_examples > 0 && FLAGS_test_out.empty()) {
    return Fail("--test_examples needs --test_out");
  }

  const auto start = std::chrono::steady_clock::now();
  if (FLAGS_ctr) {
    if (const int rc = MakeCtr(); rc != 0) return rc;
  } else if (const int rc = MakeLibsvm(); rc != 0) {
    return rc;
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::fprintf(stderr, "ps_make_sparse_data: wrote %lld + %lld examples in %.1fs\n",
               static_cast<long long>(FLAGS_examples),
               static_cast<long long>(FLAGS_test_out.empty() ? 0 : FLAGS_test_examples), seconds);
  return 0;
}
