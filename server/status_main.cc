// ps_status: a running job's live status, from its coordinator. Who trains how fast, who is
// blocked by the staleness bound and on which worker it waits, what each server holds and
// how busy it is, and recent failures.
//
//   ps_status --coordinator=tcp://HOST:PORT [--watch [--interval_seconds=2]] [--json]
//
// Exit status: 0 when the coordinator answered (with --watch: until the job ended), 1 when
// it could not be reached, 2 on bad flags.
#include <gflags/gflags.h>
#include <glog/logging.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>

#include "common/security_flags.h"
#include "common/transport.h"
#include "common/wire.h"

DEFINE_string(coordinator, "", "the coordinator's endpoint, e.g. tcp://127.0.0.1:7000 (required)");
DEFINE_bool(watch, false, "refresh every --interval_seconds until the job ends (Ctrl-C to stop)");
DEFINE_double(interval_seconds, 2, "--watch: seconds between refreshes");
DEFINE_bool(json, false, "print the coordinator's status object as JSON instead of a table");
DEFINE_int32(timeout_ms, 5000, "how long to wait for the coordinator's answer");

namespace {

using nlohmann::json;

std::atomic<bool> g_stop{false};
void OnSignal(int) { g_stop.store(true); }

// One status request on a fresh connection (so that a late answer to an earlier request
// can never be taken for this one's).
ps::Result<json> FetchStatus(ps::Transport& transport, const std::string& endpoint,
                             std::chrono::milliseconds timeout) {
  PS_ASSIGN_OR_RETURN(std::unique_ptr<ps::ClientSocket> socket, transport.Connect(endpoint));
  capnp::MallocMessageBuilder b;
  ps::NewHeader(b, 1, -1).getBody().setStatus();
  ps::Frames f;
  f.push_back(ps::EncodeFrame(b));
  PS_ASSIGN_OR_RETURN(ps::CallReply reply, ps::Call(*socket, std::move(f), timeout));
  if (reply.header.get().getBody().which() != ps::wire::Header::Body::STATUS_REPLY) {
    return ps::Internal("the coordinator at " + endpoint + " answered with another message type");
  }
  json j = json::parse(reply.header.get().getBody().getStatusReply().getJson().cStr(), nullptr,
                       /*allow_exceptions=*/false);
  if (!j.is_object()) return ps::Internal("the coordinator's status is not a JSON object");
  return j;
}

std::string Num(const json& j, const char* key, const char* fmt) {
  if (!j.contains(key) || !j[key].is_number()) return "-";
  char buf[64];
  std::snprintf(buf, sizeof buf, fmt, j[key].get<double>());
  return buf;
}

// "serving", "serving +0,2" (a promoted backup, with the lost servers whose shards it
// serves), "lost -> 1" (failed over to server 1) or "lost" (nobody serves its shards).
std::string ServerState(const json& s) {
  // The coordinator's answer is input: a field of another type prints as "?".
  const json none;
  const json& st = s.contains("state") ? s["state"] : none;
  if (!st.is_string()) return "?";
  std::string state = st.get<std::string>();
  if (state == "lost") {
    if (s.contains("served_by") && s["served_by"].is_number_integer() &&
        s["served_by"].get<int>() >= 0) {
      state += " -> " + std::to_string(s["served_by"].get<int>());
    }
    return state;
  }
  const json& serves = s.contains("serves_for") ? s["serves_for"] : none;
  if (!serves.is_array()) return state;
  for (size_t i = 0; i < serves.size(); ++i) {
    state += (i == 0 ? " +" : ",") + (serves[i].is_number() ? serves[i].dump() : "?");
  }
  return state;
}

void PrintTable(const json& st) {
  std::printf("job: %s  epoch %d/%d (%.0f%%)  %s examples  %.1fs  staleness %d\n",
              st.value("phase", "?").c_str(), st.value("epoch", 0), st.value("epochs", 0),
              100.0 * st.value("epoch_fraction", 0.0), Num(st, "examples", "%.0f").c_str(),
              st.value("elapsed_seconds", 0.0), st.value("staleness", 0));
  std::printf("\n%-6s %-24s %-9s %8s %5s %10s %10s %8s  %s\n", "worker", "device", "state", "clock",
              "lag", "ex/s", "blocked_s", "blocked", "waits on");
  for (const json& w : st.value("workers", json::array())) {
    const int waits_on = w.value("waits_on", -1);
    std::string device = w.value("device", "");
    if (device.size() > 24) device.resize(24);
    std::printf("%-6d %-24s %-9s %8s %5s %10s %10s %7.0f%%  %s\n", w.value("id", -1),
                device.c_str(), w.value("state", "").c_str(), Num(w, "clock", "%.0f").c_str(),
                Num(w, "clock_lag", "%.0f").c_str(), Num(w, "examples_per_sec", "%.0f").c_str(),
                Num(w, "wait_seconds", "%.1f").c_str(), 100.0 * w.value("blocked_fraction", 0.0),
                waits_on >= 0 ? ("worker " + std::to_string(waits_on)).c_str() : "-");
  }
  std::printf("\n%-6s %-16s %-28s %7s %10s %8s %10s %6s\n", "server", "state", "endpoint", "shards",
              "rows", "spilled", "pushes/s", "queue");
  for (const json& s : st.value("servers", json::array())) {
    std::printf("%-6d %-16s %-28s %7s %10s %8s %10s %6s\n", s.value("id", -1),
                ServerState(s).c_str(), s.value("endpoint", "").c_str(),
                Num(s, "shards", "%.0f").c_str(), Num(s, "rows", "%.0f").c_str(),
                Num(s, "rows_spilled", "%.0f").c_str(), Num(s, "pushes_per_sec", "%.0f").c_str(),
                Num(s, "queue_depth", "%.0f").c_str());
  }
  const json failures = st.value("failures", json::array());
  std::printf("\nfailures: %s\n", failures.empty() ? "none" : "");
  for (const json& f : failures) {
    // Failure events (server/coordinator.cc): kind, process, and what was recovered or why.
    std::string what = f.value("recovered", "");
    if (what.empty()) what = f.value("message", "");
    std::printf("  %.1fs  %s %s: %s\n", f.value("time", 0.0), f.value("kind", "").c_str(),
                f.value("process", "").c_str(), what.c_str());
  }
}

}  // namespace

int main(int argc, char** argv) {
  gflags::SetUsageMessage("ps_status --coordinator=tcp://HOST:PORT [--watch] [--json]");
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  FLAGS_logtostderr = true;
  google::InitGoogleLogging(argv[0]);
  if (FLAGS_coordinator.empty()) {
    std::fprintf(stderr, "ps_status: --coordinator is required (e.g. tcp://127.0.0.1:7000)\n");
    return 2;
  }
  if (ps::Status ep = ps::ValidateEndpoint(FLAGS_coordinator); !ep.ok()) {
    std::fprintf(stderr, "ps_status: --coordinator=%s: %s\n", FLAGS_coordinator.c_str(),
                 ep.ToString().c_str());
    return 2;
  }
  if (!(FLAGS_interval_seconds > 0) || FLAGS_timeout_ms <= 0) {
    std::fprintf(stderr,
                 "ps_status: --interval_seconds and --timeout_ms must be positive, got %g and %d\n",
                 FLAGS_interval_seconds, FLAGS_timeout_ms);
    return 2;
  }
  std::signal(SIGINT, OnSignal);
  std::signal(SIGTERM, OnSignal);
  ps::TransportOptions topt;
  topt.linger = std::chrono::milliseconds(0);
  // Asks as a worker does: with the job's worker key (--keys_dir), or --insecure.
  if (ps::Status sec =
          ps::InstallSecurityFromFlags(ps::SecurityRole::kWorker, {FLAGS_coordinator}, &topt);
      !sec.ok()) {
    std::fprintf(stderr, "ps_status: %s\n", sec.message().c_str());
    return 2;
  }
  ps::Transport transport(topt);
  const bool clear = FLAGS_watch && !FLAGS_json && isatty(STDOUT_FILENO);
  bool answered = false;
  do {
    ps::Result<json> st =
        FetchStatus(transport, FLAGS_coordinator, std::chrono::milliseconds(FLAGS_timeout_ms));
    if (!st.ok()) {
      if (answered) {
        // It answered before: the job is over (the coordinator exits once it is).
        std::printf("the coordinator no longer answers: the job has ended\n");
        return 0;
      }
      std::fprintf(stderr, "ps_status: no status from %s: %s\n", FLAGS_coordinator.c_str(),
                   st.status().ToString().c_str());
      return 1;
    }
    answered = true;
    if (clear) std::printf("\033[H\033[2J");
    if (FLAGS_json) {
      std::printf("%s\n", st->dump().c_str());
    } else {
      PrintTable(*st);
    }
    std::fflush(stdout);
    // A display refresh interval, not a wait on a condition.
    const auto until =
        std::chrono::steady_clock::now() + std::chrono::duration<double>(FLAGS_interval_seconds);
    while (FLAGS_watch && !g_stop.load() && std::chrono::steady_clock::now() < until) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  } while (FLAGS_watch && !g_stop.load());
  return 0;
}
