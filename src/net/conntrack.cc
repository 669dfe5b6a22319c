#include "net/conntrack.h"

#include <arpa/inet.h>
#include <linux/netfilter/nfnetlink.h>
#include <linux/netfilter/nfnetlink_conntrack.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstring>

#include <fmt/format.h>

#include "common/status_util.h"

namespace sbx::net {
namespace {

// A dump answers in messages of up to a page each, batched by the kernel into a read of up to
// this much: larger than MNL_SOCKET_BUFFER_SIZE so a big table takes fewer reads.
constexpr size_t kBufSize = 65536;

// The nested attributes of `nest`, by type, bounds-checked by libmnl (mnl_attr_type_valid
// refuses types past `max`).
template <size_t N>
int Keep(const nlattr* a, void* data) {
  auto* tb = static_cast<const nlattr**>(data);
  const uint16_t type = mnl_attr_get_type(a);
  if (type < N) tb[type] = a;
  return MNL_CB_OK;
}

template <size_t N>
void Nested(const nlattr* nest, const nlattr* (&out)[N]) {
  for (auto& a : out) a = nullptr;
  mnl_attr_parse_nested(nest, &Keep<N>, out);
}

bool ReadAddr(const nlattr* a, int family, size_t bytes, IpPrefix* out) {
  if (a == nullptr || mnl_attr_get_payload_len(a) != bytes) return false;
  *out = IpPrefix::Host(family, static_cast<const uint8_t*>(mnl_attr_get_payload(a)));
  return true;
}

bool ReadTuple(const nlattr* tuple, Flow* f) {
  if (mnl_attr_validate(tuple, MNL_TYPE_NESTED) < 0) return false;
  const nlattr* t[CTA_TUPLE_MAX + 1];
  Nested(tuple, t);
  if (t[CTA_TUPLE_IP] == nullptr || mnl_attr_validate(t[CTA_TUPLE_IP], MNL_TYPE_NESTED) < 0) return false;
  const nlattr* ip[CTA_IP_MAX + 1];
  Nested(t[CTA_TUPLE_IP], ip);
  if (ip[CTA_IP_V4_SRC] != nullptr) {
    if (!ReadAddr(ip[CTA_IP_V4_SRC], AF_INET, 4, &f->src) || !ReadAddr(ip[CTA_IP_V4_DST], AF_INET, 4, &f->dst)) {
      return false;
    }
  } else if (!ReadAddr(ip[CTA_IP_V6_SRC], AF_INET6, 16, &f->src) ||
             !ReadAddr(ip[CTA_IP_V6_DST], AF_INET6, 16, &f->dst)) {
    return false;
  }
  if (t[CTA_TUPLE_PROTO] == nullptr || mnl_attr_validate(t[CTA_TUPLE_PROTO], MNL_TYPE_NESTED) < 0) return false;
  const nlattr* p[CTA_PROTO_MAX + 1];
  Nested(t[CTA_TUPLE_PROTO], p);
  if (p[CTA_PROTO_NUM] == nullptr || mnl_attr_validate(p[CTA_PROTO_NUM], MNL_TYPE_U8) < 0) return false;
  f->proto = mnl_attr_get_u8(p[CTA_PROTO_NUM]);
  if (p[CTA_PROTO_SRC_PORT] != nullptr && mnl_attr_validate(p[CTA_PROTO_SRC_PORT], MNL_TYPE_U16) == 0) {
    f->sport = ntohs(mnl_attr_get_u16(p[CTA_PROTO_SRC_PORT]));
  }
  if (p[CTA_PROTO_DST_PORT] != nullptr && mnl_attr_validate(p[CTA_PROTO_DST_PORT], MNL_TYPE_U16) == 0) {
    f->dport = ntohs(mnl_attr_get_u16(p[CTA_PROTO_DST_PORT]));
  }
  return true;
}

nlmsghdr* PutHeader(char* buf, uint16_t type, uint16_t flags, uint8_t family, uint32_t seq) {
  nlmsghdr* nlh = mnl_nlmsg_put_header(buf);
  nlh->nlmsg_type = static_cast<uint16_t>((NFNL_SUBSYS_CTNETLINK << 8) | type);
  nlh->nlmsg_flags = flags;
  nlh->nlmsg_seq = seq;
  auto* nfg = static_cast<nfgenmsg*>(mnl_nlmsg_put_extra_header(nlh, sizeof(nfgenmsg)));
  nfg->nfgen_family = family;
  nfg->version = NFNETLINK_V0;
  nfg->res_id = 0;
  return nlh;
}

const char* ProtoName(uint8_t p) {
  switch (p) {
    case IPPROTO_TCP: return "tcp";
    case IPPROTO_UDP: return "udp";
    case IPPROTO_ICMP: return "icmp";
    case IPPROTO_ICMPV6: return "icmpv6";
    default: return "proto";
  }
}

}  // namespace

std::string Flow::ToString() const {
  return fmt::format("{} {}:{} -> {}:{}", ProtoName(proto), src.AddressString(), sport,
                     dst.AddressString(), dport);
}

std::optional<Flow> ParseFlowMessage(const void* msg, size_t len) {
  if (len < sizeof(nlmsghdr)) return std::nullopt;
  const auto* nlh = static_cast<const nlmsghdr*>(msg);
  if (!mnl_nlmsg_ok(nlh, static_cast<int>(len))) return std::nullopt;
  if (nlh->nlmsg_len < MNL_NLMSG_HDRLEN + MNL_ALIGN(sizeof(nfgenmsg))) return std::nullopt;
  const nlattr* tb[CTA_MAX + 1] = {};
  mnl_attr_parse(nlh, sizeof(nfgenmsg), &Keep<CTA_MAX + 1>, tb);
  const nlattr* orig = tb[CTA_TUPLE_ORIG];
  const nlattr* zone = tb[CTA_ZONE];
  if (orig == nullptr) return std::nullopt;
  Flow f;
  if (!ReadTuple(orig, &f)) return std::nullopt;
  if (zone != nullptr && mnl_attr_validate(zone, MNL_TYPE_U16) == 0) f.zone = ntohs(mnl_attr_get_u16(zone));
  return f;
}

Conntrack::Conntrack(mnl_socket* sock) : sock_(sock), buf_(new char[kBufSize]) {
  port_id_ = mnl_socket_get_portid(sock);
}

Conntrack::~Conntrack() = default;

absl::StatusOr<Conntrack> Conntrack::Open() {
  mnl_socket* s = mnl_socket_open2(NETLINK_NETFILTER, SOCK_CLOEXEC);
  if (s == nullptr) return ErrnoStatus(errno, "conntrack: socket(NETLINK_NETFILTER)");
  if (mnl_socket_bind(s, 0, MNL_SOCKET_AUTOPID) < 0) {
    int err = errno;
    mnl_socket_close(s);
    return ErrnoStatus(err, "conntrack: bind(NETLINK_NETFILTER)");
  }
  return Conntrack(s);
}

absl::StatusOr<std::vector<Flow>> Conntrack::FlowsFrom(const std::vector<IpPrefix>& sources) {
  const uint32_t seq = seq_++;
  nlmsghdr* nlh = PutHeader(buf_.get(), IPCTNL_MSG_CT_GET, NLM_F_REQUEST | NLM_F_DUMP, AF_UNSPEC, seq);
  if (mnl_socket_sendto(sock_.get(), nlh, nlh->nlmsg_len) < 0) {
    return ErrnoStatus(errno, "conntrack: list flows: sendto(IPCTNL_MSG_CT_GET dump)");
  }
  struct Ctx {
    const std::vector<IpPrefix>* sources;
    std::vector<Flow> out;
  } ctx{&sources, {}};
  auto cb = [](const nlmsghdr* h, void* data) -> int {
    auto* c = static_cast<Ctx*>(data);
    std::optional<Flow> f = ParseFlowMessage(h, h->nlmsg_len);
    if (!f) return MNL_CB_OK;
    for (const auto& s : *c->sources) {
      if (s.family == f->src.family && s.Contains(f->src)) {
        c->out.push_back(*f);
        break;
      }
    }
    return MNL_CB_OK;
  };
  for (;;) {
    ssize_t n = mnl_socket_recvfrom(sock_.get(), buf_.get(), kBufSize);
    if (n < 0) return ErrnoStatus(errno, "conntrack: list flows: recvfrom");
    int r = mnl_cb_run(buf_.get(), static_cast<size_t>(n), seq, port_id_, cb, &ctx);
    if (r < 0) return ErrnoStatus(errno, "conntrack: list flows: IPCTNL_MSG_CT_GET dump");
    if (r == MNL_CB_STOP) break;
  }
  return std::move(ctx.out);
}

absl::Status Conntrack::Delete(const Flow& f) {
  const uint32_t seq = seq_++;
  nlmsghdr* nlh = PutHeader(buf_.get(), IPCTNL_MSG_CT_DELETE, NLM_F_REQUEST | NLM_F_ACK,
                            static_cast<uint8_t>(f.src.family), seq);
  nlattr* tuple = mnl_attr_nest_start(nlh, CTA_TUPLE_ORIG);
  nlattr* ip = mnl_attr_nest_start(nlh, CTA_TUPLE_IP);
  const bool v4 = f.src.is_v4();
  mnl_attr_put(nlh, v4 ? CTA_IP_V4_SRC : CTA_IP_V6_SRC, f.src.bytes(), f.src.addr.data());
  mnl_attr_put(nlh, v4 ? CTA_IP_V4_DST : CTA_IP_V6_DST, f.dst.bytes(), f.dst.addr.data());
  mnl_attr_nest_end(nlh, ip);
  nlattr* proto = mnl_attr_nest_start(nlh, CTA_TUPLE_PROTO);
  mnl_attr_put_u8(nlh, CTA_PROTO_NUM, f.proto);
  if (f.proto == IPPROTO_TCP || f.proto == IPPROTO_UDP || f.proto == IPPROTO_SCTP ||
      f.proto == IPPROTO_UDPLITE || f.proto == IPPROTO_DCCP) {
    mnl_attr_put_u16(nlh, CTA_PROTO_SRC_PORT, htons(f.sport));
    mnl_attr_put_u16(nlh, CTA_PROTO_DST_PORT, htons(f.dport));
  }
  mnl_attr_nest_end(nlh, proto);
  mnl_attr_nest_end(nlh, tuple);
  if (f.zone != 0) mnl_attr_put_u16(nlh, CTA_ZONE, htons(f.zone));
  const std::string what = fmt::format("conntrack: delete {}: IPCTNL_MSG_CT_DELETE", f.ToString());
  if (mnl_socket_sendto(sock_.get(), nlh, nlh->nlmsg_len) < 0) return ErrnoStatus(errno, what);
  ssize_t n = mnl_socket_recvfrom(sock_.get(), buf_.get(), kBufSize);
  if (n < 0) return ErrnoStatus(errno, what);
  if (mnl_cb_run(buf_.get(), static_cast<size_t>(n), seq, port_id_, nullptr, nullptr) < 0) {
    if (errno == ENOENT) return absl::NotFoundError(fmt::format("{}: already gone", what));
    return ErrnoStatus(errno, what);
  }
  return absl::OkStatus();
}

absl::StatusOr<int> Conntrack::Cut(const std::vector<IpPrefix>& sources,
                                   const std::function<bool(const Flow&)>& keep) {
  SBX_ASSIGN_OR_RETURN(std::vector<Flow> flows, FlowsFrom(sources));
  int cut = 0;
  for (const Flow& f : flows) {
    if (keep(f)) continue;
    absl::Status st = Delete(f);
    if (st.ok()) ++cut;
    else if (!absl::IsNotFound(st)) return st;
  }
  return cut;
}

}  // namespace sbx::net
