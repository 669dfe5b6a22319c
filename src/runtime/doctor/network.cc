// network.veth and network.nftables: what networked egress profiles need (egress.enabled; off by
// default, so neither is required). Probed in a forked child that first unshares a fresh network namespace
// and touches nothing unless that worked: the veth pair (rtnetlink over libmnl) and the nftables
// table (libnftables) exist only in that namespace, which disappears when the child exits.
#include <libmnl/libmnl.h>
#include <linux/if_link.h>
#include <linux/rtnetlink.h>
#include <linux/veth.h>
#include <nftables/libnftables.h>
#include <sched.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <sstream>

#include <fmt/format.h>

#include "runtime/doctor/checks.h"

namespace sbx::runtime::doctor {

namespace {

constexpr char kVethName[] = "sbxdoctor0";
constexpr char kVethPeer[] = "sbxdoctor1";
constexpr char kNftProbe[] =
    "add table inet sbx_doctor\n"
    "add chain inet sbx_doctor probe { type filter hook output priority 0; policy accept; }\n";

// Child side. Returns 0 or an errno; *step names the call that failed.
int CreateVeth(const char** step) {
  *step = "mnl_socket_open2(NETLINK_ROUTE)";
  struct mnl_socket* nl = mnl_socket_open2(NETLINK_ROUTE, SOCK_CLOEXEC);
  if (nl == nullptr) return errno;
  int err = 0;
  do {
    struct timeval tv{2, 0};  // the parent's timeout is the backstop; this keeps the row precise
    ::setsockopt(mnl_socket_get_fd(nl), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    *step = "mnl_socket_bind";
    if (mnl_socket_bind(nl, 0, MNL_SOCKET_AUTOPID) < 0) {
      err = errno;
      break;
    }
    char buf[MNL_SOCKET_BUFFER_SIZE];
    struct nlmsghdr* nlh = mnl_nlmsg_put_header(buf);
    nlh->nlmsg_type = RTM_NEWLINK;
    nlh->nlmsg_flags = NLM_F_REQUEST | NLM_F_CREATE | NLM_F_EXCL | NLM_F_ACK;
    const unsigned seq = static_cast<unsigned>(::time(nullptr));
    nlh->nlmsg_seq = seq;
    auto* ifm = static_cast<struct ifinfomsg*>(mnl_nlmsg_put_extra_header(nlh, sizeof(struct ifinfomsg)));
    ifm->ifi_family = AF_UNSPEC;
    mnl_attr_put_strz(nlh, IFLA_IFNAME, kVethName);
    struct nlattr* linkinfo = mnl_attr_nest_start(nlh, IFLA_LINKINFO);
    mnl_attr_put_strz(nlh, IFLA_INFO_KIND, "veth");
    struct nlattr* data = mnl_attr_nest_start(nlh, IFLA_INFO_DATA);
    struct nlattr* peer = mnl_attr_nest_start(nlh, VETH_INFO_PEER);
    // The peer's attributes follow an ifinfomsg of its own, inside the nest.
    mnl_nlmsg_put_extra_header(nlh, sizeof(struct ifinfomsg));
    mnl_attr_put_strz(nlh, IFLA_IFNAME, kVethPeer);
    mnl_attr_nest_end(nlh, peer);
    mnl_attr_nest_end(nlh, data);
    mnl_attr_nest_end(nlh, linkinfo);
    *step = "sendto(RTM_NEWLINK veth)";
    if (mnl_socket_sendto(nl, nlh, nlh->nlmsg_len) < 0) {
      err = errno;
      break;
    }
    *step = "recv(RTM_NEWLINK ack)";
    ssize_t n = mnl_socket_recvfrom(nl, buf, sizeof(buf));
    if (n < 0) {
      err = errno;
      break;
    }
    *step = "RTM_NEWLINK veth";
    if (mnl_cb_run(buf, static_cast<size_t>(n), seq, mnl_socket_get_portid(nl), nullptr, nullptr) < 0) {
      err = errno;
      break;
    }
  } while (false);
  mnl_socket_close(nl);
  return err;
}

// Child side: the first line of libnftables' error, or "" when the commands ran.
std::string CreateNftTable(int* rc) {
  // inheritable: its socket lives in a probe's child, which execs nothing and exits.
  struct nft_ctx* nft = nft_ctx_new(NFT_CTX_DEFAULT);
  if (nft == nullptr) {
    *rc = -1;
    return "nft_ctx_new failed";
  }
  nft_ctx_buffer_output(nft);
  nft_ctx_buffer_error(nft);
  *rc = nft_run_cmd_from_buffer(nft, kNftProbe);
  std::string err;
  if (*rc != 0) {
    const char* text = nft_ctx_get_error_buffer(nft);
    err = text != nullptr ? text : "";
    // Keep the message, drop the echo of the command and the caret line below it.
    err = err.substr(0, err.find('\n'));
    if (err.empty()) err = "nft_run_cmd_from_buffer failed without a message";
  }
  nft_ctx_free(nft);
  return err;
}

std::string OneLine(std::string s) {
  for (char& ch : s) {
    if (ch == '\n' || ch == '\t') ch = ' ';
  }
  return s;
}

}  // namespace

void CheckNetwork(const Context& ctx) {
  if (!ctx.Wants(false)) return;
  if (!ctx.live) {
    ctx.AddNotProbed("network.veth", "veth pairs", false);
    ctx.AddNotProbed("network.nftables", "nftables", false);
    return;
  }
  // Lines "netns|veth|nft <tab> number <tab> text".
  auto outcome = RunInChild(
      [](int fd) {
        std::string report;
        if (::unshare(CLONE_NEWNET) != 0) {
          report = fmt::format("netns\t{}\tunshare(CLONE_NEWNET)\n", errno);
        } else {
          const char* step = "";
          int err = CreateVeth(&step);
          report += fmt::format("veth\t{}\t{}\n", err, step);
          int rc = 0;
          std::string nft_err = CreateNftTable(&rc);
          report += fmt::format("nft\t{}\t{}\n", rc, OneLine(nft_err));
        }
        (void)!::write(fd, report.data(), report.size());
      },
      ctx.opts.probe_timeout);

  Check veth{"network.veth", "veth pairs", CheckResult::kOk, "", "", false};
  Check nft{"network.nftables", "nftables", CheckResult::kOk, "", "", false};
  std::string problem;
  bool got_veth = false, got_nft = false;
  if (!outcome.ok()) {
    problem = std::string(outcome.status().message());
  } else {
    std::istringstream is(outcome->output);
    for (std::string line; std::getline(is, line);) {
      size_t t1 = line.find('\t');
      size_t t2 = t1 == std::string::npos ? std::string::npos : line.find('\t', t1 + 1);
      if (t2 == std::string::npos) continue;
      const std::string key = line.substr(0, t1);
      const int num = std::atoi(line.substr(t1 + 1, t2 - t1 - 1).c_str());
      const std::string text = line.substr(t2 + 1);
      if (key == "netns") {
        problem = fmt::format("the probe's unshare(CLONE_NEWNET) failed: {}; nothing was tried",
                              ErrnoText(num));
      } else if (key == "veth") {
        got_veth = true;
        if (num == 0) {
          veth.detail = "created a veth pair over rtnetlink (libmnl) in a throwaway network namespace";
        } else {
          veth.result = CheckResult::kWarn;
          veth.detail = fmt::format("{} in a throwaway network namespace failed: {}", text, ErrnoText(num));
          veth.remedy = num == EOPNOTSUPP || num == ENOENT
                            ? "load the veth module (modprobe veth; CONFIG_VETH) for networked egress profiles (egress.enabled)"
                            : "see the errno; needed only by networked egress profiles (egress.enabled; sbxd then also turns on net.ipv4.ip_forward and net.ipv6.conf.all.forwarding itself)";
        }
      } else if (key == "nft") {
        got_nft = true;
        if (num == 0) {
          nft.detail = "created an inet table with an output hook chain (libnftables) in a throwaway "
                       "network namespace";
        } else {
          nft.result = CheckResult::kWarn;
          nft.detail = fmt::format("nft_run_cmd_from_buffer(add table inet, add chain hook output) in a "
                                   "throwaway network namespace failed: {}", text);
          nft.remedy = "load nf_tables (modprobe nf_tables; CONFIG_NF_TABLES, CONFIG_NF_TABLES_INET); "
                       "needed only by networked egress profiles (egress.enabled; sbxd then also turns on net.ipv4.ip_forward and net.ipv6.conf.all.forwarding itself)";
        }
      }
    }
    if (problem.empty() && (!got_veth || !got_nft)) {
      problem = DescribeAbnormal(*outcome, ctx.opts.probe_timeout);
      if (problem.empty()) problem = "the probe process ended without reporting";
    }
  }
  for (auto [row, got] : {std::pair{&veth, got_veth}, std::pair{&nft, got_nft}}) {
    if (!got) {
      row->result = CheckResult::kWarn;
      row->detail = fmt::format("not probed: {}", problem);
      row->remedy = "run as root; needed only by networked egress profiles (egress.enabled; sbxd then also turns on net.ipv4.ip_forward and net.ipv6.conf.all.forwarding itself)";
    }
    ctx.Add(std::move(*row));
  }
}

}  // namespace sbx::runtime::doctor
