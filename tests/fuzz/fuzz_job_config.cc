// Fuzzes job config parsing: bytes read as a flagfile ("--NAME=VALUE" or "NAME=VALUE" a
// line; blank lines and '#' comments skipped; a later line overrides an earlier one) into
// the flag map that JobConfig::FromFlagMap parses, as the coordinator and, from the wire,
// every registering process do.
//
// A config that parses must survive the trip the coordinator sends it on: ToFlagMap, then
// FromFlagMap again in the receiving process, must succeed and print the very same map.
// Anything else would let the coordinator and the processes disagree on the job; it
// traps, so that libFuzzer saves the input.
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>

#include "common/job_config.h"
#include "tests/fuzz/fuzz_util.h"

namespace ps::fuzz {
namespace {

std::map<std::string, std::string> ParseFlagText(std::string_view text) {
  std::map<std::string, std::string> flags;
  while (!text.empty()) {
    size_t nl = text.find('\n');
    std::string_view line = text.substr(0, nl);
    text = nl == std::string_view::npos ? std::string_view() : text.substr(nl + 1);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty() || line.front() == '#') continue;
    if (line.substr(0, 2) == "--") line.remove_prefix(2);
    const size_t eq = line.find('=');
    // A bare name reaches the parser with an empty value, which it must refuse cleanly.
    std::string_view name = line.substr(0, eq);
    std::string_view value = eq == std::string_view::npos ? "" : line.substr(eq + 1);
    flags[std::string(name)] = std::string(value);
  }
  return flags;
}

void RunInput(const uint8_t* data, size_t size) {
  const std::map<std::string, std::string> flags =
      ParseFlagText(std::string_view(reinterpret_cast<const char*>(data), size));
  Result<JobConfig> config = JobConfig::FromFlagMap(flags);
  if (!config.ok()) {
    if (config.status().message().empty()) __builtin_trap();  // errors must say why
    return;
  }
  // What the servers derive from a config they were sent.
  for (const TableSpec& t : config->table_specs) Consume(config->StalenessOf(t));

  const std::map<std::string, std::string> sent = config->ToFlagMap();
  if (sent.size() != JobConfig::FlagNames().size()) __builtin_trap();
  Result<JobConfig> received = JobConfig::FromFlagMap(sent);
  if (!received.ok()) __builtin_trap();  // a valid config that does not parse back
  if (received->ToFlagMap() != sent) __builtin_trap();
  if (received->table_specs.size() != config->table_specs.size()) __builtin_trap();
  for (size_t i = 0; i < config->table_specs.size(); ++i) {
    const TableSpec& a = config->table_specs[i];
    const TableSpec& b = received->table_specs[i];
    if (a.id != b.id || a.name != b.name || a.rows != b.rows || a.width != b.width ||
        a.init != b.init || a.init_scale != b.init_scale) {
      __builtin_trap();
    }
  }
}

}  // namespace
}  // namespace ps::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  ps::fuzz::RunInput(data, size);
  return 0;
}
