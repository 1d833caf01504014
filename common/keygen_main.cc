// ps_keygen: makes CURVE key pairs for a job (see common/security.h for the layout).
//
//   ps_keygen --keys_dir=DIR                    the pairs 'server' and 'worker', once
//   ps_keygen --keys_dir=DIR --name=host7 --role=worker   one more admitted worker pair
#include <gflags/gflags.h>

#include <cstdio>
#include <filesystem>

#include "common/security.h"

DEFINE_string(keys_dir, "", "where to write the keys (created with mode 0700; required)");
DEFINE_string(name, "", "make only this pair (default: 'server' and 'worker' where missing)");
DEFINE_string(role, "worker", "with --name: the role its key is admitted as (server | worker)");

int main(int argc, char** argv) {
  gflags::SetUsageMessage("ps_keygen --keys_dir=DIR [--name=NAME --role=server|worker]");
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  if (FLAGS_keys_dir.empty()) {
    std::fprintf(stderr, "ps_keygen: --keys_dir is required\n");
    return 2;
  }
  std::vector<std::pair<std::string, std::string>> todo;  // (name, role)
  if (!FLAGS_name.empty()) {
    todo.push_back({FLAGS_name, FLAGS_role});
  } else {
    for (const char* n : {"server", "worker"}) {
      if (!std::filesystem::exists(FLAGS_keys_dir + "/" + n + ".secret")) todo.push_back({n, n});
    }
  }
  for (const auto& [name, role] : todo) {
    ps::Result<ps::CurveKeyPair> pair = ps::GenerateCurveKeyPair();
    ps::Status s = pair.ok() ? ps::WriteKeyPair(FLAGS_keys_dir, name, role, *pair) : pair.status();
    if (!s.ok()) {
      std::fprintf(stderr, "ps_keygen: %s\n", s.ToString().c_str());
      return 1;
    }
    std::printf("%s/%s.secret (%s key %s)\n", FLAGS_keys_dir.c_str(), name.c_str(), role.c_str(),
                pair->public_key.c_str());
  }
  return 0;
}
