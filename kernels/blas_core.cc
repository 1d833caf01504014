#include "kernels/blas_core.h"

#include <cblas.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <system_error>

namespace ps {
namespace {

// OpenBLAS's x86-64 cores, by the newest instruction set their GEMM kernels use. Cores not
// listed (other architectures, or ones newer than this table) are left alone.
int CoreRank(std::string_view core) {
  struct Rank {
    const char* name;
    int rank;
  };
  static constexpr Rank kRanks[] = {
      {"katmai", 0},       {"coppermine", 0},     {"northwood", 0},  {"prescott", 0},
      {"banias", 0},       {"atom", 0},           {"core2", 0},      {"penryn", 0},
      {"dunnington", 0},   {"nehalem", 0},        {"athlon", 0},     {"opteron", 0},
      {"opteron_sse3", 0}, {"barcelona", 0},      {"nano", 0},       {"bobcat", 0},
      {"sandybridge", 1},  {"bulldozer", 1},      {"piledriver", 1}, {"steamroller", 1},
      {"excavator", 1},    {"haswell", 2},        {"zen", 2},        {"skylakex", 3},
      {"cooperlake", 3},   {"sapphirerapids", 3},
  };
  for (const Rank& r : kRanks) {
    if (core.size() == std::strlen(r.name) && strncasecmp(core.data(), r.name, core.size()) == 0) {
      return r.rank;
    }
  }
  return -1;
}

int FeatureRank(const CpuFeatures& cpu) {
  if (cpu.avx512) return 3;
  if (cpu.avx2_fma) return 2;
  if (cpu.avx) return 1;
  return 0;
}

}  // namespace

CpuFeatures ThisCpuFeatures() {
  CpuFeatures cpu;
#if defined(__x86_64__) && defined(__GNUC__)
  __builtin_cpu_init();
  cpu.avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512cd") &&
               __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
               __builtin_cpu_supports("avx512vl");
  cpu.avx2_fma = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  cpu.avx = __builtin_cpu_supports("avx");
#endif
  return cpu;
}

std::string BestBlasCoreFor(const CpuFeatures& cpu) {
  switch (FeatureRank(cpu)) {
    case 3:
      return "SkylakeX";
    case 2:
      return "Haswell";
    case 1:
      return "Sandybridge";
    default:
      return "";
  }
}

std::string BetterBlasCore(std::string_view chosen, const CpuFeatures& cpu) {
  const int have = CoreRank(chosen);
  if (have < 0 || have >= FeatureRank(cpu)) return "";
  return BestBlasCoreFor(cpu);
}

std::string ChosenBlasCore() {
  const char* name = openblas_get_corename();
  return name == nullptr ? "" : name;
}

Status RestartWithBestBlasCore(char** argv) {
  if (std::getenv("OPENBLAS_CORETYPE") != nullptr) return Status::Ok();
  const char* check = std::getenv("PS_BLAS_CORE_CHECK");
  if (check != nullptr && std::strcmp(check, "0") == 0) return Status::Ok();
  const std::string chosen = ChosenBlasCore();
  const std::string better = BetterBlasCore(chosen, ThisCpuFeatures());
  if (better.empty()) return Status::Ok();
  // The binary's own path, not /proc/self/exe: the process name (comm, what ps, top and
  // pkill show) is the executed file's name.
  std::error_code ec;
  const std::string self = std::filesystem::read_symlink("/proc/self/exe", ec).string();
  if (ec) {
    return Internal("OpenBLAS chose its " + chosen + " kernels; could not restart with " +
                    "OPENBLAS_CORETYPE=" + better + ": reading /proc/self/exe: " + ec.message());
  }
  if (std::filesystem::path(self).filename().string().starts_with("ld-")) {
    // Started through the dynamic loader (ld-linux.so PROGRAM ...): exec'ing it with this
    // argv would not run this program again.
    return FailedPrecondition("OpenBLAS chose its " + chosen + " kernels; started through " + self +
                              ", so not restarting: set OPENBLAS_CORETYPE=" + better +
                              " for this CPU's faster ones");
  }
  // glog is not set up yet (this runs before flags are parsed), and the line matters: it
  // explains a restart that a user would otherwise see only as two "starting" lines.
  std::fprintf(stderr,
               "OpenBLAS chose its %s kernels, but this CPU runs its %s ones: restarting with "
               "OPENBLAS_CORETYPE=%s (set OPENBLAS_CORETYPE to choose, or "
               "PS_BLAS_CORE_CHECK=0 to keep OpenBLAS's choice)\n",
               chosen.c_str(), better.c_str(), better.c_str());
  if (setenv("OPENBLAS_CORETYPE", better.c_str(), 1) != 0) {
    return Internal(std::string("setenv OPENBLAS_CORETYPE: ") + std::strerror(errno));
  }
  execv(self.c_str(), argv);
  const int err = errno;
  unsetenv("OPENBLAS_CORETYPE");
  return Internal("could not restart with OPENBLAS_CORETYPE=" + better + ": execv " + self + ": " +
                  std::strerror(err));
}

}  // namespace ps
