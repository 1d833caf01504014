// `ps_worker --standalone`: the job's model trained in this one process, with the
// project's own kernels, initializers, optimizer and learning-rate policy, and no
// coordinator, servers or sockets. It is the baseline a distributed job is measured
// against: what one process does with the same code.
//
// It follows one BSP worker of a one-server job step for step: the same initial rows
// (common/row_init.h), the same example order and chunking (EpochOrder, chunks of
// --chunk_examples), the same gradient scaling, the same learning rate per step
// (iteration = step, as for a job of one worker) and the same update rule applied row by
// row (common/optimizer.h). Its final model, and so its test loss, is bit-identical to such
// a job's on the CPU (tests/integration/standalone_test.cc checks this). Gradients pass the
// servers' check (common/gradient_check.h); a bad one stops the run with an error.
//
// The tables (values and optimizer state), the gradients and the model's activations stay
// in the kernels' memory: the GPU's with --device=cuda, where the update is
// Kernels::ApplyUpdate's CUDA kernel and a step copies only its batch in and its loss and
// one gradient-check flag out. That makes it the one-GPU baseline a job is measured against.
//
// It writes the run files a job writes (metrics.jsonl train and eval lines, summary.json
// with the same keys where they apply, `"mode": "standalone"`). --model=mlp or network.
//
// The update rules are the servers' own, from common/, so the baseline links no server
// code. Its job settings come from JobConfig::FromFlagfile (common/job_config.h).
//
// Thread model: RunStandalone runs on the calling thread (OpenBLAS may use its own).
#pragma once

#include <atomic>
#include <nlohmann/json.hpp>
#include <string>

#include "common/job_config.h"
#include "common/status.h"

namespace ps {

struct StandaloneOptions {
  // Where metrics.jsonl and summary.json go (created if missing). Required.
  std::string run_dir;
  // "cpu", "cuda", "cuda:N" or "auto" (kernels/kernels.h).
  std::string device = "cpu";
  // Print a line per epoch on stdout, as the coordinator does for a job.
  bool print_progress = true;
};

// Trains config's model to the end and writes the run files; *summary (may be null) gets
// summary.json's contents. The config is used as one worker and one server would see it
// (num_workers and num_servers become 1).
Status RunStandalone(JobConfig config, const StandaloneOptions& options,
                     const std::atomic<bool>& stop, nlohmann::json* summary);

}  // namespace ps
