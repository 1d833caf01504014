#include "common/job_config.h"

#include <cctype>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <sstream>

#include "common/network_config.h"

namespace ps {
namespace {

// One `--name=value` (or `--name`, `--noname` for booleans) token of a flagfile line or of
// an override; `where` names its origin in the error.
Status ApplyFlagToken(const std::string& token, const std::string& where,
                      std::map<std::string, std::string>* flags) {
  if (token.rfind("--", 0) != 0 || token.size() < 3) {
    return InvalidArgument(where + ": '" + token + "' is not a --name=value flag");
  }
  const std::string body = token.substr(2);
  const size_t eq = body.find('=');
  if (eq == std::string::npos) {
    // Booleans as gflags writes them.
    if (body.rfind("no", 0) == 0 && body.size() > 2) {
      (*flags)[body.substr(2)] = "false";
    } else {
      (*flags)[body] = "true";
    }
    return Status::Ok();
  }
  (*flags)[body.substr(0, eq)] = body.substr(eq + 1);
  return Status::Ok();
}

// Later lines override earlier ones, and a nested flagfile's lines land where it is named.
Status ReadFlagfile(const std::string& path, int depth, std::map<std::string, std::string>* flags) {
  if (depth > 8) return InvalidArgument("flagfiles nest deeper than 8 at '" + path + "'");
  std::ifstream in(path);
  if (!in) return NotFound("cannot read flagfile '" + path + "'");
  std::string line;
  int number = 0;
  while (std::getline(in, line)) {
    ++number;
    const size_t first = line.find_first_not_of(" \t\r");
    if (first == std::string::npos || line[first] == '#') continue;
    const size_t last = line.find_last_not_of(" \t\r");
    const std::string token = line.substr(first, last + 1 - first);
    if (token.rfind("--flagfile=", 0) == 0) {
      PS_RETURN_IF_ERROR(ReadFlagfile(token.substr(11), depth + 1, flags));
      continue;
    }
    PS_RETURN_IF_ERROR(ApplyFlagToken(token, path + ":" + std::to_string(number), flags));
  }
  return Status::Ok();
}

Status BadValue(const std::string& flag, const std::string& value, const std::string& allowed) {
  return InvalidArgument("--" + flag + "=" + value + " is not allowed: expected " + allowed);
}

Result<int64_t> ParseInt(const std::string& flag, const std::string& v, int64_t lo, int64_t hi) {
  char* end = nullptr;
  errno = 0;
  long long x = std::strtoll(v.c_str(), &end, 10);
  if (v.empty() || *end != '\0' || errno != 0 || x < lo || x > hi) {
    return BadValue(flag, v,
                    "an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
  }
  return static_cast<int64_t>(x);
}

Result<double> ParseDouble(const std::string& flag, const std::string& v, double lo, double hi,
                           bool lo_open) {
  char* end = nullptr;
  errno = 0;
  double x = std::strtod(v.c_str(), &end);
  bool in_range = lo_open ? x > lo : x >= lo;
  if (v.empty() || *end != '\0' || errno != 0 || !std::isfinite(x) || !in_range || x > hi) {
    std::ostringstream allowed;
    allowed << "a number in " << (lo_open ? "(" : "[") << lo << ", " << hi << "]";
    return BadValue(flag, v, allowed.str());
  }
  return x;
}

// The shortest text that reads back as the same double ("0.1", not "0.10000000000000001").
std::string Str(double x) {
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), x);
  return ec == std::errc() ? std::string(buf, end) : std::to_string(x);
}

// One entry per setting: how to read it from text, how to write it back.
struct Field {
  std::string name;
  std::function<Status(JobConfig&, const std::string&)> parse;
  std::function<std::string(const JobConfig&)> print;
};

template <typename T>
Field IntField(const char* name, T JobConfig::*member, int64_t lo, int64_t hi) {
  return Field{name,
               [=](JobConfig& c, const std::string& v) -> Status {
                 PS_ASSIGN_OR_RETURN(int64_t x, ParseInt(name, v, lo, hi));
                 c.*member = static_cast<T>(x);
                 return Status::Ok();
               },
               [=](const JobConfig& c) { return std::to_string(c.*member); }};
}

Field DoubleField(const char* name, double JobConfig::*member, double lo, double hi, bool lo_open) {
  return Field{name,
               [=](JobConfig& c, const std::string& v) -> Status {
                 PS_ASSIGN_OR_RETURN(double x, ParseDouble(name, v, lo, hi, lo_open));
                 c.*member = x;
                 return Status::Ok();
               },
               [=](const JobConfig& c) { return Str(c.*member); }};
}

Field StringField(const char* name, std::string JobConfig::*member,
                  std::vector<std::string> allowed = {}) {
  return Field{name,
               [=](JobConfig& c, const std::string& v) -> Status {
                 if (!allowed.empty()) {
                   bool ok = false;
                   std::string list;
                   for (const auto& a : allowed) {
                     ok |= a == v;
                     list += (list.empty() ? "" : "|") + a;
                   }
                   if (!ok) return BadValue(name, v, "one of " + list);
                 }
                 c.*member = v;
                 return Status::Ok();
               },
               [=](const JobConfig& c) { return c.*member; }};
}

// code-shape: table (one entry per job setting)
const std::vector<Field>& Fields() {
  static const std::vector<Field> fields = {
      StringField("model", &JobConfig::model, {"mlp", "sparse_lr", "none", "network", "wide_deep"}),
      StringField("mlp_layers", &JobConfig::mlp_layers),
      StringField("network", &JobConfig::network),
      StringField("tables", &JobConfig::tables),
      IntField("num_servers", &JobConfig::num_servers, 1, 1024),
      IntField("num_workers", &JobConfig::num_workers, 1, 100000),
      IntField("replicas", &JobConfig::replicas, 1, 2),
      IntField("staleness", &JobConfig::staleness, -1, 1000000),
      StringField("table_staleness", &JobConfig::table_staleness),
      IntField("max_grad_staleness", &JobConfig::max_grad_staleness, -1, 1000000000),
      DoubleField("staleness_wait_seconds", &JobConfig::staleness_wait_seconds, 0, 1e7, true),
      IntField("epochs", &JobConfig::epochs, 1, 100000),
      Field{"batch_size",
            [](JobConfig& c, const std::string& v) -> Status {
              c.auto_batch = v == "auto";
              if (c.auto_batch) return Status::Ok();  // the average stays at its default
              PS_ASSIGN_OR_RETURN(int64_t x, ParseInt("batch_size", v, 1, 1 << 16));
              c.batch_size = static_cast<int>(x);
              return Status::Ok();
            },
            [](const JobConfig& c) {
              return c.auto_batch ? std::string("auto") : std::to_string(c.batch_size);
            }},
      IntField("global_batch_size", &JobConfig::global_batch_size, 0, 1 << 24),
      IntField("chunk_examples", &JobConfig::chunk_examples, 1, 1 << 24),
      StringField("optimizer", &JobConfig::optimizer,
                  {"sgd", "momentum", "nesterov", "adagrad", "adam", "adamw"}),
      DoubleField("momentum", &JobConfig::momentum, 0, 1, false),
      DoubleField("beta1", &JobConfig::beta1, 0, 1, false),
      DoubleField("beta2", &JobConfig::beta2, 0, 1, false),
      DoubleField("epsilon", &JobConfig::epsilon, 0, 1, true),
      DoubleField("weight_decay", &JobConfig::weight_decay, 0, 1e3, false),
      DoubleField("clip_grad_norm", &JobConfig::clip_grad_norm, 0, 1e12, false),
      DoubleField("base_lr", &JobConfig::base_lr, 0, 1e6, /*lo_open=*/true),
      StringField("lr_policy", &JobConfig::lr_policy,
                  {"fixed", "step", "multistep", "exp", "inv", "poly", "cosine"}),
      DoubleField("gamma", &JobConfig::gamma, 0, 1e6, true),
      IntField("stepsize", &JobConfig::stepsize, 1, INT64_MAX),
      StringField("stepvalue", &JobConfig::stepvalue),
      DoubleField("power", &JobConfig::power, 0, 1e3, false),
      IntField("max_iter", &JobConfig::max_iter, 0, INT64_MAX),
      IntField("warmup_iters", &JobConfig::warmup_iters, 0, INT64_MAX),
      StringField("staleness_lr", &JobConfig::staleness_lr, {"none", "inverse", "sqrt"}),
      DoubleField("pull_lookahead", &JobConfig::pull_lookahead, 0, 16, false),
      IntField("softsync", &JobConfig::softsync, 0, 65536),
      IntField("local_steps", &JobConfig::local_steps, 1, 1024),
      DoubleField("divergence_loss_ratio", &JobConfig::divergence_loss_ratio, 0, 1e12, false),
      IntField("seed", &JobConfig::seed, 0, INT64_MAX),
      StringField("data_dir", &JobConfig::data_dir),
      StringField("train_data", &JobConfig::train_data),
      StringField("test_data", &JobConfig::test_data),
      Field{"hash_features",
            [](JobConfig& c, const std::string& v) -> Status {
              if (v != "true" && v != "false") return BadValue("hash_features", v, "true or false");
              c.hash_features = v == "true";
              return Status::Ok();
            },
            [](const JobConfig& c) { return std::string(c.hash_features ? "true" : "false"); }},
      DoubleField("report_every_seconds", &JobConfig::report_every_seconds, 0, 3600, true),
      IntField("group_size", &JobConfig::group_size, 1, 1 << 16),
      DoubleField("group_timeout_seconds", &JobConfig::group_timeout_seconds, 0, 1e7, true),
      Field{"memory_budget",
            [](JobConfig& c, const std::string& v) -> Status {
              PS_ASSIGN_OR_RETURN(c.memory_budget, ParseByteSize("memory_budget", v));
              return Status::Ok();
            },
            [](const JobConfig& c) { return std::to_string(c.memory_budget); }},
      // "500": clocks; "30s": seconds (the coordinator then picks the clocks).
      Field{"checkpoint_every",
            [](JobConfig& c, const std::string& v) -> Status {
              if (!v.empty() && v.back() == 's') {
                Result<double> seconds =
                    ParseDouble("checkpoint_every", v.substr(0, v.size() - 1), 0, 1e7, false);
                if (!seconds.ok()) {
                  return InvalidArgument("--checkpoint_every=" + v +
                                         ": expected a number of clocks (500) or of seconds "
                                         "(30s) in [0, 1e7]");
                }
                c.checkpoint_every_seconds = *seconds;
                c.checkpoint_every = 0;
                return Status::Ok();
              }
              PS_ASSIGN_OR_RETURN(int64_t clocks,
                                  ParseInt("checkpoint_every", v, 0, int64_t{1} << 40));
              c.checkpoint_every = clocks;
              c.checkpoint_every_seconds = 0;
              return Status::Ok();
            },
            [](const JobConfig& c) {
              if (c.checkpoint_every_seconds > 0) {
                std::ostringstream os;
                os.precision(17);
                os << c.checkpoint_every_seconds << "s";
                return os.str();
              }
              return std::to_string(c.checkpoint_every);
            }},
      StringField("checkpoint_dir", &JobConfig::checkpoint_dir),
      StringField("restore", &JobConfig::restore),
      DoubleField("heartbeat_timeout", &JobConfig::heartbeat_timeout, 0.1, 3600, false),
      DoubleField("coordinator_restart_timeout", &JobConfig::coordinator_restart_timeout, 0, 86400,
                  false),
  };
  return fields;
}

}  // namespace

Result<uint64_t> ParseByteSize(const std::string& flag, const std::string& value) {
  auto bad = [&] {
    return BadValue(flag, value,
                    "a byte count like 1048576, 512MB or 4GB (K, M, G, T: powers of 1024)");
  };
  size_t digits = 0;
  while (digits < value.size() && value[digits] >= '0' && value[digits] <= '9') ++digits;
  if (digits == 0 || digits > 15) return bad();
  uint64_t n = std::stoull(value.substr(0, digits));
  std::string unit = value.substr(digits);
  for (char& ch : unit) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
  if (unit.size() == 3 && unit[1] == 'I' && unit[2] == 'B') unit = unit.substr(0, 1);
  if (unit.size() == 2 && unit[1] == 'B') unit = unit.substr(0, 1);
  int shift = 0;
  if (unit.empty() || unit == "B") {
    shift = 0;
  } else if (unit == "K") {
    shift = 10;
  } else if (unit == "M") {
    shift = 20;
  } else if (unit == "G") {
    shift = 30;
  } else if (unit == "T") {
    shift = 40;
  } else {
    return bad();
  }
  if (shift > 0 && n > (uint64_t{1} << (63 - shift))) return bad();
  return n << shift;
}

namespace {

Result<InitKind> ParseInit(const std::string& s) {
  if (s == "zeros") return InitKind::kZeros;
  if (s == "uniform") return InitKind::kUniform;
  if (s == "normal") return InitKind::kNormal;
  return InvalidArgument("initializer '" + s + "' is unknown: expected zeros|uniform|normal");
}

std::vector<std::string> Split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::string cur;
  for (char ch : s) {
    if (ch == sep) {
      out.push_back(cur);
      cur.clear();
    } else {
      cur += ch;
    }
  }
  out.push_back(cur);
  return out;
}

Result<std::vector<TableSpec>> ParseTables(const std::string& value) {
  std::vector<TableSpec> out;
  if (value.empty()) return out;
  for (const std::string& item : Split(value, ',')) {
    auto bad = [&](const std::string& why) {
      return BadValue("tables", value,
                      "NAME:ROWS:WIDTH[:INIT[:SCALE]] items (ROWS a count or 'sparse'); item '" +
                          item + "' " + why);
    };
    std::vector<std::string> parts = Split(item, ':');
    if (parts.size() < 3 || parts.size() > 5) return bad("has the wrong number of fields");
    TableSpec t;
    t.name = parts[0];
    if (t.name.empty()) return bad("has an empty name");
    if (parts[1] == "sparse") {
      t.rows = 0;
    } else {
      Result<int64_t> rows = ParseInt("tables", parts[1], 1, int64_t{1} << 40);
      if (!rows.ok()) return bad("has a bad row count");
      t.rows = static_cast<uint64_t>(rows.value());
    }
    Result<int64_t> width = ParseInt("tables", parts[2], 1, 1 << 20);
    if (!width.ok()) return bad("has a bad width");
    t.width = static_cast<uint32_t>(width.value());
    if (parts.size() >= 4) {
      Result<InitKind> init = ParseInit(parts[3]);
      if (!init.ok()) return bad(init.status().message());
      t.init = init.value();
    }
    if (parts.size() == 5) {
      Result<double> scale = ParseDouble("tables", parts[4], 0, 1e6, false);
      if (!scale.ok()) return bad("has a bad scale");
      t.init_scale = static_cast<float>(scale.value());
    }
    out.push_back(std::move(t));
  }
  return out;
}

}  // namespace

Result<std::vector<int>> ParseIntList(const std::string& flag, const std::string& value) {
  std::vector<int> out;
  for (const std::string& item : Split(value, ',')) {
    Result<int64_t> x = ParseInt(flag, item, 1, 1 << 24);
    if (!x.ok()) return BadValue(flag, value, "a comma-separated list of positive integers");
    out.push_back(static_cast<int>(x.value()));
  }
  return out;
}

const std::vector<std::string>& JobConfig::FlagNames() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> n;
    for (const Field& f : Fields()) n.push_back(f.name);
    return n;
  }();
  return names;
}

Result<JobConfig> JobConfig::FromFlagMap(const std::map<std::string, std::string>& flags) {
  JobConfig c;
  for (const auto& [name, value] : flags) {
    const Field* field = nullptr;
    for (const Field& f : Fields()) {
      if (f.name == name) field = &f;
    }
    if (field == nullptr) return InvalidArgument("unknown job setting --" + name);
    PS_RETURN_IF_ERROR(field->parse(c, value));
  }
  if (c.model == "sparse_lr" && c.train_data.empty()) {
    return BadValue("train_data", "",
                    "a LIBSVM file (scripts/make_sparse_data.sh): --model=sparse_lr needs "
                    "training data");
  }
  if (c.model == "wide_deep" && c.train_data.empty()) {
    return BadValue("train_data", "",
                    "a CTR file (scripts/make_sparse_data.sh --ctr) or, for input:sparse, a "
                    "LIBSVM file: --model=wide_deep needs training data");
  }
  if (c.model == "mlp") {
    PS_ASSIGN_OR_RETURN(std::vector<int> layers, ParseIntList("mlp_layers", c.mlp_layers));
    if (layers.size() < 2) {
      return BadValue("mlp_layers", c.mlp_layers, "at least two layer widths (input, output)");
    }
  }
  if (!c.network.empty() && c.model != "network" && c.model != "wide_deep") {
    return BadValue("network", c.network,
                    "empty unless --model=network or wide_deep (the model is '" + c.model + "')");
  }
  if (c.model != "none") {
    // Every model is a network: --mlp_layers' MLP, sparse LR's or --network itself, whose
    // layers own the job's first tables.
    PS_ASSIGN_OR_RETURN(NetworkSpec net, JobNetwork(c));
    if (c.model == "network" || c.model == "wide_deep") {
      PS_RETURN_IF_ERROR(CheckNetworkForModel(net, c.model));
    }
    c.table_specs = net.Tables();
  }
  PS_ASSIGN_OR_RETURN(std::vector<TableSpec> extra, ParseTables(c.tables));
  for (TableSpec& t : extra) c.table_specs.push_back(std::move(t));
  for (size_t i = 0; i < c.table_specs.size(); ++i) {
    c.table_specs[i].id = static_cast<uint32_t>(i);
    for (size_t j = 0; j < i; ++j) {
      if (c.table_specs[j].name == c.table_specs[i].name) {
        return BadValue("tables", c.tables,
                        "unique table names; '" + c.table_specs[i].name + "' is declared twice");
      }
    }
  }
  if (c.global_batch_size > 0) {
    const int asked = c.batch_size;
    PS_RETURN_IF_ERROR(c.SetNumWorkers(c.num_workers));
    // A --batch_size given beside it must agree: a value silently replaced would be a surprise.
    if (flags.count("batch_size") && !c.auto_batch && asked != c.batch_size) {
      return BadValue("batch_size", std::to_string(asked),
                      "unset, or " + std::to_string(c.batch_size) + " (--global_batch_size=" +
                          std::to_string(c.global_batch_size) + " over " +
                          std::to_string(c.num_workers) + " workers): set one of the two");
    }
  }
  PS_RETURN_IF_ERROR(c.Validate());
  return c;
}

int64_t JobConfig::IterationsPerEpoch(uint64_t train_examples) const {
  const uint64_t batch =
      static_cast<uint64_t>(std::max(global_batch_size > 0 ? global_batch_size : batch_size, 1));
  return static_cast<int64_t>((train_examples + batch - 1) / batch);
}

void JobConfig::SetWholeJobMaxIter(uint64_t train_examples) {
  if (max_iter != 0) return;
  max_iter = std::max<int64_t>(1, epochs * IterationsPerEpoch(train_examples));
}

Status JobConfig::SetNumWorkers(int workers) {
  num_workers = workers;
  if (global_batch_size <= 0) return Status::Ok();
  if (global_batch_size < workers) {
    return BadValue(
        "global_batch_size", std::to_string(global_batch_size),
        "at least --num_workers=" + std::to_string(workers) + " (one example per worker per step)");
  }
  batch_size = global_batch_size / workers;
  return Status::Ok();
}

Result<JobConfig> JobConfig::FromFlagfile(const std::string& path, const std::string& overrides) {
  std::map<std::string, std::string> flags;
  PS_RETURN_IF_ERROR(ReadFlagfile(path, 0, &flags));
  std::istringstream in(overrides);
  std::string token;
  while (in >> token) {
    if (token.rfind("--flagfile=", 0) == 0) {
      PS_RETURN_IF_ERROR(ReadFlagfile(token.substr(11), 0, &flags));
    } else {
      PS_RETURN_IF_ERROR(ApplyFlagToken(token, "overrides", &flags));
    }
  }
  return FromFlagMap(flags);
}

std::map<std::string, std::string> JobConfig::ToFlagMap() const {
  std::map<std::string, std::string> m;
  for (const Field& f : Fields()) m[f.name] = f.print(*this);
  return m;
}

Status JobConfig::Validate() const {
  if (table_specs.empty()) {
    return InvalidArgument("the job has no tables: set --model=mlp or declare --tables");
  }
  // [0, 1) bounds, which the field table's closed ranges cannot say.
  for (auto [name, value] :
       {std::pair<const char*, double>{"momentum", momentum}, {"beta1", beta1}, {"beta2", beta2}}) {
    if (value >= 1) return BadValue(name, Str(value), "a number in [0, 1)");
  }
  if (!stepvalue.empty()) {
    PS_ASSIGN_OR_RETURN(std::vector<int64_t> steps, ParseStepValues(stepvalue));
    (void)steps;
  } else if (lr_policy == "multistep") {
    return BadValue("stepvalue", "",
                    "a comma-separated list of increasing iterations, needed by "
                    "--lr_policy=multistep");
  }
  PS_RETURN_IF_ERROR(TableStalenessMap().status());
  if (replicas > num_servers) {
    return BadValue("replicas", Str(replicas),
                    "at most --num_servers (a backup is another server)");
  }
  if (group_size > 1 && model != "mlp" && model != "network") {
    return BadValue("group_size", std::to_string(group_size),
                    "1 unless --model=mlp or network (groups all-reduce dense gradients; --model=" +
                        model + " pulls different rows on every worker)");
  }
  if (local_steps > 1 && model != "mlp" && model != "network") {
    return BadValue("local_steps", std::to_string(local_steps),
                    "1 unless --model=mlp or network (local steps move a worker's own copy of "
                    "dense tables; --model=" +
                        model + " pulls each batch's rows)");
  }
  if (local_steps > 1 && group_size > 1) {
    return BadValue("local_steps", std::to_string(local_steps),
                    "1 with --group_size=" + std::to_string(group_size) +
                        " (a group's leader pushes its members' sum every step)");
  }
  // Without a directory nothing would be written, and a later --restore=latest would find
  // nothing: refuse rather than train on without the checkpoints the user asked for.
  if ((checkpoint_every > 0 || checkpoint_every_seconds > 0) && checkpoint_dir.empty()) {
    return BadValue("checkpoint_every", ToFlagMap().at("checkpoint_every"),
                    "0 unless --checkpoint_dir names where the servers write their checkpoints "
                    "(e.g. --checkpoint_dir=runs/myjob/checkpoints)");
  }
  if (max_grad_staleness >= 0 && staleness != -1) {
    return BadValue("max_grad_staleness", std::to_string(max_grad_staleness),
                    "-1 unless --staleness=-1 (the drop rule is for asynchronous training)");
  }
  return Status::Ok();
}

Result<std::vector<int64_t>> ParseStepValues(const std::string& value) {
  std::vector<int64_t> out;
  for (const std::string& item : Split(value, ',')) {
    Result<int64_t> x = ParseInt("stepvalue", item, 1, INT64_MAX);
    if (!x.ok() || (!out.empty() && x.value() <= out.back())) {
      return BadValue("stepvalue", value,
                      "a comma-separated list of increasing positive iterations");
    }
    out.push_back(x.value());
  }
  return out;
}

Result<std::map<std::string, int>> JobConfig::TableStalenessMap() const {
  std::map<std::string, int> out;
  if (table_staleness.empty()) return out;
  for (const std::string& item : Split(table_staleness, ',')) {
    std::vector<std::string> parts = Split(item, ':');
    bool known = false;
    for (const TableSpec& t : table_specs) known |= parts.size() == 2 && t.name == parts[0];
    Result<int64_t> s = parts.size() == 2 ? ParseInt("table_staleness", parts[1], -1, 1000000)
                                          : Result<int64_t>(InvalidArgument("bad"));
    if (!known || !s.ok()) {
      return BadValue("table_staleness", table_staleness,
                      "NAME:S items naming tables of the job, S >= -1; item '" + item + "' is not");
    }
    out[parts[0]] = static_cast<int>(s.value());
  }
  return out;
}

int JobConfig::StalenessOf(const TableSpec& table) const {
  Result<std::map<std::string, int>> m = TableStalenessMap();
  if (m.ok()) {
    auto it = m->find(table.name);
    if (it != m->end()) return it->second;
  }
  return staleness;
}

}  // namespace ps
