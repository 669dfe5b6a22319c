#include "service/admission.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <vector>

#include "common/status_util.h"

namespace sbx::service {
namespace {

struct Resource {
  const char* name;   // details.resource
  const char* field;  // details.field: the request field that asked for it
  const char* unit;
  int64_t Demand::*member;
  int64_t HostCapacity::*host;
};

// Memory first: it is what the finding was about and what the OOM killer takes from the host.
constexpr Resource kResources[] = {
    {"memory", "resources.memory_mib", "MiB", &Demand::memory_mib, &HostCapacity::memory_mib},
    {"vcpu", "resources.vcpu", "vCPUs", &Demand::vcpu, &HostCapacity::vcpu},
    {"disk", "resources.disk_mib", "MiB", &Demand::disk_mib, &HostCapacity::disk_mib},
};

int64_t PercentOf(const Resource& r, const AdmissionSettings& s) {
  if (r.member == &Demand::memory_mib) return s.memory_overcommit_percent;
  if (r.member == &Demand::vcpu) return s.cpu_overcommit_percent;
  return s.disk_overcommit_percent;
}

int64_t ReserveOf(const Resource& r, const AdmissionSettings& s) {
  if (r.member == &Demand::memory_mib) return s.reserve_memory_mib;
  if (r.member == &Demand::disk_mib) return s.reserve_disk_mib;
  return 0;  // CPU time left over goes to the host anyway: nothing to set aside
}

std::string HowComputed(const Resource& r, const HostCapacity& host, const AdmissionSettings& s) {
  const int64_t reserve = ReserveOf(r, s);
  std::string out = fmt::format("host {} {} x {:.2f}", host.*r.host, r.unit,
                                static_cast<double>(PercentOf(r, s)) / 100.0);
  if (reserve > 0) out += fmt::format(" - {} {} reserved for the host", reserve, r.unit);
  return out;
}

}  // namespace

Demand CapacityOf(const HostCapacity& host, const AdmissionSettings& s) {
  Demand out;
  for (const Resource& r : kResources) {
    // Integer arithmetic in MiB/vCPUs: the percentages keep the ratios exact.
    const int64_t c = host.*r.host * PercentOf(r, s) / 100 - ReserveOf(r, s);
    out.*r.member = std::max<int64_t>(0, c);
  }
  return out;
}

absl::Status CheckFits(const Demand& want, const Demand& reserved, const Demand& capacity,
                       const HostCapacity& host, const AdmissionSettings& s,
                       std::string_view what) {
  std::vector<const Resource*> never, not_now;
  for (const Resource& r : kResources) {
    if (want.*r.member > capacity.*r.member) {
      never.push_back(&r);
    } else if (reserved.*r.member + want.*r.member > capacity.*r.member) {
      not_now.push_back(&r);
    }
  }
  if (never.empty() && not_now.empty()) return absl::OkStatus();
  // A request that can never fit says so even when another resource is merely busy now: a
  // retry would not help.
  const bool permanent = !never.empty();
  const auto& failing = permanent ? never : not_now;
  std::vector<std::string> parts;
  for (const Resource* r : failing) {
    const int64_t available = std::max<int64_t>(0, capacity.*r->member - reserved.*r->member);
    if (permanent) {
      parts.push_back(fmt::format("{}: {} asks for {} {}, more than this host can ever give one "
                                  "sandbox ({} {} = {})",
                                  r->name, what, want.*r->member, r->unit, capacity.*r->member,
                                  r->unit, HowComputed(*r, host, s)));
    } else {
      parts.push_back(fmt::format("{}: {} asks for {} {}, {} {} of {} {} are free ({} {} held by "
                                  "other sandboxes; capacity = {})",
                                  r->name, what, want.*r->member, r->unit, available, r->unit,
                                  capacity.*r->member, r->unit, reserved.*r->member, r->unit,
                                  HowComputed(*r, host, s)));
    }
  }
  const Resource& first = *failing.front();
  absl::Status st =
      permanent
          ? ApiError(absl::StatusCode::kOutOfRange, "exceeds_capacity",
                     fmt::format("exceeds capacity: {}", fmt::join(parts, "; ")), first.field)
          : ApiError(absl::StatusCode::kResourceExhausted, "insufficient_capacity",
                     fmt::format("insufficient capacity: {}", fmt::join(parts, "; ")),
                     first.field);
  st = WithDetail(st, "resource", first.name);
  st = WithDetail(st, "requested", fmt::format("{}", want.*first.member));
  st = WithDetail(st, "available",
                  fmt::format("{}", std::max<int64_t>(0, capacity.*first.member -
                                                             reserved.*first.member)));
  st = WithDetail(st, "capacity", fmt::format("{}", capacity.*first.member));
  return st;
}

Admission::Admission(AdmissionSettings settings, Probe probe)
    : probe_(std::move(probe)), settings_(settings) {}

void Admission::SetSettings(const AdmissionSettings& s) {
  std::lock_guard lock(mu_);
  settings_ = s;
}

AdmissionSettings Admission::settings() const {
  std::lock_guard lock(mu_);
  return settings_;
}

Demand Admission::ReservedLocked() const {
  Demand sum;
  for (const auto& [id, d] : held_) sum += d;
  return sum;
}

absl::Status Admission::Admit(const std::string& id, const Demand& want, std::string_view what) {
  std::lock_guard lock(mu_);
  SBX_RETURN_IF_ERROR(CheckCountLocked(id, what));
  if (settings_.enabled && probe_) {
    // Probed under the lock: the disk's free space moves, and two admissions must not both
    // count the same free space.
    absl::StatusOr<HostCapacity> host = probe_();
    if (!host.ok()) {
      return ApiError(absl::StatusCode::kUnavailable, "unavailable",
                      fmt::format("admission: the host's capacity cannot be read: {}",
                                  std::string(host.status().message())));
    }
    Demand reserved = ReservedLocked();
    if (auto it = held_.find(id); it != held_.end()) {
      reserved.vcpu -= it->second.vcpu;
      reserved.memory_mib -= it->second.memory_mib;
      reserved.disk_mib -= it->second.disk_mib;
    }
    SBX_RETURN_IF_ERROR(
        CheckFits(want, reserved, CapacityOf(*host, settings_), *host, settings_, what));
  }
  held_[id] = want;
  return absl::OkStatus();
}

absl::Status Admission::CheckCountLocked(const std::string& id, std::string_view what) const {
  const int64_t max = settings_.max_sandboxes;
  if (max <= 0 || held_.count(id) > 0) return absl::OkStatus();
  const auto held = static_cast<int64_t>(held_.size());
  if (held < max) return absl::OkStatus();
  absl::Status st = ApiError(
      absl::StatusCode::kResourceExhausted, "insufficient_capacity",
      fmt::format("insufficient capacity: sandboxes: {} would be one more than the {} this sbxd "
                  "holds at once ({} held, warm pool included; admission.max_sandboxes)",
                  what, max, held));
  st = WithDetail(st, "resource", "sandboxes");
  st = WithDetail(st, "requested", "1");
  st = WithDetail(st, "available", "0");
  st = WithDetail(st, "capacity", fmt::format("{}", max));
  return st;
}

void Admission::Hold(const std::string& id, const Demand& want) {
  std::lock_guard lock(mu_);
  held_[id] = want;
}

bool Admission::Release(const std::string& id) {
  std::lock_guard lock(mu_);
  return held_.erase(id) > 0;
}

bool Admission::Holds(const std::string& id) const {
  std::lock_guard lock(mu_);
  return held_.count(id) > 0;
}

Admission::Snapshot Admission::Read() const {
  Snapshot out;
  AdmissionSettings s;
  {
    std::lock_guard lock(mu_);
    s = settings_;
    out.reserved = ReservedLocked();
    out.holders = static_cast<int64_t>(held_.size());
  }
  out.enabled = s.enabled;
  if (probe_) {
    auto host = probe_();
    if (host.ok()) {
      out.probed = true;
      out.host = *host;
      out.capacity = CapacityOf(*host, s);
    } else {
      spdlog::warn("admission: the host's capacity cannot be read: {}",
                   std::string(host.status().message()));
    }
  }
  return out;
}

}  // namespace sbx::service
