#include "api/e2b/multipart.h"

#include <gtest/gtest.h>

#include <random>
#include <vector>

namespace sbx::api::e2b {
namespace {

struct Parsed {
  struct P {
    std::string name;
    std::optional<std::string> filename;
    std::string data;
  };
  std::vector<P> parts;
  bool ended = false;
  absl::Status error;
};

// Feeds `body` in pieces of the given sizes (the last one repeated), collecting the parts.
Parsed ParseAll(const std::string& boundary, std::string_view body, std::vector<size_t> pieces,
           MultipartReader::Limits limits = {}, size_t* max_buffered = nullptr) {
  MultipartReader r(boundary, limits);
  Parsed out;
  size_t at = 0, k = 0;
  bool open = false;
  for (;;) {
    auto ev = r.Next();
    if (!ev.ok()) {
      out.error = ev.status();
      return out;
    }
    if (max_buffered) *max_buffered = std::max(*max_buffered, r.buffered());
    switch (ev->kind) {
      case MultipartReader::Kind::kNeedMore: {
        if (at >= body.size()) {
          r.Finish();
          break;
        }
        const size_t n = std::min(pieces[std::min(k, pieces.size() - 1)], body.size() - at);
        ++k;
        r.Feed(body.substr(at, n));
        at += n;
        break;
      }
      case MultipartReader::Kind::kPart:
        EXPECT_FALSE(open);
        open = true;
        out.parts.push_back({r.part().name, r.part().filename, {}});
        break;
      case MultipartReader::Kind::kData:
        EXPECT_TRUE(open);
        EXPECT_FALSE(ev->data.empty());
        out.parts.back().data.append(ev->data);
        break;
      case MultipartReader::Kind::kPartEnd:
        EXPECT_TRUE(open);
        open = false;
        break;
      case MultipartReader::Kind::kEnd:
        EXPECT_FALSE(open);
        out.ended = true;
        return out;
    }
  }
}

std::string Body(const std::string& b, const std::vector<std::pair<std::string, std::string>>& files) {
  std::string s;
  for (const auto& [name, data] : files) {
    s += "--" + b + "\r\n";
    s += "Content-Disposition: form-data; name=\"file\"; filename=\"" + name + "\"\r\n";
    s += "Content-Type: application/octet-stream\r\n\r\n";
    s += data;
    s += "\r\n";
  }
  s += "--" + b + "--\r\n";
  return s;
}

const std::string kB = "----formdata-undici-028103354497";

TEST(Multipart, TheCapturedUndiciUpload) {
  auto p = ParseAll(kB, Body(kB, {{"/tmp/acc/hello.txt", "hello world"}}), {1 << 20});
  ASSERT_TRUE(p.error.ok()) << p.error;
  ASSERT_TRUE(p.ended);
  ASSERT_EQ(p.parts.size(), 1u);
  EXPECT_EQ(p.parts[0].name, "file");
  EXPECT_EQ(p.parts[0].filename, "/tmp/acc/hello.txt");
  EXPECT_EQ(p.parts[0].data, "hello world");
}

TEST(Multipart, EverySplitOfSeveralBinaryParts) {
  // Binary content with CRLF, "--", a near-boundary and NUL bytes inside.
  const std::string bin = std::string("\x00\x01\x02\xfa\xff\x0a\r\n--\r\n--", 12) +
                          kB.substr(0, 10) + "\r\n-";
  const std::string body = Body(kB, {{"/a", bin}, {"/b", ""}, {"/c/d e.txt", "x\r\n"}});
  for (size_t split = 1; split <= body.size(); ++split) {
    auto p = ParseAll(kB, body, {split});
    ASSERT_TRUE(p.error.ok()) << "split " << split << ": " << p.error;
    ASSERT_TRUE(p.ended);
    ASSERT_EQ(p.parts.size(), 3u) << split;
    EXPECT_EQ(p.parts[0].data, bin) << split;
    EXPECT_EQ(p.parts[1].data, "") << split;
    EXPECT_EQ(p.parts[2].data, "x\r\n") << split;
    EXPECT_EQ(p.parts[2].filename, "/c/d e.txt");
  }
  // Two pieces split at every offset.
  for (size_t cut = 0; cut <= body.size(); ++cut) {
    auto p = ParseAll(kB, body, {cut == 0 ? body.size() : cut, body.size()});
    ASSERT_TRUE(p.error.ok()) << cut;
    ASSERT_EQ(p.parts.size(), 3u);
    EXPECT_EQ(p.parts[0].data, bin);
  }
}

TEST(Multipart, RandomBinaryAndRandomPieces) {
  std::mt19937 rng(7);
  for (int round = 0; round < 200; ++round) {
    std::string data(rng() % 3000, '\0');
    for (char& c : data) c = static_cast<char>(rng() % 4 == 0 ? "\r\n-"[rng() % 3] : rng());
    const std::string body = Body(kB, {{"/x", data}, {"/y", data}});
    auto p = ParseAll(kB, body, {1 + rng() % 100, 1 + rng() % 7, 1 + rng() % 500});
    ASSERT_TRUE(p.error.ok()) << p.error;
    ASSERT_EQ(p.parts.size(), 2u);
    EXPECT_EQ(p.parts[0].data, data);
    EXPECT_EQ(p.parts[1].data, data);
  }
}

TEST(Multipart, MemoryStaysBoundedForALargePart) {
  const std::string data(8 << 20, 'a');
  size_t max_buffered = 0;
  auto p = ParseAll(kB, Body(kB, {{"/big", data}}), {64 << 10}, {}, &max_buffered);
  ASSERT_TRUE(p.error.ok());
  EXPECT_EQ(p.parts[0].data.size(), data.size());
  EXPECT_LE(max_buffered, (64u << 10) + 200);
}

TEST(Multipart, PreambleEpilogueHttpxStyleAndPadding) {
  std::string body = "preamble\r\n--B  \r\nContent-Disposition: form-data; name=\"file\"; "
                     "filename=\"a\\\\b%22c\"\r\n\r\nabc\r\n--B--trailing junk";
  auto p = ParseAll("B", body, {3});
  ASSERT_TRUE(p.error.ok()) << p.error;
  ASSERT_EQ(p.parts.size(), 1u);
  EXPECT_EQ(p.parts[0].filename, "a\\b%22c");  // as Go's mime parser: escapes undone, % kept
  EXPECT_EQ(p.parts[0].data, "abc");
}

TEST(Multipart, PartWithoutHeadersAndOtherNames) {
  auto p = ParseAll("B", "--B\r\n\r\nraw\r\n--B\r\ncontent-disposition: form-data; name=other\r\n\r\n"
                    "v\r\n--B--", {5});
  ASSERT_TRUE(p.error.ok()) << p.error;
  ASSERT_EQ(p.parts.size(), 2u);
  EXPECT_EQ(p.parts[0].name, "");
  EXPECT_EQ(p.parts[0].data, "raw");
  EXPECT_EQ(p.parts[1].name, "other");
  EXPECT_FALSE(p.parts[1].filename);
}

TEST(Multipart, MalformedIsRefusedClearly) {
  auto expect_error = [](std::string_view body, std::string_view words,
                         MultipartReader::Limits limits = {}) {
    auto p = ParseAll("B", body, {4}, limits);
    ASSERT_FALSE(p.error.ok()) << body;
    EXPECT_EQ(p.error.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(std::string(p.error.message()).find(words), std::string::npos) << p.error;
  };
  expect_error("", "no boundary line");
  expect_error("no boundary here at all", "no boundary line");
  expect_error("--B\r\nContent-Disposition: x\r\n\r\nabc", "ended before its boundary");
  expect_error("--B\r\nContent-Disposition: x\r\n", "ended in its headers");
  expect_error("--B\r\nContent-Disposition: x\r\n\r\nabc\r\n--B", "no closing");
  expect_error("--Bx\r\n\r\n", "neither CRLF");
  expect_error("--B\r\nno colon line\r\n\r\nabc\r\n--B--", "without a name");
  expect_error("--B\r\nX: " + std::string(100, 'a') + "\r\n\r\n\r\n--B--", "headers longer",
               {.max_header_bytes = 64});
  expect_error("--B\r\n\r\n\r\n--B\r\n\r\n\r\n--B\r\n\r\n\r\n--B--", "more than 2 parts",
               {.max_parts = 2});
  expect_error(std::string(1000, 'p') + "--B\r\n\r\n\r\n--B--", "no boundary in the first",
               {.max_preamble_bytes = 100});
  // Once failed, always failed.
  MultipartReader r("B");
  r.Feed("--Bx");
  EXPECT_FALSE(r.Next().ok());
  r.Feed("\r\n\r\n--B--");
  EXPECT_FALSE(r.Next().ok());
}

TEST(Multipart, Boundary) {
  EXPECT_EQ(*MultipartBoundary("multipart/form-data; boundary=----formdata-undici-0281"),
            "----formdata-undici-0281");
  EXPECT_EQ(*MultipartBoundary("Multipart/Form-Data;boundary=\"a b\""), "a b");
  EXPECT_EQ(*MultipartBoundary("multipart/form-data; charset=utf-8; boundary=x"), "x");
  EXPECT_FALSE(MultipartBoundary("multipart/form-data").ok());
  EXPECT_FALSE(MultipartBoundary("multipart/form-data; boundary=").ok());
  EXPECT_FALSE(MultipartBoundary("multipart/form-data; boundary=" + std::string(71, 'a')).ok());
  EXPECT_FALSE(MultipartBoundary("application/json; boundary=x").ok());
}

TEST(Multipart, DispositionParams) {
  EXPECT_EQ(DispositionParam("form-data; name=\"file\"; filename=\"/tmp/a.txt\"", "filename"),
            "/tmp/a.txt");
  EXPECT_EQ(DispositionParam("form-data; name=file", "name"), "file");
  EXPECT_EQ(DispositionParam("form-data; filename=\"a;b\"; name=x", "name"), "x");
  EXPECT_EQ(DispositionParam("form-data; filename=\"a\"; filename*=UTF-8''%C3%A9t%C3%A9",
                             "filename"),
            "\xc3\xa9t\xc3\xa9");
  EXPECT_EQ(DispositionParam("form-data; name=\"file\"", "filename"), std::nullopt);
  EXPECT_EQ(DispositionParam("form-data; filename=\"unterminated", "filename"), std::nullopt);
}

}  // namespace
}  // namespace sbx::api::e2b
