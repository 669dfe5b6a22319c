// Assembles latest.json from the results: ratios against the peers and the targets,
// computed on the JSON form so that they are tested on hand-written inputs.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

namespace sbx::load {

// {name: {value, numerator, denominator, basis}} for every ratio whose two sides were measured.
nlohmann::json BuildRatios(const nlohmann::json& scenarios, const nlohmann::json& peers);

// [{name, target, op, measured, unit, met, …}]: `met` is null when the measurement is missing.
nlohmann::json BuildTargets(const nlohmann::json& scenarios, const nlohmann::json& ratios);

// [{scenario, cpu_ms_per_op, syscalls_per_op, host_cpu_ms_per_op, cpu_ns_per_byte, cpu_ops}]
// for every scenario that metered sbxd (scenarios.cc, SbxdMeter), or {scenario,
// cpu_unavailable} when it tried and could not: the figures that do not move with the load of
// a shared host.
nlohmann::json BuildRepeatable(const nlohmann::json& scenarios);

// One line per result for the terminal.
std::string FormatSummaryLine(const std::string& name, const nlohmann::json& result);

}  // namespace sbx::load
