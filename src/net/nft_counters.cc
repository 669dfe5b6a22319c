#include "net/nft_counters.h"

#include <endian.h>
#include <libmnl/libmnl.h>
#include <linux/netfilter.h>
#include <linux/netfilter/nf_tables.h>
#include <linux/netfilter/nfnetlink.h>
#include <net/if.h>

#include <cerrno>
#include <cstring>
#include <memory>

#include <fmt/format.h>

#include "common/status_util.h"
#include "net/nft_ruleset.h"

namespace sbx::net {
namespace {

struct Closer {
  void operator()(mnl_socket* s) const { mnl_socket_close(s); }
};

// The nested attribute of `type` directly inside `nest`, or nullptr.
const nlattr* Child(const nlattr* nest, int type) {
  const nlattr* found = nullptr;
  const char* end = static_cast<const char*>(mnl_attr_get_payload(nest)) + mnl_attr_get_payload_len(nest);
  for (const auto* a = static_cast<const nlattr*>(mnl_attr_get_payload(nest));
       mnl_attr_ok(a, static_cast<int>(end - reinterpret_cast<const char*>(a))); a = mnl_attr_next(a)) {
    if (mnl_attr_get_type(a) == type) found = a;
  }
  return found;
}

// The packets of a counter expression {NFTA_EXPR_NAME "counter", NFTA_EXPR_DATA {...}}.
bool CounterPackets(const nlattr* expr, uint64_t* packets) {
  const nlattr* name = Child(expr, NFTA_EXPR_NAME);
  const nlattr* data = Child(expr, NFTA_EXPR_DATA);
  if (name == nullptr || data == nullptr || std::strcmp(mnl_attr_get_str(name), "counter") != 0) return false;
  const nlattr* p = Child(data, NFTA_COUNTER_PACKETS);
  if (p == nullptr || mnl_attr_get_payload_len(p) != sizeof(uint64_t)) return false;
  *packets = be64toh(mnl_attr_get_u64(p));
  return true;
}

struct Reply {
  bool found = false;
  uint64_t packets = 0;
};

int OnElement(const nlmsghdr* h, void* data) {
  auto* reply = static_cast<Reply*>(data);
  const char* tail = static_cast<const char*>(mnl_nlmsg_get_payload_tail(h));
  for (const auto* a = static_cast<const nlattr*>(mnl_nlmsg_get_payload_offset(h, sizeof(nfgenmsg)));
       mnl_attr_ok(a, static_cast<int>(tail - reinterpret_cast<const char*>(a))); a = mnl_attr_next(a)) {
    if (mnl_attr_get_type(a) != NFTA_SET_ELEM_LIST_ELEMENTS) continue;
    const nlattr* elem = Child(a, NFTA_LIST_ELEM);
    if (elem == nullptr) continue;
    if (const nlattr* expr = Child(elem, NFTA_SET_ELEM_EXPR); expr != nullptr) {
      reply->found = CounterPackets(expr, &reply->packets) || reply->found;
    }
    if (const nlattr* list = Child(elem, NFTA_SET_ELEM_EXPRESSIONS); list != nullptr) {
      if (const nlattr* expr = Child(list, NFTA_LIST_ELEM); expr != nullptr) {
        reply->found = CounterPackets(expr, &reply->packets) || reply->found;
      }
    }
  }
  return MNL_CB_OK;
}

}  // namespace

absl::StatusOr<DenialCounts> ReadVethCounters(const std::string& veth) {
  if (veth.empty() || veth.size() >= IFNAMSIZ) {
    return absl::InvalidArgumentError(fmt::format("denial counters: '{}' is not an interface name", veth));
  }
  std::unique_ptr<mnl_socket, Closer> sock(mnl_socket_open2(NETLINK_NETFILTER, SOCK_CLOEXEC));
  if (!sock) return ErrnoStatus(errno, "denial counters: socket(NETLINK_NETFILTER)");
  if (mnl_socket_bind(sock.get(), 0, MNL_SOCKET_AUTOPID) < 0) {
    return ErrnoStatus(errno, "denial counters: bind(NETLINK_NETFILTER)");
  }
  unsigned port = mnl_socket_get_portid(sock.get());
  char key[IFNAMSIZ] = {};
  std::memcpy(key, veth.data(), veth.size());
  auto buf = std::make_unique<char[]>(MNL_SOCKET_BUFFER_SIZE);
  DenialCounts out;
  uint32_t seq = 1;
  for (const auto& reason : DenialReasons()) {
    std::string set = "deny_" + reason;
    nlmsghdr* nlh = mnl_nlmsg_put_header(buf.get());
    nlh->nlmsg_type = (NFNL_SUBSYS_NFTABLES << 8) | NFT_MSG_GETSETELEM;
    nlh->nlmsg_flags = NLM_F_REQUEST;
    nlh->nlmsg_seq = ++seq;
    auto* nfg = static_cast<nfgenmsg*>(mnl_nlmsg_put_extra_header(nlh, sizeof(nfgenmsg)));
    nfg->nfgen_family = NFPROTO_INET;
    nfg->version = NFNETLINK_V0;
    nfg->res_id = 0;
    mnl_attr_put_strz(nlh, NFTA_SET_ELEM_LIST_TABLE, kTable);
    mnl_attr_put_strz(nlh, NFTA_SET_ELEM_LIST_SET, set.c_str());
    nlattr* elems = mnl_attr_nest_start(nlh, NFTA_SET_ELEM_LIST_ELEMENTS);
    nlattr* elem = mnl_attr_nest_start(nlh, NFTA_LIST_ELEM);
    nlattr* k = mnl_attr_nest_start(nlh, NFTA_SET_ELEM_KEY);
    mnl_attr_put(nlh, NFTA_DATA_VALUE, sizeof(key), key);
    mnl_attr_nest_end(nlh, k);
    mnl_attr_nest_end(nlh, elem);
    mnl_attr_nest_end(nlh, elems);
    if (mnl_socket_sendto(sock.get(), nlh, nlh->nlmsg_len) < 0) {
      return ErrnoStatus(errno, fmt::format("denial counters: sendto(GETSETELEM {})", set));
    }
    ssize_t n = mnl_socket_recvfrom(sock.get(), buf.get(), MNL_SOCKET_BUFFER_SIZE);
    if (n < 0) return ErrnoStatus(errno, fmt::format("denial counters: recvfrom(GETSETELEM {})", set));
    Reply reply;
    if (mnl_cb_run(buf.get(), n, seq, port, OnElement, &reply) < 0) {
      if (errno == ENOENT) {
        return absl::NotFoundError(fmt::format("denial counters: no element {} in {}", veth, set));
      }
      return ErrnoStatus(errno, fmt::format("denial counters: GETSETELEM {} {}", set, veth));
    }
    if (!reply.found) {
      return absl::InternalError(fmt::format("denial counters: element {} of {} has no counter", veth, set));
    }
    out[reason] = reply.packets;
  }
  return out;
}

}  // namespace sbx::net
