#include "common/security_flags.h"

#include <gflags/gflags.h>

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

namespace ps {

Status InstallSecurityFromFlags(SecurityRole role, const std::vector<std::string>& endpoints,
                                TransportOptions* options) {
  SecurityFlags flags;
  flags.keys_dir = FLAGS_keys_dir;
  flags.key_name = FLAGS_key_name;
  flags.insecure = FLAGS_insecure;
  flags.allow_insecure_remote = FLAGS_allow_insecure_remote;
  PS_ASSIGN_OR_RETURN(options->security, LoadSecurity(role, flags, endpoints));
  return Status::Ok();
}

}  // namespace ps
