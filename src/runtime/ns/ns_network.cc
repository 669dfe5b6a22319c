#include "runtime/ns/ns_network.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "common/status_util.h"
#include "common/unique_fd.h"
#include "net/dns_policy.h"
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

absl::StatusOr<std::unique_ptr<net::SandboxNetwork>> PrebuildNetwork(net::NetworkHost* host,
                                                                     const std::string& id,
                                                                     NetnsPool* pool,
                                                                     UniqueFd* netns) {
  if (host == nullptr) {
    return absl::FailedPreconditionError(fmt::format(
        "create {}: network-ready: this sbxd has networking off (egress.enabled)", id));
  }
  std::optional<PooledNetns> pooled = pool ? pool->TakeNetworked() : std::nullopt;
  if (!pooled) {
    auto built = BuildNetworkedNetns(host);
    if (!built.ok()) return Annotate(built.status(), fmt::format("create {}: network-ready", id));
    pooled = std::move(*built);
  }
  *netns = std::move(pooled->netns);
  return std::move(pooled->network);
}

absl::Status ClaimNetwork(net::NetworkHost* host, const std::string& id,
                          const nlohmann::json& egress, net::SandboxNetwork& network) {
  auto resolved = net::ResolvedEgress::FromJson(egress);
  if (!resolved.ok()) return Annotate(resolved.status(), fmt::format("attach egress {}", id));
  if (!resolved->networked) {
    return absl::InvalidArgumentError(fmt::format(
        "attach egress {}: profile '{}' is not networked", id, resolved->profile));
  }
  return Annotate(host->Claim(network, id, resolved->policy()),
                  fmt::format("attach egress {}", id));
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

namespace {

std::string ResolvConfFile(const std::string& dir) { return dir + "/resolv.conf"; }

}  // namespace

absl::StatusOr<BindMount> PlanResolvConf(const TemplateSpec& tmpl, const std::string& dir) {
  namespace fs = std::filesystem;
  // The template's /etc: a bind of it (base: the host's) or its rootfs.
  std::string etc = tmpl.rootfs_dir + "/etc";
  for (const auto& b : tmpl.binds) {
    if (b.sandbox_path == "/etc") etc = b.host_path;
  }
  std::string target = "/etc/resolv.conf";
  std::error_code ec;
  const fs::path link = fs::path(etc) / "resolv.conf";
  if (fs::is_symlink(fs::symlink_status(link, ec))) {
    const fs::path to = fs::read_symlink(link, ec);
    if (!ec) target = (to.is_absolute() ? to : fs::path("/etc") / to).lexically_normal().string();
  }
  const std::string file = ResolvConfFile(dir);
  UniqueFd fd(::open(file.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0644));
  if (!fd) return ErrnoStatus(errno, fmt::format("resolv.conf: open({})", file));
  return BindMount{file, target, true};
}

absl::Status WriteResolvConf(const std::string& dir, const net::SandboxNetwork& network) {
  const std::string file = ResolvConfFile(dir);
  const std::string text = net::SandboxResolvConf(network.addrs().host4, network.addrs().host6);
  UniqueFd fd(::open(file.c_str(), O_WRONLY | O_TRUNC | O_CLOEXEC | O_NOFOLLOW));
  if (!fd) return ErrnoStatus(errno, fmt::format("resolv.conf: open({})", file));
  if (::write(fd.get(), text.data(), text.size()) != static_cast<ssize_t>(text.size())) {
    return ErrnoStatus(errno, fmt::format("resolv.conf: write({})", file));
  }
  return absl::OkStatus();
}

nlohmann::json NetworkPolicyJson(const net::SandboxNetwork* network) {
  if (network == nullptr || !network->policy()) return nullptr;
  const net::SandboxPolicy& p = *network->policy();
  return net::ResolvedEgress{.profile = p.profile, .networked = true, .narrowed = p.narrowed}.ToJson();
}

}  // namespace sbx::runtime::ns
