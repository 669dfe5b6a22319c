// What the E2B adapter keeps between requests, owned by Api (one per sbxd).
#pragma once

#include "api/e2b/guest_ids.h"
#include "api/e2b/process_table.h"
#include "api/e2b/watchers.h"

namespace sbx::api::e2b {

struct State {
  ProcessTable processes;
  WatcherTable watchers;
  GuestIdsCache guest_ids;
};

}  // namespace sbx::api::e2b
