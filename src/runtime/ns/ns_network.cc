#include "runtime/ns/ns_network.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "common/status_util.h"
#include "net/profiles.h"

namespace sbx::runtime::ns {

absl::StatusOr<std::unique_ptr<net::SandboxNetwork>> AttachNetwork(net::NetworkHost* host,
                                                                   const std::string& id,
                                                                   const nlohmann::json& egress,
                                                                   NetnsPool* pool, UniqueFd* netns) {
  auto resolved = net::ResolvedEgress::FromJson(egress);
  if (!resolved.ok()) return Annotate(resolved.status(), fmt::format("create {}: network", id));
  if (host == nullptr) {
    return absl::FailedPreconditionError(fmt::format(
        "create {}: network: egress profile '{}' needs networking, which this sbxd has off "
        "(egress.enabled)",
        id, resolved->profile));
  }
  const net::SandboxPolicy policy = resolved->policy();
  std::optional<PooledNetns> pooled = pool ? pool->TakeNetworked() : std::nullopt;
  if (pooled) {
    // On an error the pooled network and namespace go with `pooled`.
    SBX_RETURN_IF_ERROR(Annotate(host->Claim(*pooled->network, id, policy),
                                 fmt::format("create {}: network (pooled)", id)));
    *netns = std::move(pooled->netns);
    spdlog::debug("create {}: network: pooled veth {}", id, pooled->network->veth());
    return std::move(pooled->network);
  }
  spdlog::debug("create {}: network: none pooled, built now", id);
  *netns = pool ? pool->Take() : UniqueFd();
  if (!*netns) {
    SBX_ASSIGN_OR_RETURN(*netns, BuildNetns());
  }
  auto network = host->Attach(id, netns->get(), policy);
  if (!network.ok()) return Annotate(network.status(), fmt::format("create {}: network", id));
  return network;
}

std::unique_ptr<net::SandboxNetwork> AdoptNetwork(net::NetworkHost* host, const std::string& id,
                                                  const nlohmann::json& egress) {
  if (host == nullptr) return nullptr;
  std::optional<net::SandboxPolicy> policy;
  if (!egress.is_null()) {
    auto resolved = net::ResolvedEgress::FromJson(egress);
    if (resolved.ok()) policy = resolved->policy();
    else spdlog::error("ns: adopt {}: network policy: {}", id, std::string(resolved.status().message()));
  }
  auto network = host->Adopt(id, std::move(policy));
  if (network.ok()) return std::move(*network);
  if (!absl::IsNotFound(network.status())) {
    spdlog::error("ns: adopt {}: network: {}", id, std::string(network.status().message()));
  }
  return nullptr;
}

nlohmann::json NetworkPolicyJson(const net::SandboxNetwork* network) {
  if (network == nullptr || !network->policy()) return nullptr;
  const net::SandboxPolicy& p = *network->policy();
  return net::ResolvedEgress{.profile = p.profile, .networked = true, .narrowed = p.narrowed}.ToJson();
}

}  // namespace sbx::runtime::ns
