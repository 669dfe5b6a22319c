#include "net/dns_message.h"

#include <netinet/in.h>
#include <sys/socket.h>

#include <fmt/format.h>

namespace sbx::net::dns {
namespace {

constexpr size_t kHeader = 12;
constexpr size_t kMaxName = 253;

uint16_t Get16(std::string_view w, size_t at) {
  return static_cast<uint16_t>((static_cast<uint8_t>(w[at]) << 8) | static_cast<uint8_t>(w[at + 1]));
}
uint32_t Get32(std::string_view w, size_t at) {
  return (static_cast<uint32_t>(Get16(w, at)) << 16) | Get16(w, at + 2);
}
void Put16(std::string& out, uint16_t v) {
  out.push_back(static_cast<char>(v >> 8));
  out.push_back(static_cast<char>(v & 0xff));
}
void Put32(std::string& out, uint32_t v) {
  Put16(out, static_cast<uint16_t>(v >> 16));
  Put16(out, static_cast<uint16_t>(v & 0xffff));
}

bool LabelByte(uint8_t c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
         c == '_';
}
char Lower(uint8_t c) { return static_cast<char>(c >= 'A' && c <= 'Z' ? c + 32 : c); }

// Reads the name at `*pos` into `out` (lowercase, dotted), leaving `*pos` past it. Compression
// pointers are followed only when `pointers` (answers) and only backwards.
absl::Status ReadName(std::string_view w, size_t* pos, bool pointers, std::string* out) {
  out->clear();
  size_t at = *pos;
  size_t resume = 0;  // where the caller continues: past the first pointer
  int jumps = 0;
  for (;;) {
    if (at >= w.size()) return absl::InvalidArgumentError("dns: name runs past the message");
    const uint8_t len = static_cast<uint8_t>(w[at]);
    if (len == 0) {
      ++at;
      break;
    }
    if ((len & 0xc0) == 0xc0) {
      if (!pointers) return absl::InvalidArgumentError("dns: compressed name in a query");
      if (at + 1 >= w.size()) return absl::InvalidArgumentError("dns: pointer runs past the message");
      const size_t target = Get16(w, at) & 0x3fff;
      if (target >= at) return absl::InvalidArgumentError("dns: forward compression pointer");
      if (++jumps > kMaxPointers) return absl::InvalidArgumentError("dns: too many pointers");
      if (resume == 0) resume = at + 2;
      at = target;
      continue;
    }
    if ((len & 0xc0) != 0) return absl::InvalidArgumentError("dns: unknown label type");
    if (at + 1 + len > w.size()) return absl::InvalidArgumentError("dns: label runs past the message");
    if (!out->empty()) out->push_back('.');
    for (size_t i = 0; i < len; ++i) {
      const auto c = static_cast<uint8_t>(w[at + 1 + i]);
      if (!LabelByte(c)) return absl::InvalidArgumentError("dns: name holds a byte no host name has");
      out->push_back(Lower(c));
    }
    if (out->size() > kMaxName) return absl::InvalidArgumentError("dns: name longer than 253");
    at += 1 + len;
  }
  *pos = resume != 0 ? resume : at;
  return absl::OkStatus();
}

// `name` (dotted, validated by ReadName or our own) in wire form, uncompressed.
void PutName(std::string& out, const std::string& name) {
  size_t start = 0;
  while (start < name.size()) {
    size_t dot = name.find('.', start);
    if (dot == std::string::npos) dot = name.size();
    out.push_back(static_cast<char>(dot - start));
    out.append(name, start, dot - start);
    start = dot + 1;
  }
  out.push_back('\0');
}

void PutQuestion(std::string& out, const Query& q) {
  PutName(out, q.name);
  Put16(out, q.qtype);
  Put16(out, q.qclass);
}

void PutRecord(std::string& out, const Record& r) {
  PutName(out, r.name);
  Put16(out, r.type);
  Put16(out, kClassIn);
  Put32(out, r.ttl);
  if (r.type == kTypeCname) {
    std::string target;
    PutName(target, r.target);
    Put16(out, static_cast<uint16_t>(target.size()));
    out += target;
  } else {
    const int n = r.addr.bytes();
    Put16(out, static_cast<uint16_t>(n));
    out.append(reinterpret_cast<const char*>(r.addr.addr.data()), n);
  }
}

void PutHeader(std::string& out, uint16_t id, uint16_t flags, uint16_t qd, uint16_t an,
               uint16_t ns, uint16_t ar) {
  Put16(out, id);
  Put16(out, flags);
  Put16(out, qd);
  Put16(out, an);
  Put16(out, ns);
  Put16(out, ar);
}

}  // namespace

absl::StatusOr<Query> ParseQuery(std::string_view w) {
  if (w.size() < kHeader) return absl::InvalidArgumentError("dns: query shorter than a header");
  if (w.size() > kMaxQueryBytes) return absl::InvalidArgumentError("dns: query too long");
  const uint16_t flags = Get16(w, 2);
  if (flags & 0x8000) return absl::InvalidArgumentError("dns: a response, not a query");
  if (((flags >> 11) & 0xf) != 0) return absl::UnimplementedError("dns: opcode is not QUERY");
  if (Get16(w, 4) != 1) return absl::InvalidArgumentError("dns: query without exactly one question");
  if (Get16(w, 6) != 0 || Get16(w, 8) != 0) {
    return absl::InvalidArgumentError("dns: query with answer or authority records");
  }
  const uint16_t ar = Get16(w, 10);
  if (ar > 1) return absl::InvalidArgumentError("dns: query with more than one additional record");
  Query q;
  q.id = Get16(w, 0);
  q.rd = (flags & 0x0100) != 0;
  size_t pos = kHeader;
  if (auto s = ReadName(w, &pos, false, &q.name); !s.ok()) return s;
  if (pos + 4 > w.size()) return absl::InvalidArgumentError("dns: question runs past the query");
  q.qtype = Get16(w, pos);
  q.qclass = Get16(w, pos + 2);
  pos += 4;
  if (ar == 1) {
    // EDNS: root name, type OPT; its payload size is all we use.
    if (pos + 11 > w.size() || w[pos] != 0 || Get16(w, pos + 1) != kTypeOpt) {
      return absl::InvalidArgumentError("dns: additional record is not EDNS OPT");
    }
    const uint16_t rdlen = Get16(w, pos + 9);
    if (pos + 11 + rdlen != w.size()) return absl::InvalidArgumentError("dns: OPT length mismatch");
    q.edns = true;
    const uint16_t size = Get16(w, pos + 3);
    q.udp_size = size < 512 ? 512 : (size > kEdnsPayload ? kEdnsPayload : size);
    pos += 11 + rdlen;
  }
  if (pos != w.size()) return absl::InvalidArgumentError("dns: bytes after the query");
  return q;
}

std::optional<std::string> ErrorReplyToBytes(std::string_view w) {
  if (w.size() < kHeader) return std::nullopt;
  const uint16_t flags = Get16(w, 2);
  if (flags & 0x8000) return std::nullopt;
  const bool other_opcode = ((flags >> 11) & 0xf) != 0;
  std::string out;
  // QR, the sender's opcode and RD; RA; the rcode.
  const uint16_t reply_flags = static_cast<uint16_t>(0x8000 | (flags & 0x7900) | 0x0080 |
                                                     (other_opcode ? kNotImp : kFormErr));
  PutHeader(out, Get16(w, 0), reply_flags, 0, 0, 0, 0);
  return out;
}

std::string BuildReply(const Query& q, uint8_t rcode, const std::vector<Record>& answers,
                       size_t max_bytes, bool aa) {
  std::string body;
  PutQuestion(body, q);
  size_t opt_bytes = q.edns ? 11 : 0;
  uint16_t count = 0;
  bool tc = false;
  for (const auto& r : answers) {
    std::string rec;
    PutRecord(rec, r);
    if (kHeader + body.size() + rec.size() + opt_bytes > max_bytes) {
      tc = true;
      break;
    }
    body += rec;
    ++count;
  }
  uint16_t flags = static_cast<uint16_t>(0x8000 | (q.rd ? 0x0100 : 0) | 0x0080 | (rcode & 0xf));
  if (aa) flags |= 0x0400;
  if (tc) flags |= 0x0200;
  std::string out;
  PutHeader(out, q.id, flags, 1, count, 0, q.edns ? 1 : 0);
  out += body;
  if (q.edns) {
    out.push_back('\0');
    Put16(out, kTypeOpt);
    Put16(out, kEdnsPayload);
    Put32(out, 0);
    Put16(out, 0);
  }
  return out;
}

std::string BuildUpstreamQuery(const Query& q, uint16_t id) {
  std::string out;
  PutHeader(out, id, 0x0100, 1, 0, 0, 1);
  PutQuestion(out, q);
  out.push_back('\0');
  Put16(out, kTypeOpt);
  Put16(out, kEdnsPayload);
  Put32(out, 0);
  Put16(out, 0);
  return out;
}

absl::StatusOr<Response> ParseResponse(std::string_view w, const Query& q, uint16_t id) {
  if (w.size() < kHeader) return absl::InvalidArgumentError("dns: answer shorter than a header");
  if (w.size() > kMaxAnswerBytes) return absl::InvalidArgumentError("dns: answer too long");
  if (Get16(w, 0) != id) return absl::InvalidArgumentError("dns: answer to another id");
  const uint16_t flags = Get16(w, 2);
  if (!(flags & 0x8000) || ((flags >> 11) & 0xf) != 0) {
    return absl::InvalidArgumentError("dns: not an answer to a QUERY");
  }
  Response r;
  r.id = id;
  r.rcode = static_cast<uint8_t>(flags & 0xf);
  r.tc = (flags & 0x0200) != 0;
  r.aa = (flags & 0x0400) != 0;
  const uint16_t qd = Get16(w, 4), an = Get16(w, 6);
  if (qd != 1) return absl::InvalidArgumentError("dns: answer without exactly one question");
  size_t pos = kHeader;
  std::string name;
  if (auto s = ReadName(w, &pos, true, &name); !s.ok()) return s;
  if (pos + 4 > w.size()) return absl::InvalidArgumentError("dns: question runs past the answer");
  if (name != q.name || Get16(w, pos) != q.qtype || Get16(w, pos + 2) != q.qclass) {
    return absl::InvalidArgumentError("dns: answer to another question");
  }
  pos += 4;
  if (an > kMaxRecords) return absl::InvalidArgumentError("dns: too many answer records");
  for (uint16_t i = 0; i < an; ++i) {
    Record rec;
    if (auto s = ReadName(w, &pos, true, &rec.name); !s.ok()) return s;
    if (pos + 10 > w.size()) return absl::InvalidArgumentError("dns: record runs past the answer");
    rec.type = Get16(w, pos);
    const uint16_t cls = Get16(w, pos + 2);
    // A TTL with the top bit set is read as 0 (RFC 2181 §8).
    rec.ttl = Get32(w, pos + 4);
    if (rec.ttl > 0x7fffffffu) rec.ttl = 0;
    const uint16_t rdlen = Get16(w, pos + 8);
    pos += 10;
    if (pos + rdlen > w.size()) return absl::InvalidArgumentError("dns: rdata runs past the answer");
    const size_t end = pos + rdlen;
    bool keep = cls == kClassIn;
    if (keep && rec.type == kTypeA) {
      if (rdlen != 4) return absl::InvalidArgumentError("dns: A record of the wrong length");
      rec.addr = IpPrefix::Host(AF_INET, reinterpret_cast<const uint8_t*>(w.data() + pos));
    } else if (keep && rec.type == kTypeAaaa) {
      if (rdlen != 16) return absl::InvalidArgumentError("dns: AAAA record of the wrong length");
      rec.addr = IpPrefix::Host(AF_INET6, reinterpret_cast<const uint8_t*>(w.data() + pos));
    } else if (keep && rec.type == kTypeCname) {
      size_t at = pos;
      if (auto s = ReadName(w, &at, true, &rec.target); !s.ok()) return s;
      if (at != end) return absl::InvalidArgumentError("dns: CNAME rdata length mismatch");
    } else {
      keep = false;
    }
    pos = end;
    if (keep) r.answers.push_back(std::move(rec));
  }
  // Authority and additional sections are not read: nothing of them is passed on.
  return r;
}

std::vector<Record> Chain(const std::vector<Record>& answers, const std::string& name,
                          uint16_t qtype) {
  std::vector<Record> out;
  std::string cur = name;
  std::vector<std::string> seen;
  for (int hop = 0; hop <= kMaxChain; ++hop) {
    for (const auto& seen_name : seen) {
      if (seen_name == cur) return out;  // a loop
    }
    seen.push_back(cur);
    const Record* next = nullptr;
    for (const auto& r : answers) {
      if (r.name != cur) continue;
      if (r.type == qtype && qtype != kTypeCname) out.push_back(r);
      if (r.type == kTypeCname && next == nullptr) next = &r;
    }
    if (next == nullptr) break;
    out.push_back(*next);
    if (qtype == kTypeCname) break;
    cur = next->target;
  }
  return out;
}

}  // namespace sbx::net::dns
