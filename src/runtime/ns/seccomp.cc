#include "runtime/ns/seccomp.h"

#include <linux/audit.h>
#include <linux/seccomp.h>
#include <sched.h>
#include <seccomp.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdlib>
#include <map>
#include <memory>
#include <set>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "common/status_util.h"
#include "common/unique_fd.h"
#include "runtime/ns/fsutil.h"
#include "runtime/ns/seccomp_policy_embed.h"  // generated: kSeccompPolicyJson

namespace sbx::runtime::ns {

namespace {

using nlohmann::json;

#if defined(__x86_64__)
constexpr uint32_t kAuditArch = AUDIT_ARCH_X86_64;
#elif defined(__aarch64__)
constexpr uint32_t kAuditArch = AUDIT_ARCH_AARCH64;
#else
#error "seccomp filter: unsupported architecture"
#endif

#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
constexpr uint32_t kArg0Lo = offsetof(struct seccomp_data, args[0]);
constexpr uint32_t kArg0Hi = offsetof(struct seccomp_data, args[0]) + 4;
constexpr uint32_t kArg2Lo = offsetof(struct seccomp_data, args[2]);
#else
constexpr uint32_t kArg0Lo = offsetof(struct seccomp_data, args[0]) + 4;
constexpr uint32_t kArg0Hi = offsetof(struct seccomp_data, args[0]);
constexpr uint32_t kArg2Lo = offsetof(struct seccomp_data, args[2]) + 4;
#endif

// errno names a policy may use. A short list on purpose: a seccomp errno other than these
// would confuse programs more than it helps.
const std::map<std::string, int>& ErrnoNames() {
  static const std::map<std::string, int> kNames = {
      {"EPERM", EPERM},   {"ENOSYS", ENOSYS},           {"EACCES", EACCES},
      {"EINVAL", EINVAL}, {"EOPNOTSUPP", EOPNOTSUPP}, {"EAFNOSUPPORT", EAFNOSUPPORT},
  };
  return kNames;
}

bool ValidName(const std::string& s) {
  if (s.empty() || s.size() > 64) return false;
  return std::all_of(s.begin(), s.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_';
  });
}

absl::Status PolicyError(const std::string& where, const std::string& what) {
  return absl::InvalidArgumentError(fmt::format("seccomp policy: {}: {}", where, what));
}

absl::StatusOr<std::string> GetName(const json& v, const std::string& where) {
  if (!v.is_string()) return PolicyError(where, fmt::format("expected a syscall name (string), got {}", v.dump()));
  std::string name = v.get<std::string>();
  if (!ValidName(name)) return PolicyError(where, fmt::format("\"{}\" is not a syscall name", name));
  return name;
}

absl::StatusOr<uint64_t> GetU64(const json& v, const std::string& where) {
  if (v.is_number_unsigned()) return v.get<uint64_t>();
  if (v.is_number_integer() && v.get<int64_t>() >= 0) return static_cast<uint64_t>(v.get<int64_t>());
  if (v.is_string()) {
    const std::string s = v.get<std::string>();
    char* end = nullptr;
    errno = 0;
    unsigned long long n = std::strtoull(s.c_str(), &end, 0);
    if (!s.empty() && s[0] != '-' && errno == 0 && end != nullptr && *end == '\0') return n;
  }
  return PolicyError(where, fmt::format("expected a non-negative number or \"0x...\" string, got {}", v.dump()));
}

absl::StatusOr<int> GetErrno(const json& v, const std::string& where) {
  if (v.is_string()) {
    auto it = ErrnoNames().find(v.get<std::string>());
    if (it != ErrnoNames().end()) return it->second;
  }
  std::vector<std::string> known;
  for (const auto& [k, _] : ErrnoNames()) known.push_back(k);
  return PolicyError(where, fmt::format("expected one of {}, got {}", fmt::join(known, " "), v.dump()));
}

absl::StatusOr<SeccompPolicy::Op> GetOp(const json& v, const std::string& where) {
  static const std::map<std::string, SeccompPolicy::Op> kOps = {
      {"eq", SeccompPolicy::Op::kEq}, {"ne", SeccompPolicy::Op::kNe}, {"lt", SeccompPolicy::Op::kLt},
      {"le", SeccompPolicy::Op::kLe}, {"gt", SeccompPolicy::Op::kGt}, {"ge", SeccompPolicy::Op::kGe},
      {"masked_eq", SeccompPolicy::Op::kMaskedEq}};
  if (v.is_string()) {
    auto it = kOps.find(v.get<std::string>());
    if (it != kOps.end()) return it->second;
  }
  return PolicyError(where, fmt::format("expected op eq|ne|lt|le|gt|ge|masked_eq, got {}", v.dump()));
}

absl::Status CheckKeys(const json& obj, const std::string& where, std::initializer_list<const char*> known) {
  for (const auto& [key, _] : obj.items()) {
    if (!key.empty() && key[0] == '_') continue;
    if (std::none_of(known.begin(), known.end(), [&](const char* k) { return key == k; })) {
      return PolicyError(where, fmt::format("unknown key \"{}\"", key));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<const json*> GetArray(const json& obj, const char* key, const std::string& where, bool required) {
  static const json kEmpty = json::array();
  auto it = obj.find(key);
  if (it == obj.end()) {
    if (required) return PolicyError(where, fmt::format("missing \"{}\"", key));
    return &kEmpty;
  }
  if (!it->is_array()) return PolicyError(fmt::format("{}{}", where == "top level" ? "" : where + ".", key), "expected an array");
  return &*it;
}

struct CtxDeleter {
  void operator()(void* ctx) const { seccomp_release(ctx); }
};

scmp_compare ToScmp(SeccompPolicy::Op op) {
  switch (op) {
    case SeccompPolicy::Op::kEq: return SCMP_CMP_EQ;
    case SeccompPolicy::Op::kNe: return SCMP_CMP_NE;
    case SeccompPolicy::Op::kLt: return SCMP_CMP_LT;
    case SeccompPolicy::Op::kLe: return SCMP_CMP_LE;
    case SeccompPolicy::Op::kGt: return SCMP_CMP_GT;
    case SeccompPolicy::Op::kGe: return SCMP_CMP_GE;
    case SeccompPolicy::Op::kMaskedEq: return SCMP_CMP_MASKED_EQ;
  }
  return SCMP_CMP_EQ;
}

// A tiny forward-only BPF assembler: jump targets are labels resolved at the end.
class BpfAsm {
 public:
  static constexpr int kNext = -1;  // fall through
  int NewLabel() {
    labels_.push_back(-1);
    return static_cast<int>(labels_.size()) - 1;
  }
  void Bind(int label) { labels_[static_cast<size_t>(label)] = static_cast<int>(code_.size()); }
  void Stmt(uint16_t code, uint32_t k) { code_.push_back({BPF_STMT(code, k), kNext, kNext}); }
  void Jump(uint16_t code, uint32_t k, int jt, int jf) { code_.push_back({BPF_JUMP(code, k, 0, 0), jt, jf}); }

  absl::StatusOr<std::vector<sock_filter>> Finish() {
    std::vector<sock_filter> out;
    for (size_t pc = 0; pc < code_.size(); ++pc) {
      sock_filter f = code_[pc].f;
      for (auto [label, field] : {std::pair{code_[pc].jt, &f.jt}, std::pair{code_[pc].jf, &f.jf}}) {
        if (label == kNext) continue;
        const int target = labels_[static_cast<size_t>(label)];
        const int off = target - static_cast<int>(pc) - 1;
        if (target < 0 || off < 0 || off > 255) {
          return absl::InternalError(fmt::format("seccomp: hand-written filter: bad jump at {}", pc));
        }
        *field = static_cast<uint8_t>(off);
      }
      out.push_back(f);
    }
    return out;
  }

 private:
  struct Insn {
    sock_filter f;
    int jt, jf;
  };
  std::vector<Insn> code_;
  std::vector<int> labels_;
};

absl::StatusOr<std::vector<sock_filter>> HandwrittenFilter(const SeccompPolicy& policy,
                                                           const std::vector<std::pair<int, std::vector<uint32_t>>>& deny_arg0) {
  const uint32_t deny = SECCOMP_RET_ERRNO | (static_cast<uint32_t>(policy.default_errno) & SECCOMP_RET_DATA);
  const uint32_t enosys = SECCOMP_RET_ERRNO | (ENOSYS & SECCOMP_RET_DATA);
  BpfAsm a;
  const int allow_l = a.NewLabel();
  const int deny_l = a.NewLabel();
  const int enosys_l = a.NewLabel();
  constexpr uint16_t kLd = BPF_LD | BPF_W | BPF_ABS;
  constexpr uint16_t kJeq = BPF_JMP | BPF_JEQ | BPF_K;

  a.Stmt(kLd, offsetof(struct seccomp_data, arch));
  // Other architectures are killed by the main filter; not this filter's business.
  a.Jump(kJeq, kAuditArch, BpfAsm::kNext, allow_l);
  a.Stmt(kLd, offsetof(struct seccomp_data, nr));

  // personality: the kernel reads an unsigned int; any high bits mean a caller playing games.
  int next = a.NewLabel();
  a.Jump(kJeq, __NR_personality, BpfAsm::kNext, next);
  a.Stmt(kLd, kArg0Hi);
  a.Jump(kJeq, 0, BpfAsm::kNext, deny_l);
  a.Stmt(kLd, kArg0Lo);
  a.Jump(kJeq, 0x0, allow_l, BpfAsm::kNext);
  a.Jump(kJeq, 0x8, allow_l, BpfAsm::kNext);
  a.Jump(kJeq, 0xffffffff, allow_l, deny_l);
  a.Bind(next);

  // socket(AF_NETLINK, *, protocol): only the listed protocols. Families that broadcast the
  // host's events (uevents, the proc connector, audit) would otherwise reach the sandbox: its
  // network namespace belongs to the host's user namespace, which is what the kernel
  // broadcasts untagged uevents to. The kernel reads both as int: compare the low 32 bits.
  if (policy.netlink_allow.has_value()) {
    next = a.NewLabel();
    const int not_netlink = a.NewLabel();
    a.Jump(kJeq, __NR_socket, BpfAsm::kNext, next);
    a.Stmt(kLd, kArg0Lo);
    a.Jump(kJeq, AF_NETLINK, BpfAsm::kNext, not_netlink);
    a.Stmt(kLd, kArg2Lo);
    for (uint32_t v : *policy.netlink_allow) a.Jump(kJeq, v, allow_l, BpfAsm::kNext);
    a.Stmt(BPF_RET | BPF_K, deny);
    a.Bind(not_netlink);
    a.Stmt(kLd, offsetof(struct seccomp_data, nr));
    a.Bind(next);
  }

  for (const auto& [nr, values] : deny_arg0) {
    next = a.NewLabel();
    a.Jump(kJeq, static_cast<uint32_t>(nr), BpfAsm::kNext, next);
    a.Stmt(kLd, kArg0Lo);
    for (uint32_t v : values) a.Jump(kJeq, v, deny_l, BpfAsm::kNext);
    a.Stmt(BPF_RET | BPF_K, SECCOMP_RET_ALLOW);
    a.Bind(next);
  }
  if (policy.enosys_from_nr > 0) {
    a.Jump(BPF_JMP | BPF_JGE | BPF_K, static_cast<uint32_t>(policy.enosys_from_nr), enosys_l, allow_l);
  }
  a.Bind(allow_l);
  a.Stmt(BPF_RET | BPF_K, SECCOMP_RET_ALLOW);
  a.Bind(deny_l);
  a.Stmt(BPF_RET | BPF_K, deny);
  a.Bind(enosys_l);
  a.Stmt(BPF_RET | BPF_K, enosys);
  return a.Finish();
}

// Resolves a name for this architecture: the syscall number, or nullopt (with a warning) when
// libseccomp does not know it. Negative "pseudo" numbers are names libseccomp knows from other
// architectures (e.g. `_llseek` on x86_64); rules on them are accepted and do nothing.
std::optional<int> Resolve(const std::string& name, std::vector<std::string>* skipped) {
  int nr = seccomp_syscall_resolve_name(name.c_str());
  if (nr == __NR_SCMP_ERROR) {
    spdlog::warn("seccomp: libseccomp does not know syscall {}; skipped (it gets the default errno)", name);
    skipped->push_back(name);
    return std::nullopt;
  }
  return nr;
}

absl::StatusOr<SeccompProgram> Compile(const SeccompPolicy& policy) {
  SeccompProgram prog;
  std::unique_ptr<void, CtxDeleter> ctx(seccomp_init(SCMP_ACT_ERRNO(static_cast<uint32_t>(policy.default_errno))));
  if (!ctx) return absl::InternalError("seccomp: seccomp_init failed");
  // A binary tree of syscall numbers instead of a linear chain: ~9 compares instead of up to ~300.
  int rc = seccomp_attr_set(ctx.get(), SCMP_FLTATR_CTL_OPTIMIZE, 2);
  if (rc < 0) return ErrnoStatus(-rc, "seccomp: seccomp_attr_set(SCMP_FLTATR_CTL_OPTIMIZE, 2)");

  for (size_t i = 0; i < policy.allow.size(); ++i) {
    const std::string& name = policy.allow[i];
    auto nr = Resolve(name, &prog.skipped);
    if (!nr) continue;
    rc = seccomp_rule_add(ctx.get(), SCMP_ACT_ALLOW, *nr, 0);
    if (rc < 0) return ErrnoStatus(-rc, fmt::format("seccomp policy: allow[{}] ({}): seccomp_rule_add", i, name));
  }
  for (size_t i = 0; i < policy.allow_if.size(); ++i) {
    const auto& r = policy.allow_if[i];
    auto nr = Resolve(r.name, &prog.skipped);
    if (!nr) continue;
    std::vector<scmp_arg_cmp> conds;
    for (const auto& c : r.all) {
      scmp_arg_cmp cmp{};
      cmp.arg = c.arg;
      cmp.op = ToScmp(c.op);
      cmp.datum_a = c.op == SeccompPolicy::Op::kMaskedEq ? c.mask : c.value;
      cmp.datum_b = c.op == SeccompPolicy::Op::kMaskedEq ? c.value : 0;
      conds.push_back(cmp);
    }
    rc = seccomp_rule_add_array(ctx.get(), SCMP_ACT_ALLOW, *nr, static_cast<unsigned>(conds.size()), conds.data());
    if (rc < 0) return ErrnoStatus(-rc, fmt::format("seccomp policy: allow_if[{}] ({}): seccomp_rule_add", i, r.name));
  }
  for (size_t i = 0; i < policy.errno_rules.size(); ++i) {
    const auto& r = policy.errno_rules[i];
    auto nr = Resolve(r.name, &prog.skipped);
    if (!nr) continue;
    rc = seccomp_rule_add(ctx.get(), SCMP_ACT_ERRNO(static_cast<uint32_t>(r.err)), *nr, 0);
    if (rc < 0) return ErrnoStatus(-rc, fmt::format("seccomp policy: errno[{}] ({}): seccomp_rule_add", i, r.name));
  }
  std::vector<std::pair<int, std::vector<uint32_t>>> deny_arg0;
  for (const auto& r : policy.deny_arg0) {
    auto nr = Resolve(r.name, &prog.skipped);
    if (nr && *nr >= 0) deny_arg0.emplace_back(*nr, r.values);
  }
  // Explicit denials need no rule (the default denies them); resolving them only reports names
  // this libseccomp cannot check.
  for (const std::string& name : policy.deny) {
    if (seccomp_syscall_resolve_name(name.c_str()) == __NR_SCMP_ERROR) prog.skipped.push_back(name);
  }

  // libseccomp 2.5 can only export to an fd.
  UniqueFd mfd(static_cast<int>(::syscall(SYS_memfd_create, "sbx-seccomp", MFD_CLOEXEC)));
  if (!mfd) return ErrnoStatus(errno, "seccomp: memfd_create(sbx-seccomp)");
  rc = seccomp_export_bpf(ctx.get(), mfd.get());
  if (rc < 0) return ErrnoStatus(-rc, "seccomp: seccomp_export_bpf");
  off_t size = ::lseek(mfd.get(), 0, SEEK_END);
  if (size <= 0 || size % static_cast<off_t>(sizeof(sock_filter)) != 0) {
    return absl::InternalError(fmt::format("seccomp: exported BPF has odd size {}", size));
  }
  prog.main.resize(static_cast<size_t>(size) / sizeof(sock_filter));
  ssize_t n = ::pread(mfd.get(), prog.main.data(), static_cast<size_t>(size), 0);
  if (n != size) return ErrnoStatus(n < 0 ? errno : EIO, "seccomp: read exported BPF");
  if (prog.main.size() > BPF_MAXINSNS) {
    return absl::InvalidArgumentError(fmt::format("seccomp policy: filter has {} instructions, the kernel takes {}",
                                                  prog.main.size(), BPF_MAXINSNS));
  }
  SBX_ASSIGN_OR_RETURN(prog.handwritten, HandwrittenFilter(policy, deny_arg0));
  return prog;
}

struct EmbeddedLists {
  std::vector<std::string> denied;
  std::vector<std::string> allowed;
};

const EmbeddedLists& Embedded() {
  static const EmbeddedLists kLists = [] {
    EmbeddedLists l;
    auto p = ParseSeccompPolicy(EmbeddedSeccompPolicyJson());
    if (!p.ok()) return l;
    l.denied = p->deny;
    std::set<std::string> allowed(p->allow.begin(), p->allow.end());
    for (const auto& r : p->allow_if) allowed.insert(r.name);
    l.allowed.assign(allowed.begin(), allowed.end());
    return l;
  }();
  return kLists;
}

// ParseSeccompPolicy's state: the policy so far, and which list first claimed each name (a
// name may sit in only one list; allow_if and deny_arg0 may repeat a name, and deny_arg0 names
// must be allowed). The lists are read in this order; deny_arg0 last, as it refines "allow".
class PolicyParser {
 public:
  explicit PolicyParser(const json& doc) : doc_(doc) {}

  absl::StatusOr<SeccompPolicy> Parse() {
    SBX_RETURN_IF_ERROR(CheckKeys(doc_, "top level",
                                  {"default_errno", "enosys_from_nr", "allow", "allow_if", "deny_arg0", "errno",
                                   "deny", "netlink_protocols"}));
    SBX_RETURN_IF_ERROR(ParseDefaults());
    SBX_RETURN_IF_ERROR(ParseAllow());
    SBX_RETURN_IF_ERROR(ParseAllowIf());
    SBX_RETURN_IF_ERROR(ParseErrnoRules());
    SBX_RETURN_IF_ERROR(ParseDeny());
    SBX_RETURN_IF_ERROR(ParseDenyArg0());
    SBX_RETURN_IF_ERROR(ParseNetlinkProtocols());
    return std::move(p_);
  }

 private:
  absl::Status Claim(const std::string& name, const std::string& where, bool repeat_ok) {
    auto [it, fresh] = owner_.emplace(name, where);
    if (fresh) return absl::OkStatus();
    if (repeat_ok && it->second.rfind(where.substr(0, where.find('[')), 0) == 0) return absl::OkStatus();
    return PolicyError(where, fmt::format("{} is already listed at {}", name, it->second));
  }

  // Whether `name` was claimed by the unconditional "allow" list.
  bool Allowed(const std::string& name) const {
    auto it = owner_.find(name);
    return it != owner_.end() && it->second.rfind("allow[", 0) == 0;
  }

  absl::Status ParseDefaults() {
    if (!doc_.contains("default_errno")) return PolicyError("top level", "missing \"default_errno\"");
    SBX_ASSIGN_OR_RETURN(p_.default_errno, GetErrno(doc_["default_errno"], "default_errno"));
    if (doc_.contains("enosys_from_nr")) {
      SBX_ASSIGN_OR_RETURN(uint64_t from, GetU64(doc_["enosys_from_nr"], "enosys_from_nr"));
      // Below 424 numbers differ between architectures, and a low value would deny the basics.
      if (from != 0 && (from < 424 || from > 4095)) {
        return PolicyError("enosys_from_nr", fmt::format("{} is outside 424..4095 (or 0 for none)", from));
      }
      p_.enosys_from_nr = static_cast<int>(from);
    }
    return absl::OkStatus();
  }

  absl::Status ParseAllow() {
    SBX_ASSIGN_OR_RETURN(const json* allow, GetArray(doc_, "allow", "top level", true));
    for (size_t i = 0; i < allow->size(); ++i) {
      const std::string where = fmt::format("allow[{}]", i);
      SBX_ASSIGN_OR_RETURN(std::string name, GetName((*allow)[i], where));
      SBX_RETURN_IF_ERROR(Claim(name, where, false));
      p_.allow.push_back(std::move(name));
    }
    return absl::OkStatus();
  }

  absl::Status ParseAllowIf() {
    SBX_ASSIGN_OR_RETURN(const json* allow_if, GetArray(doc_, "allow_if", "top level", false));
    for (size_t i = 0; i < allow_if->size(); ++i) {
      const std::string where = fmt::format("allow_if[{}]", i);
      const json& e = (*allow_if)[i];
      if (!e.is_object()) return PolicyError(where, "expected an object {name, why, all}");
      SBX_RETURN_IF_ERROR(CheckKeys(e, where, {"name", "why", "all"}));
      SeccompPolicy::AllowIf r;
      SBX_ASSIGN_OR_RETURN(r.name, GetName(e.value("name", json()), where + ".name"));
      SBX_RETURN_IF_ERROR(Claim(r.name, where, true));
      SBX_ASSIGN_OR_RETURN(const json* all, GetArray(e, "all", where, true));
      if (all->empty() || all->size() > 6) return PolicyError(where + ".all", "expected 1..6 conditions");
      std::set<unsigned> args_seen;
      for (size_t j = 0; j < all->size(); ++j) {
        SBX_ASSIGN_OR_RETURN(SeccompPolicy::Condition cond,
                             ParseCondition((*all)[j], fmt::format("{}.all[{}]", where, j), &args_seen));
        r.all.push_back(cond);
      }
      p_.allow_if.push_back(std::move(r));
    }
    return absl::OkStatus();
  }

  static absl::StatusOr<SeccompPolicy::Condition> ParseCondition(const json& c, const std::string& cw,
                                                                 std::set<unsigned>* args_seen) {
    if (!c.is_object()) return PolicyError(cw, "expected an object {arg, op, value, mask?}");
    SBX_RETURN_IF_ERROR(CheckKeys(c, cw, {"arg", "op", "value", "mask"}));
    SeccompPolicy::Condition cond;
    SBX_ASSIGN_OR_RETURN(uint64_t arg, GetU64(c.value("arg", json()), cw + ".arg"));
    if (arg > 5) return PolicyError(cw + ".arg", fmt::format("{} is not an argument index 0..5", arg));
    cond.arg = static_cast<unsigned>(arg);
    // libseccomp 2.5 rejects two comparisons of one argument in one rule (EINVAL); say so here.
    if (!args_seen->insert(cond.arg).second) {
      return PolicyError(cw, fmt::format("second condition on arg {} (use another allow_if entry, or deny_arg0)", arg));
    }
    SBX_ASSIGN_OR_RETURN(cond.op, GetOp(c.value("op", json()), cw + ".op"));
    SBX_ASSIGN_OR_RETURN(cond.value, GetU64(c.value("value", json()), cw + ".value"));
    if (cond.op == SeccompPolicy::Op::kMaskedEq) {
      SBX_ASSIGN_OR_RETURN(cond.mask, GetU64(c.value("mask", json()), cw + ".mask"));
    } else if (c.contains("mask")) {
      return PolicyError(cw, "mask is only for op masked_eq");
    }
    return cond;
  }

  absl::Status ParseErrnoRules() {
    SBX_ASSIGN_OR_RETURN(const json* errno_rules, GetArray(doc_, "errno", "top level", false));
    for (size_t i = 0; i < errno_rules->size(); ++i) {
      const std::string where = fmt::format("errno[{}]", i);
      const json& e = (*errno_rules)[i];
      if (!e.is_object()) return PolicyError(where, "expected an object {name, errno, why}");
      SBX_RETURN_IF_ERROR(CheckKeys(e, where, {"name", "errno", "why"}));
      SeccompPolicy::ErrnoRule r;
      SBX_ASSIGN_OR_RETURN(r.name, GetName(e.value("name", json()), where + ".name"));
      SBX_RETURN_IF_ERROR(Claim(r.name, where, false));
      SBX_ASSIGN_OR_RETURN(r.err, GetErrno(e.value("errno", json()), where + ".errno"));
      p_.errno_rules.push_back(std::move(r));
    }
    return absl::OkStatus();
  }

  absl::Status ParseDeny() {
    SBX_ASSIGN_OR_RETURN(const json* deny, GetArray(doc_, "deny", "top level", false));
    for (size_t i = 0; i < deny->size(); ++i) {
      const std::string where = fmt::format("deny[{}]", i);
      const json& g = (*deny)[i];
      if (!g.is_object()) return PolicyError(where, "expected an object {why, names}");
      SBX_RETURN_IF_ERROR(CheckKeys(g, where, {"why", "names"}));
      if (!g.contains("why") || !g["why"].is_string() || g["why"].get<std::string>().empty()) {
        return PolicyError(where, "every denial group needs a \"why\"");
      }
      SBX_ASSIGN_OR_RETURN(const json* names, GetArray(g, "names", where, true));
      for (size_t j = 0; j < names->size(); ++j) {
        const std::string nw = fmt::format("{}.names[{}]", where, j);
        SBX_ASSIGN_OR_RETURN(std::string name, GetName((*names)[j], nw));
        SBX_RETURN_IF_ERROR(Claim(name, nw, false));
        p_.deny.push_back(std::move(name));
      }
    }
    return absl::OkStatus();
  }

  // deny_arg0 refines names that must already be allowed unconditionally.
  absl::Status ParseDenyArg0() {
    SBX_ASSIGN_OR_RETURN(const json* deny_arg0, GetArray(doc_, "deny_arg0", "top level", false));
    for (size_t i = 0; i < deny_arg0->size(); ++i) {
      const std::string where = fmt::format("deny_arg0[{}]", i);
      const json& e = (*deny_arg0)[i];
      if (!e.is_object()) return PolicyError(where, "expected an object {name, values, why}");
      SBX_RETURN_IF_ERROR(CheckKeys(e, where, {"name", "values", "why"}));
      SeccompPolicy::DenyArg0 r;
      SBX_ASSIGN_OR_RETURN(r.name, GetName(e.value("name", json()), where + ".name"));
      if (!Allowed(r.name)) {
        return PolicyError(where, fmt::format("{} must be in \"allow\" (deny_arg0 narrows an allowed syscall)", r.name));
      }
      if (r.name == "personality") return PolicyError(where, "personality has its own hand-written check");
      SBX_ASSIGN_OR_RETURN(const json* values, GetArray(e, "values", where, true));
      if (values->empty() || values->size() > 32) return PolicyError(where + ".values", "expected 1..32 values");
      for (size_t j = 0; j < values->size(); ++j) {
        SBX_ASSIGN_OR_RETURN(uint64_t v, GetU64((*values)[j], fmt::format("{}.values[{}]", where, j)));
        if (v > 0xffffffffu) return PolicyError(fmt::format("{}.values[{}]", where, j), "compares 32 bits: value > 0xffffffff");
        r.values.push_back(static_cast<uint32_t>(v));
      }
      p_.deny_arg0.push_back(std::move(r));
    }
    return absl::OkStatus();
  }

  absl::Status ParseNetlinkProtocols() {
    if (!doc_.contains("netlink_protocols")) return absl::OkStatus();
    const std::string where = "netlink_protocols";
    const json& e = doc_["netlink_protocols"];
    if (!e.is_object()) return PolicyError(where, "expected an object {allow, why}");
    SBX_RETURN_IF_ERROR(CheckKeys(e, where, {"allow", "why"}));
    if (!Allowed("socket")) return PolicyError(where, "socket must be in \"allow\" (netlink_protocols narrows it)");
    SBX_ASSIGN_OR_RETURN(const json* values, GetArray(e, "allow", where, true));
    if (values->size() > 32) return PolicyError(where + ".allow", "expected 0..32 protocol numbers");
    std::vector<uint32_t> allowed;
    for (size_t j = 0; j < values->size(); ++j) {
      SBX_ASSIGN_OR_RETURN(uint64_t v, GetU64((*values)[j], fmt::format("{}.allow[{}]", where, j)));
      if (v > 31) return PolicyError(fmt::format("{}.allow[{}]", where, j), "netlink protocols are 0..31");
      allowed.push_back(static_cast<uint32_t>(v));
    }
    p_.netlink_allow = std::move(allowed);
    return absl::OkStatus();
  }

  const json& doc_;
  SeccompPolicy p_;
  std::map<std::string, std::string> owner_;
};

}  // namespace

absl::StatusOr<SeccompPolicy> ParseSeccompPolicy(const std::string& json_text) {
  json doc;
  try {
    doc = json::parse(json_text);
  } catch (const json::exception& e) {
    return absl::InvalidArgumentError(fmt::format("seccomp policy: not valid JSON: {}", e.what()));
  }
  if (!doc.is_object()) return PolicyError("top level", "expected an object");
  return PolicyParser(doc).Parse();
}

const std::string& EmbeddedSeccompPolicyJson() {
  static const std::string kJson(kSeccompPolicyJson);
  return kJson;
}

const std::vector<std::string>& SeccompDeniedSyscalls() { return Embedded().denied; }
const std::vector<std::string>& SeccompAllowedSyscalls() { return Embedded().allowed; }

absl::StatusOr<SeccompProgram> BuildSeccompProgramFromPolicy(const std::string& json_text, SeccompFor who) {
  SBX_ASSIGN_OR_RETURN(SeccompPolicy policy, ParseSeccompPolicy(json_text));
  if (who == SeccompFor::kAgent) {
    // The agent enters the sandbox's user namespace in every process it starts, and puts each
    // into a cgroup namespace of its own; those processes then stack AgentChildFilter (agent/
    // identity.h), which denies setns and unshare again, on top of this filter.
    std::erase(policy.deny, std::string("setns"));
    std::erase(policy.deny, std::string("unshare"));
    SeccompPolicy::AllowIf setns{"setns", {{1, SeccompPolicy::Op::kEq, CLONE_NEWUSER, 0}}};
    SeccompPolicy::AllowIf unshare{"unshare", {{0, SeccompPolicy::Op::kEq, CLONE_NEWCGROUP, 0}}};
    policy.allow_if.push_back(std::move(setns));
    policy.allow_if.push_back(std::move(unshare));
  }
  return Compile(policy);
}

absl::StatusOr<SeccompProgram> BuildSeccompProgram(SeccompFor who) {
  if (who == SeccompFor::kAgent) {
    static const absl::StatusOr<SeccompProgram> kAgentProgram =
        BuildSeccompProgramFromPolicy(EmbeddedSeccompPolicyJson(), SeccompFor::kAgent);
    return kAgentProgram;
  }
  // Once per process: the embedded policy cannot change, and sbxd's start-up needs it twice (the
  // host preflight installs it in a test child, then the backend keeps it).
  static const absl::StatusOr<SeccompProgram> kProgram =
      BuildSeccompProgramFromPolicy(EmbeddedSeccompPolicyJson());
  return kProgram;
}

absl::StatusOr<SeccompProgram> BuildSeccompProgramFromFile(const std::string& path, SeccompFor who) {
  auto text = ReadFileToString(path);
  if (!text.ok()) return Annotate(text.status(), fmt::format("seccomp policy {}", path));
  auto prog = BuildSeccompProgramFromPolicy(*text, who);
  if (!prog.ok()) return Annotate(prog.status(), path);
  return prog;
}

int InstallSeccomp(const SeccompProgram& prog) {
  // main first: on equal actions the most recently installed filter's errno wins, and the
  // hand-written ENOSYS must win over main's default EPERM.
  const std::vector<sock_filter>* filters[] = {&prog.main, &prog.handwritten};
  for (const auto* f : filters) {
    struct sock_fprog fprog;
    fprog.len = static_cast<unsigned short>(f->size());
    fprog.filter = const_cast<sock_filter*>(f->data());
    if (::prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &fprog, 0, 0) != 0) return errno;
  }
  return 0;
}

}  // namespace sbx::runtime::ns
