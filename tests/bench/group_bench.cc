// ps_group_bench: all-reduce goodput of the groups' cpu backend (ZeroMQ ipc, reduce-
// broadcast at the leader; worker/group_comm.h) against memcpy bandwidth of the same
// buffers in the same run, and of NCCL (a group of one per GPU here) where present.
//
// Each member is its own process (fork), as in a job. Goodput = the tensor's bytes / the
// time of one AllReduceSum (every rank ends with the sum), the median of --iters.
//
//   build/bin/ps_group_bench [--sizes_mb=1,4,16,64] [--group_sizes=2,3] [--iters=10]
#include <gflags/gflags.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <vector>

#include "common/job_config.h"
#include "kernels/nccl_comm.h"
#include "worker/group_comm.h"

DEFINE_string(sizes_mb, "1,4,16,64", "tensor sizes in MB");
DEFINE_string(group_sizes, "2,3", "group sizes to measure");
DEFINE_int32(iters, 10, "timed all-reduces per point (after one warm-up)");

namespace {

using Clock = std::chrono::steady_clock;

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

double MemcpyGBs(size_t bytes, int iters) {
  std::vector<char> a(bytes, 1), b(bytes, 2);
  std::memcpy(b.data(), a.data(), bytes);  // warm, fault the pages in
  std::vector<double> t;
  for (int i = 0; i < iters; ++i) {
    auto s = Clock::now();
    std::memcpy(b.data(), a.data(), bytes);
    t.push_back(std::chrono::duration<double>(Clock::now() - s).count());
    a[i % bytes] = b[(i * 7) % bytes];  // keep the copies observable
  }
  return bytes / Median(t) / 1e9;
}

// One rank's loop: warm-up plus iters all-reduces; the leader returns the median seconds.
int RunRank(int rank, int size, const std::string& endpoint, size_t floats, double* seconds) {
  ps::Transport transport;
  ps::GroupCommOptions o;
  o.rank = rank;
  o.size = size;
  o.leader_endpoint = endpoint;
  o.timeout = std::chrono::seconds(60);
  auto g = ps::JoinGroup(&transport, o);
  if (!g.ok()) {
    std::fprintf(stderr, "rank %d: %s\n", rank, g.status().ToString().c_str());
    return 1;
  }
  std::vector<float> data(floats, 1.0f + rank);
  std::vector<std::span<float>> spans = {data};
  std::vector<double> t;
  for (int i = 0; i <= FLAGS_iters; ++i) {
    std::fill(data.begin(), data.end(), 1.0f + rank);
    auto s = Clock::now();
    ps::Status st = (*g)->AllReduceSum(spans);
    if (!st.ok()) {
      std::fprintf(stderr, "rank %d: %s\n", rank, st.ToString().c_str());
      return 1;
    }
    if (i > 0) t.push_back(std::chrono::duration<double>(Clock::now() - s).count());
  }
  const float want = size * (size + 1) / 2.0f;
  if (data[0] != want || data[floats - 1] != want) {
    std::fprintf(stderr, "rank %d: wrong sum %g, expected %g\n", rank, data[0], want);
    return 1;
  }
  *seconds = Median(t);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  std::printf("%-8s %-6s %-10s %14s %14s %8s\n", "backend", "group", "size_MB", "allreduce_GB/s",
              "memcpy_GB/s", "ratio");
  // Bad lists are the user's input: a message, not an exception.
  ps::Result<std::vector<int>> sizes_mb = ps::ParseIntList("sizes_mb", FLAGS_sizes_mb);
  ps::Result<std::vector<int>> group_sizes = ps::ParseIntList("group_sizes", FLAGS_group_sizes);
  for (const ps::Status& s : {sizes_mb.status(), group_sizes.status()}) {
    if (!s.ok()) {
      std::fprintf(stderr, "ps_group_bench: %s\n", s.ToString().c_str());
      return 2;
    }
  }
  int run = 0;
  for (int mb : *sizes_mb) {
    const size_t bytes = static_cast<size_t>(mb) << 20;
    const size_t floats = bytes / sizeof(float);
    const double memcpy_gbs = MemcpyGBs(bytes, FLAGS_iters);
    for (int size : *group_sizes) {
      const std::string endpoint =
          "ipc:///tmp/ps-group-bench-" + std::to_string(getpid()) + "-" + std::to_string(run++);
      std::vector<pid_t> kids;
      for (int r = 1; r < size; ++r) {
        pid_t p = fork();
        if (p == 0) {
          double s = 0;
          _exit(RunRank(r, size, endpoint, floats, &s));
        }
        kids.push_back(p);
      }
      double seconds = 0;
      int rc = RunRank(0, size, endpoint, floats, &seconds);
      for (pid_t p : kids) {
        int st = 0;
        waitpid(p, &st, 0);
        if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) rc = 1;
      }
      if (rc != 0) return 1;
      const double gbs = bytes / seconds / 1e9;
      std::printf("%-8s %-6d %-10d %14.2f %14.2f %8.2f\n", "cpu", size, mb, gbs, memcpy_gbs,
                  gbs / memcpy_gbs);
      std::fflush(stdout);
    }
    // NCCL: a group of one on GPU 0 (the real NCCL path: staging, collective, copy back).
    if (ps::NcclBuiltIn()) {
      auto id = ps::NcclNewUniqueId();
      auto comm = id.ok() ? ps::NcclComm::Create(*id, 0, 1, 0, std::chrono::seconds(30))
                          : ps::Result<std::unique_ptr<ps::NcclComm>>(id.status());
      if (!comm.ok()) {
        if (mb == sizes_mb->front()) {
          std::printf("nccl: skipped (%s)\n", comm.status().ToString().c_str());
        }
        continue;
      }
      std::vector<float> data(floats, 1.0f);
      std::vector<double> t;
      for (int i = 0; i <= FLAGS_iters; ++i) {
        auto s = Clock::now();
        if (!(*comm)->AllReduceSumHost(data.data(), floats, std::chrono::seconds(30)).ok())
          return 1;
        if (i > 0) t.push_back(std::chrono::duration<double>(Clock::now() - s).count());
      }
      const double gbs = bytes / Median(t) / 1e9;
      std::printf("%-8s %-6d %-10d %14.2f %14.2f %8.2f\n", "nccl", 1, mb, gbs, memcpy_gbs,
                  gbs / memcpy_gbs);
    }
  }
  return 0;
}
