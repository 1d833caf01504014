// Prometheus metrics of a running job (launch_local.sh --metrics_port): each process's
// endpoint answers a plain HTTP GET on 127.0.0.1, and its counters move while it trains.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <random>
#include <sstream>
#include <thread>

#include "tests/integration/job_test_util.h"

namespace ps {
namespace {

constexpr char kTrainImages[] = "/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz";

// GET /metrics from 127.0.0.1:port over a plain socket; the body, or an error.
Result<std::string> Scrape(int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return Unavailable("socket() failed");
  timeval tv{5, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    close(fd);
    return Unavailable("nothing listens on 127.0.0.1:" + std::to_string(port));
  }
  const std::string req = "GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
  if (send(fd, req.data(), req.size(), 0) != static_cast<ssize_t>(req.size())) {
    close(fd);
    return Unavailable("send failed");
  }
  std::string response;
  char buf[8192];
  for (ssize_t n; (n = recv(fd, buf, sizeof buf, 0)) > 0;) response.append(buf, size_t(n));
  close(fd);
  if (response.rfind("HTTP/1.", 0) != 0 || response.find(" 200 ") == std::string::npos) {
    return Internal("not an HTTP 200 answer: " + response.substr(0, 200));
  }
  const size_t body = response.find("\r\n\r\n");
  return body == std::string::npos ? std::string() : response.substr(body + 4);
}

// The sum of every series of metric `name` (any labels); -1 when there is none.
double Value(const std::string& text, const std::string& name) {
  std::istringstream lines(text);
  double sum = -1;
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind(name, 0) != 0 || line.size() <= name.size()) continue;
    const char next = line[name.size()];
    if (next != '{' && next != ' ') continue;
    const size_t space = line.rfind(' ');
    sum = std::max(sum, 0.0) + std::stod(line.substr(space + 1));
  }
  return sum;
}

// A base port with `count` free ports after it on 127.0.0.1 (checked by binding them).
int FreePortRange(int count) {
  std::mt19937 rng(static_cast<unsigned>(getpid()));
  for (int attempt = 0; attempt < 50; ++attempt) {
    const int base = 20000 + static_cast<int>(rng() % 30000);
    bool all_free = true;
    for (int p = base; p < base + count && all_free; ++p) {
      int fd = socket(AF_INET, SOCK_STREAM, 0);
      sockaddr_in addr{};
      addr.sin_family = AF_INET;
      addr.sin_port = htons(static_cast<uint16_t>(p));
      addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      all_free = bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
      close(fd);
    }
    if (all_free) return base;
  }
  return 0;
}

TEST(MetricsJobTest, EveryProcessServesMetricsAndTheyMove) {
  if (access(kTrainImages, R_OK) != 0) {
    GTEST_SKIP() << kTrainImages << " is not here (scripts/install_deps.sh installs it)";
  }
  itest::TempDir dir("ps_metrics_test_");
  const std::string bin_dir =
      std::filesystem::path(itest::BinaryPath("ps_coordinator")).parent_path().string();
  setenv("PS_BIN_DIR", bin_dir.c_str(), /*overwrite=*/0);
  const int base = FreePortRange(5);
  ASSERT_GT(base, 0) << "no 5 free ports in a row on 127.0.0.1";
  const int coordinator = base, server0 = base + 1, worker1 = base + 4;
  const auto deadline = itest::DeadlineIn(std::chrono::seconds(90));
  // The whole default job (15 epochs, ~25 s here): the scrapes below need it running for a
  // few seconds (one epoch is over in under 2 s with shared memory), and the test stops
  // it once they are done.
  auto job = itest::ChildProcess::Spawn(
      {"/bin/bash", itest::SourceDir() + "/scripts/launch_local.sh", "--no_build", "--run_dir",
       dir.Join("run"), "--metrics_port", std::to_string(base), "--", "--epochs=15"},
      dir.Join("launch.log"), SIGTERM);
  ASSERT_TRUE(job.ok()) << job.status().ToString();

  // Wait (bounded) until worker 1 has completed pulls, then look again a moment later.
  std::string first;
  while (itest::SteadyClock::now() < deadline) {
    ASSERT_FALSE(job->TryReap()) << "the job ended early:\n"
                                 << itest::TailOfFile(dir.Join("launch.log"), 30);
    Result<std::string> text = Scrape(worker1);
    if (text.ok() && Value(*text, "ps_pulls_total") > 0 && Value(*text, "ps_examples_total") > 0) {
      first = *text;
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(200));  // until it listens
  }
  ASSERT_FALSE(first.empty()) << "worker 1 never showed completed pulls";
  Result<std::string> server_first = Scrape(server0);
  ASSERT_TRUE(server_first.ok()) << server_first.status().ToString();

  // Counters move: wait (bounded) for a later scrape to show more pulls and pushes.
  bool moved = false;
  std::string second, server_second;
  while (!moved && itest::SteadyClock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    Result<std::string> w = Scrape(worker1);
    Result<std::string> s = Scrape(server0);
    ASSERT_TRUE(w.ok() && s.ok()) << (w.ok() ? s.status() : w.status()).ToString();
    second = *w;
    server_second = *s;
    moved = Value(second, "ps_pulls_total") > Value(first, "ps_pulls_total") &&
            Value(server_second, "ps_pushes_total") > Value(*server_first, "ps_pushes_total");
  }
  EXPECT_TRUE(moved) << "worker:\n" << second << "\nserver:\n" << server_second;
  EXPECT_GT(Value(second, "ps_pull_latency_seconds_count"), 0) << second;
  EXPECT_GT(Value(second, "ps_push_latency_seconds_count"), 0) << second;
  EXPECT_GT(Value(second, "ps_pushed_bytes_total"), 0) << second;
  EXPECT_NE(second.find("role=\"worker\""), std::string::npos) << second;
  EXPECT_NE(second.find("id=\"1\""), std::string::npos) << second;
  EXPECT_GT(Value(server_second, "ps_gradient_staleness_count"), 0) << server_second;
  EXPECT_GT(Value(server_second, "ps_rows"), 0) << server_second;
  EXPECT_GE(Value(server_second, "ps_pulls_total"), 0) << server_second;
  Result<std::string> coord = Scrape(coordinator);
  ASSERT_TRUE(coord.ok()) << coord.status().ToString();
  EXPECT_GT(Value(*coord, "ps_examples_total"), 0) << *coord;
  EXPECT_EQ(Value(*coord, "ps_workers"), 2) << *coord;
  EXPECT_EQ(Value(*coord, "ps_failures_total"), 0) << *coord;
  job->Kill();
}

}  // namespace
}  // namespace ps
