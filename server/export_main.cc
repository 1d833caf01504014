// ps_export: the whole model as one safetensors file (server/model_export.h), from a
// checkpoint set or from the per-server files of ps_server --export_dir.
#include <gflags/gflags.h>
#include <glog/logging.h>

#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "server/model_export.h"

DEFINE_string(checkpoint, "",
              "a checkpoint set, DIR/clock-<C>; the job's settings come from "
              "DIR/checkpoints.json (the coordinator's record)");
DEFINE_string(exports, "",
              "instead: a directory of per-server files server-<id>.safetensors "
              "(ps_server --export_dir), every server's");
DEFINE_string(out, "", "the safetensors file to write (required)");

int main(int argc, char** argv) {
  gflags::SetUsageMessage("ps_export --checkpoint=DIR/clock-<C> | --exports=DIR --out=FILE");
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  google::InitGoogleLogging(argv[0]);
  if (FLAGS_out.empty() || FLAGS_checkpoint.empty() == FLAGS_exports.empty()) {
    std::fprintf(stderr, "ps_export: give --out and one of --checkpoint or --exports\n");
    return 2;
  }
  ps::Status s;
  if (!FLAGS_checkpoint.empty()) {
    s = ps::ExportCheckpointSet(FLAGS_checkpoint, FLAGS_out);
  } else {
    std::vector<std::string> files;
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(FLAGS_exports, ec)) {
      const std::string name = e.path().filename().string();
      if (name.rfind("server-", 0) == 0 && e.path().extension() == ".safetensors") {
        files.push_back(e.path().string());
      }
    }
    if (files.empty()) {
      std::fprintf(stderr, "ps_export: no server-<id>.safetensors in %s\n", FLAGS_exports.c_str());
      return 2;
    }
    s = ps::MergeServerExports(files, FLAGS_out);
  }
  if (!s.ok()) {
    std::fprintf(stderr, "ps_export: %s\n", s.ToString().c_str());
    return 1;
  }
  std::printf("wrote %s\n", FLAGS_out.c_str());
  return 0;
}
