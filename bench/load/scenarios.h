// The scenarios of the standard suite (see docs/benchmarks.md), each driving sbxd over HTTP
// the way a client would and returning per-iteration samples. A failed request is counted in
// Result::errors and the scenario carries on; a scenario that cannot start at all sets
// Result::failure. Every sandbox a scenario creates is deleted before it returns, also when
// it fails midway.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "cli/client.h"
#include "load/stats.h"

namespace sbx::load {

struct Config {
  cli::Endpoint endpoint;
  std::string token;
  std::optional<cli::Endpoint> warm_endpoint;  // an sbxd started with a warm pool
  std::string warm_token;
  int sbxd_pid = 0;  // for RSS and the cgroup of the main sbxd; 0 = unknown
  bool quick = false;

  int create_n = 200;
  // create_cold: idle time before each create (after the previous delete). 0 is the standard
  // back-to-back loop; a pause measures a create that finds sbxd's pools refilled, as a client
  // that creates now and then does.
  int create_pace_ms = 0;
  int warm_n = 200;
  int warm_pace_ms = 30;  // between warm creates, so the pool's background refill keeps up
  int first_output_n = 200;
  int exec_n = 500;
  int concurrency = 50;
  int concurrent_rounds = 3;
  int sustained_workers = 8;
  double sustained_s = 60;
  uint64_t attach_bytes = 1ull << 30;
  int attach_n = 3;
  // Runs the pipe peer beside the attach scenarios (one run before each timed attach and one
  // after the last), so their ratio compares runs minutes apart on a host whose speed drifts.
  bool pipe_beside_attach = false;
  int density_n = 5000;  // issue 15's goal: 5,000 running on one host
  int density_parallel = 4;  // creates in flight while filling
  int pause_n = 50;
  // create_cold and create_warm: the create body's egress_profile (empty: the default, none).
  std::string egress_profile;
};

// Results by name. One scenario may produce several (first_output → first_output and
// first_output_exit; pause → pause, pause_wake, pause_delete).
using Results = std::map<std::string, Result>;

// The selectable scenario names, in the order the suite runs them.
const std::vector<std::string>& ScenarioNames();
// Runs scenario `name` and adds its results to `out`.
void RunScenario(const std::string& name, const Config& cfg, Results& out);

}  // namespace sbx::load
