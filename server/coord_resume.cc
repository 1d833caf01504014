#include "server/coord_resume.h"

namespace ps {
namespace {

using nlohmann::json;

template <typename T>
T Get(const json& j, const char* key, T fallback) {
  if (!j.is_object() || !j.contains(key)) return fallback;
  try {
    return j[key].get<T>();
  } catch (const json::exception&) {
    return fallback;
  }
}

json LeaseJson(const LeaseTable::Lease& l) {
  return {{"epoch", l.epoch}, {"chunk", l.chunk}, {"begin", l.begin}, {"end", l.end}};
}

LeaseTable::Lease LeaseFrom(const json& j) {
  return LeaseTable::Lease{Get(j, "epoch", 0), Get<uint64_t>(j, "chunk", 0),
                           Get<uint64_t>(j, "begin", 0), Get<uint64_t>(j, "end", 0)};
}

}  // namespace

json MemberToJson(const Member& m) {
  return {{"endpoint", m.endpoint},
          {"device", m.device},
          {"host", m.host},
          {"pid", m.pid},
          {"group", m.group},
          {"group_formed", m.group_formed},
          {"dead", m.dead},
          {"left", m.left},
          {"joined", m.joined},
          {"silent_reported", m.silent_reported},
          {"done", m.result.done},
          {"failed", m.result.failed},
          {"message", m.result.message},
          {"totals", m.result.totals},
          {"done_request", m.result.done_request}};
}

Member MemberFromJson(const json& j) {
  Member m;
  m.endpoint = Get<std::string>(j, "endpoint", "");
  m.device = Get<std::string>(j, "device", "");
  m.host = Get<std::string>(j, "host", "");
  m.pid = Get<uint32_t>(j, "pid", 0);
  m.group = Get<std::string>(j, "group", "");
  m.group_formed = Get<std::string>(j, "group_formed", "");
  m.dead = Get(j, "dead", false);
  m.left = Get(j, "left", false);
  m.joined = Get(j, "joined", false);
  m.silent_reported = Get(j, "silent_reported", false);
  m.result.done = Get(j, "done", false);
  m.result.failed = Get(j, "failed", false);
  m.result.message = Get<std::string>(j, "message", "");
  m.result.totals = Get(j, "totals", json::object());
  m.result.done_request = Get<uint64_t>(j, "done_request", 0);
  return m;
}

json LeaseStateToJson(const LeaseTable::State& s) {
  json pending = json::array();
  for (const LeaseTable::Lease& l : s.pending) pending.push_back(LeaseJson(l));
  json outstanding = json::array();
  for (const LeaseTable::Outstanding& o : s.outstanding) {
    outstanding.push_back({{"epoch", o.epoch}, {"chunk", o.chunk}, {"worker", o.worker}});
  }
  return {{"examples", s.examples},
          {"opened_epochs", s.opened_epochs},
          {"pending", std::move(pending)},
          {"outstanding", std::move(outstanding)},
          {"chunks_done", s.chunks_done},
          {"examples_done", s.examples_done},
          {"newly_completed", s.newly_completed}};
}

Result<LeaseTable::State> LeaseStateFromJson(const json& j) {
  if (!j.is_object() || !j.contains("chunks_done") || !j["chunks_done"].is_array()) {
    return InvalidArgument("the journal holds no lease table");
  }
  LeaseTable::State s;
  s.examples = Get<uint64_t>(j, "examples", 0);
  s.opened_epochs = Get(j, "opened_epochs", 0);
  for (const json& l : Get(j, "pending", json::array())) s.pending.push_back(LeaseFrom(l));
  for (const json& o : Get(j, "outstanding", json::array())) {
    s.outstanding.push_back(
        {Get(o, "epoch", 0), Get<uint64_t>(o, "chunk", 0), Get(o, "worker", -1)});
  }
  s.chunks_done = Get(j, "chunks_done", std::vector<uint64_t>{});
  s.examples_done = Get(j, "examples_done", std::vector<uint64_t>{});
  s.newly_completed = Get(j, "newly_completed", std::vector<int>{});
  return s;
}

json LeaseAnswerToJson(const LeaseAnswer& a) {
  json j = {{"worker", a.worker},
            {"request_id", a.request_id},
            {"batch_size", a.batch_size},
            {"finished", a.finished},
            {"wait", a.wait}};
  if (a.evaluate_epoch) j["evaluate_epoch"] = *a.evaluate_epoch;
  if (a.chunk) j["chunk"] = LeaseJson(*a.chunk);
  return j;
}

LeaseAnswer LeaseAnswerFromJson(const json& j) {
  LeaseAnswer a;
  a.worker = Get(j, "worker", -1);
  a.request_id = Get<uint64_t>(j, "request_id", 0);
  a.batch_size = Get<uint32_t>(j, "batch_size", 0);
  a.finished = Get(j, "finished", false);
  a.wait = Get(j, "wait", false);
  if (j.is_object() && j.contains("evaluate_epoch")) a.evaluate_epoch = Get(j, "evaluate_epoch", 0);
  if (j.is_object() && j.contains("chunk")) a.chunk = LeaseFrom(j["chunk"]);
  return a;
}

}  // namespace ps
