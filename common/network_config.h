// A network described in a config string (--network, with --model=network): an ordered list
// of layers, parsed and shape-checked here, where the coordinator validates the job, and
// built into kernels-backed layers by the worker (worker/network.h). Every layer with
// parameters owns one table (weight) or two (weight, bias), so the servers' optimizers,
// staleness, spill, checkpoints and export see ordinary dense tables.
//
// Syntax: layers separated by commas; each layer is KIND, then its fields separated by
// colons; optional fields are NAME=VALUE. Spaces around items are ignored.
//
//   input:CxHxW | input:N   first and only first: the shape of one example (N = Nx1x1)
//   input:N:fields=F        --model=wide_deep: N dense features and F categorical fields
//   input:sparse            --model=wide_deep: LIBSVM rows, any number of id:value features
//                           an example; only wide may follow (logistic regression)
//   embedding:DIM           right after an input with fields: each field's id looked up in
//                           the sparse table `emb` (width DIM, keyed by id) -> F*DIM
//   concat                  right after embedding: the F*DIM embeddings, then the N dense
//                           features -> F*DIM + N
//   wide                    right before sigmoid_ce, on one logit: adds the wide part, a
//                           weight per id (sparse table wide.weight, width 1) summed over
//                           the example's fields, plus wide.bias [1 x 1]; right after
//                           input:sparse it is the whole logit, bias + sum of weight x value
//   conv2d:FILTERS:KERNEL[:stride=S][:pad=P]  square KERNEL x KERNEL filters over CxHxW;
//                           tables convN.weight [FILTERS x C*K*K] and convN.bias [1 x FILTERS]
//   maxpool:WINDOW[:stride=S][:pad=P]  max over WINDOW x WINDOW (stride defaults to WINDOW)
//   flatten                 CxHxW -> C*H*W (a dense layer needs a flat input)
//   dense:UNITS             y = x W + b; tables fcN.weight [IN x UNITS], fcN.bias [1 x UNITS]
//   relu                    max(x, 0)
//   dropout:P               drops each value with probability P in [0, 1) while training
//   softmax_ce              last: softmax cross-entropy over a flat input of >= 2 classes
//   sigmoid_ce              last: sigmoid cross-entropy over a flat input of 1 (labels 0/1)
//
// N in the table names counts the layers of that kind from 0 (conv0, conv1, fc0, ...), so
// "input:784,dense:256,relu,dense:128,relu,dense:10,softmax_ce" has the MLP's tables.
// embedding, concat and wide need the example's ids, so --model=wide_deep runs them itself
// (worker/wide_deep.h) and the layers between concat and wide as kernels-backed layers;
// --model=network refuses them (CheckNetworkForModel). --model=sparse_lr is shorthand for
// --model=wide_deep with kSparseLrNetwork.
// Example (a small CNN for 28x28 grey images):
//   input:1x28x28,conv2d:16:3:pad=1,relu,maxpool:2,conv2d:32:3:pad=1,relu,maxpool:2,
//   flatten,dense:128,relu,dense:10,softmax_ce
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/job_config.h"
#include "common/status.h"

namespace ps {

enum class LayerKind {
  kConv2d,
  kMaxPool,
  kFlatten,
  kDense,
  kRelu,
  kDropout,
  kEmbedding,
  kConcat,
  kWide
};
enum class LossKind { kSoftmaxCe, kSigmoidCe };

// The shape of one example's activations: channels x height x width, row-major (NCHW
// without the N). A flat vector of N values is N x 1 x 1.
struct ActShape {
  int c = 1;
  int h = 1;
  int w = 1;
  int64_t size() const { return int64_t{c} * h * w; }
  bool flat() const { return h == 1 && w == 1; }
  std::string ToString() const;  // "16x7x7", or "784" for a flat shape
  bool operator==(const ActShape&) const = default;
};

// One layer after parsing: its kind, fields, shapes and tables.
struct LayerSpec {
  LayerKind kind = LayerKind::kRelu;
  int index = 0;     // position in the --network list (the input is 0)
  std::string text;  // the item as written, for messages
  std::string name;  // table prefix: "conv0", "fc1"; empty for layers without parameters
  ActShape in, out;
  int units = 0;    // dense; embedding: DIM
  int filters = 0;  // conv2d
  int kernel = 0;   // conv2d: filter size; maxpool: window
  int stride = 1;   // conv2d, maxpool
  int pad = 0;      // conv2d, maxpool
  float drop = 0;   // dropout: probability of dropping a value
  // Weight then bias, in the order the layer's Forward takes them (ids not yet assigned).
  std::vector<TableSpec> tables;
};

struct NetworkSpec {
  ActShape input;
  int fields = 0;                 // categorical fields per example (input's fields=F); 0 for images
  bool sparse_input = false;      // input:sparse (then input is 0 values wide: no dense features)
  std::vector<LayerSpec> layers;  // between the input and the loss
  LossKind loss = LossKind::kSoftmaxCe;
  int classes = 0;  // softmax_ce: the input width; sigmoid_ce: 1 (labels 0 or 1)

  // Every layer's tables, in layer order.
  std::vector<TableSpec> Tables() const;
};

// Parses and shape-checks `text`. InvalidArgument, starting "--network: layer I (KIND
// 'ITEM')", naming the field and what was expected; a shape mismatch gives the shapes.
Result<NetworkSpec> ParseNetwork(const std::string& text);

const char* LayerKindName(LayerKind kind);

// Whether `model` ("network" or "wide_deep") can run `net`: --model=network has no
// categorical fields, sparse input, embedding, concat or wide; --model=wide_deep has either
// input:sparse then wide, or an input with fields, then embedding and concat, sigmoid_ce
// last, and only dense, relu and dropout between concat and (optional) wide. InvalidArgument naming
// the layer otherwise.
Status CheckNetworkForModel(const NetworkSpec& net, const std::string& model);

// The --network that --model=mlp trains: --mlp_layers' widths, input first and classes last,
// as dense layers with ReLU between them and softmax cross-entropy at the end. {784, 256,
// 128, 10} -> "input:784,dense:256,relu,dense:128,relu,dense:10,softmax_ce", whose tables
// are fc0.weight [784 x 256], fc0.bias [1 x 256], ... InvalidArgument naming --mlp_layers
// for fewer than two widths or a width < 1.
Result<std::string> MlpNetwork(const std::vector<int>& widths);

// The network --model=sparse_lr trains: logistic regression on LIBSVM rows, whose tables
// are wide.weight (sparse, width 1, keyed by feature id) and wide.bias [1 x 1].
inline constexpr char kSparseLrNetwork[] = "input:sparse,wide,sigmoid_ce";

// The parsed network of a job: --mlp_layers' MLP for "mlp", kSparseLrNetwork for
// "sparse_lr", --network for "network" and "wide_deep"; InvalidArgument for another model
// or a bad list.
Result<NetworkSpec> JobNetwork(const JobConfig& config);

}  // namespace ps
