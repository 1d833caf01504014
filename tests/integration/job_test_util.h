// What the multi-process tests share: the worker's side of the coordinator protocol (as
// worker/trainer.cc speaks it) for workers played by test threads, and a fixture that
// starts real ps_coordinator / ps_server processes in a scratch directory, asks a running
// coordinator for its status, and prints the processes' logs when a test fails.
//
// Tests learn what a job did from its run directory (summary.json, metrics.jsonl, the
// endpoint file, checkpoints) or from the coordinator's status, never from the processes'
// console text: that is worded for people and may change; the logs are for diagnosis.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <filesystem>
#include <functional>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common/registration.h"
#include "common/security.h"
#include "common/wire.h"
#include "tests/integration/process.h"

namespace ps::itest {

using nlohmann::json;
using SteadyClock = std::chrono::steady_clock;

// Every test finishes well inside this; each wait below is bounded by it.
constexpr std::chrono::seconds kTestTimeout{45};

inline std::chrono::milliseconds TimeLeft(Deadline deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - SteadyClock::now());
  return std::max(left, std::chrono::milliseconds(1));
}

// ---- the worker's side of the coordinator protocol (as worker/trainer.cc speaks it) ----

inline Frames OneFrame(capnp::MallocMessageBuilder& b) {
  Frames f;
  f.push_back(EncodeFrame(b));
  return f;
}

// A Register header as a worker sends it, with any protocol version.
inline Frames WorkerRegisterFrames(uint32_t protocol_version, uint64_t request_id,
                                   const std::string& device) {
  capnp::MallocMessageBuilder b;
  auto h = NewHeader(b, request_id, -1);
  h.setProtocolVersion(protocol_version);
  auto reg = h.getBody().initRegister();
  reg.setRole(wire::Role::WORKER);
  reg.setDevice(device);
  reg.setHost("localhost");
  reg.setPid(static_cast<uint32_t>(getpid()));
  return OneFrame(b);
}

// Sends a request on a socket with nothing else in flight and checks that the reply is
// `expected` (an `error` reply is its Status).
inline Status CallExpecting(ClientSocket& socket, Frames request,
                            wire::Header::Body::Which expected, Deadline deadline) {
  PS_ASSIGN_OR_RETURN(CallReply reply, Call(socket, std::move(request), TimeLeft(deadline)));
  if (reply.header.get().getBody().which() != expected) {
    return Internal("the coordinator answered with an unexpected message type");
  }
  return Status::Ok();
}

// One line of metrics.jsonl; the final eval report ends the job.
inline Status SendReport(ClientSocket& coordinator, int worker_id, const json& report,
                         Deadline deadline) {
  capnp::MallocMessageBuilder b;
  NewHeader(b, 11, worker_id).getBody().initReport().setJson(report.dump());
  return CallExpecting(coordinator, OneFrame(b), wire::Header::Body::REPORT_REPLY, deadline);
}

// Tells the coordinator this worker is done (or failed) and waits for every worker to be:
// the coordinator answers only then.
inline Status SendDone(ClientSocket& coordinator, int worker_id, const Status& outcome,
                       Deadline deadline) {
  capnp::MallocMessageBuilder b;
  auto done = NewHeader(b, 12, worker_id).getBody().initDone();
  done.setJson(json({{"examples", 0}, {"device", "test thread"}, {"seconds", 0}}).dump());
  done.setFailed(!outcome.ok());
  done.setMessage(outcome.ToString());
  return CallExpecting(coordinator, OneFrame(b), wire::Header::Body::DONE_REPLY, deadline);
}

inline json FinalEvalReport() {
  return {{"kind", "eval"}, {"final", true}, {"epoch", 1}, {"test_accuracy", 0}, {"test_loss", 0}};
}

// ---- the fixture: a scratch dir, the processes' command lines, logs on failure ----

class JobTest : public ::testing::Test {
 protected:
  void TearDown() override {
    if (!HasFailure()) return;
    // The processes are gone by now (the test body's ChildProcess objects killed them);
    // their logs say why the test failed.
    std::error_code ec;
    for (const auto& e : std::filesystem::recursive_directory_iterator(dir_.path(), ec)) {
      if (e.path().extension() != ".log") continue;
      std::cerr << "---- last lines of " << e.path().string() << " ----\n"
                << TailOfFile(e.path().string(), 40);
    }
  }

  // ---- security: every process of a test job speaks CURVE with keys made here ----

  // The job's keys directory (dir_/keys), made on first use with the pairs 'server' and
  // 'worker' (as ps_keygen makes them).
  const std::string& KeysDir() {
    if (keys_dir_.empty()) {
      const std::string dir = dir_.Join("keys");
      for (const char* name : {"server", "worker"}) {
        Result<CurveKeyPair> pair = GenerateCurveKeyPair();
        EXPECT_TRUE(pair.ok()) << pair.status().ToString();
        if (!pair.ok()) break;
        Status s = WriteKeyPair(dir, name, name, *pair);
        EXPECT_TRUE(s.ok()) << s.ToString();
      }
      keys_dir_ = dir;
    }
    return keys_dir_;
  }

  // The flags that give a started binary the job's keys. Every binary a test starts gets
  // these (StartCoordinator and StartServer add them).
  std::vector<std::string> SecurityFlags() {
    if (insecure_) return {"--insecure"};
    return {"--keys_dir=" + KeysDir()};
  }

  // From now on, start binaries with --insecure and make plain client transports.
  void UseInsecure() { insecure_ = true; }

  // Options for a Transport whose client sockets play a worker (or, with key_name "server",
  // the coordinator or a server) of the job.
  TransportOptions ClientTransportOptions(const std::string& key_name = "worker") {
    TransportOptions o;
    if (insecure_) return o;
    ps::SecurityFlags flags;
    flags.keys_dir = KeysDir();
    flags.key_name = key_name;
    Result<SecurityOptions> sec = LoadSecurity(SecurityRole::kWorker, flags, {});
    EXPECT_TRUE(sec.ok()) << sec.status().ToString();
    if (sec.ok()) o.security = *sec;
    return o;
  }

  // Starts ps_coordinator on a free port and waits for its endpoint.
  Result<ChildProcess> StartCoordinator(const std::vector<std::string>& job_flags,
                                        Deadline deadline, std::string* endpoint) {
    std::vector<std::string> argv = {
        BinaryPath("ps_coordinator"),         "--listen=tcp://127.0.0.1:*",
        "--endpoint_file=" + dir_.Join("ep"), "--run_dir=" + RunDir(),
        "--progress_every_seconds=0",         "--register_timeout_ms=30000"};
    for (std::string& f : SecurityFlags()) argv.push_back(std::move(f));
    argv.insert(argv.end(), job_flags.begin(), job_flags.end());
    // A second job in one test must not find the first coordinator's endpoint.
    std::filesystem::remove(dir_.Join("ep"));
    PS_ASSIGN_OR_RETURN(ChildProcess c, ChildProcess::Spawn(argv, dir_.Join("coordinator.log")));
    PS_RETURN_IF_ERROR(WaitForFile(dir_.Join("ep"), deadline, &c));
    PS_ASSIGN_OR_RETURN(std::string text, ReadFile(dir_.Join("ep")));
    while (!text.empty() && (text.back() == '\n' || text.back() == '\r')) text.pop_back();
    *endpoint = text;
    return c;
  }

  Result<ChildProcess> StartServer(int i, const std::string& coordinator,
                                   const std::vector<std::string>& extra_flags = {}) {
    std::vector<std::string> argv = {BinaryPath("ps_server"), "--coordinator=" + coordinator,
                                     "--listen=tcp://127.0.0.1:*", "--register_timeout_ms=30000"};
    for (std::string& f : SecurityFlags()) argv.push_back(std::move(f));
    argv.insert(argv.end(), extra_flags.begin(), extra_flags.end());
    return ChildProcess::Spawn(argv, dir_.Join("server-" + std::to_string(i) + ".log"));
  }

  // Fails the test unless `p` exits with status 0 before `deadline`; the test goes on, so
  // that every process's outcome is reported.
  void ExpectCleanExit(ChildProcess& p, const std::string& name, Deadline deadline) {
    Result<int> rc = p.WaitExit(deadline);
    ASSERT_TRUE(rc.ok()) << name << ": " << rc.status().ToString();
    EXPECT_EQ(*rc, 0) << name << " exited with status " << *rc;
  }

  Result<json> ReadSummary() {
    PS_ASSIGN_OR_RETURN(std::string text, ReadFile(RunDir() + "/summary.json"));
    json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object()) {
      return InvalidArgument("summary.json is not a JSON object");
    }
    return j;
  }

  std::string RunDir() const { return dir_.Join("run"); }

  // The live status of the coordinator at `endpoint`, as `ps_status --json` shows it
  // (server/status_main.cc), asked with the job's worker key on a fresh connection (so that
  // a late answer to an earlier request is never taken for this one's).
  Result<json> FetchStatus(const std::string& endpoint, Deadline deadline) {
    if (status_transport_ == nullptr) {
      status_transport_ = std::make_unique<Transport>(ClientTransportOptions());
    }
    PS_ASSIGN_OR_RETURN(std::unique_ptr<ClientSocket> socket, status_transport_->Connect(endpoint));
    capnp::MallocMessageBuilder b;
    NewHeader(b, 1, -1).getBody().setStatus();
    PS_ASSIGN_OR_RETURN(CallReply reply, Call(*socket, OneFrame(b), TimeLeft(deadline)));
    if (reply.header.get().getBody().which() != wire::Header::Body::STATUS_REPLY) {
      return Internal("the coordinator answered a status request with another message type");
    }
    json j = json::parse(reply.header.get().getBody().getStatusReply().getJson().cStr(), nullptr,
                         /*allow_exceptions=*/false);
    if (!j.is_object()) return Internal("the coordinator's status is not a JSON object");
    return j;
  }

  // Waits until the live status of the coordinator at `endpoint` lists a failure entry (the
  // entries summary.json's "failures" ends with) for which `match` holds, and returns it.
  // DeadlineExceeded at `deadline`; Unavailable at once when `coordinator` exits first.
  Result<json> WaitForFailure(const std::string& endpoint, ChildProcess& coordinator,
                              const std::function<bool(const json&)>& match, Deadline deadline) {
    while (SteadyClock::now() < deadline) {
      // One unanswered request (a busy coordinator) is followed by another.
      const Deadline call_deadline = std::min(deadline, DeadlineIn(std::chrono::seconds(5)));
      if (Result<json> st = FetchStatus(endpoint, call_deadline); st.ok()) {
        for (const json& f : st->value("failures", json::array())) {
          if (f.is_object() && match(f)) return f;
        }
      }
      if (coordinator.TryReap()) return Unavailable("the coordinator exited");
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    return DeadlineExceeded("no such failure in the coordinator's status");
  }

  TempDir dir_{"ps_job_test_"};

 private:
  std::string keys_dir_;
  bool insecure_ = false;
  std::unique_ptr<Transport> status_transport_;  // made on first use, with the job's keys
};

// ---- whole jobs through scripts/launch_local.sh ----

struct LaunchResult {
  int exit_status = -1;
  double seconds = 0;
  std::string logs;           // the script's console and the tail of every process's log
  json summary;               // summary.json (null when missing)
  std::vector<json> metrics;  // metrics.jsonl, line by line
  // ps_* processes of the job still alive after the script exited.
  std::vector<ProcessInfo> leftovers;
};

// Runs `scripts/launch_local.sh ARGS... --no_build --run_dir RUN_DIR` and collects what it
// left. The script gets SIGTERM should the test die (it then stops its job).
inline Result<LaunchResult> RunLaunchLocal(const std::vector<std::string>& args,
                                           const std::string& run_dir, const std::string& log,
                                           std::chrono::seconds timeout) {
  // The script finds the binaries through PS_BIN_DIR (ctest sets it; a direct run too).
  const std::string bin_dir =
      std::filesystem::path(BinaryPath("ps_coordinator")).parent_path().string();
  setenv("PS_BIN_DIR", bin_dir.c_str(), /*overwrite=*/0);
  std::vector<std::string> argv = {"/bin/bash", SourceDir() + "/scripts/launch_local.sh"};
  std::vector<std::string> job_flags;
  bool after_dashes = false;
  for (const std::string& a : args) {
    if (a == "--") after_dashes = true;
    (after_dashes ? job_flags : argv).push_back(a);
  }
  argv.insert(argv.end(), {"--no_build", "--run_dir", run_dir});
  argv.insert(argv.end(), job_flags.begin(), job_flags.end());
  PS_ASSIGN_OR_RETURN(ChildProcess job, ChildProcess::Spawn(argv, log, SIGTERM));
  const auto start = SteadyClock::now();
  PS_ASSIGN_OR_RETURN(int rc, job.WaitExit(DeadlineIn(timeout)));
  LaunchResult r;
  r.exit_status = rc;
  r.seconds = std::chrono::duration<double>(SteadyClock::now() - start).count();
  r.logs = "---- launch_local.sh ----\n" + TailOfFile(log, 40);
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(run_dir + "/logs", ec)) {
    r.logs +=
        "---- " + e.path().filename().string() + " ----\n" + TailOfFile(e.path().string(), 20);
  }
  // Nothing the script started may outlive it: its process group, and any process whose
  // command line names the run directory or the coordinator's endpoint (servers and
  // workers carry only the endpoint). Zombies have exited and do not count.
  Result<std::string> endpoint = ReadFile(run_dir + "/coordinator.endpoint");
  std::string ep = endpoint.ok() ? *endpoint : "";
  while (!ep.empty() && (ep.back() == '\n' || ep.back() == '\r')) ep.pop_back();
  for (const ProcessInfo& p : ScanProcesses()) {
    if (p.state == 'Z' || p.comm.rfind("ps_", 0) != 0) continue;
    if (p.pgid == job.pid() || p.cmdline.find(run_dir) != std::string::npos ||
        (!ep.empty() && p.cmdline.find(ep) != std::string::npos)) {
      r.leftovers.push_back(p);
    }
  }
  if (Result<std::string> text = ReadFile(run_dir + "/summary.json"); text.ok()) {
    r.summary = json::parse(*text, nullptr, /*allow_exceptions=*/false);
  }
  if (Result<std::string> text = ReadFile(run_dir + "/metrics.jsonl"); text.ok()) {
    std::istringstream lines(*text);
    for (std::string line; std::getline(lines, line);) {
      if (!line.empty()) r.metrics.push_back(json::parse(line, nullptr, false));
    }
  }
  return r;
}

inline std::string Describe(const std::vector<ProcessInfo>& ps) {
  std::ostringstream s;
  for (const ProcessInfo& p : ps) s << "  pid " << p.pid << " " << p.cmdline << "\n";
  return s.str();
}

// A launch that should have trained to the end: the script ran and exited 0, left no
// process behind, and wrote a summary.json whose status is "ok". Call it under
// ASSERT_NO_FATAL_FAILURE: a failed ASSERT here ends only this function.
inline void ExpectFinishedOk(const Result<LaunchResult>& r) {
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->exit_status, 0) << "launch_local.sh failed\n" << r->logs;
  EXPECT_TRUE(r->leftovers.empty()) << "still running after launch_local.sh exited:\n"
                                    << Describe(r->leftovers);
  ASSERT_TRUE(r->summary.is_object()) << r->logs;
  EXPECT_EQ(r->summary.value("status", ""), "ok") << r->summary.dump();
}

// A launch the coordinator refused at start: it failed with `message` in its logs, left no
// process, wrote no train line, and started no server or worker (no log of one in RUN_DIR).
inline void ExpectRefusedBeforeAnythingStarted(const LaunchResult& r, const std::string& run_dir,
                                               const std::string& what,
                                               const std::string& message) {
  EXPECT_NE(r.exit_status, 0) << what << "\n" << r.logs;
  EXPECT_NE(r.logs.find(message), std::string::npos) << "expected '" << message << "' in\n"
                                                     << r.logs;
  EXPECT_TRUE(r.leftovers.empty()) << Describe(r.leftovers);
  for (const json& line : r.metrics) {
    EXPECT_NE(line.value("kind", ""), "train") << "a refused job trained: " << line.dump();
  }
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(run_dir + "/logs", ec)) {
    const std::string name = e.path().filename().string();
    EXPECT_EQ(name.find("worker"), std::string::npos) << "a worker was started: " << name;
    EXPECT_EQ(name.find("server"), std::string::npos) << "a server was started: " << name;
  }
}

}  // namespace ps::itest
