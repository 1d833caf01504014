// blas_core.h: which OpenBLAS kernels this process runs, and how to get the best ones the
// CPU has.
//
// OpenBLAS picks its kernels ("core") once, when the library loads, from the CPU's family
// and model. A CPU newer than the library is not in its table: Debian 12's OpenBLAS 0.3.21
// gives family 6 model 207 (Emerald Rapids, an AVX-512 Xeon) its 2004 Prescott SSE3
// kernels, which run the MLP's GEMMs 3x slower than its SkylakeX (AVX-512) kernels on the
// same CPU. Only the environment variable OPENBLAS_CORETYPE, read as the library loads,
// changes the choice, so a process that finds a weaker core than its CPU can run sets it and
// re-executes itself (same PID, same arguments) before doing anything else.
//
// A user who sets OPENBLAS_CORETYPE keeps that choice; PS_BLAS_CORE_CHECK=0 turns the check
// off.
//
// Thread model: RestartWithBestBlasCore runs first thing in main(), before any thread
// exists (execv replaces the process). The rest are pure functions.
#ifndef PS_KERNELS_BLAS_CORE_H_
#define PS_KERNELS_BLAS_CORE_H_

#include <string>
#include <string_view>

#include "common/status.h"

namespace ps {

// The instruction sets OpenBLAS's x86-64 kernels are built for.
struct CpuFeatures {
  bool avx512 = false;    // AVX-512 F, CD, BW, DQ and VL: the SkylakeX kernels
  bool avx2_fma = false;  // AVX2 and FMA: the Haswell kernels
  bool avx = false;       // AVX: the Sandybridge kernels
};

// This CPU's features (GCC's __builtin_cpu_supports; all false off x86-64).
CpuFeatures ThisCpuFeatures();

// The OpenBLAS core name of the best kernels a CPU with `cpu` runs: "SkylakeX", "Haswell",
// "Sandybridge", or "" when it has none of these.
std::string BestBlasCoreFor(const CpuFeatures& cpu);

// The core to switch to when OpenBLAS chose `chosen` (as openblas_get_corename() names it,
// case ignored) on a CPU with `cpu`: BestBlasCoreFor(cpu) when `chosen` is an older Intel
// or AMD core than that, else "" (as good already, or a core this table does not rank).
std::string BetterBlasCore(std::string_view chosen, const CpuFeatures& cpu);

// The core OpenBLAS runs in this process, e.g. "SkylakeX" or "Prescott".
std::string ChosenBlasCore();

// When OPENBLAS_CORETYPE is unset (and PS_BLAS_CORE_CHECK is not 0) and BetterBlasCore
// names a core: sets OPENBLAS_CORETYPE to it, says so on stderr and execv's this binary
// (the path /proc/self/exe links to, so the process keeps its name) with `argv`; it does
// not return then. Returns Ok when nothing needed
// changing, and an error (the process goes on with the kernels it has) when the restart
// failed or cannot work (a program started through the dynamic loader, ld-linux.so).
Status RestartWithBestBlasCore(char** argv);

}  // namespace ps

#endif  // PS_KERNELS_BLAS_CORE_H_
