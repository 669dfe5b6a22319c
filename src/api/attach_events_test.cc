#include "api/attach_events.h"

#include <gtest/gtest.h>

#include <random>
#include <string>

#include <nlohmann/json.hpp>

#include "api/target.h"
#include "common/base64.h"

namespace sbx::api {
namespace {

using Stream = service::OutputStream;

// What Api::Attach sent before the event was built in place: the wire contract.
std::string Reference(uint64_t id, Stream stream, uint64_t offset, std::string_view data) {
  nlohmann::json j = {{"data_b64", Base64Encode(data)}, {"offset", offset}};
  return SseEvent(id, stream == Stream::kStderr ? "stderr" : "stdout", j.dump());
}

TEST(SseOutputEvent, WireFormat) {
  EXPECT_EQ(SseOutputEvent(7, Stream::kStdout, 0, "hi\n"),
            "id: 7\nevent: stdout\ndata: {\"data_b64\":\"aGkK\",\"offset\":0}\n\n");
  EXPECT_EQ(SseOutputEvent(18446744073709551615ull, Stream::kStderr, 18446744073709551615ull, ""),
            "id: 18446744073709551615\nevent: stderr\ndata: "
            "{\"data_b64\":\"\",\"offset\":18446744073709551615}\n\n");
  EXPECT_EQ(SseOutputEvent(0, Stream::kStdout, 3, "h"),
            "event: stdout\ndata: {\"data_b64\":\"aA==\",\"offset\":3}\n\n");
}

TEST(SseOutputEvent, MatchesTheJsonBuiltEventForAnyBytes) {
  std::mt19937_64 rng(7);
  for (size_t n : {0, 1, 2, 3, 4, 5, 63, 64, 65, 4095, 4096, 65536, 65537, 262144}) {
    std::string data(n, '\0');
    for (char& c : data) c = static_cast<char>(rng());
    const uint64_t id = rng() % 1000000 + 1;
    const uint64_t offset = rng();
    for (Stream s : {Stream::kStdout, Stream::kStderr}) {
      EXPECT_EQ(SseOutputEvent(id, s, offset, data), Reference(id, s, offset, data)) << n;
      EXPECT_LE(SseOutputEvent(UINT64_MAX, s, UINT64_MAX, data).size(),
                SseOutputEventSizeBound(n));
    }
  }
}

TEST(SseOutputEvent, AppendsToWhatIsThere) {
  std::string out = ": keepalive\n\n";
  AppendSseOutputEvent(out, 1, Stream::kStdout, 0, "a");
  AppendSseOutputEvent(out, 2, Stream::kStderr, 0, "bc");
  EXPECT_EQ(out, ": keepalive\n\n" + Reference(1, Stream::kStdout, 0, "a") +
                     Reference(2, Stream::kStderr, 0, "bc"));
}

}  // namespace
}  // namespace sbx::api
