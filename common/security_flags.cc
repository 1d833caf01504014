#include "common/security_flags.h"

#include <gflags/gflags.h>

#include <fstream>

DEFINE_string(keys_dir, "",
              "directory of CURVE keys (ps_keygen --keys_dir=DIR makes one); required unless "
              "--insecure");
DEFINE_string(key_name, "",
              "the key pair in --keys_dir to use (default: 'server' for the coordinator and "
              "servers, 'worker' for workers)");
DEFINE_bool(insecure, false,
            "no authentication, no encryption (loopback only unless --allow_insecure_remote)");
DEFINE_bool(allow_insecure_remote, false,
            "with --insecure: also use endpoints other hosts can reach (anyone there can read "
            "and change the model)");

DEFINE_string(shm, "auto",
              "same-host payloads: auto sends frames of 64 KB or more to ipc:// peers through "
              "shared memory (/dev/shm, readable by this user only, not encrypted; CURVE still "
              "authenticates the socket); off sends every frame through the socket");
DEFINE_int32(shm_ring_mb, 256,
             "capacity of one shared-memory ring (virtual: pages are committed as used)");

namespace ps {

Status InstallSecurityFromFlags(SecurityRole role, const std::vector<std::string>& endpoints,
                                TransportOptions* options) {
  SecurityFlags flags;
  flags.keys_dir = FLAGS_keys_dir;
  flags.key_name = FLAGS_key_name;
  flags.insecure = FLAGS_insecure;
  flags.allow_insecure_remote = FLAGS_allow_insecure_remote;
  PS_ASSIGN_OR_RETURN(options->security, LoadSecurity(role, flags, endpoints));
  // The shared-memory path is set here too: every binary calls this once, and what it
  // trades (payloads outside the encrypted socket) is a security choice.
  if (FLAGS_shm == "auto") {
    options->shm = ShmMode::kAuto;
  } else if (FLAGS_shm == "off") {
    options->shm = ShmMode::kOff;
  } else {
    return InvalidArgument("--shm=" + FLAGS_shm + ": expected auto or off");
  }
  if (FLAGS_shm_ring_mb < 1) {
    return InvalidArgument("--shm_ring_mb=" + std::to_string(FLAGS_shm_ring_mb) +
                           ": expected at least 1");
  }
  options->shm_ring_bytes = static_cast<uint64_t>(FLAGS_shm_ring_mb) << 20;
  return Status::Ok();
}

namespace {

Status CheckFlagfile(const std::string& path, int depth) {
  if (depth > 8) return InvalidArgument(path + ": flagfiles nest more than 8 deep");
  std::ifstream in(path);
  if (!in) return NotFound("flagfile " + path + " cannot be read");
  int line_no = 0;
  for (std::string line; std::getline(in, line);) {
    ++line_no;
    size_t start = line.find_first_not_of(" \t");
    if (start == std::string::npos || line[start] == '#' || line[start] != '-') continue;
    std::string flag = line.substr(line.find_first_not_of('-', start));
    std::string value;
    if (size_t eq = flag.find('='); eq != std::string::npos) {
      value = flag.substr(eq + 1);
      flag = flag.substr(0, eq);
    }
    while (!flag.empty() && (flag.back() == ' ' || flag.back() == '\r')) flag.pop_back();
    gflags::CommandLineFlagInfo info;
    const bool known =
        gflags::GetCommandLineFlagInfo(flag.c_str(), &info) ||
        (flag.rfind("no", 0) == 0 &&
         gflags::GetCommandLineFlagInfo(flag.substr(2).c_str(), &info) && info.type == "bool");
    if (!known) {
      return InvalidArgument(path + ":" + std::to_string(line_no) + ": unknown flag --" + flag +
                             " (expected one of this binary's flags; see --help)");
    }
    if (flag == "flagfile") PS_RETURN_IF_ERROR(CheckFlagfile(value, depth + 1));
  }
  return Status::Ok();
}

}  // namespace

Status CheckFlagfiles() {
  for (const std::string& arg : gflags::GetArgvs()) {
    for (const char* prefix : {"--flagfile=", "-flagfile="}) {
      if (arg.rfind(prefix, 0) == 0) {
        PS_RETURN_IF_ERROR(CheckFlagfile(arg.substr(std::string(prefix).size()), 0));
      }
    }
  }
  return Status::Ok();
}

}  // namespace ps
