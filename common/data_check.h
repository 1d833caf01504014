// Whether the data a job config names is on disk, checked by the coordinator right after it
// loads the config: a missing file is then refused before any process registers, instead of
// every worker failing on it once the job has assembled.
//
// Paths are looked up as the workers will open them: relative ones from the current
// directory (the launchers run every process from the repository root). The check reads
// only file metadata, never the data itself; ResolveWholeJobMaxIter reads one header.
//
// Thread safety: a free function on its argument and the filesystem; callable from any
// thread.
#pragma once

#include "common/job_config.h"
#include "common/status.h"

namespace ps {

// OK when every data file of `config` is there and readable: for --model=mlp the IDX files
// under data_dir (train- and t10k- images and labels, each NAME.gz or NAME); for
// --model=sparse_lr the LIBSVM files train_data and, when set, test_data; for
// --model=wide_deep the CTR files train_data and test_data likewise. --model=none reads
// no data. Otherwise NotFound (or FailedPrecondition for a path that is a directory or not
// readable) whose message names the path, the setting that names it and what makes the
// data: `scripts/make_sparse_data.sh` for the generated sparse set (data/sparse_lr/),
// `scripts/make_sparse_data.sh --ctr` for the generated CTR set (data/ctr/),
// `scripts/install_deps.sh` (Debian's dataset-fashion-mnist) for the default data_dir.
Status CheckJobData(const JobConfig& config);

// With --max_iter=0 (the end of the job) and a schedule that reads it (poly, cosine): sets
// config->max_iter from the training set's size, read from the IDX labels file's header
// (--model=mlp, network). InvalidArgument for other models, whose example count is not
// known before the workers read their files: those give --max_iter. REQUIRES: CheckJobData
// passed.
Status ResolveWholeJobMaxIter(JobConfig* config);

}  // namespace ps
