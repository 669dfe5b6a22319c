#include "net/sandbox_net.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "common/status_util.h"
#include "common/unique_fd.h"
#include "net/netlink.h"

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

}  // namespace

SandboxNetwork::SandboxNetwork(NetworkHost* host, std::string id, SandboxAddrs addrs)
    : host_(host), id_(std::move(id)), veth_(VethName(addrs.slot)), addrs_(addrs) {}

SandboxNetwork::~SandboxNetwork() {
  if (absl::Status st = Destroy(); !st.ok()) {
    spdlog::warn("sandbox {}: network teardown: {}", id_, std::string(st.message()));
  }
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
    absl::Status st = host_->nft_->Run(DeleteSandboxRuleset(id_, veth_),
                                       fmt::format("sandbox {}: remove its nftables rules", id_));
    if (!st.ok()) {
      // nftables 1.0.6 has no "delete if present": a sweep may have removed them already.
      auto chains = host_->nft_->ListSandboxChains();
      if (chains.ok() && !chains->count(id_)) st = absl::OkStatus();
    }
    if (st.ok()) rules_ = false;
    else first.Update(st);
  }
  // The slot goes back only once nothing of this sandbox uses its addresses any more.
  if (slot_ && !link_ && !rules_) {
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

absl::StatusOr<std::unique_ptr<SandboxNetwork>> NetworkHost::Attach(const std::string& id,
                                                                    int netns_fd,
                                                                    const SandboxPolicy& policy) {
  if (!IsSafeName(id)) {
    return absl::InvalidArgumentError(fmt::format("network: '{}' is not a sandbox id", id));
  }
  SBX_ASSIGN_OR_RETURN(SandboxAddrs addrs, pool_.Allocate());
  std::unique_ptr<SandboxNetwork> net(new SandboxNetwork(this, id, addrs));
  const std::string& veth = net->veth_;
  SBX_RETURN_IF_ERROR(nft_->Run(AddSandboxRuleset(id, veth, addrs, cfg_, policy),
                                fmt::format("sandbox {}: add its nftables rules", id)));
  net->rules_ = true;
  SBX_ASSIGN_OR_RETURN(Netlink host, Netlink::Open());
  SBX_RETURN_IF_ERROR(host.CreateVeth(veth, kSandboxIfName, netns_fd));
  net->link_ = true;
  SBX_ASSIGN_OR_RETURN(int host_idx, host.IfIndex(veth));
  SBX_RETURN_IF_ERROR(host.SetAlias(host_idx, id));
  SBX_RETURN_IF_ERROR(host.AddAddress(host_idx, addrs.host4));
  SBX_RETURN_IF_ERROR(host.AddAddress(host_idx, addrs.host6));
  SBX_RETURN_IF_ERROR(host.SetUp(host_idx));
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
  return net;
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

absl::StatusOr<std::unique_ptr<SandboxNetwork>> NetworkHost::Adopt(const std::string& id) {
  SBX_ASSIGN_OR_RETURN(auto veths, SandboxVeths());
  auto it = veths.find(id);
  if (it == veths.end()) return absl::NotFoundError(fmt::format("sandbox {}: no veth left", id));
  SBX_ASSIGN_OR_RETURN(SandboxAddrs addrs, pool_.Reserve(*SlotOfVethName(it->second)));
  std::unique_ptr<SandboxNetwork> net(new SandboxNetwork(this, id, addrs));
  net->link_ = true;
  net->rules_ = true;
  return net;
}

absl::Status NetworkHost::Sweep(const std::set<std::string>& known_ids) {
  absl::Status first = absl::OkStatus();
  SBX_ASSIGN_OR_RETURN(auto veths, SandboxVeths());
  SBX_ASSIGN_OR_RETURN(Netlink nl, Netlink::Open());
  for (const auto& [id, name] : veths) {
    if (known_ids.count(id)) continue;
    spdlog::info("network sweep: removing veth {} of sandbox {} (gone)", name, id);
    auto idx = nl.IfIndex(name);
    absl::Status st = idx.ok() ? nl.DeleteLink(*idx) : idx.status();
    if (!st.ok() && !absl::IsNotFound(st)) first.Update(st);
  }
  SBX_ASSIGN_OR_RETURN(auto chains, nft_->ListSandboxChains());
  for (const auto& [id, veth] : chains) {
    if (known_ids.count(id) || !IsSafeName(id)) continue;
    spdlog::info("network sweep: removing nftables chain of sandbox {} (gone)", id);
    first.Update(nft_->Run(DeleteSandboxRuleset(id, veth),
                           fmt::format("network sweep: remove sandbox {}'s rules", id)));
  }
  return first;
}

absl::StatusOr<DenialCounts> NetworkHost::Denials(const std::string& id) {
  SBX_ASSIGN_OR_RETURN(auto all, nft_->ReadAllCounters());
  auto it = all.find(id);
  if (it == all.end()) return absl::NotFoundError(fmt::format("sandbox {}: no denial counters", id));
  return it->second;
}

absl::StatusOr<std::map<std::string, DenialCounts>> NetworkHost::AllDenials() {
  return nft_->ReadAllCounters();
}

}  // namespace sbx::net
