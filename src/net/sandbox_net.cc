#include "net/sandbox_net.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "common/status_util.h"
#include "common/unique_fd.h"
#include "net/netlink.h"
#include "net/tap.h"
#include "net/nft_counters.h"

namespace sbx::net {
namespace {

absl::Status WriteSysctl(const char* path, const char* value) {
  UniqueFd fd(::open(path, O_WRONLY | O_CLOEXEC));
  if (!fd) return ErrnoStatus(errno, fmt::format("network start: open({})", path));
  if (::write(fd.get(), value, 1) != 1) return ErrnoStatus(errno, fmt::format("network start: write({})", path));
  return absl::OkStatus();
}

// The sandbox end is created inside its namespace under this name.
constexpr char kSandboxIfName[] = "eth0";
// The kernel's link-watch work runs a veth's "urgent" carrier change at once, so the wait is
// normally well under a millisecond; this bounds a kernel that falls behind.
constexpr int kOperUpTimeoutMs = 2000;

}  // namespace

std::string PooledAlias(const std::string& veth) { return "pooled_" + veth; }

SandboxNetwork::SandboxNetwork(NetworkHost* host, std::string id, SandboxAddrs addrs,
                               std::optional<SandboxPolicy> policy)
    : host_(host),
      id_(std::move(id)),
      veth_(VethName(addrs.slot)),
      addrs_(addrs),
      policy_(std::move(policy)) {}

SandboxNetwork::~SandboxNetwork() {
  if (absl::Status st = Destroy(); !st.ok()) {
    spdlog::warn("sandbox {}: network teardown: {}", id_, std::string(st.message()));
  }
}

void SandboxNetwork::Release() {
  if (slot_) host_->Unregister(veth_);
  link_ = rules_ = slot_ = false;
}

absl::Status SandboxNetwork::Destroy() {
  absl::Status first = absl::OkStatus();
  if (link_) {
    auto nl = Netlink::Open();
    absl::Status st = nl.status();
    if (nl.ok()) {
      auto idx = nl->IfIndex(veth_);
      if (idx.ok()) st = nl->DeleteLink(*idx);
      else st = idx.status();
    }
    if (st.ok() || absl::IsNotFound(st)) link_ = false;
    else first.Update(st);
  }
  if (rules_) {
    absl::Status st = host_->RemoveRules(id_, veth_, addrs_, narrowed_, tap_);
    if (st.ok()) rules_ = false;
    else first.Update(st);
  }
  // The slot goes back only once nothing of this sandbox uses its addresses any more.
  if (slot_ && !link_ && !rules_) {
    host_->Unregister(veth_);
    host_->names_.Forget(id_);
    host_->denials_log_.Forget(id_);
    host_->pool_.Release(addrs_.slot);
    slot_ = false;
  }
  return first;
}

absl::StatusOr<std::unique_ptr<NetworkHost>> NetworkHost::Start(const NetPolicyConfig& cfg) {
  SBX_ASSIGN_OR_RETURN(AddrPool pool, AddrPool::Make(cfg.pool4, cfg.pool6));
  SBX_RETURN_IF_ERROR(WriteSysctl("/proc/sys/net/ipv4/ip_forward", "1"));
  SBX_RETURN_IF_ERROR(WriteSysctl("/proc/sys/net/ipv6/conf/all/forwarding", "1"));
  SBX_ASSIGN_OR_RETURN(std::unique_ptr<Nft> nft, Nft::Open());
  SBX_RETURN_IF_ERROR(nft->Run(BaseRuleset(cfg), "network start: create sbx's nftables table"));
  return std::unique_ptr<NetworkHost>(new NetworkHost(cfg, std::move(pool), std::move(nft)));
}

absl::Status NetworkHost::CheckPolicy(const std::string& id, const SandboxPolicy& policy) const {
  if (!IsSafeName(id)) {
    return absl::InvalidArgumentError(fmt::format("network: '{}' is not a sandbox id", id));
  }
  bool known = policy.profile == "open";
  for (const auto& p : cfg_.profiles) known = known || (p.networked && p.name == policy.profile);
  if (!known) {
    return absl::InvalidArgumentError(
        fmt::format("network: sandbox {}: no networked egress profile '{}'", id, policy.profile));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<SandboxNetwork>> NetworkHost::Attach(const std::string& id,
                                                                    int netns_fd,
                                                                    const SandboxPolicy& policy) {
  return AttachLink(id, netns_fd, policy, /*tap=*/false);
}

absl::StatusOr<std::unique_ptr<SandboxNetwork>> NetworkHost::AttachTap(const std::string& id,
                                                                       const SandboxPolicy& policy,
                                                                       uint32_t owner) {
  return AttachLink(id, -1, policy, /*tap=*/true, owner);
}

absl::StatusOr<std::unique_ptr<SandboxNetwork>> NetworkHost::AttachLink(const std::string& id, int netns_fd,
                                                                        const SandboxPolicy& policy, bool tap,
                                                                        uint32_t tap_owner) {
  SBX_RETURN_IF_ERROR(CheckPolicy(id, policy));
  SBX_ASSIGN_OR_RETURN(SandboxAddrs addrs, pool_.Allocate());
  std::unique_ptr<SandboxNetwork> net(new SandboxNetwork(this, id, addrs, policy));
  Register(*net);
  {
    std::lock_guard lock(mu_);
    net_of_id_[id] = net.get();
  }
  net->narrowed_ = policy.narrowed.has_value();
  net->tap_ = tap;
  SBX_RETURN_IF_ERROR(nft_->Run(AddSandboxRuleset(id, net->veth_, addrs, cfg_, policy, tap),
                                fmt::format("sandbox {}: add its nftables rules", id)));
  net->rules_ = true;
  SBX_RETURN_IF_ERROR(BuildLink(*net, netns_fd, id, tap, tap_owner));
  return net;
}

absl::StatusOr<std::unique_ptr<SandboxNetwork>> NetworkHost::Prebuild(int netns_fd) {
  SBX_ASSIGN_OR_RETURN(SandboxAddrs addrs, pool_.Allocate());
  std::unique_ptr<SandboxNetwork> net(new SandboxNetwork(this, "", addrs, std::nullopt));
  Register(*net);
  SBX_RETURN_IF_ERROR(BuildLink(*net, netns_fd, PooledAlias(net->veth_)));
  return net;
}

absl::Status NetworkHost::Claim(SandboxNetwork& net, const std::string& id,
                                const SandboxPolicy& policy) {
  SBX_RETURN_IF_ERROR(CheckPolicy(id, policy));
  if (!net.id_.empty() || !net.link_ || net.rules_) {
    return absl::FailedPreconditionError(
        fmt::format("network: sandbox {}: veth {} is not an unclaimed pooled one", id, net.veth_));
  }
  net.id_ = id;
  net.policy_ = policy;
  Register(net);
  {
    std::lock_guard lock(mu_);
    net_of_id_[id] = &net;
  }
  net.narrowed_ = policy.narrowed.has_value();
  SBX_RETURN_IF_ERROR(nft_->Run(AddSandboxRuleset(id, net.veth_, net.addrs_, cfg_, policy),
                                fmt::format("sandbox {}: add its nftables rules", id)));
  net.rules_ = true;
  SBX_ASSIGN_OR_RETURN(Netlink host, Netlink::Open());
  return host.SetAlias(net.ifindex_, id);
}

absl::Status NetworkHost::BuildLink(SandboxNetwork& net, int netns_fd, const std::string& alias, bool tap,
                                    uint32_t tap_owner) {
  const SandboxAddrs& addrs = net.addrs_;
  SBX_ASSIGN_OR_RETURN(Netlink host, Netlink::Open());
  if (tap) {
    SBX_RETURN_IF_ERROR(CreatePersistentTap(net.veth_, tap_owner));
  } else {
    SBX_RETURN_IF_ERROR(host.CreateVeth(net.veth_, kSandboxIfName, netns_fd));
  }
  net.link_ = true;
  SBX_ASSIGN_OR_RETURN(int host_idx, host.IfIndex(net.veth_));
  net.ifindex_ = host_idx;
  Register(net);  // now with its interface index
  SBX_RETURN_IF_ERROR(host.SetAlias(host_idx, alias));
  SBX_RETURN_IF_ERROR(host.AddAddress(host_idx, addrs.host4));
  SBX_RETURN_IF_ERROR(host.AddAddress(host_idx, addrs.host6));
  SBX_RETURN_IF_ERROR(host.SetUp(host_idx));
  if (tap) {
    // A tap has no carrier until its VMM opens it, and its other end is the guest's NIC: no
    // sandbox end to set up here, no wait. Only the direction toward the sandbox is shaped
    // (the guest sends through QEMU, outside any qdisc of ours).
    return LimitRate(alias, host_idx, -1, 0);
  }
  SBX_ASSIGN_OR_RETURN(Netlink inside, Netlink::Open(netns_fd));
  SBX_ASSIGN_OR_RETURN(int idx, inside.IfIndex(kSandboxIfName));
  SBX_RETURN_IF_ERROR(inside.AddAddress(idx, addrs.sandbox4));
  SBX_RETURN_IF_ERROR(inside.AddAddress(idx, addrs.sandbox6));
  SBX_RETURN_IF_ERROR(inside.SetUp(idx));
  IpPrefix gw4 = addrs.host4, gw6 = addrs.host6;
  gw4.len = 32;
  gw6.len = 128;
  SBX_RETURN_IF_ERROR(inside.AddDefaultRoute(idx, gw4));
  SBX_RETURN_IF_ERROR(inside.AddDefaultRoute(idx, gw6));
  // Both ends must carry packets before the sandbox's first one: the first DNS query or SYN
  // would otherwise vanish into the link's initial no-op qdisc (a retry 1-5 s later).
  SBX_RETURN_IF_ERROR(inside.WaitOperUp(idx, kOperUpTimeoutMs));
  SBX_RETURN_IF_ERROR(host.WaitOperUp(host_idx, kOperUpTimeoutMs));
  return LimitRate(alias, host_idx, netns_fd, idx);
}

absl::StatusOr<std::map<std::string, std::string>> NetworkHost::SandboxVeths() {
  SBX_ASSIGN_OR_RETURN(Netlink nl, Netlink::Open());
  SBX_ASSIGN_OR_RETURN(std::vector<LinkInfo> links, nl.ListLinks());
  std::map<std::string, std::string> out;
  for (const auto& l : links) {
    if (SlotOfVethName(l.name).has_value()) out[l.alias] = l.name;
  }
  return out;
}

absl::StatusOr<std::unique_ptr<SandboxNetwork>> NetworkHost::Adopt(
    const std::string& id, std::optional<SandboxPolicy> policy) {
  SBX_ASSIGN_OR_RETURN(auto veths, SandboxVeths());
  auto it = veths.find(id);
  if (it == veths.end()) return absl::NotFoundError(fmt::format("sandbox {}: no veth left", id));
  SBX_ASSIGN_OR_RETURN(SandboxAddrs addrs, pool_.Reserve(*SlotOfVethName(it->second)));
  std::unique_ptr<SandboxNetwork> net(new SandboxNetwork(this, id, addrs, std::move(policy)));
  {
    SBX_ASSIGN_OR_RETURN(Netlink nl, Netlink::Open());
    auto idx = nl.IfIndex(net->veth_);
    if (idx.ok()) net->ifindex_ = *idx;
  }
  Register(*net);
  {
    std::lock_guard lock(mu_);
    net_of_id_[id] = net.get();
  }
  net->link_ = true;
  net->rules_ = true;
  // A tap (a microVM's: tun devices have tun_flags) is policed through the `taps` set; one
  // made by an sbxd from before that set joins it now.
  struct stat tun {};
  if (::stat(fmt::format("/sys/class/net/{}/tun_flags", net->veth_).c_str(), &tun) == 0) {
    net->tap_ = true;
    SBX_RETURN_IF_ERROR(nft_->Run(AddTapElement(net->veth_), fmt::format("sandbox {}: its tap into the taps set", id)));
  }
  auto mapped = nft_->MappedVeths();
  net->narrowed_ = mapped.ok() && (*mapped)[net->veth_] == id;
  return net;
}

void NetworkHost::Register(const SandboxNetwork& net) {
  std::lock_guard lock(mu_);
  live_[net.veth_] = Live{.id = net.id_, .ifindex = net.ifindex_, .addrs = net.addrs_,
                          .policy = net.policy_};
}

void NetworkHost::Unregister(const std::string& veth) {
  std::lock_guard lock(mu_);
  auto it = live_.find(veth);
  if (it != live_.end()) net_of_id_.erase(it->second.id);
  live_.erase(veth);
}

std::optional<std::string> NetworkHost::IdOfIfindex(int ifindex) {
  if (ifindex <= 0) return std::nullopt;
  std::lock_guard lock(mu_);
  for (const auto& [veth, l] : live_) {
    if (l.ifindex == ifindex && !l.id.empty()) return l.id;
  }
  return std::nullopt;
}

std::optional<std::string> NetworkHost::IdOfAddress(const IpPrefix& addr) {
  auto same = [&](const IpPrefix& own) {
    return own.family == addr.family &&
           std::equal(own.addr.begin(), own.addr.begin() + own.bytes(), addr.addr.begin());
  };
  std::lock_guard lock(mu_);
  for (const auto& [veth, l] : live_) {
    if (!l.id.empty() && (same(l.addrs.sandbox4) || same(l.addrs.sandbox6))) return l.id;
  }
  return std::nullopt;
}

EffectiveRules NetworkHost::RulesOfPolicy(const SandboxPolicy& policy) const {
  EffectiveRules r{.profile = policy.profile};
  if (policy.profile == "open") {
    r.allow = OpenProfile().allow;
  } else {
    for (const auto& p : cfg_.profiles) {
      if (p.name != policy.profile) continue;
      r.allow = p.allow;
      r.deny = p.deny;
    }
  }
  if (policy.narrowed) r.allow = *policy.narrowed;
  return r;
}

std::optional<EffectiveRules> NetworkHost::RulesOf(const std::string& id) {
  std::optional<SandboxPolicy> policy;
  {
    std::lock_guard lock(mu_);
    for (const auto& [veth, l] : live_) {
      if (l.id == id) policy = l.policy;
    }
  }
  if (!policy) return std::nullopt;
  return RulesOfPolicy(*policy);
}

absl::Status NetworkHost::SetPolicy(const std::string& id, const SandboxPolicy& policy) {
  std::lock_guard lock(mu_);
  for (auto& [veth, l] : live_) {
    if (l.id != id) continue;
    l.policy = policy;
    return absl::OkStatus();
  }
  return absl::NotFoundError(fmt::format("sandbox {}: no network", id));
}

absl::Status NetworkHost::RemoveRules(const std::string& id, const std::string& veth,
                                      const SandboxAddrs& addrs, bool narrowed, bool tap) {
  std::vector<std::string> cmds = DeleteSandboxCommands(id, veth, addrs, narrowed, tap);
  std::string all;
  for (const auto& c : cmds) all += c + "\n";
  std::string what = fmt::format("sandbox {}: remove its nftables rules", id);
  if (nft_->Run(all, what).ok()) return absl::OkStatus();
  // nftables 1.0.6 has no "delete if present": one by one, where "not there" is success.
  absl::Status first = absl::OkStatus();
  for (const auto& c : cmds) {
    absl::Status st = nft_->Run(c, what);
    if (!st.ok() && st.message().find("No such file or directory") == std::string::npos) first.Update(st);
  }
  return first;
}

absl::Status NetworkHost::Sweep(const std::set<std::string>& known_ids) {
  absl::Status first = absl::OkStatus();
  SBX_ASSIGN_OR_RETURN(auto veths, SandboxVeths());
  SBX_ASSIGN_OR_RETURN(Netlink nl, Netlink::Open());
  std::set<std::string> kept_veths;
  {
    // This sbxd's own live networks, pooled ones included, are never leftovers.
    std::lock_guard lock(mu_);
    for (const auto& [veth, l] : live_) kept_veths.insert(veth);
  }
  for (const auto& [id, name] : veths) {
    if (known_ids.count(id) || kept_veths.count(name)) {
      kept_veths.insert(name);
      continue;
    }
    spdlog::info("network sweep: removing veth {} of sandbox {} (gone)", name, id);
    auto idx = nl.IfIndex(name);
    absl::Status st = idx.ok() ? nl.DeleteLink(*idx) : idx.status();
    if (!st.ok() && !absl::IsNotFound(st)) first.Update(st);
  }
  // Elements of veths that are gone or belong to no known sandbox.
  SBX_ASSIGN_OR_RETURN(auto mapped, nft_->MappedVeths());
  for (const auto& [veth, target] : mapped) {
    if (kept_veths.count(veth)) continue;
    auto slot = SlotOfVethName(veth);
    if (!slot.has_value() || *slot >= pool_.capacity()) continue;
    spdlog::info("network sweep: removing nftables elements of veth {} (its sandbox is gone)", veth);
    bool narrowed = target.rfind("p_", 0) != 0;
    // Whether it was a tap is not known any more: its element is removed if there.
    first.Update(RemoveRules(narrowed ? target : "gone", veth, pool_.AddrsOf(*slot), narrowed, /*tap=*/true));
  }
  SBX_ASSIGN_OR_RETURN(auto chains, nft_->SandboxChains());
  for (const auto& id : chains) {
    if (known_ids.count(id) || !IsSafeName(id)) continue;
    first.Update(nft_->Run(fmt::format("flush chain inet {} {}\ndelete chain inet {} {}", kTable, id, kTable, id),
                           fmt::format("network sweep: remove sandbox {}'s chain", id)));
  }
  return first;
}

absl::StatusOr<DenialCounts> NetworkHost::Denials(const std::string& id) {
  std::string veth;
  if (id.empty()) return absl::NotFoundError("network: no sandbox id");
  {
    std::lock_guard lock(mu_);
    for (const auto& [v, l] : live_) {
      if (l.id == id) veth = v;
    }
  }
  if (veth.empty()) return absl::NotFoundError(fmt::format("sandbox {}: no network", id));
  return ReadVethCounters(veth);
}

absl::StatusOr<std::map<std::string, DenialCounts>> NetworkHost::AllDenials() {
  SBX_ASSIGN_OR_RETURN(auto by_veth, nft_->ReadAllCounters());
  std::map<std::string, DenialCounts> out;
  std::lock_guard lock(mu_);
  for (auto& [veth, counts] : by_veth) {
    auto it = live_.find(veth);
    if (it != live_.end()) out[it->second.id] = std::move(counts);
  }
  return out;
}

}  // namespace sbx::net
