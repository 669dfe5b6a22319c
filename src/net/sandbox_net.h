// The host side of sandbox networking: NetworkHost sets up sbx's nftables table once, hands out
// addresses and builds each networked sandbox's SandboxNetwork; the start-up sweep removes
// what sandboxes that are gone left behind.
//
// Steps of NetworkHost::Attach, in order (docs/isolation.md lists them as privileged steps):
//   1. a slot of the address pool (its /30 and /126);
//   2. the sandbox's nftables elements (its counters, its own addresses, its profile; a chain
//      of its own when narrowed), one transaction, so no packet of the sandbox is ever
//      forwarded before its rules exist (a veth without them is dropped anyway);
//   3. the veth pair: `sbxv<slot>` on the host, named after the sandbox id by its alias, and
//      `eth0` created directly inside the sandbox's network namespace;
//   4. host end: addresses .1 and ::1, up;
//   5. sandbox end (a netlink socket made inside its namespace): addresses .2 and ::2, up,
//      default routes via the host end.
// A failure undoes the steps done, in reverse.
//
// Pooled (issue 16's speed): Prebuild does steps 1 and 3-5 ahead of any create, for a namespace
// that belongs to no sandbox yet: the veth is named by the alias `pooled_<veth>` (never a
// sandbox id, so the start-up sweep removes one an earlier sbxd left) and has no nftables
// elements, so everything it sends is dropped (forward: not its own source address; input:
// nothing but neighbour discovery). Claim then names it after the sandbox and runs step 2:
// one transaction and one alias, the only network work left on the create path.
//
// Thread safety: NetworkHost's methods are safe to call concurrently.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "net/addr_pool.h"
#include "net/denial_log.h"
#include "net/name_table.h"
#include "net/nft.h"
#include "net/nflog.h"
#include "net/nft_ruleset.h"

namespace sbx::net {

class NetworkHost;

// What a live sandbox may reach by name and address: its narrowing (or its profile's allow
// rules) and its profile's deny rules. The operator's deny list and the always-blocked ranges
// are not here: they hold for every sandbox (NetPolicyConfig).
struct EffectiveRules {
  std::string profile;
  std::vector<EgressRule> allow;
  std::vector<EgressRule> deny;
};

// One sandbox's veth pair, addresses and nftables objects, named after its id. The destructor
// removes them (Destroy's errors are logged there); Destroy is idempotent.
class SandboxNetwork {
 public:
  ~SandboxNetwork();
  SandboxNetwork(const SandboxNetwork&) = delete;
  SandboxNetwork& operator=(const SandboxNetwork&) = delete;

  const std::string& id() const { return id_; }  // empty while pooled (unclaimed)
  const std::string& veth() const { return veth_; }
  const SandboxAddrs& addrs() const { return addrs_; }
  // The host end's interface index (0 when unknown).
  int ifindex() const { return ifindex_; }
  // What it was created with (or last PATCHed to); nullopt for one adopted from a record that
  // did not keep it.
  const std::optional<SandboxPolicy>& policy() const { return policy_; }
  absl::Status Destroy();
  // Leaves the network to the sandbox, which outlives this object (sbxd stops): the
  // destructor then removes nothing, and a restart's Adopt takes it back.
  void Release();

 private:
  friend class NetworkHost;
  SandboxNetwork(NetworkHost* host, std::string id, SandboxAddrs addrs,
                 std::optional<SandboxPolicy> policy);

  NetworkHost* host_;
  std::string id_;
  std::string veth_;
  SandboxAddrs addrs_;
  std::optional<SandboxPolicy> policy_;
  std::atomic<bool> narrowed_ = false;  // has a chain of its own (a create's narrowing or a PATCH)
  bool rules_ = false;  // step 2 done
  bool link_ = false;   // step 3 done
  bool slot_ = true;    // step 1 done, not yet given back
  bool tap_ = false;    // a microVM's tap, in the `taps` set (nft_ruleset.h)
  int ifindex_ = 0;     // of the host end, once step 3 is done
};

// The alias of a pooled veth that no sandbox has claimed yet.
std::string PooledAlias(const std::string& veth);


class NetworkHost {
 public:
  // Turns on IPv4 and IPv6 forwarding in the calling thread's network namespace and creates
  // (or refreshes) sbx's table. IPv6 forwarding makes interfaces with accept_ra=1 ignore
  // router advertisements (docs/isolation.md §2.3b): the caller sets up the uplink for it.
  static absl::StatusOr<std::unique_ptr<NetworkHost>> Start(const NetPolicyConfig& cfg);

  // Builds sandbox `id`'s network, its sandbox end in the namespace of `netns_fd`.
  absl::StatusOr<std::unique_ptr<SandboxNetwork>> Attach(const std::string& id, int netns_fd,
                                                         const SandboxPolicy& policy);
  // A microVM's network: steps 1 and 2 as Attach, then instead of a veth pair a persistent
  // tap (net/tap.h) named and addressed as the veth's host end would be. The VM's NIC holds
  // addrs().sandbox4/6 and routes via host4/6; the guest configures them itself.
  // `owner` (not 0): the uid that may open the tap without privileges (a VMM that opens its
  // NIC by name, as Firecracker does).
  absl::StatusOr<std::unique_ptr<SandboxNetwork>> AttachTap(const std::string& id,
                                                            const SandboxPolicy& policy,
                                                            uint32_t owner = 0);
  // Steps 1 and 3-5 for the namespace of `netns_fd`, which no sandbox has yet: a pooled
  // network (id() empty) that passes no traffic until Claim.
  absl::StatusOr<std::unique_ptr<SandboxNetwork>> Prebuild(int netns_fd);
  // Gives pooled network `net` to sandbox `id`: its alias and step 2. On an error `net` may
  // hold part of it; destroying it removes everything.
  absl::Status Claim(SandboxNetwork& net, const std::string& id, const SandboxPolicy& policy);
  // After a restart: takes back the network sandbox `id` still has (its veth and elements),
  // NotFound when it has none. `policy`: what it was created with (a sandbox persisted before
  // sbxd kept it has none: then no name resolves for it, the safe side).
  absl::StatusOr<std::unique_ptr<SandboxNetwork>> Adopt(const std::string& id,
                                                        std::optional<SandboxPolicy> policy = {});
  // Removes the veths, elements and chains of every sandbox not in `known_ids`, and the
  // elements of veths that no longer exist.
  absl::Status Sweep(const std::set<std::string>& known_ids);
  // Denials per reason of one sandbox (NotFound when it has no network), or of all, by id.
  absl::StatusOr<DenialCounts> Denials(const std::string& id);
  absl::StatusOr<std::map<std::string, DenialCounts>> AllDenials();

  // Which live sandbox a packet belongs to: by the host end it arrived on, or by its source
  // address (one of a sandbox's own; the veth validated it).
  std::optional<std::string> IdOfIfindex(int ifindex);
  std::optional<std::string> IdOfAddress(const IpPrefix& addr);
  // A live sandbox's effective rules; nullopt when it has no network here or its policy is
  // unknown (adopted from a record that did not keep it).
  std::optional<EffectiveRules> RulesOf(const std::string& id);
  // The policy a live sandbox's rules are read from (after a PATCH). NotFound when it has no
  // network here. Does not touch nftables: the caller changes the rules first.
  absl::Status SetPolicy(const std::string& id, const SandboxPolicy& policy);
  // The effective rules of `policy` under this host's configuration.
  EffectiveRules RulesOfPolicy(const SandboxPolicy& policy) const;

  // Shared by the resolver, the Host/SNI proxy, the NFLOG reader and the API.
  NameTable& names() { return names_; }
  DenialLog& denials_log() { return denials_log_; }

  // A PATCH (sandbox_patch.cc): sandbox `id`'s allow rules become `allow`, each within the
  // allow rules of its profile `profile` (the caller checks: ParseNarrowing), live in one
  // nftables transaction, and its policy (RulesOf) with them; then the open flows the new
  // rules forbid are cut (conntrack.h) and so are the connections sbxd's own proxies hold for
  // it (the cut hook). Returns the number of flows cut. NotFound when it has no network here.
  absl::StatusOr<int> PatchAllow(const std::string& id, const std::string& profile,
                                 const std::vector<EgressRule>& allow);
  // Called by PatchAllow with the sandbox's new effective rules, for connections that never
  // show in conntrack as the sandbox's (a Host/SNI proxy's own sockets: ConnProxy::
  // CutDisallowed). Set once, before sandboxes exist.
  using CutHook = std::function<void(const std::string& id, const EffectiveRules& rules)>;
  void SetCutHook(CutHook hook) { cut_hook_ = std::move(hook); }
  // Starts the reader of refused packets (nflog.h) that fills denials_log() with each
  // sandbox's recent denials. Once, after Start.
  absl::Status StartDenialReader();

  const NetPolicyConfig& config() const { return cfg_; }
  AddrPool& pool() { return pool_; }

 private:
  friend class SandboxNetwork;
  NetworkHost(NetPolicyConfig cfg, AddrPool pool, std::unique_ptr<Nft> nft)
      : cfg_(std::move(cfg)), pool_(std::move(pool)), nft_(std::move(nft)) {}
  // Every sbx veth on the host, by the sandbox id its alias names.
  absl::StatusOr<std::map<std::string, std::string>> SandboxVeths();
  // Removes a sandbox's elements (and chain): one transaction, or command by command when
  // part of it is already gone (a sweep, the kernel removing a veth).
  absl::Status RemoveRules(const std::string& id, const std::string& veth, const SandboxAddrs& addrs,
                           bool narrowed, bool tap);
  // Refuses an id that cannot be put in rules or a profile this host does not have.
  absl::Status CheckPolicy(const std::string& id, const SandboxPolicy& policy) const;
  // Attach and AttachTap: steps 1 and 2, then BuildLink.
  absl::StatusOr<std::unique_ptr<SandboxNetwork>> AttachLink(const std::string& id, int netns_fd,
                                                             const SandboxPolicy& policy, bool tap,
                                                             uint32_t tap_owner = 0);
  // Steps 3-5 for `net` (step 1 done), its veth named by `alias`; `tap`: a tap instead.
  absl::Status BuildLink(SandboxNetwork& net, int netns_fd, const std::string& alias, bool tap = false,
                         uint32_t tap_owner = 0);
  void Register(const SandboxNetwork& net);
  void Unregister(const std::string& veth);
  // The bandwidth limit of a new sandbox (cfg_.rate_mbit; limits.h): a shaper on each end of
  // its veth pair, the sandbox's end in the namespace of `netns_fd` (sandbox_patch.cc).
  absl::Status LimitRate(const std::string& id, int host_ifindex, int netns_fd, int sandbox_ifindex);
  // Live networks by sandbox id, for a PATCH (which flips their narrowed_).
  std::map<std::string, SandboxNetwork*> net_of_id_;
  CutHook cut_hook_;
  std::mutex patch_mu_;
  std::unique_ptr<NflogReader> denial_reader_;

  struct Live {
    std::string id;
    int ifindex = 0;
    SandboxAddrs addrs;
    std::optional<SandboxPolicy> policy;
  };
  std::mutex mu_;
  // Live SandboxNetworks, pooled ones too (id empty): the sweep never removes their veths.
  std::map<std::string, Live> live_;  // by veth
  NameTable names_;
  DenialLog denials_log_;

  NetPolicyConfig cfg_;
  AddrPool pool_;
  std::unique_ptr<Nft> nft_;
};

}  // namespace sbx::net
