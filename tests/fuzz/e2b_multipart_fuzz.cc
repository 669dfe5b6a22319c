// Fuzz target for envd's multipart/form-data reader (src/api/e2b/multipart.h): bodies of
// POST /files from any holder of a sandbox's envd token. Properties: never crashes or throws;
// the events are well nested (data only inside a part, every part ended before the next and
// before the end); the bytes held back stay bounded by one fed piece plus the header block;
// feeding the same body in pieces of any size gives the same parts as feeding it whole.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "api/e2b/multipart.h"

extern const char* const kFuzzSeeds[] = {
    "------formdata-undici-028103354497\r\nContent-Disposition: form-data; name=\"file\"; "
    "filename=\"/tmp/acc/hello.txt\"\r\nContent-Type: application/octet-stream\r\n\r\nhello "
    "world\r\n------formdata-undici-028103354497--\r\n",
    "--B\r\nContent-Disposition: form-data; name=\"file\"; filename=\"/a\"\r\n\r\n\x01\x02\r\n--"
    "\r\n--B\r\nContent-Disposition: form-data; name=\"file\"; filename*=UTF-8''%C3%A9\r\n\r\n"
    "\r\n--B--",
    "preamble\r\n--B \t\r\n\r\nx\r\n--B--epilogue",
    "--B\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a\\\\b%22\"\r\n\r\n",
    "multipart/form-data; boundary=\"quoted b\"",
};
extern const size_t kFuzzSeedCount = sizeof(kFuzzSeeds) / sizeof(kFuzzSeeds[0]);

namespace {

void Check(bool cond) {
  if (!cond) std::abort();
}

struct Result {
  bool ok = false;
  std::vector<std::string> parts;  // name '\0' filename '\0' data
};

Result Parse(const std::string& boundary, const std::string& body, size_t piece) {
  namespace e2b = sbx::api::e2b;
  e2b::MultipartReader::Limits limits;
  limits.max_header_bytes = 256;
  limits.max_parts = 16;
  limits.max_preamble_bytes = 1024;
  e2b::MultipartReader r(boundary, limits);
  Result out;
  size_t at = 0;
  bool open = false;
  for (int guard = 0; guard < 1000000; ++guard) {
    auto ev = r.Next();
    if (!ev.ok()) {
      Check(ev.status().code() == absl::StatusCode::kInvalidArgument);
      Check(!r.Next().ok());
      return out;
    }
    Check(r.buffered() <= piece + limits.max_header_bytes + limits.max_preamble_bytes + 512);
    switch (ev->kind) {
      case e2b::MultipartReader::Kind::kNeedMore:
        if (at >= body.size()) {
          r.Finish();
        } else {
          const size_t n = std::min(piece, body.size() - at);
          r.Feed(std::string_view(body).substr(at, n));
          at += n;
        }
        break;
      case e2b::MultipartReader::Kind::kPart:
        Check(!open);
        open = true;
        out.parts.push_back(r.part().name + '\0' + r.part().filename.value_or("-") + '\0');
        break;
      case e2b::MultipartReader::Kind::kData:
        Check(open && !ev->data.empty());
        out.parts.back().append(ev->data);
        break;
      case e2b::MultipartReader::Kind::kPartEnd:
        Check(open);
        open = false;
        break;
      case e2b::MultipartReader::Kind::kEnd:
        Check(!open);
        out.ok = true;
        return out;
    }
  }
  std::abort();  // no progress
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  namespace e2b = sbx::api::e2b;
  const std::string in(reinterpret_cast<const char*>(data), size);
  (void)e2b::MultipartBoundary(in);
  (void)e2b::DispositionParam(in, "filename");
  const std::string boundary = in.find("--B") != std::string::npos ? "B"
                               : in.find("------formdata") != std::string::npos
                                   ? "----formdata-undici-028103354497"
                                   : "quoted b";
  const Result whole = Parse(boundary, in, in.size() + 1);
  const size_t piece = 1 + (size > 0 ? data[0] % 17 : 0);
  const Result split = Parse(boundary, in, piece);
  Check(whole.ok == split.ok);
  if (whole.ok) Check(whole.parts == split.parts);
  return 0;
}
