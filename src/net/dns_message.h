// DNS messages for sbxd's resolver (dns_server.h): a small parser and builder of our own, not
// libresolv's ns_initparse/ns_parserr. The resolver never relays a message it did not build:
// queries from a sandbox (untrusted) are parsed to one question and re-made for the upstream,
// and the upstream's answer is parsed and re-made for the sandbox with only the records of the
// queried name's CNAME chain, names written out uncompressed. So nothing a sandbox or a forged
// answer puts in the other sections (glue, EDNS options, compression tricks) reaches the
// other side, and every address the sandbox is told is one the resolver saw and checked.
//
// Limits, each refused with FORMERR (queries) or an error (answers), never a crash:
//   query at most kMaxQueryBytes, exactly one question, no answer or authority records, at most
//   one additional record (EDNS OPT, its options ignored); names of 1-63 byte labels of
//   [A-Za-z0-9_-] (a label holding a dot or another byte could not be matched against a rule
//   without ambiguity), at most 253 characters; answers: compression pointers only backwards
//   and at most kMaxPointers per name, at most kMaxRecords records, CNAME chains of at most
//   kMaxChain hops.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "net/ip_prefix.h"

namespace sbx::net::dns {

inline constexpr uint16_t kTypeA = 1;
inline constexpr uint16_t kTypeCname = 5;
inline constexpr uint16_t kTypeAaaa = 28;
inline constexpr uint16_t kTypeOpt = 41;
inline constexpr uint16_t kClassIn = 1;

inline constexpr uint8_t kNoError = 0;
inline constexpr uint8_t kFormErr = 1;
inline constexpr uint8_t kServFail = 2;
inline constexpr uint8_t kNxDomain = 3;
inline constexpr uint8_t kNotImp = 4;
inline constexpr uint8_t kRefused = 5;

inline constexpr size_t kMaxQueryBytes = 512;
inline constexpr size_t kMaxAnswerBytes = 65535;
inline constexpr size_t kMaxRecords = 256;
inline constexpr int kMaxPointers = 32;
inline constexpr int kMaxChain = 16;
// The payload size sbxd offers over UDP (the upstream's answers and the sandbox's): the DNS
// flag day 2020 value, below every path MTU that matters.
inline constexpr uint16_t kEdnsPayload = 1232;

struct Query {
  uint16_t id = 0;
  bool rd = false;
  std::string name;  // lowercase, dotted, no trailing dot ("" is the root)
  uint16_t qtype = 0;
  uint16_t qclass = 0;
  // What the sender can take over UDP: 512, or its EDNS payload size within [512, 1232].
  uint16_t udp_size = 512;
  bool edns = false;
};

// A query from a sandbox. InvalidArgument (answer FORMERR) for anything outside the limits
// above, a response (QR set) or an opcode other than QUERY (NotImp answer: see IsNotImp).
absl::StatusOr<Query> ParseQuery(std::string_view wire);

// The answer to bytes ParseQuery refused: FORMERR (NOTIMP for another opcode) with the
// sender's id and no question; nullopt when the bytes are no query at all (shorter than a
// header, or a response: answering those could loop two resolvers into each other).
std::optional<std::string> ErrorReplyToBytes(std::string_view wire);

// A record of an answer, its name and (CNAME) target lowercase and dotted.
struct Record {
  std::string name;
  uint16_t type = 0;
  uint32_t ttl = 0;
  IpPrefix addr;       // A / AAAA
  std::string target;  // CNAME
};

// An answer: the header's rcode and flags, the question echoed and the given records (written
// uncompressed). When the message would exceed `max_bytes`, records are left off from the end
// and TC is set, as RFC 1035 asks.
std::string BuildReply(const Query& q, uint8_t rcode, const std::vector<Record>& answers,
                       size_t max_bytes, bool aa = false);

// The query sbxd sends upstream for `q`: id `id`, RD, the lowercase name, and EDNS offering
// kEdnsPayload (no options: nothing of the sandbox's query is passed on).
std::string BuildUpstreamQuery(const Query& q, uint16_t id);

struct Response {
  uint16_t id = 0;
  uint8_t rcode = 0;
  bool tc = false;
  bool aa = false;
  std::vector<Record> answers;  // A, AAAA and CNAME records of class IN; others skipped
};

// An upstream's answer to `q` sent with id `id`: the id, QR, the opcode and the question must
// match (an answer to something else is an error, as is anything malformed).
absl::StatusOr<Response> ParseResponse(std::string_view wire, const Query& q, uint16_t id);

// The records of `answers` on the CNAME chain from `name` (at most kMaxChain hops), in chain
// order: each CNAME, and the records of type `qtype` owned by a name of the chain. Records off
// the chain (an upstream's extra records about other names) are dropped.
std::vector<Record> Chain(const std::vector<Record>& answers, const std::string& name,
                          uint16_t qtype);

}  // namespace sbx::net::dns
