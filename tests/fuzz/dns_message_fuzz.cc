// Fuzz target for sbxd's DNS messages (src/net/dns_message.h): queries come from sandboxes,
// answers from the upstream or whoever forges them. Properties: never crashes or throws; an
// accepted query's upstream query and reply parse back to the same question and id; a reply
// never exceeds the size asked; the input read as an answer to a fixed query gives a CNAME
// chain of at most kMaxChain + 1 names' records; bytes refused as a query get a 12-byte
// error reply or none.
//
// Binary seeds (DNS is full of zero bytes), so this target carries its own driver instead of
// mutation_main.cc (which takes C-string seeds):
//   dns_message_fuzz FILE...        runs the target once per file (corpus / crash replay)
//   dns_message_fuzz --random N     mutates the seeds N times from a fixed seed
// With clang, build it with -fsanitize=fuzzer -DSBX_LIBFUZZER instead.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "net/dns_message.h"

namespace {

namespace dns = sbx::net::dns;

void Check(bool cond) {
  if (!cond) std::abort();
}

std::string Hex(const char* hex) {
  std::string out;
  for (size_t i = 0; hex[i] != '\0' && hex[i + 1] != '\0'; i += 2) {
    out.push_back(static_cast<char>(std::strtoul(std::string(hex + i, 2).c_str(), nullptr, 16)));
  }
  return out;
}

const char* const kSeedHex[] = {
    // A query for www.example.org A, RD.
    "12340100000100000000000003777777076578616d706c65036f72670000010001",
    // AAAA with EDNS (payload 4096).
    "0007010000010000000000010161016200001c00010000291000000000000000",
    // An answer: CNAME (compressed) to cdn.example.net, two A records, one off the chain.
    "424281800001000400000000037777770765786d706c65036f72670000010001c00c0005000100"
    "00012c00110363646e076578616d706c65036e657400c02d000100010000003c0004cb007107c0"
    "2d00010001000000780004"
    "0a000001056f74686572036f726700000100010000003c000401020304",
    // A pointer loop, a response bit, an unknown label type.
    "0001818000010000000000000c0c",
    "000181800001000000000000c00c00010001",
    "00010100000100000000000041616100000100 01",
    // An opcode other than QUERY.
    "0001280000010000000000000161000001 0001",
};

dns::Query FixedQuery() {
  dns::Query q;
  q.id = 0x4242;
  q.name = "www.example.org";
  q.qtype = dns::kTypeA;
  q.qclass = dns::kClassIn;
  return q;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  auto q = dns::ParseQuery(in);
  if (q.ok()) {
    Check(q->name.size() <= 253);
    Check(q->udp_size >= 512 && q->udp_size <= dns::kEdnsPayload);
    auto up = dns::ParseQuery(dns::BuildUpstreamQuery(*q, 0x1111));
    Check(up.ok() && up->name == q->name && up->qtype == q->qtype && up->id == 0x1111);
    std::vector<dns::Record> recs = {{q->name, dns::kTypeCname, 5, {}, "a.example"}};
    const std::string reply = dns::BuildReply(*q, dns::kRefused, recs, q->udp_size);
    Check(reply.size() <= q->udp_size);
    if (q->qclass == dns::kClassIn) {
      auto back = dns::ParseResponse(reply, *q, q->id);
      Check(back.ok() && back->rcode == dns::kRefused);
    }
  } else {
    auto err = dns::ErrorReplyToBytes(in);
    Check(!err.has_value() || err->size() == 12);
  }
  const dns::Query fixed = FixedQuery();
  uint16_t id = size >= 2 ? static_cast<uint16_t>((data[0] << 8) | data[1]) : 0;
  auto r = dns::ParseResponse(in, fixed, id);
  if (r.ok()) {
    Check(r->answers.size() <= dns::kMaxRecords);
    auto chain = dns::Chain(r->answers, fixed.name, fixed.qtype);
    Check(chain.size() <= r->answers.size());
    const std::string rebuilt = dns::BuildReply(fixed, r->rcode, chain, 512);
    Check(rebuilt.size() <= 512);
    Check(dns::ParseResponse(rebuilt, fixed, fixed.id).ok());
  }
  return 0;
}

#ifndef SBX_LIBFUZZER
namespace {

std::string Mutate(std::string s, std::mt19937_64& rng, const std::vector<std::string>& seeds) {
  const int rounds = 1 + static_cast<int>(rng() % 6);
  for (int r = 0; r < rounds; ++r) {
    const size_t pos = s.empty() ? 0 : rng() % (s.size() + 1);
    switch (rng() % 6) {
      case 0:
        if (pos < s.size()) s[pos] = static_cast<char>(rng());
        break;
      case 1:
        if (pos < s.size()) s.erase(pos, 1 + rng() % 8);
        break;
      case 2:  // a length or pointer byte
        s.insert(pos, 1, static_cast<char>(std::vector<uint8_t>{0, 1, 0x3f, 0x40, 0xc0, 0xff}[rng() % 6]));
        break;
      case 3: {
        const std::string& other = seeds[rng() % seeds.size()];
        if (other.empty()) break;
        const size_t from = rng() % other.size();
        s.insert(pos, other, from, 1 + rng() % 32);
        break;
      }
      case 4:
        if (pos + 1 < s.size()) s[pos] = static_cast<char>(s[pos] ^ (1 << (rng() % 8)));
        break;
      default:
        s.insert(pos, std::string(1 + rng() % 4, static_cast<char>(rng())));
    }
  }
  return s;
}

void Run(const std::string& s) {
  LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(s.data()), s.size());
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> seeds;
  for (const char* h : kSeedHex) {
    std::string clean;
    for (const char* c = h; *c; ++c) {
      if (*c != ' ') clean.push_back(*c);
    }
    seeds.push_back(Hex(clean.c_str()));
  }
  if (argc == 3 && std::strcmp(argv[1], "--random") == 0) {
    const long n = std::strtol(argv[2], nullptr, 10);
    std::mt19937_64 rng(0xd45);
    for (const auto& s : seeds) Run(s);
    for (long i = 0; i < n; ++i) Run(Mutate(seeds[rng() % seeds.size()], rng, seeds));
    std::printf("dns_message_fuzz: %ld random inputs, no failure\n", n);
    return 0;
  }
  for (int i = 1; i < argc; ++i) {
    std::ifstream f(argv[i], std::ios::binary);
    Run(std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()));
  }
  return 0;
}
#endif
