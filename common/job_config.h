// The job config: every setting that all processes of a job must agree on. The
// coordinator reads it from its flags (a gflags flagfile plus overrides), validates it,
// and sends it to every server and worker at registration as a flag-name -> value map, so
// that each process parses the very same text with the very same code (FromFlagMap).
//
// Adding a setting: add the field with its default and a comment here, add it to the
// field table in job_config.cc (name, parse, print, check), and define the flag in
// server/coordinator_main.cc with `JobConfig{}.field` as its default.
#pragma once

#include <algorithm>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "common/status.h"

namespace ps {

enum class InitKind { kZeros, kUniform, kNormal };

// One named table of fixed-width float rows. A dense table has `rows` > 0 rows indexed
// 0..rows-1 (a dense tensor is such a table); a sparse table (rows == 0) has rows keyed by
// any uint64 id, created on first touch with the initializer.
struct TableSpec {
  uint32_t id = 0;  // index in JobConfig::tables
  std::string name;
  uint64_t rows = 0;   // 0 = sparse
  uint32_t width = 1;  // floats per row
  InitKind init = InitKind::kZeros;
  float init_scale = 0;  // uniform: values in [-scale, scale]; normal: standard deviation
  bool dense() const { return rows > 0; }
};

struct JobConfig {
  // ---- the model and its tables ----
  // "mlp": a multilayer perceptron on IDX images, tables derived from mlp_layers.
  // "sparse_lr": logistic regression on LIBSVM data, a sparse table keyed by feature id:
  //   shorthand for "wide_deep" with network kSparseLrNetwork (input:sparse,wide,sigmoid_ce).
  // "network": the layers of `network` on IDX images (common/network_config.h).
  // "wide_deep": the layers of `network` with embedding, concat and wide on click-through
  // data (worker/wide_deep.h): sparse tables `emb` and `wide.weight` keyed by id.
  // "none": only the tables of `tables` (for custom clients and tests).
  std::string model = "mlp";
  // Layer widths of the MLP, input first: ReLU between layers, softmax cross-entropy last.
  std::string mlp_layers = "784,256,128,10";
  // --model=network: the layers, input first and loss last, e.g.
  // "input:1x28x28,conv2d:16:3:pad=1,relu,maxpool:2,flatten,dense:10,softmax_ce". The syntax
  // of every layer kind is in common/network_config.h; each layer with parameters owns the
  // tables convN.weight/.bias or fcN.weight/.bias. Checked at start, shapes included.
  std::string network;
  // Extra tables, comma-separated NAME:ROWS:WIDTH[:INIT[:SCALE]] with ROWS a count or
  // "sparse" and INIT zeros|uniform|normal, e.g. "emb:sparse:16:normal:0.01".
  std::string tables;

  // ---- processes ----
  int num_servers = 2;
  int num_workers = 2;
  // Copies of each shard: 1, or 2 for a primary on server p and a backup on server
  // (p + 1) % num_servers that has every acknowledged push (server/replication.h).
  // REQUIRES: replicas <= num_servers.
  int replicas = 1;

  // ---- consistency ----
  // How stale a worker's view may be, in clocks (Ho et al. 2013): a worker at clock c sees
  // every update from clocks <= c - staleness - 1 of every live worker. 0 is bulk-synchronous
  // (BSP), s > 0 stale-synchronous (SSP), -1 fully asynchronous (ASP).
  int staleness = -1;
  // Per-table bounds overriding `staleness`: "NAME:S,NAME:S".
  std::string table_staleness;
  // ASP only: a gradient more than this many versions stale is rejected (counted, not
  // applied). -1 applies every gradient.
  int max_grad_staleness = -1;
  // How long a server holds a pull that the staleness bound blocks before answering with
  // an error naming the worker it waited on.
  double staleness_wait_seconds = 300;

  // ---- training ----
  int epochs = 5;
  // Examples per worker step. --batch_size=auto sets auto_batch: each worker's batch then
  // follows its measured throughput (batch_size on average), so that workers of different
  // speeds tick their clocks at the same pace.
  int batch_size = 64;
  bool auto_batch = false;
  // When > 0, the job's batch: every clock, the workers' batches together hold this many
  // examples, each worker's --batch_size being global_batch_size / num_workers (rounded
  // down; set by FromFlagMap, which refuses a --batch_size that says otherwise). With
  // --softsync=0 every update is then one batch of this size whatever the worker count, and
  // the schedule's iteration is the clock (ScheduleIteration). 0: --batch_size per worker.
  int global_batch_size = 0;
  // Examples per data lease: workers lease chunks of each epoch from the coordinator.
  int chunk_examples = 2048;

  // n-softsync (server/softsync.h): a server applies the mean of this many pushes to a
  // dense table as one update. 1: each push at once (asynchronous SGD); 0: the number of
  // workers (every update one global batch, a gradient about one update stale).
  int softsync = 1;
  // The batches per update (c) that `softsync` means for this job: one push of each worker
  // (an all-reduce group's push counts its members' batches, server/softsync.h).
  int BatchesPerUpdate() const { return softsync == 0 ? num_workers : softsync; }
  // Local updates: a worker takes this many steps on its own copy of the parameters (plain
  // SGD at the servers' current rate) between a pull and a push, and pushes the sum of
  // their gradients as one update; its clock ticks once per push, so --staleness and
  // softsync count pushes (rounds of local_steps batches). A round also ends with its data
  // chunk. Dense models only (--model=mlp or network), without all-reduce groups. 1: a
  // push every step.
  int local_steps = 1;
  // The lr schedule's iteration once the workers' clocks add up to `worker_clocks` (each of
  // local_steps steps of --batch_size, taken across the job): those minibatches, or, with
  // --global_batch_size, the global batches they make (divided by num_workers). Counting
  // the whole job's steps, not one worker's clock, keeps the schedule on the job's pace
  // under ASP, where a fast worker's clock runs hundreds of steps ahead of the others.
  int64_t ScheduleIteration(int64_t worker_clocks) const {
    const int64_t steps = worker_clocks * std::max(local_steps, 1);
    return global_batch_size > 0 ? steps / std::max(num_workers, 1) : steps;
  }
  // The schedule's iterations in one epoch of `train_examples` examples: global batches
  // with --global_batch_size, else minibatches of --batch_size (rounded up).
  int64_t IterationsPerEpoch(uint64_t train_examples) const;
  // With max_iter 0 (the whole job), sets it to epochs x IterationsPerEpoch(train_examples);
  // otherwise leaves it.
  void SetWholeJobMaxIter(uint64_t train_examples);
  // Sets num_workers and, with --global_batch_size, the batch per worker that follows.
  // InvalidArgument when the global batch has fewer examples than there are workers.
  Status SetNumWorkers(int workers);

  // ---- optimizer (applied on the servers) ----
  // sgd | momentum | nesterov | adagrad | adam | adamw
  std::string optimizer = "sgd";
  double momentum = 0.9;  // momentum, nesterov
  double beta1 = 0.9;     // adam, adamw
  double beta2 = 0.999;   // adam, adamw
  double epsilon = 1e-8;  // adagrad, adam, adamw
  // L2 penalty added to the gradient (sgd, momentum, nesterov, adagrad, adam); decoupled
  // decay of the weights (adamw, Loshchilov & Hutter 2019).
  double weight_decay = 0;
  // When > 0, each row's gradient is scaled down to at most this L2 norm before the update.
  double clip_grad_norm = 0;

  // ---- learning rate (Caffe's names) ----
  double base_lr = 0.1;
  // fixed | step | multistep | exp | inv | poly | cosine. The iteration counts minibatches
  // across the job (ScheduleIteration: the workers' clocks added up), so a schedule reads the
  // same whatever the number of workers (an epoch is examples / batch_size); with
  // --global_batch_size, global batches (an epoch is examples / global_batch_size).
  std::string lr_policy = "fixed";
  double gamma = 0.1;       // step, multistep, exp, inv
  int64_t stepsize = 1000;  // step: lr = base_lr * gamma ^ floor(iter / stepsize)
  std::string stepvalue;    // multistep: comma-separated iterations, increasing
  double power = 1.0;       // inv, poly
  // poly, cosine: the iteration where the schedule ends. 0: the end of the job, worked out
  // at start from the training set's size (SetWholeJobMaxIter), so --epochs moves it too.
  int64_t max_iter = 0;
  int64_t warmup_iters = 0;  // linear warmup from 0 to the schedule's value
  // Staleness-aware learning rate (after Zhang et al. 2016): none | inverse | sqrt weights
  // each gradient by 1 / (1 + its staleness in updates) (or the root of it): a fresh one
  // keeps its whole rate. Summed (--softsync) tables weight each push as it joins the sum.
  std::string staleness_lr = "none";
  // Pull look-ahead (after DANA, Hakimi et al. 2019): a pull of a table whose optimizer
  // keeps a velocity (momentum, nesterov) returns the values the velocity alone would
  // carry its rows to over this many times the table's recent mean staleness (in updates),
  // so that a gradient is computed about where the model will be when it lands. Stored
  // values, checkpoints and exports are unchanged. 0: off (pulls return the stored values);
  // under BSP the staleness is 0 and so is the look-ahead.
  double pull_lookahead = 0;
  // The job stops with status "diverged" (common/divergence.h) when a worker's mean
  // training loss exceeds this many times the job's first reported loss (or is not finite,
  // whatever this is). 0: only non-finite losses and gradients count.
  double divergence_loss_ratio = 10;
  uint64_t seed = 1;                                           // initializers and data order
  std::string data_dir = "/usr/share/datasets/fashion-mnist";  // mlp: IDX files
  // sparse_lr (and input:sparse): LIBSVM training file (gzip or plain); wide_deep: CTR file
  // (worker/ctr_data.h)
  std::string train_data;
  std::string test_data;  // sparse_lr, wide_deep: the test file, same format
  // sparse_lr: hash feature ids into 64 bits (xxHash), for ids from several sources.
  bool hash_features = false;
  // Bytes each server's rows (values + optimizer state) may take in memory; colder rows of
  // sparse tables spill to RocksDB (server/row_store.h). Written like 512MB or 4GB (units
  // of 1024); 0: no limit. A server's own --memory_budget overrides it.
  uint64_t memory_budget = 0;
  // Checkpoints (server/checkpoint.h): every `checkpoint_every` clocks of the slowest live
  // worker (0: never), or every `checkpoint_every_seconds`, and on SIGTERM, each server writes its
  // shard (values, optimizer state, versions, clocks) under checkpoint_dir/clock-<C>/ (empty: no
  // checkpoints). Consistent across servers under BSP (staleness 0).
  int64_t checkpoint_every = 0;
  // Or every `checkpoint_every_seconds` (flag: --checkpoint_every=30s; 0: by clocks): the
  // coordinator then names the clock of each set in its answer to the servers' reports, so
  // that every server writes the same clock.
  double checkpoint_every_seconds = 0;
  std::string checkpoint_dir;
  // Servers start from a checkpoint: "latest" (the latest complete set in checkpoint_dir)
  // or the path of one set's directory; empty: a fresh model.
  std::string restore;
  // Seconds between a worker's training reports to the coordinator (metrics.jsonl lines).
  double report_every_seconds = 1.0;
  // A process silent (no heartbeat) for longer is declared dead; every process sends one
  // every heartbeat_timeout / 4 (common/heartbeat.h).
  double heartbeat_timeout = 4.0;
  // How long servers and workers wait for a coordinator that stopped answering to come
  // back (restarted with --resume, server/coordinator.h) before they stop: they are told
  // it is lost after 3 * heartbeat_timeout + this. 0: stop then.
  double coordinator_restart_timeout = 60.0;

  // ---- all-reduce groups (worker/group_comm.h) ----
  // Workers per all-reduce group, formed by worker id (ids kG..kG+G-1; the last group may be
  // smaller): members sum their gradients at the group's leader, which alone pushes, pulls
  // and ticks the clock. 1: no groups (a worker's --group=NAME still groups it). Dense models
  // only (mlp, network); the members of a group must share one host and one kind of device.
  int group_size = 1;
  // How long a group member waits for another before the group dissolves (no partial sum is
  // ever pushed; the survivors train on their own). Must exceed the longest step, including
  // a pull the staleness bound holds.
  double group_timeout_seconds = 60;

  // Tables, filled by FromFlagMap from `model` and `tables`; ids are their indices.
  std::vector<TableSpec> table_specs;

  // The names of every setting, in a stable order.
  static const std::vector<std::string>& FlagNames();

  // Parses and validates a flag map. Missing names keep their defaults; an unknown name or
  // a bad value is an InvalidArgument naming the flag, the value and what is allowed.
  static Result<JobConfig> FromFlagMap(const std::map<std::string, std::string>& flags);
  // A job's settings as a gflags flagfile writes them, for a process that does not define
  // them as its own flags (ps_worker --standalone): the flagfile at `path` (`--name=value`
  // lines, `--name` / `--noname` for booleans, `#` comments, nested `--flagfile=PATH`
  // relative to the working directory), then the space-separated `overrides` on top (e.g.
  // "--epochs=1 --base_lr=0.05"; `--flagfile=PATH` reads a file there), then FromFlagMap.
  // NotFound for a missing file, InvalidArgument naming the file and line of a line that is
  // not a flag, or for a bad setting.
  static Result<JobConfig> FromFlagfile(const std::string& path, const std::string& overrides);
  std::map<std::string, std::string> ToFlagMap() const;

  Status Validate() const;

  // --table_staleness parsed: table name -> bound. Validated by FromFlagMap.
  Result<std::map<std::string, int>> TableStalenessMap() const;
  // The staleness bound of one table: its --table_staleness entry, else --staleness.
  int StalenessOf(const TableSpec& table) const;
};

// Parses --stepvalue ("1000,2000,5000": increasing positive iterations).
Result<std::vector<int64_t>> ParseStepValues(const std::string& value);

// Parses a byte count: digits with an optional unit K, M, G, T (also KB/KiB, ...: all powers
// of 1024), e.g. "512MB", "4GB", "1048576". `flag` names the setting in the error.
Result<uint64_t> ParseByteSize(const std::string& flag, const std::string& value);

// Parses a comma-separated list of positive ints ("784,256,10").
Result<std::vector<int>> ParseIntList(const std::string& flag, const std::string& value);

}  // namespace ps
