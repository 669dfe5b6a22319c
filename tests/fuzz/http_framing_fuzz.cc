// Fuzz target for the HTTP server's request framing (http/framing.h) on top of Beast's parser:
// the bytes a client sends before any token is checked. Properties: never crashes or throws,
// and whatever is accepted is framed one way only (no obs-fold, Transfer-Encoding only as
// exactly "chunked" and never beside a Content-Length, at most one Content-Length).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include <boost/beast/http.hpp>

#include "http/framing.h"

extern const char* const kFuzzSeeds[] = {
    "GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n",
    "POST /v1/sandboxes HTTP/1.1\r\nHost: t\r\nContent-Length: 2\r\n\r\n{}",
    "POST / HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n5;a=b\r\nhello\r\n0\r\n\r\n",
    "POST / HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: xchunked\r\nContent-Length: 0\r\n\r\n",
    "POST / HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
    "POST / HTTP/1.1\r\nHost: t\r\nX-A: a\r\n b\r\nContent-Length: 0\r\n\r\n",
    "POST / HTTP/1.0\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\nhello",
    "\r\nGET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n",
};
extern const size_t kFuzzSeedCount = sizeof(kFuzzSeeds) / sizeof(kFuzzSeeds[0]);

namespace {

namespace bhttp = boost::beast::http;

void Require(bool ok) {
  if (!ok) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string in(reinterpret_cast<const char*>(data), size);
  const size_t end = sbx::http::HeaderBlockEnd(in);
  // Resuming a search over a prefix that had no CRLFCRLF finds the same end (the server reads
  // a header in pieces).
  if (end != std::string::npos && end > 8) {
    Require(sbx::http::HeaderBlockEnd(in, end - 4) == end);
  }
  if (end == std::string::npos) return 0;
  const std::string block = in.substr(0, end);
  if (sbx::http::CheckHeaderBlock(block)) return 0;
  bhttp::request_parser<bhttp::string_body> parser;
  boost::beast::error_code ec;
  const size_t used = parser.put(boost::asio::buffer(block.data(), block.size()), ec);
  if (ec || !parser.is_header_done()) return 0;
  Require(used == block.size());
  if (sbx::http::CheckFraming(parser.get())) return 0;
  // Accepted: framed one way only.
  Require(block.find("\r\n ") == std::string::npos && block.find("\r\n\t") == std::string::npos);
  const auto& h = parser.get();
  const auto te = h.count(bhttp::field::transfer_encoding);
  const auto cl = h.count(bhttp::field::content_length);
  Require(cl <= 1);
  Require(te == 0 || (te == 1 && cl == 0 && parser.chunked()));
  // The body, if any, parses or fails; never more than one way.
  parser.eager(true);
  const std::string body = in.substr(end);
  size_t off = 0;
  while (!parser.is_done() && off < body.size()) {
    off += parser.put(boost::asio::buffer(body.data() + off, body.size() - off), ec);
    if (ec) break;
  }
  return 0;
}
