#include "common/network_config.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <utility>

namespace ps {
namespace {

// Per-example activations and weight tensors past these are surely a typo.
constexpr int64_t kMaxActivation = int64_t{1} << 26;
constexpr int64_t kMaxDim = int64_t{1} << 24;

// c * h * w, in double: the sizes come from the user and their product may overflow int64.
double Values(const ActShape& s) {
  return static_cast<double>(s.c) * static_cast<double>(s.h) * static_cast<double>(s.w);
}

std::string Trim(const std::string& s) {
  const size_t first = s.find_first_not_of(" \t\r\n");
  if (first == std::string::npos) return "";
  const size_t last = s.find_last_not_of(" \t\r\n");
  return s.substr(first, last + 1 - first);
}

std::vector<std::string> SplitOn(const std::string& s, char sep) {
  std::vector<std::string> out(1);
  for (char ch : s) {
    if (ch == sep) {
      out.emplace_back();
    } else {
      out.back() += ch;
    }
  }
  return out;
}

// What each kind accepts: positional field names and optional NAME=VALUE fields.
struct KindSyntax {
  const char* kind;
  std::vector<const char*> positional;
  std::vector<const char*> optional;
  const char* usage;
};

const std::vector<KindSyntax>& Syntaxes() {
  static const std::vector<KindSyntax> table = {
      {"input", {"SHAPE"}, {"fields"}, "input:CxHxW, input:N, input:N:fields=F or input:sparse"},
      {"conv2d",
       {"FILTERS", "KERNEL"},
       {"stride", "pad"},
       "conv2d:FILTERS:KERNEL[:stride=S][:pad=P]"},
      {"maxpool", {"WINDOW"}, {"stride", "pad"}, "maxpool:WINDOW[:stride=S][:pad=P]"},
      {"flatten", {}, {}, "flatten"},
      {"dense", {"UNITS"}, {}, "dense:UNITS"},
      {"relu", {}, {}, "relu"},
      {"dropout", {"P"}, {}, "dropout:P"},
      {"embedding", {"DIM"}, {}, "embedding:DIM"},
      {"concat", {}, {}, "concat"},
      {"wide", {}, {}, "wide"},
      {"softmax_ce", {}, {}, "softmax_ce"},
      {"sigmoid_ce", {}, {}, "sigmoid_ce"},
  };
  return table;
}

// One item being parsed: its position and text, for messages.
class Item {
 public:
  Item(int index, std::string text) : index_(index), text_(std::move(text)) {}

  Status Error(const std::string& what) const {
    return InvalidArgument("--network: layer " + std::to_string(index_) + " (" + kind_ + " '" +
                           text_ + "'): " + what);
  }

  // Splits the fields and checks them against the kind's syntax.
  Status Split() {
    std::vector<std::string> parts = SplitOn(text_, ':');
    kind_ = Trim(parts[0]);
    for (const KindSyntax& s : Syntaxes()) {
      if (kind_ == s.kind) syntax_ = &s;
    }
    if (syntax_ == nullptr) {
      std::string kinds;
      for (const KindSyntax& s : Syntaxes())
        kinds += std::string(kinds.empty() ? "" : ", ") + s.kind;
      return Error("unknown layer kind '" + kind_ + "': expected one of " + kinds);
    }
    for (size_t i = 1; i < parts.size(); ++i) {
      const std::string p = Trim(parts[i]);
      const size_t eq = p.find('=');
      if (eq == std::string::npos) {
        positional_.push_back(p);
        continue;
      }
      const std::string name = p.substr(0, eq);
      bool known = false;
      for (const char* o : syntax_->optional) known |= name == o;
      if (!known) {
        return Error("unknown field '" + name + "': expected " + syntax_->usage);
      }
      optional_.emplace_back(name, p.substr(eq + 1));
    }
    const size_t want = syntax_->positional.size();
    if (positional_.size() < want) {
      return Error("missing field " + std::string(syntax_->positional[positional_.size()]) +
                   ": expected " + syntax_->usage);
    }
    if (positional_.size() > want) {
      return Error("unexpected field '" + positional_[want] + "': expected " + syntax_->usage);
    }
    return Status::Ok();
  }

  const std::string& kind() const { return kind_; }
  const std::string& text() const { return text_; }
  int index() const { return index_; }

  // Positional field i as an integer in [lo, hi].
  Result<int> Int(size_t i, int64_t lo, int64_t hi) const {
    return ParseIntField(syntax_->positional[i], positional_[i], lo, hi);
  }
  // Optional field `name`, or `dflt` when absent.
  Result<int> OptionalInt(const char* name, int dflt, int64_t lo, int64_t hi) const {
    for (const auto& [n, v] : optional_) {
      if (n == name) return ParseIntField(name, v, lo, hi);
    }
    return dflt;
  }
  const std::string& Field(size_t i) const { return positional_[i]; }
  bool HasOptional(const char* name) const {
    for (const auto& [n, v] : optional_) {
      if (n == name) return true;
    }
    return false;
  }

 private:
  Result<int> ParseIntField(const std::string& name, const std::string& v, int64_t lo,
                            int64_t hi) const {
    char* end = nullptr;
    errno = 0;
    const long long x = std::strtoll(v.c_str(), &end, 10);
    if (v.empty() || *end != '\0' || errno != 0 || x < lo || x > hi) {
      return Error(name + " = '" + v + "': expected an integer in [" + std::to_string(lo) + ", " +
                   std::to_string(hi) + "]");
    }
    return static_cast<int>(x);
  }

  int index_;
  std::string text_;
  std::string kind_;
  const KindSyntax* syntax_ = nullptr;
  std::vector<std::string> positional_;
  std::vector<std::pair<std::string, std::string>> optional_;
};

Result<ActShape> ParseShape(const Item& item) {
  const std::vector<std::string> dims = SplitOn(item.Field(0), 'x');
  if (dims.size() != 1 && dims.size() != 3) {
    return item.Error("SHAPE = '" + item.Field(0) + "': expected CxHxW (e.g. 1x28x28) or N");
  }
  std::vector<int> v;
  for (const std::string& d : dims) {
    char* end = nullptr;
    errno = 0;
    const long long x = std::strtoll(d.c_str(), &end, 10);
    if (d.empty() || *end != '\0' || errno != 0 || x < 1 || x > kMaxDim) {
      return item.Error("SHAPE = '" + item.Field(0) +
                        "': expected CxHxW or N with every size in [1, " + std::to_string(kMaxDim) +
                        "]");
    }
    v.push_back(static_cast<int>(x));
  }
  ActShape s = dims.size() == 1 ? ActShape{v[0], 1, 1} : ActShape{v[0], v[1], v[2]};
  if (Values(s) > kMaxActivation) {
    return item.Error("SHAPE " + s.ToString() + " has more than " + std::to_string(kMaxActivation) +
                      " values per example");
  }
  return s;
}

TableSpec Table(const std::string& name, uint64_t rows, uint32_t width, InitKind init,
                float scale) {
  TableSpec t;
  t.name = name;
  t.rows = rows;
  t.width = width;
  t.init = init;
  t.init_scale = scale;
  return t;
}

// One output axis of a sliding window: floor((size + 2 pad - window) / stride) + 1.
Result<int> Slide(const Item& item, const char* axis, int size, int window, int stride, int pad,
                  const ActShape& in) {
  if (window > int64_t{size} + 2 * int64_t{pad}) {
    return item.Error("window " + std::to_string(window) + " does not fit the input " +
                      in.ToString() + " (" + axis + " " + std::to_string(size) + " + 2 * pad " +
                      std::to_string(pad) + "): expected a window of at most " +
                      std::to_string(int64_t{size} + 2 * pad));
  }
  return static_cast<int>((int64_t{size} + 2 * int64_t{pad} - window) / stride + 1);
}

Status ParseConv(const Item& item, LayerSpec* l, int* count) {
  PS_ASSIGN_OR_RETURN(l->filters, item.Int(0, 1, 1 << 16));
  PS_ASSIGN_OR_RETURN(l->kernel, item.Int(1, 1, 1 << 12));
  PS_ASSIGN_OR_RETURN(l->stride, item.OptionalInt("stride", 1, 1, 1 << 12));
  PS_ASSIGN_OR_RETURN(l->pad, item.OptionalInt("pad", 0, 0, 1 << 12));
  PS_ASSIGN_OR_RETURN(int oh, Slide(item, "height", l->in.h, l->kernel, l->stride, l->pad, l->in));
  PS_ASSIGN_OR_RETURN(int ow, Slide(item, "width", l->in.w, l->kernel, l->stride, l->pad, l->in));
  l->out = ActShape{l->filters, oh, ow};
  const int64_t fan_in = int64_t{l->in.c} * l->kernel * l->kernel;
  if (fan_in * l->filters > kMaxActivation) {
    return item.Error("the weight has " + std::to_string(fan_in * l->filters) +
                      " values: expected at most " + std::to_string(kMaxActivation));
  }
  l->name = "conv" + std::to_string((*count)++);
  const float scale = static_cast<float>(std::sqrt(2.0 / static_cast<double>(fan_in)));
  l->tables = {Table(l->name + ".weight", static_cast<uint64_t>(l->filters),
                     static_cast<uint32_t>(fan_in), InitKind::kNormal, scale),
               Table(l->name + ".bias", 1, static_cast<uint32_t>(l->filters), InitKind::kZeros, 0)};
  return Status::Ok();
}

Status ParsePool(const Item& item, LayerSpec* l) {
  PS_ASSIGN_OR_RETURN(l->kernel, item.Int(0, 1, 1 << 12));
  PS_ASSIGN_OR_RETURN(l->stride, item.OptionalInt("stride", l->kernel, 1, 1 << 12));
  PS_ASSIGN_OR_RETURN(l->pad, item.OptionalInt("pad", 0, 0, 1 << 12));
  if (l->pad > l->kernel / 2) {
    return item.Error("pad = " + std::to_string(l->pad) +
                      ": expected at most WINDOW / 2 = " + std::to_string(l->kernel / 2));
  }
  PS_ASSIGN_OR_RETURN(int oh, Slide(item, "height", l->in.h, l->kernel, l->stride, l->pad, l->in));
  PS_ASSIGN_OR_RETURN(int ow, Slide(item, "width", l->in.w, l->kernel, l->stride, l->pad, l->in));
  l->out = ActShape{l->in.c, oh, ow};
  return Status::Ok();
}

Status ParseDense(const Item& item, LayerSpec* l, int* count) {
  PS_ASSIGN_OR_RETURN(l->units, item.Int(0, 1, kMaxDim));
  if (!l->in.flat()) {
    return item.Error("the input " + l->in.ToString() +
                      " is not flat: expected a flat input (put flatten before dense)");
  }
  if (l->in.size() * l->units > kMaxActivation) {
    return item.Error("the weight " + l->in.ToString() + " x " + std::to_string(l->units) +
                      " has more than " + std::to_string(kMaxActivation) + " values");
  }
  l->out = ActShape{l->units, 1, 1};
  l->name = "fc" + std::to_string((*count)++);
  const float scale = static_cast<float>(std::sqrt(2.0 / static_cast<double>(l->in.size())));
  l->tables = {Table(l->name + ".weight", static_cast<uint64_t>(l->in.size()),
                     static_cast<uint32_t>(l->units), InitKind::kNormal, scale),
               Table(l->name + ".bias", 1, static_cast<uint32_t>(l->units), InitKind::kZeros, 0)};
  return Status::Ok();
}

Status ParseDropout(const Item& item, LayerSpec* l) {
  const std::string& v = item.Field(0);
  char* end = nullptr;
  const double p = std::strtod(v.c_str(), &end);
  if (v.empty() || *end != '\0' || !(p >= 0 && p < 1)) {
    return item.Error("P = '" + v + "': expected a drop probability in [0, 1)");
  }
  l->drop = static_cast<float>(p);
  return Status::Ok();
}

// input:SHAPE[:fields=F]: categorical fields go with a flat input of dense features.
Status ParseInput(const Item& item, NetworkSpec* net) {
  if (item.Field(0) == "sparse") {
    net->sparse_input = true;
    net->input = ActShape{0, 1, 1};
    if (item.HasOptional("fields")) {
      return item.Error("input:sparse takes no fields: its examples are LIBSVM rows of any length");
    }
    return Status::Ok();
  }
  PS_ASSIGN_OR_RETURN(net->input, ParseShape(item));
  PS_ASSIGN_OR_RETURN(net->fields, item.OptionalInt("fields", 0, 0, 1 << 12));
  if (net->fields > 0 && !net->input.flat()) {
    return item.Error("fields = " + std::to_string(net->fields) + " with the input " +
                      net->input.ToString() +
                      ": expected a flat input of dense features (input:N)");
  }
  return Status::Ok();
}

Status ParseLoss(const Item& item, const ActShape& in, NetworkSpec* net) {
  const bool softmax = item.kind() == "softmax_ce";
  if (softmax && !(in.flat() && in.c >= 2)) {
    return item.Error("the input " + in.ToString() +
                      " is not a flat vector of >= 2 classes: expected e.g. dense:10 before it");
  }
  if (!softmax && in != ActShape{1, 1, 1}) {
    return item.Error("the input " + in.ToString() +
                      " is not one logit: expected dense:1 before sigmoid_ce");
  }
  net->loss = softmax ? LossKind::kSoftmaxCe : LossKind::kSigmoidCe;
  net->classes = softmax ? in.c : 1;
  return Status::Ok();
}

// The layers of --model=wide_deep that read the example's categorical ids: embedding (first
// after an input with fields), concat (right after embedding) and wide (on one logit).
Status ParseCtrLayer(const Item& item, const NetworkSpec& net, LayerSpec* l) {
  const std::string& k = item.kind();
  const LayerKind prev = net.layers.empty() ? LayerKind::kRelu : net.layers.back().kind;
  if (net.fields == 0 && !net.sparse_input) {
    return item.Error(
        "needs categorical fields or sparse features: expected an input like input:13:fields=26 "
        "or input:sparse");
  }
  if (k == "embedding") {
    l->kind = LayerKind::kEmbedding;
    if (!net.layers.empty()) return item.Error("must come right after the input");
    PS_ASSIGN_OR_RETURN(l->units, item.Int(0, 1, 4096));
    l->out = ActShape{net.fields * l->units, 1, 1};
    l->name = "emb";
    // Small values: an embedding starts near zero and the MLP's first layer sees a sum over
    // all fields.
    l->tables = {Table("emb", 0, static_cast<uint32_t>(l->units), InitKind::kNormal, 0.05f)};
    return Status::Ok();
  }
  if (k == "concat") {
    l->kind = LayerKind::kConcat;
    if (net.layers.empty() || prev != LayerKind::kEmbedding) {
      return item.Error("must come right after embedding");
    }
    l->out = ActShape{static_cast<int>(l->in.size() + net.input.size()), 1, 1};
    return Status::Ok();
  }
  l->kind = LayerKind::kWide;
  if (net.sparse_input && net.layers.empty()) {
    l->out = ActShape{1, 1, 1};  // the logit is the wide part alone: logistic regression
  } else if (l->in != ActShape{1, 1, 1}) {
    return item.Error("the input " + l->in.ToString() +
                      " is not one logit: expected dense:1 before wide");
  }
  l->name = "wide";
  l->tables = {Table("wide.weight", 0, 1, InitKind::kZeros, 0),
               Table("wide.bias", 1, 1, InitKind::kZeros, 0)};
  return Status::Ok();
}

// Counters for the table names.
struct Counts {
  int conv = 0;
  int dense = 0;
};

Status ParseLayer(const Item& item, LayerSpec* l, Counts* counts) {
  const std::string& k = item.kind();
  l->out = l->in;
  if (k == "conv2d") {
    l->kind = LayerKind::kConv2d;
    return ParseConv(item, l, &counts->conv);
  }
  if (k == "maxpool") {
    l->kind = LayerKind::kMaxPool;
    return ParsePool(item, l);
  }
  if (k == "dense") {
    l->kind = LayerKind::kDense;
    return ParseDense(item, l, &counts->dense);
  }
  if (k == "flatten") {
    l->kind = LayerKind::kFlatten;
    l->out = ActShape{static_cast<int>(l->in.size()), 1, 1};
    return Status::Ok();
  }
  if (k == "relu") {
    l->kind = LayerKind::kRelu;
    return Status::Ok();
  }
  if (k == "dropout") {
    l->kind = LayerKind::kDropout;
    return ParseDropout(item, l);
  }
  return item.Error("must come first (only the first layer is the input)");
}

}  // namespace

std::string ActShape::ToString() const {
  if (flat()) return std::to_string(c);
  return std::to_string(c) + "x" + std::to_string(h) + "x" + std::to_string(w);
}

const char* LayerKindName(LayerKind kind) {
  switch (kind) {
    case LayerKind::kConv2d:
      return "conv2d";
    case LayerKind::kMaxPool:
      return "maxpool";
    case LayerKind::kFlatten:
      return "flatten";
    case LayerKind::kDense:
      return "dense";
    case LayerKind::kRelu:
      return "relu";
    case LayerKind::kDropout:
      return "dropout";
    case LayerKind::kEmbedding:
      return "embedding";
    case LayerKind::kConcat:
      return "concat";
    case LayerKind::kWide:
      return "wide";
  }
  return "?";
}

std::vector<TableSpec> NetworkSpec::Tables() const {
  std::vector<TableSpec> out;
  for (const LayerSpec& l : layers) out.insert(out.end(), l.tables.begin(), l.tables.end());
  return out;
}

Result<NetworkSpec> ParseNetwork(const std::string& text) {
  const std::string usage =
      "a comma-separated layer list starting with input:CxHxW and ending with softmax_ce or "
      "sigmoid_ce (see common/network_config.h)";
  if (Trim(text).empty()) return InvalidArgument("--network is empty: expected " + usage);
  const std::vector<std::string> items = SplitOn(text, ',');
  NetworkSpec net;
  Counts counts;
  bool has_loss = false;
  for (size_t i = 0; i < items.size(); ++i) {
    Item item(static_cast<int>(i), Trim(items[i]));
    PS_RETURN_IF_ERROR(item.Split());
    if (i == 0) {
      if (item.kind() != "input") return item.Error("the first layer must be input:CxHxW");
      PS_RETURN_IF_ERROR(ParseInput(item, &net));
      continue;
    }
    if (has_loss) return item.Error("comes after the loss: expected the loss to be last");
    const ActShape in = net.layers.empty() ? net.input : net.layers.back().out;
    const bool loss = item.kind() == "softmax_ce" || item.kind() == "sigmoid_ce";
    if (net.sparse_input && net.layers.empty() && item.kind() != "wide") {
      return item.Error(
          "follows input:sparse, whose features (id:value, any number an example) only wide "
          "reads: expected input:sparse,wide,sigmoid_ce");
    }
    if (!net.layers.empty() && net.layers.back().kind == LayerKind::kWide && !loss) {
      return item.Error("comes after wide: expected sigmoid_ce right after wide");
    }
    if (loss) {
      PS_RETURN_IF_ERROR(ParseLoss(item, in, &net));
      has_loss = true;
      continue;
    }
    LayerSpec l;
    l.index = static_cast<int>(i);
    l.text = item.text();
    l.in = in;
    const std::string& k = item.kind();
    if (k == "embedding" || k == "concat" || k == "wide") {
      PS_RETURN_IF_ERROR(ParseCtrLayer(item, net, &l));
    } else {
      PS_RETURN_IF_ERROR(ParseLayer(item, &l, &counts));
    }
    if (Values(l.out) > kMaxActivation) {
      return item.Error("the output " + l.out.ToString() + " has more than " +
                        std::to_string(kMaxActivation) + " values per example");
    }
    net.layers.push_back(std::move(l));
  }
  if (!has_loss) {
    return InvalidArgument("--network: no loss after layer " + std::to_string(items.size() - 1) +
                           ": expected softmax_ce or sigmoid_ce last");
  }
  return net;
}

Status CheckNetworkForModel(const NetworkSpec& net, const std::string& model) {
  auto error = [](const LayerSpec& l, const std::string& what) {
    return InvalidArgument("--network: layer " + std::to_string(l.index) + " (" +
                           LayerKindName(l.kind) + " '" + l.text + "'): " + what);
  };
  const bool wide_deep = model == "wide_deep";
  if (!wide_deep) {
    if (net.sparse_input) {
      return InvalidArgument(
          "--network: layer 0 (input): input:sparse needs LIBSVM data: expected "
          "--model=wide_deep, not --model=" +
          model);
    }
    if (net.fields > 0) {
      return InvalidArgument(
          "--network: layer 0 (input): fields=" + std::to_string(net.fields) +
          " needs categorical data: expected --model=wide_deep, not --model=" + model);
    }
    for (const LayerSpec& l : net.layers) {
      if (l.kind == LayerKind::kEmbedding || l.kind == LayerKind::kConcat ||
          l.kind == LayerKind::kWide) {
        return error(l, "reads categorical ids: expected --model=wide_deep, not --model=" + model);
      }
    }
    return Status::Ok();
  }
  if (net.sparse_input) return Status::Ok();  // ParseNetwork allows wide only after it
  if (net.fields == 0) {
    return InvalidArgument(
        "--network: layer 0 (input): no categorical fields: --model=wide_deep expects "
        "input:N:fields=F (e.g. input:13:fields=26) or input:sparse");
  }
  if (net.layers.size() < 2 || net.layers[0].kind != LayerKind::kEmbedding ||
      net.layers[1].kind != LayerKind::kConcat) {
    return InvalidArgument(
        "--network: --model=wide_deep expects embedding:DIM then concat right after the input");
  }
  if (net.loss != LossKind::kSigmoidCe) {
    return InvalidArgument("--network: --model=wide_deep expects sigmoid_ce last (labels 0/1)");
  }
  for (size_t i = 2; i < net.layers.size(); ++i) {
    const LayerSpec& l = net.layers[i];
    const bool ok = l.kind == LayerKind::kDense || l.kind == LayerKind::kRelu ||
                    l.kind == LayerKind::kDropout ||
                    (l.kind == LayerKind::kWide && i + 1 == net.layers.size());
    if (!ok)
      return error(l, "--model=wide_deep runs dense, relu and dropout between concat and wide");
  }
  return Status::Ok();
}

Result<std::string> MlpNetwork(const std::vector<int>& widths) {
  std::string list;
  for (int w : widths) list += (list.empty() ? "" : ",") + std::to_string(w);
  if (widths.size() < 2) {
    return InvalidArgument("--mlp_layers: '" + list + "' has " + std::to_string(widths.size()) +
                           " widths; expected at least two (inputs, classes), e.g. 784,256,10");
  }
  for (int w : widths) {
    if (w < 1) {
      return InvalidArgument("--mlp_layers: width " + std::to_string(w) + " in '" + list +
                             "'; expected widths >= 1");
    }
  }
  std::string net = "input:" + std::to_string(widths.front());
  for (size_t l = 1; l < widths.size(); ++l) {
    net += ",dense:" + std::to_string(widths[l]);
    net += l + 1 < widths.size() ? ",relu" : ",softmax_ce";
  }
  return net;
}

Result<NetworkSpec> JobNetwork(const JobConfig& config) {
  if (config.model == "network" || config.model == "wide_deep") return ParseNetwork(config.network);
  if (config.model == "sparse_lr") return ParseNetwork(kSparseLrNetwork);
  if (config.model != "mlp") {
    return InvalidArgument("the job's model '" + config.model +
                           "' is not a network: expected mlp, network, sparse_lr or wide_deep");
  }
  PS_ASSIGN_OR_RETURN(std::vector<int> widths, ParseIntList("mlp_layers", config.mlp_layers));
  PS_ASSIGN_OR_RETURN(std::string net, MlpNetwork(widths));
  return ParseNetwork(net);
}

}  // namespace ps
