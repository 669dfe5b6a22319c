// Fuzz target for the plain-HTTP Host peek of sbxd's connection proxy (net/peek.h): the first
// bytes a sandbox sends on a connection under domain rules.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "net/peek.h"
#include "peek_check.h"

extern const char* const kFuzzSeeds[] = {
    "GET / HTTP/1.1\r\nHost: pypi.org\r\n\r\n",
    "GET /simple/ HTTP/1.1\r\nUser-Agent: pip\r\nhost:  Files.PythonHosted.org:443 \r\n\r\n",
    "GET http://a.example.com:8080/x?y HTTP/1.1\r\nHost: a.example.com\r\n\r\n",
    "GET http://evil.com/ HTTP/1.1\r\nHost: pypi.org\r\n\r\n",
    "POST /x HTTP/1.0\r\nHost: a.b\r\nContent-Length: 3\r\n\r\nabc",
    "GET / HTTP/1.1\r\nHost: a.com\r\nHost: b.com\r\n\r\n",
    "GET / HTTP/1.1\r\nX: y\r\n Host: a.com\r\n\r\n",
    "CONNECT a.com:443 HTTP/1.1\r\nHost: a.com:443\r\n\r\n",
    "OPTIONS * HTTP/1.1\r\nHost: [::1]:80\r\n\r\n",
    "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
};
extern const size_t kFuzzSeedCount = sizeof(kFuzzSeeds) / sizeof(kFuzzSeeds[0]);

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  sbx::fuzz::CheckPeek(sbx::net::PeekHttpHost, in);
  sbx::fuzz::CheckPeek(sbx::net::PeekName, in);
  return 0;
}
