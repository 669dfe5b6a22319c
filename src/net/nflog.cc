#include "net/nflog.h"

#include <arpa/inet.h>
#include <linux/netfilter/nfnetlink.h>
#include <linux/netfilter/nfnetlink_log.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstring>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "common/status_util.h"

namespace sbx::net {
namespace {

constexpr size_t kBufSize = 65536;
// How often the reader looks at its stop flag while no packet comes.
constexpr int kPollMs = 200;

int Keep(const nlattr* a, void* data) {
  auto* tb = static_cast<const nlattr**>(data);
  const uint16_t type = mnl_attr_get_type(a);
  if (type <= NFULA_MAX) tb[type] = a;
  return MNL_CB_OK;
}

std::string ProtoName(uint8_t p) {
  switch (p) {
    case IPPROTO_TCP: return "tcp";
    case IPPROTO_UDP: return "udp";
    case IPPROTO_ICMP: return "icmp";
    case IPPROTO_ICMPV6: return "icmpv6";
    default: return fmt::format("{}", p);
  }
}

// Destination, protocol and port of an IP packet's first bytes (no IPv6 extension headers
// are followed: the port then stays 0).
void ReadPayload(const uint8_t* p, size_t n, LoggedPacket* out) {
  if (n < 1) return;
  const int version = p[0] >> 4;
  uint8_t proto = 0;
  size_t l4 = 0;
  if (version == 4) {
    if (n < 20) return;
    const size_t ihl = static_cast<size_t>(p[0] & 0x0f) * 4;
    if (ihl < 20) return;
    out->dst = IpPrefix::Host(AF_INET, p + 16);
    proto = p[9];
    // A later fragment carries no ports.
    const bool first_fragment = ((p[6] & 0x1f) == 0 && p[7] == 0);
    l4 = first_fragment ? ihl : 0;
  } else if (version == 6) {
    if (n < 40) return;
    out->dst = IpPrefix::Host(AF_INET6, p + 24);
    proto = p[6];
    l4 = 40;
  } else {
    return;
  }
  out->protocol = ProtoName(proto);
  if ((proto == IPPROTO_TCP || proto == IPPROTO_UDP) && l4 != 0 && n >= l4 + 4) {
    out->port = static_cast<uint16_t>((p[l4 + 2] << 8) | p[l4 + 3]);
  }
}

nlmsghdr* PutConfig(char* buf, uint32_t seq, uint8_t family, uint16_t group) {
  nlmsghdr* nlh = mnl_nlmsg_put_header(buf);
  nlh->nlmsg_type = (NFNL_SUBSYS_ULOG << 8) | NFULNL_MSG_CONFIG;
  nlh->nlmsg_flags = NLM_F_REQUEST | NLM_F_ACK;
  nlh->nlmsg_seq = seq;
  auto* nfg = static_cast<nfgenmsg*>(mnl_nlmsg_put_extra_header(nlh, sizeof(nfgenmsg)));
  nfg->nfgen_family = family;
  nfg->version = NFNETLINK_V0;
  nfg->res_id = htons(group);
  return nlh;
}

}  // namespace

std::optional<LoggedPacket> ParseNflogMessage(const void* msg, size_t len) {
  if (len < sizeof(nlmsghdr)) return std::nullopt;
  const auto* nlh = static_cast<const nlmsghdr*>(msg);
  if (!mnl_nlmsg_ok(nlh, static_cast<int>(len))) return std::nullopt;
  if (nlh->nlmsg_type != ((NFNL_SUBSYS_ULOG << 8) | NFULNL_MSG_PACKET)) return std::nullopt;
  if (nlh->nlmsg_len < MNL_NLMSG_HDRLEN + MNL_ALIGN(sizeof(nfgenmsg))) return std::nullopt;
  const nlattr* tb[NFULA_MAX + 1] = {};
  mnl_attr_parse(nlh, sizeof(nfgenmsg), &Keep, tb);
  const nlattr* prefix = tb[NFULA_PREFIX];
  if (prefix == nullptr || mnl_attr_validate(prefix, MNL_TYPE_NUL_STRING) < 0) return std::nullopt;
  std::string text(mnl_attr_get_str(prefix));
  const size_t plen = std::strlen(kNflogPrefix);
  if (text.size() <= plen || text.compare(0, plen, kNflogPrefix) != 0) return std::nullopt;
  LoggedPacket out;
  out.reason = text.substr(plen);
  // nft pads a prefix with nothing, but an operator's own rule might: keep the reason a word.
  while (!out.reason.empty() && out.reason.back() == ' ') out.reason.pop_back();
  if (out.reason.empty()) return std::nullopt;
  if (tb[NFULA_IFINDEX_INDEV] != nullptr && mnl_attr_validate(tb[NFULA_IFINDEX_INDEV], MNL_TYPE_U32) == 0) {
    out.in_ifindex = static_cast<int>(ntohl(mnl_attr_get_u32(tb[NFULA_IFINDEX_INDEV])));
  }
  if (tb[NFULA_PAYLOAD] != nullptr) {
    ReadPayload(static_cast<const uint8_t*>(mnl_attr_get_payload(tb[NFULA_PAYLOAD])),
                mnl_attr_get_payload_len(tb[NFULA_PAYLOAD]), &out);
  }
  return out;
}

NflogReader::NflogReader(mnl_socket* sock, Callback cb) : sock_(sock), cb_(std::move(cb)) {}

NflogReader::~NflogReader() { Stop(); }

void NflogReader::Stop() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
}

absl::StatusOr<std::unique_ptr<NflogReader>> NflogReader::Start(Callback cb) {
  mnl_socket* s = mnl_socket_open2(NETLINK_NETFILTER, SOCK_CLOEXEC);
  if (s == nullptr) return ErrnoStatus(errno, "nflog: socket(NETLINK_NETFILTER)");
  std::unique_ptr<NflogReader> r(new NflogReader(s, std::move(cb)));
  if (mnl_socket_bind(s, 0, MNL_SOCKET_AUTOPID) < 0) return ErrnoStatus(errno, "nflog: bind(NETLINK_NETFILTER)");
  // A burst of denials must not overflow the socket silently: a bigger buffer, and ENOBUFS
  // (lost messages) is logged and survived by the reader.
  int rcvbuf = 1 << 20;
  ::setsockopt(mnl_socket_get_fd(s), SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof(rcvbuf));
  const unsigned port = mnl_socket_get_portid(s);
  std::unique_ptr<char[]> buf(new char[kBufSize]);
  uint32_t seq = 1;
  auto transact = [&](nlmsghdr* nlh, const char* what) -> absl::Status {
    if (mnl_socket_sendto(s, nlh, nlh->nlmsg_len) < 0) return ErrnoStatus(errno, what);
    ssize_t n = mnl_socket_recvfrom(s, buf.get(), kBufSize);
    if (n < 0) return ErrnoStatus(errno, what);
    if (mnl_cb_run(buf.get(), static_cast<size_t>(n), nlh->nlmsg_seq, port, nullptr, nullptr) < 0) {
      return ErrnoStatus(errno, what);
    }
    return absl::OkStatus();
  };
  {
    nlmsghdr* nlh = PutConfig(buf.get(), seq++, AF_UNSPEC, kNflogGroup);
    nfulnl_msg_config_cmd cmd{.command = NFULNL_CFG_CMD_BIND};
    mnl_attr_put(nlh, NFULA_CFG_CMD, sizeof(cmd), &cmd);
    SBX_RETURN_IF_ERROR(transact(nlh, "nflog: bind group: NFULNL_MSG_CONFIG(NFULNL_CFG_CMD_BIND)"));
  }
  {
    nlmsghdr* nlh = PutConfig(buf.get(), seq++, AF_UNSPEC, kNflogGroup);
    nfulnl_msg_config_mode mode{};
    mode.copy_range = htonl(kNflogSnaplen);
    mode.copy_mode = NFULNL_COPY_PACKET;
    mnl_attr_put(nlh, NFULA_CFG_MODE, sizeof(mode), &mode);
    // Each message at once: a denial should show in GET .../egress right after it happened.
    mnl_attr_put_u32(nlh, NFULA_CFG_QTHRESH, htonl(1));
    SBX_RETURN_IF_ERROR(transact(nlh, "nflog: packet mode: NFULNL_MSG_CONFIG(NFULA_CFG_MODE)"));
  }
  r->thread_ = std::thread([raw = r.get()] { raw->Run(); });
  return r;
}

void NflogReader::Run() {
  std::unique_ptr<char[]> buf(new char[kBufSize]);
  const int fd = mnl_socket_get_fd(sock_.get());
  while (!stop_) {
    pollfd p{.fd = fd, .events = POLLIN};
    int pr = ::poll(&p, 1, kPollMs);
    if (pr <= 0) continue;
    ssize_t n = ::recv(fd, buf.get(), kBufSize, MSG_DONTWAIT);
    if (n < 0) {
      if (errno == ENOBUFS) spdlog::debug("nflog: the kernel dropped log messages (a burst of denials)");
      continue;
    }
    size_t left = static_cast<size_t>(n);
    const auto* nlh = reinterpret_cast<const nlmsghdr*>(buf.get());
    while (mnl_nlmsg_ok(nlh, static_cast<int>(left))) {
      if (auto pkt = ParseNflogMessage(nlh, nlh->nlmsg_len)) cb_(*pkt);
      int rest = static_cast<int>(left);
      nlh = mnl_nlmsg_next(nlh, &rest);
      left = static_cast<size_t>(rest);
    }
  }
}

}  // namespace sbx::net
