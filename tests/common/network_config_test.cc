// --network parsing: shapes, tables, and the messages a bad network is refused with.
#include "common/network_config.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "common/job_config.h"

namespace ps {
namespace {

constexpr char kCnn[] =
    "input:1x28x28,conv2d:16:3:pad=1,relu,maxpool:2,conv2d:32:3:pad=1,relu,maxpool:2,"
    "flatten,dense:128,relu,dropout:0.25,dense:10,softmax_ce";

std::string ErrorOf(const std::string& text) {
  Result<NetworkSpec> r = ParseNetwork(text);
  EXPECT_FALSE(r.ok()) << text << " was accepted";
  return r.ok() ? "" : r.status().message();
}

TEST(NetworkConfigTest, ParsesTheCnnWithItsShapesAndTables) {
  Result<NetworkSpec> r = ParseNetwork(kCnn);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  const NetworkSpec& net = *r;
  EXPECT_EQ(net.input, (ActShape{1, 28, 28}));
  ASSERT_EQ(net.layers.size(), 11u);
  EXPECT_EQ(net.layers[0].out, (ActShape{16, 28, 28}));
  EXPECT_EQ(net.layers[2].out, (ActShape{16, 14, 14}));
  EXPECT_EQ(net.layers[5].out, (ActShape{32, 7, 7}));
  EXPECT_EQ(net.layers[6].out, (ActShape{32 * 7 * 7, 1, 1}));
  EXPECT_EQ(net.layers[9].kind, LayerKind::kDropout);
  EXPECT_FLOAT_EQ(net.layers[9].drop, 0.25f);
  EXPECT_EQ(net.layers[10].index, 11);
  EXPECT_EQ(net.loss, LossKind::kSoftmaxCe);
  EXPECT_EQ(net.classes, 10);
  const std::vector<TableSpec> t = net.Tables();
  ASSERT_EQ(t.size(), 8u);
  const char* names[] = {"conv0.weight", "conv0.bias", "conv1.weight", "conv1.bias",
                         "fc0.weight",   "fc0.bias",   "fc1.weight",   "fc1.bias"};
  for (size_t i = 0; i < t.size(); ++i) EXPECT_EQ(t[i].name, names[i]);
  EXPECT_EQ(t[0].rows, 16u);
  EXPECT_EQ(t[0].width, 9u);
  EXPECT_EQ(t[2].rows, 32u);
  EXPECT_EQ(t[2].width, 16u * 9u);
  EXPECT_EQ(t[3].rows, 1u);
  EXPECT_EQ(t[3].width, 32u);
  EXPECT_EQ(t[4].rows, 1568u);
  EXPECT_EQ(t[4].width, 128u);
  EXPECT_EQ(t[0].init, InitKind::kNormal);
  EXPECT_EQ(t[1].init, InitKind::kZeros);
}

TEST(NetworkConfigTest, StrideAndPaddingShapeTheOutput) {
  Result<NetworkSpec> r = ParseNetwork(
      " input:3x10x9 , conv2d:4:3:stride=2 , maxpool:3:stride=1:pad=1 ,flatten,"
      "dense:1,sigmoid_ce");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->layers[0].out, (ActShape{4, 4, 4}));  // floor((10 - 3) / 2) + 1, (9 - 3) / 2 + 1
  EXPECT_EQ(r->layers[1].out, (ActShape{4, 4, 4}));
  EXPECT_EQ(r->loss, LossKind::kSigmoidCe);
  EXPECT_EQ(r->classes, 1);
}

// --model=mlp is the network MlpNetwork writes: dense layers, ReLU between them, softmax
// cross-entropy last; tables fcL.weight (He-normal for the ReLU after it) and fcL.bias (zeros).
TEST(NetworkConfigTest, TheMlpIsANetworkOfDenseLayers) {
  Result<std::string> text = MlpNetwork({784, 256, 128, 10});
  ASSERT_TRUE(text.ok()) << text.status().ToString();
  EXPECT_EQ(*text, "input:784,dense:256,relu,dense:128,relu,dense:10,softmax_ce");
  EXPECT_EQ(MlpNetwork({5, 3}).value(), "input:5,dense:3,softmax_ce");
  Result<NetworkSpec> r = ParseNetwork(*text);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->classes, 10);
  const std::vector<TableSpec> t = r->Tables();
  const int widths[] = {784, 256, 128, 10};
  ASSERT_EQ(t.size(), 6u);
  for (size_t l = 0; l < 3; ++l) {
    const TableSpec& w = t[2 * l];
    const TableSpec& b = t[2 * l + 1];
    EXPECT_EQ(w.name, "fc" + std::to_string(l) + ".weight");
    EXPECT_EQ(w.rows, static_cast<uint64_t>(widths[l]));
    EXPECT_EQ(w.width, static_cast<uint32_t>(widths[l + 1]));
    EXPECT_EQ(w.init, InitKind::kNormal);
    EXPECT_FLOAT_EQ(w.init_scale, std::sqrt(2.0f / widths[l]));
    EXPECT_EQ(b.name, "fc" + std::to_string(l) + ".bias");
    EXPECT_EQ(b.rows, 1u);
    EXPECT_EQ(b.width, static_cast<uint32_t>(widths[l + 1]));
    EXPECT_EQ(b.init, InitKind::kZeros);
  }
}

TEST(NetworkConfigTest, AnMlpOfTooFewOrEmptyLayersIsRefusedNamingTheWidths) {
  Result<std::string> one = MlpNetwork({784});
  ASSERT_FALSE(one.ok());
  EXPECT_EQ(one.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(one.status().message().find("--mlp_layers: '784' has 1 widths"), std::string::npos)
      << one.status().message();
  EXPECT_FALSE(MlpNetwork({}).ok());
  Result<std::string> zero = MlpNetwork({784, 0, 10});
  ASSERT_FALSE(zero.ok());
  EXPECT_NE(zero.status().message().find("width 0 in '784,0,10'"), std::string::npos)
      << zero.status().message();
}

// A job's network: --network for --model=network, the MLP of --mlp_layers for --model=mlp.
TEST(NetworkConfigTest, AJobsNetworkComesFromItsModel) {
  JobConfig c;
  c.model = "mlp";
  c.mlp_layers = "6,4,3";
  Result<NetworkSpec> mlp = JobNetwork(c);
  ASSERT_TRUE(mlp.ok()) << mlp.status().ToString();
  ASSERT_EQ(mlp->layers.size(), 3u);  // dense, relu, dense
  EXPECT_EQ(mlp->input.size(), 6);
  EXPECT_EQ(mlp->classes, 3);
  c.model = "network";
  c.network = "input:1x4x4,flatten,dense:2,softmax_ce";
  Result<NetworkSpec> net = JobNetwork(c);
  ASSERT_TRUE(net.ok()) << net.status().ToString();
  EXPECT_EQ(net->input, (ActShape{1, 4, 4}));
  c.model = "sparse_lr";
  Result<NetworkSpec> lr = JobNetwork(c);
  ASSERT_TRUE(lr.ok()) << lr.status().ToString();
  EXPECT_TRUE(lr->sparse_input);
  c.model = "none";
  Result<NetworkSpec> none = JobNetwork(c);
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.status().message().find("'none'"), std::string::npos) << none.status().message();
}

// Sparse LR is the network input:sparse,wide,sigmoid_ce: the wide part alone, whose tables
// are --model=sparse_lr's, run by --model=wide_deep.
TEST(NetworkConfigTest, SparseLrIsTheWidePartOfASparseInput) {
  Result<NetworkSpec> r = ParseNetwork(kSparseLrNetwork);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE(r->sparse_input);
  EXPECT_EQ(r->fields, 0);
  ASSERT_EQ(r->layers.size(), 1u);
  EXPECT_EQ(r->layers[0].kind, LayerKind::kWide);
  EXPECT_EQ(r->layers[0].out, (ActShape{1, 1, 1}));
  EXPECT_EQ(r->loss, LossKind::kSigmoidCe);
  const std::vector<TableSpec> t = r->Tables();
  ASSERT_EQ(t.size(), 2u);
  EXPECT_EQ(t[0].name, "wide.weight");
  EXPECT_FALSE(t[0].dense());  // keyed by feature id
  EXPECT_EQ(t[0].width, 1u);
  EXPECT_EQ(t[1].name, "wide.bias");
  EXPECT_EQ(t[1].rows, 1u);
  EXPECT_TRUE(CheckNetworkForModel(*r, "wide_deep").ok());
  const Status as_network = CheckNetworkForModel(*r, "network");
  ASSERT_FALSE(as_network.ok());
  EXPECT_NE(as_network.message().find("input:sparse needs LIBSVM data"), std::string::npos)
      << as_network.message();

  Result<JobConfig> job =
      JobConfig::FromFlagMap({{"model", "sparse_lr"}, {"train_data", "data/sparse_lr/train.svm"}});
  ASSERT_TRUE(job.ok()) << job.status().ToString();
  ASSERT_EQ(job->table_specs.size(), 2u);
  EXPECT_EQ(job->table_specs[0].name, "wide.weight");
  EXPECT_EQ(job->table_specs[1].name, "wide.bias");
  Result<JobConfig> same = JobConfig::FromFlagMap({{"model", "wide_deep"},
                                                   {"network", kSparseLrNetwork},
                                                   {"train_data", "data/sparse_lr/train.svm"}});
  ASSERT_TRUE(same.ok()) << same.status().ToString();
  EXPECT_EQ(same->table_specs.size(), 2u);
  EXPECT_EQ(same->table_specs[0].name, "wide.weight");
}

TEST(NetworkConfigTest, ASparseInputFeedsOnlyWide) {
  struct Case {
    const char* text;
    const char* message;
  };
  const Case cases[] = {
      {"input:sparse,dense:1,sigmoid_ce",
       "layer 1 (dense 'dense:1'): follows input:sparse, whose features (id:value, any number an "
       "example) only wide reads"},
      {"input:sparse,sigmoid_ce", "layer 1 (sigmoid_ce 'sigmoid_ce'): follows input:sparse"},
      {"input:sparse,embedding:8,concat,dense:1,sigmoid_ce",
       "layer 1 (embedding 'embedding:8'): follows input:sparse"},
      {"input:sparse:fields=3,wide,sigmoid_ce", "input:sparse takes no fields"},
      {"input:sparse,wide,softmax_ce", "is not a flat vector of >= 2 classes"},
      {"input:sparse,wide", "no loss after layer 1"},
      {"input:sparsely,wide,sigmoid_ce", "SHAPE = 'sparsely'"},
  };
  for (const Case& c : cases) {
    const std::string e = ErrorOf(c.text);
    EXPECT_NE(e.find(c.message), std::string::npos) << c.text << "\n" << e;
  }
}

TEST(NetworkConfigTest, AnUnknownKindIsNamedWithItsPosition) {
  const std::string e = ErrorOf("input:1x28x28,conv2d:8:3,conv3d:8:3,flatten,dense:10,softmax_ce");
  EXPECT_NE(e.find("layer 2 (conv3d 'conv3d:8:3')"), std::string::npos) << e;
  EXPECT_NE(e.find("unknown layer kind 'conv3d'"), std::string::npos) << e;
  EXPECT_NE(e.find("maxpool"), std::string::npos) << "the message lists the kinds: " << e;
}

TEST(NetworkConfigTest, AMissingFieldIsNamed) {
  const std::string e = ErrorOf("input:1x28x28,conv2d:8,flatten,dense:10,softmax_ce");
  EXPECT_NE(e.find("layer 1 (conv2d 'conv2d:8')"), std::string::npos) << e;
  EXPECT_NE(e.find("missing field KERNEL"), std::string::npos) << e;
  EXPECT_NE(e.find("conv2d:FILTERS:KERNEL"), std::string::npos) << e;
}

TEST(NetworkConfigTest, BadValuesNameTheFieldAndTheRange) {
  EXPECT_NE(ErrorOf("input:1x8x8,conv2d:x:3,flatten,dense:2,softmax_ce").find("FILTERS = 'x'"),
            std::string::npos);
  EXPECT_NE(ErrorOf("input:1x8x8,conv2d:4:3:pad=-1,flatten,dense:2,softmax_ce").find("pad = '-1'"),
            std::string::npos);
  EXPECT_NE(ErrorOf("input:1x8x8,conv2d:4:3:padding=1,flatten,dense:2,softmax_ce")
                .find("unknown field 'padding'"),
            std::string::npos);
  EXPECT_NE(ErrorOf("input:8,dropout:1.0,dense:2,softmax_ce").find("drop probability in [0, 1)"),
            std::string::npos);
  EXPECT_NE(ErrorOf("input:8,relu:3,dense:2,softmax_ce").find("unexpected field '3'"),
            std::string::npos);
  EXPECT_NE(ErrorOf("input:1x28,dense:2,softmax_ce").find("expected CxHxW"), std::string::npos);
}

TEST(NetworkConfigTest, ShapeMismatchesSayTheShapes) {
  std::string e = ErrorOf("input:1x28x28,conv2d:16:3,dense:10,softmax_ce");
  EXPECT_NE(e.find("layer 2 (dense 'dense:10')"), std::string::npos) << e;
  EXPECT_NE(e.find("16x26x26 is not flat"), std::string::npos) << e;
  EXPECT_NE(e.find("flatten"), std::string::npos) << e;
  e = ErrorOf("input:1x4x4,conv2d:2:5,flatten,dense:2,softmax_ce");
  EXPECT_NE(e.find("window 5 does not fit the input 1x4x4"), std::string::npos) << e;
  e = ErrorOf("input:1x4x4,maxpool:2:pad=2,flatten,dense:2,softmax_ce");
  EXPECT_NE(e.find("at most WINDOW / 2 = 1"), std::string::npos) << e;
  e = ErrorOf("input:1x4x4,conv2d:2:3,softmax_ce");
  EXPECT_NE(e.find("layer 2 (softmax_ce"), std::string::npos) << e;
  EXPECT_NE(e.find("2x2x2 is not a flat vector"), std::string::npos) << e;
  e = ErrorOf("input:4,dense:2,sigmoid_ce");
  EXPECT_NE(e.find("the input 2 is not one logit"), std::string::npos) << e;
}

TEST(NetworkConfigTest, HugeShapesAreRefusedWithoutOverflow) {
  EXPECT_NE(ErrorOf("input:16777216x16777216x16777216,flatten,dense:2,softmax_ce")
                .find("values per example"),
            std::string::npos);
  EXPECT_NE(ErrorOf("input:1x4096x4096,conv2d:65536:1,flatten,dense:2,softmax_ce")
                .find("the output 65536x4096x4096 has more than"),
            std::string::npos);
}

TEST(NetworkConfigTest, TheListMustStartWithTheInputAndEndWithTheLoss) {
  EXPECT_NE(ErrorOf("").find("--network is empty"), std::string::npos);
  EXPECT_NE(ErrorOf("dense:10,softmax_ce").find("the first layer must be input"),
            std::string::npos);
  EXPECT_NE(ErrorOf("input:4,dense:2").find("no loss after layer 1"), std::string::npos);
  EXPECT_NE(ErrorOf("input:4,dense:2,softmax_ce,relu").find("comes after the loss"),
            std::string::npos);
  EXPECT_NE(ErrorOf("input:4,input:4,dense:2,softmax_ce").find("must come first"),
            std::string::npos);
}

TEST(NetworkConfigTest, TheJobConfigTakesItsTablesFromTheNetwork) {
  Result<JobConfig> c = JobConfig::FromFlagMap({{"model", "network"}, {"network", kCnn}});
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  ASSERT_EQ(c->table_specs.size(), 8u);
  EXPECT_EQ(c->table_specs[2].name, "conv1.weight");
  EXPECT_EQ(c->table_specs[2].id, 2u);
  Result<JobConfig> back = JobConfig::FromFlagMap(c->ToFlagMap());
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->network, kCnn);
  EXPECT_EQ(back->table_specs.size(), 8u);
}

// A network's tables are dense and pulled whole, like the MLP's: all-reduce groups apply.
TEST(NetworkConfigTest, ANetworkJobMayTrainInGroups) {
  Result<JobConfig> c =
      JobConfig::FromFlagMap({{"model", "network"}, {"network", kCnn}, {"group_size", "2"}});
  EXPECT_TRUE(c.ok()) << c.status().ToString();
}

TEST(NetworkConfigTest, TheJobConfigRefusesABadOrStrayNetwork) {
  Result<JobConfig> c = JobConfig::FromFlagMap(
      {{"model", "network"}, {"network", "input:1x28x28,conv2d:16:3,dense:10,softmax_ce"}});
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("layer 2 (dense"), std::string::npos)
      << c.status().ToString();
  c = JobConfig::FromFlagMap({{"model", "network"}});
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("--network is empty"), std::string::npos)
      << c.status().ToString();
  c = JobConfig::FromFlagMap({{"model", "mlp"}, {"network", "input:4,dense:2,softmax_ce"}});
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("--model=network"), std::string::npos)
      << c.status().ToString();
}

// ---- --model=wide_deep: input fields, embedding, concat, wide ----

constexpr char kWideDeep[] =
    "input:13:fields=26,embedding:8,concat,dense:64,relu,dense:32,relu,dense:1,wide,sigmoid_ce";

TEST(NetworkConfigTest, ParsesAWideAndDeepNetworkWithItsSparseTables) {
  Result<NetworkSpec> r = ParseNetwork(kWideDeep);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->fields, 26);
  EXPECT_EQ(r->input, (ActShape{13, 1, 1}));
  EXPECT_EQ(r->layers[0].kind, LayerKind::kEmbedding);
  EXPECT_EQ(r->layers[0].out, (ActShape{208, 1, 1}));
  EXPECT_EQ(r->layers[1].out, (ActShape{221, 1, 1}));  // 26 x 8 embeddings + 13 features
  EXPECT_EQ(r->layers[2].tables[0].rows, 221u);
  const std::vector<TableSpec> t = r->Tables();
  ASSERT_EQ(t.size(), 9u);
  EXPECT_EQ(t[0].name, "emb");
  EXPECT_FALSE(t[0].dense());
  EXPECT_EQ(t[0].width, 8u);
  EXPECT_EQ(t[7].name, "wide.weight");
  EXPECT_FALSE(t[7].dense());
  EXPECT_EQ(t[8].name, "wide.bias");
  EXPECT_TRUE(CheckNetworkForModel(*r, "wide_deep").ok());
  EXPECT_FALSE(CheckNetworkForModel(*r, "network").ok());
}

TEST(NetworkConfigTest, BadWideAndDeepLayersAreNamed) {
  struct Case {
    const char* text;
    const char* message;
  };
  const Case cases[] = {
      {"input:13:fields=26,embeding:8,concat,dense:1,sigmoid_ce",
       "layer 1 (embeding 'embeding:8'): unknown layer kind 'embeding'"},
      {"input:13:fields=26,embedding,concat,dense:1,sigmoid_ce",
       "layer 1 (embedding 'embedding'): missing field DIM"},
      {"input:13,embedding:8,concat,dense:1,sigmoid_ce",
       "layer 1 (embedding 'embedding:8'): needs categorical fields"},
      {"input:13:fields=26,concat,dense:1,sigmoid_ce",
       "layer 1 (concat 'concat'): must come right after embedding"},
      {"input:13:fields=26,embedding:8,concat,dense:4,wide,sigmoid_ce",
       "layer 4 (wide 'wide'): the input 4 is not one logit"},
      {"input:13:fields=26,embedding:8,concat,dense:1,wide,relu,sigmoid_ce",
       "layer 5 (relu 'relu'): comes after wide"},
      {"input:1x13x1:fields=26,embedding:8,concat,dense:1,sigmoid_ce",
       "layer 0 (input 'input:1x13x1:fields=26'): fields = 26 with the input 1x13x1"},
      {"input:13:fields=26:dim=3,embedding:8,concat,dense:1,sigmoid_ce",
       "layer 0 (input 'input:13:fields=26:dim=3'): unknown field 'dim'"},
  };
  for (const Case& c : cases) {
    const std::string e = ErrorOf(c.text);
    EXPECT_NE(e.find(c.message), std::string::npos) << c.text << "\n" << e;
  }
}

TEST(NetworkConfigTest, TheJobConfigChecksTheNetworkAgainstTheModel) {
  auto error = [](const std::string& model, const std::string& network) {
    Result<JobConfig> c = JobConfig::FromFlagMap(
        {{"model", model}, {"network", network}, {"train_data", "data/ctr/train.tsv"}});
    EXPECT_FALSE(c.ok()) << model << " " << network;
    return c.ok() ? "" : c.status().message();
  };
  Result<JobConfig> ok = JobConfig::FromFlagMap(
      {{"model", "wide_deep"}, {"network", kWideDeep}, {"train_data", "data/ctr/train.tsv"}});
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  EXPECT_EQ(ok->table_specs.size(), 9u);
  EXPECT_EQ(ok->table_specs[7].id, 7u);
  std::string e = error("network", kWideDeep);
  EXPECT_NE(e.find("fields=26 needs categorical data"), std::string::npos) << e;
  e = error("wide_deep", "input:13,dense:1,sigmoid_ce");
  EXPECT_NE(e.find("no categorical fields"), std::string::npos) << e;
  e = error("wide_deep", "input:13:fields=2,embedding:4,concat,dense:2,softmax_ce");
  EXPECT_NE(e.find("expects sigmoid_ce last"), std::string::npos) << e;
  e = error("wide_deep", "input:4:fields=2,embedding:4,concat,flatten,dense:1,sigmoid_ce");
  EXPECT_NE(e.find("layer 3 (flatten 'flatten'): --model=wide_deep runs dense, relu and dropout"),
            std::string::npos)
      << e;
  Result<JobConfig> no_data =
      JobConfig::FromFlagMap({{"model", "wide_deep"}, {"network", kWideDeep}});
  ASSERT_FALSE(no_data.ok());
  EXPECT_NE(no_data.status().message().find("--model=wide_deep needs training data"),
            std::string::npos)
      << no_data.status().ToString();
}

}  // namespace
}  // namespace ps
