// The security flags every binary shares (--keys_dir, --key_name, --insecure,
// --allow_insecure_remote) and the one call each main makes to apply them. Kept out of
// libpscommon: only binaries read gflags.
//
// Thread model: call once from main, before the Transport is made.
#pragma once

#include <string>
#include <vector>

#include "common/security.h"
#include "common/transport.h"

namespace ps {

// Fills options->security from the flags for a process of `role` that will use `endpoints`
// (its --listen and --coordinator), and the shared-memory path from --shm and --shm_ring_mb
// (see TransportOptions). On error the message says what to give instead; main
// prints it and exits.
Status InstallSecurityFromFlags(SecurityRole role, const std::vector<std::string>& endpoints,
                                TransportOptions* options);

// Checks every --flagfile given on the command line (and the flagfiles they name): each
// flag must be one this binary defines. gflags itself skips unknown flags in a flagfile; a
// misspelt job setting would silently keep its default. The error names FILE:LINE.
Status CheckFlagfiles();

}  // namespace ps
