// The coordinator's state as JSON, for its journal (server/coord_journal.h): a member of
// the job, the lease table, a lease answer. Each ...FromJson reads what the matching
// ...ToJson wrote; a field missing or of the wrong type takes its default (the journal is
// written by this code only; a damaged one fails in RocksDB or the JSON parser first).
//
// Thread model: free functions, no state.
#pragma once

#include <nlohmann/json.hpp>

#include "common/lease_table.h"
#include "common/status.h"
#include "server/coord_leases.h"
#include "server/coord_membership.h"

namespace ps {

// Everything but the peer, the registration request and the heartbeat time, which belong
// to one coordinator process.
nlohmann::json MemberToJson(const Member& m);
Member MemberFromJson(const nlohmann::json& j);

nlohmann::json LeaseStateToJson(const LeaseTable::State& s);
// An error when `j` is not a lease table.
Result<LeaseTable::State> LeaseStateFromJson(const nlohmann::json& j);

// Without the peer (the worker may ask again from another one).
nlohmann::json LeaseAnswerToJson(const LeaseAnswer& a);
LeaseAnswer LeaseAnswerFromJson(const nlohmann::json& j);

}  // namespace ps
