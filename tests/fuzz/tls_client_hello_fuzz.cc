// Fuzz target for the TLS ClientHello SNI peek of sbxd's connection proxy (net/peek.h). The
// input is used three ways: as raw bytes of the connection; as the SNI name and one extension
// of a well-formed ClientHello, cut into records of an input-chosen size; and as (offset,
// value) edits of that ClientHello. The seeds are text (the mutation driver's seeds cannot hold
// NUL bytes), the second and third ways give the parser valid structure to break.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "net/peek.h"
#include "peek_check.h"

extern const char* const kFuzzSeeds[] = {
    "pypi.org|",
    "Files.PythonHosted.org.|\x01\x02\x03",
    "a..b|xx",
    "\x16\x03\x01\x01\x10\x01\x01\x0c\x03\x03",
    "example.com|\xfe\x0d",
    "\x80\x2e\x01\x03\x01",
};
extern const size_t kFuzzSeedCount = sizeof(kFuzzSeeds) / sizeof(kFuzzSeeds[0]);

namespace {

void Put16(std::string& s, size_t v) {
  s.push_back(static_cast<char>((v >> 8) & 0xff));
  s.push_back(static_cast<char>(v & 0xff));
}

std::string Ext(uint16_t type, std::string_view data) {
  std::string e;
  Put16(e, type);
  Put16(e, data.size());
  e += data;
  return e;
}

std::string Hello(std::string_view name, std::string_view ext, uint16_t ext_type, size_t frag) {
  std::string list;
  list.push_back(0);
  Put16(list, name.size());
  list += name;
  std::string sni;
  Put16(sni, list.size());
  std::string exts = Ext(0x0a0a, "") + Ext(0, sni + list) + Ext(ext_type, ext);
  std::string b;
  Put16(b, 0x0303);
  b += std::string(32, 'r');
  b.push_back(0);
  Put16(b, 2);
  Put16(b, 0x1301);
  b.push_back(1);
  b.push_back(0);
  Put16(b, exts.size());
  b += exts;
  std::string hs;
  hs.push_back(1);
  hs.push_back(0);
  Put16(hs, b.size());
  hs += b;
  std::string out;
  for (size_t i = 0; i < hs.size(); i += frag) {
    std::string part = hs.substr(i, frag);
    out.push_back(0x16);
    Put16(out, 0x0301);
    Put16(out, part.size());
    out += part;
  }
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  sbx::fuzz::CheckPeek(sbx::net::PeekTlsClientHello, in);
  sbx::fuzz::CheckPeek(sbx::net::PeekName, in);
  if (size > 4096) return 0;
  const size_t bar = in.find('|');
  const std::string_view name = in.substr(0, bar);
  const std::string_view ext = bar == std::string_view::npos ? "" : in.substr(bar + 1);
  const uint16_t ext_type = ext.size() >= 2 ? static_cast<uint16_t>((uint8_t(ext[0]) << 8) | uint8_t(ext[1]))
                                            : 0x0015;
  std::string hello = Hello(name, ext, ext_type, 1 + size % 97);
  sbx::fuzz::CheckPeek(sbx::net::PeekTlsClientHello, hello);
  for (size_t i = 0; i + 1 < size; i += 2) {
    hello[(static_cast<uint8_t>(in[i]) * 7 + i) % hello.size()] = in[i + 1];
  }
  sbx::fuzz::CheckPeek(sbx::net::PeekTlsClientHello, hello);
  return 0;
}
