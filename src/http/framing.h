// Request framing checks Beast's parser does not make (RFC 9112 §§2.2, 5, 6). Beast accepts
// obs-fold (it joins the lines), a Transfer-Encoding whose last coding is not `chunked` (it
// then ignores the header and reads no body), Transfer-Encoding beside a Content-Length when
// the TE field comes first and is not `chunked`, repeated identical Content-Length values,
// and a request without a Host or with two. Each of those lets a proxy in front of sbxd and
// sbxd disagree on where a request ends (request smuggling), so the server refuses them and
// closes the connection. What Beast does refuse (space before the colon, CR/LF/NUL/CTL inside
// a value, bad chunk sizes, differing Content-Length values, versions other than 1.0/1.1)
// stays Beast's job.
//
// Pure functions over bytes and parsed headers, so that the table of cases is unit-tested
// and fuzzed without a socket (http/framing_test.cc, tests/fuzz/http_framing_fuzz.cc).
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

#include <boost/beast/http.hpp>

namespace sbx::http {

struct FramingError {
  boost::beast::http::status status;
  std::string message;
};

// The length of the header block at the start of `data` (request line through the empty line,
// CRLFCRLF included), or npos while it is incomplete. `from`: bytes already searched by an
// earlier call on a prefix of the same data (the search resumes 3 bytes before it).
size_t HeaderBlockEnd(std::string_view data, size_t from = 0);

// The raw header block (as HeaderBlockEnd delimits it): refuses obs-fold and any line starting
// with whitespace (RFC 9112 §5.2, §2.2), NUL, and a CR or LF that is not part of a CRLF.
std::optional<FramingError> CheckHeaderBlock(std::string_view block);

// The parsed header (RFC 9112 §6.1, §6.3, §3.2): HTTP/1.0 or 1.1 only (505; Beast refuses
// other versions itself today, this keeps it so if that changes); exactly one Host
// in HTTP/1.1, at most one in 1.0; at most one Content-Length field and no list in it;
// Transfer-Encoding only as exactly `chunked` (case-insensitive, OWS around it allowed), never
// with a Content-Length and never in HTTP/1.0. Codings before a final `chunked` are 501 (sbxd
// decodes none), a last coding other than `chunked` is 400 (the body length is then unknown).
std::optional<FramingError> CheckFraming(const boost::beast::http::request_header<>& header);

}  // namespace sbx::http
