// Fuzz target for the readers of kernel netlink messages sbxd parses (src/net/nflog.h,
// src/net/conntrack.h): NFLOG packets carry the first bytes of whatever a sandbox sent, so
// their payload is the sandbox's to choose. Each input is tried three ways: as a whole
// message; as the attributes of a well-formed nfnetlink_log / ctnetlink message (so attribute
// walking is reached); and as the payload of a well-formed NFLOG packet of sbx's (so the IP
// header reader is reached). Properties: never crashes or reads out of bounds (ASan builds);
// a parsed packet's reason is non-empty and its port is 0 unless TCP or UDP.
#include <libmnl/libmnl.h>
#include <linux/netfilter/nfnetlink.h>
#include <linux/netfilter/nfnetlink_conntrack.h>
#include <linux/netfilter/nfnetlink_log.h>
#include <arpa/inet.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "net/conntrack.h"
#include "net/nflog.h"

extern const char* const kFuzzSeeds[] = {
    "E\x00\x00\x3c\x00\x00@\x00@\x06\x00\x00\x0a\xc8\x00\x02\xc6\x12\x00\x02\x9c\x40\x1f\x90",
    "`\x00\x00\x00\x00\x14\x06@",
    "\x08\x00\x0a\x00sbx host",
    "\x14\x00\x01\x80\x0c\x00\x01\x80\x08\x00\x01\x00\x0a\x00\x00\x02",
    "sbx not_allowed",
};
extern const size_t kFuzzSeedCount = sizeof(kFuzzSeeds) / sizeof(kFuzzSeeds[0]);

namespace {

void Check(bool cond) {
  if (!cond) std::abort();
}

void CheckPacket(const std::optional<sbx::net::LoggedPacket>& p) {
  if (!p) return;
  Check(!p->reason.empty());
  if (p->protocol != "tcp" && p->protocol != "udp") Check(p->port == 0);
}

// A message of `type` whose attribute area is `data` (at most what fits).
std::vector<char> Wrap(uint16_t type, const uint8_t* data, size_t size) {
  std::vector<char> buf(MNL_SOCKET_BUFFER_SIZE * 2);
  nlmsghdr* nlh = mnl_nlmsg_put_header(buf.data());
  nlh->nlmsg_type = type;
  mnl_nlmsg_put_extra_header(nlh, sizeof(nfgenmsg));
  size_t n = std::min(size, buf.size() - nlh->nlmsg_len);
  std::memcpy(static_cast<char*>(mnl_nlmsg_get_payload_tail(nlh)), data, n);
  nlh->nlmsg_len += static_cast<uint32_t>(n);
  buf.resize(nlh->nlmsg_len);
  return buf;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // Raw, exactly the bytes given (a copy, so a read past the end is a heap overflow).
  std::vector<char> raw(data, data + size);
  CheckPacket(sbx::net::ParseNflogMessage(raw.data(), raw.size()));
  (void)sbx::net::ParseFlowMessage(raw.data(), raw.size());

  const uint16_t log_type = (NFNL_SUBSYS_ULOG << 8) | NFULNL_MSG_PACKET;
  std::vector<char> attrs = Wrap(log_type, data, size);
  CheckPacket(sbx::net::ParseNflogMessage(attrs.data(), attrs.size()));
  std::vector<char> ct = Wrap((NFNL_SUBSYS_CTNETLINK << 8) | IPCTNL_MSG_CT_NEW, data, size);
  (void)sbx::net::ParseFlowMessage(ct.data(), ct.size());

  if (size > 60000) return 0;
  std::vector<char> buf(MNL_SOCKET_BUFFER_SIZE * 16);
  nlmsghdr* nlh = mnl_nlmsg_put_header(buf.data());
  nlh->nlmsg_type = log_type;
  mnl_nlmsg_put_extra_header(nlh, sizeof(nfgenmsg));
  mnl_attr_put_strz(nlh, NFULA_PREFIX, "sbx not_allowed");
  mnl_attr_put_u32(nlh, NFULA_IFINDEX_INDEV, htonl(7));
  mnl_attr_put(nlh, NFULA_PAYLOAD, size, data);
  std::vector<char> pkt(buf.data(), buf.data() + nlh->nlmsg_len);
  auto p = sbx::net::ParseNflogMessage(pkt.data(), pkt.size());
  Check(p.has_value() && p->reason == "not_allowed" && p->in_ifindex == 7);
  CheckPacket(p);
  return 0;
}
