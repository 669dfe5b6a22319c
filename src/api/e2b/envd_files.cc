// envd's REST file routes, GET and POST /files (e2b-compat.md §6), over the agent's read and
// write streams as sbx's own files API uses them (files_api.cc): nothing is held in sbxd's
// memory but a chunk. Uploads are multipart/form-data (every part named "file", its filename
// the destination) or, when the SDK is asked to, the raw body (application/octet-stream,
// gzip-encoded or not). Paths as in envd_filesystem.cc: relative ones against the template's
// workdir.
#include <zlib.h>

#include <charconv>

#include <fmt/format.h>

#include "api/e2b/e2b.h"
#include "api/e2b/errors.h"
#include "api/e2b/multipart.h"
#include "api/handler_util.h"
#include "common/log.h"
#include "common/status_util.h"
#include "service/agent_client.h"

namespace sbx::api::e2b {
namespace {

namespace bhttp = http::bhttp;
namespace asio = http::asio;
using nlohmann::json;

// What is read from the client at once, and the size of the chunks sent to the agent (as
// files_api.cc's kUploadChunk: a frame of it stays under the mmap threshold).
constexpr size_t kReadChunk = 64 << 10;
constexpr size_t kUploadChunk = 252 * 1024;

absl::Status Bad(std::string_view message) {
  return ApiError(absl::StatusCode::kInvalidArgument, "invalid_argument", std::string(message));
}

absl::StatusOr<std::string> PathParam(const std::optional<std::string>& v, std::string_view what) {
  if (!v || v->empty()) return Bad(fmt::format("{} is required", what));
  if (v->find('\0') != std::string::npos) return Bad(fmt::format("{} contains a NUL byte", what));
  try {
    (void)json(*v).dump();  // the agent speaks JSON: UTF-8 only
  } catch (const json::exception&) {
    return Bad(fmt::format("{} is not valid UTF-8", what));
  }
  return *v;
}

std::string HeaderOr(const http::Request& req, bhttp::field f, std::string_view fallback = {}) {
  auto it = req.find(f);
  return it == req.end() ? std::string(fallback) : std::string(it->value());
}

std::string Lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

std::string MediaTypeOf(const std::string& content_type) {
  std::string m = content_type.substr(0, content_type.find(';'));
  while (!m.empty() && (m.back() == ' ' || m.back() == '\t')) m.pop_back();
  while (!m.empty() && (m.front() == ' ' || m.front() == '\t')) m.erase(0, 1);
  return Lower(m);
}

std::string BaseName(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

// ---- GET /files -----------------------------------------------------------------------------

Awaitable Download(EnvdCall& call) {
  http::RequestContext& ctx = call.ctx;
  auto path = PathParam(call.target.Query("path"), "path");
  if (!path.ok()) co_return RestError(ctx, path.status(), Side::kEnvd);
  auto awake = Gateway::Service(call.api).activity().StreamOpened(call.sandbox_id);
  service::ReadRequest request;
  request.path = *path;
  auto stream = co_await call.agent.Read(ctx.executor, std::move(request));
  if (!stream.ok()) co_return RestError(ctx, stream.status(), Side::kEnvd);
  // The SDKs want the length (an empty file is Content-Length: 0): the body is exactly the
  // agent's `length` bytes, or the connection closes short of it.
  bhttp::response_header<> header;
  header.result(bhttp::status::ok);
  header.version(ctx.req.version());
  header.set(bhttp::field::content_type, "application/octet-stream");
  header.set(bhttp::field::content_length, std::to_string(stream->reply().length));
  header.set(bhttp::field::cache_control, "no-store");
  header.set("X-Request-Id", ctx.request_id);
  if (!ctx.req.keep_alive()) header.set(bhttp::field::connection, "close");
  if (!co_await ctx.stream.Begin(std::move(header))) {
    stream->Close();
    co_return std::nullopt;
  }
  for (;;) {
    auto chunk = co_await stream->NextChunk();
    if (!chunk.ok()) {
      SBX_LOG_WARN(ctx.log, "GET /files {} of {} failed midway: {}", *path, call.sandbox_id,
                   std::string(chunk.status().message()));
      break;
    }
    if (!*chunk) {
      stream->Close();
      co_await ctx.stream.End();
      co_return std::nullopt;
    }
    if (!co_await ctx.stream.Write(std::move(**chunk))) break;
  }
  stream->Close();  // short of its Content-Length: the connection closes
  co_return std::nullopt;
}

// ---- POST /files ----------------------------------------------------------------------------

// One file being written: the agent's upload stream, fed in kUploadChunk pieces.
class FileSink {
 public:
  explicit FileSink(service::UploadStream s) : s_(std::move(s)) { buf_.reserve(kUploadChunk); }
  asio::awaitable<absl::Status> Append(std::string_view data) {
    while (!data.empty()) {
      const size_t n = std::min(data.size(), kUploadChunk - buf_.size());
      buf_.append(data.substr(0, n));
      data.remove_prefix(n);
      if (buf_.size() == kUploadChunk) {
        auto st = co_await s_.Send(buf_);
        buf_.clear();
        if (!st.ok()) co_return st;
      }
    }
    co_return absl::OkStatus();
  }
  asio::awaitable<absl::StatusOr<service::FileEntry>> Finish() {
    if (!buf_.empty()) {
      auto st = co_await s_.Send(buf_);
      buf_.clear();
      if (!st.ok()) co_return st;
    }
    auto end = co_await s_.Finish();
    if (!end.ok()) co_return end.status();
    if (!end->entry) {
      co_return ApiError(absl::StatusCode::kInternal, "bad_agent_reply",
                         "the agent's write ended without an entry");
    }
    co_return *end->entry;
  }
  void Abort() { s_.Abort(); }

 private:
  service::UploadStream s_;
  std::string buf_;
};

// A gzip body (Content-Encoding: gzip) inflated piece by piece.
class Gunzip {
 public:
  Gunzip() {
    zs_.zalloc = Z_NULL;
    zs_.zfree = Z_NULL;
    zs_.opaque = Z_NULL;
    ok_ = inflateInit2(&zs_, 16 + MAX_WBITS) == Z_OK;
  }
  ~Gunzip() {
    if (ok_) inflateEnd(&zs_);
  }
  Gunzip(const Gunzip&) = delete;
  Gunzip& operator=(const Gunzip&) = delete;
  // Takes `in` as the next input; Inflate then returns its output in pieces. The caller keeps
  // `in` alive until pending() is false.
  void Feed(std::string_view in) {
    zs_.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(in.data()));
    zs_.avail_in = static_cast<uInt>(in.size());
  }
  // Input left, or output zlib could not hand over in the last piece (it filled it).
  bool pending() const { return !done_ && (zs_.avail_in > 0 || full_); }
  // Replaces `out` with at most kMaxPiece inflated bytes of what was fed: a gzip bomb (1000:1)
  // costs sbxd one piece at a time, never the inflated chunk whole. InvalidArgument for a body
  // that is not gzip.
  static constexpr size_t kMaxPiece = 256 << 10;
  absl::Status Inflate(std::string& out) {
    if (!ok_) return absl::InternalError("zlib: inflateInit2 failed");
    out.resize(kMaxPiece);
    zs_.next_out = reinterpret_cast<Bytef*>(out.data());
    zs_.avail_out = static_cast<uInt>(out.size());
    const int r = inflate(&zs_, Z_NO_FLUSH);
    if (r != Z_OK && r != Z_STREAM_END && r != Z_BUF_ERROR) {
      out.clear();
      return Bad(fmt::format("the gzip body does not inflate: {}", zs_.msg ? zs_.msg : "corrupt"));
    }
    full_ = zs_.avail_out == 0;
    out.resize(out.size() - zs_.avail_out);
    if (r == Z_STREAM_END) done_ = true;
    // No progress with input left: zlib wants more than this input holds (a truncated body
    // is caught at the end by done()).
    if (r == Z_BUF_ERROR && out.empty()) {
      zs_.avail_in = 0;
      full_ = false;
    }
    return absl::OkStatus();
  }
  bool done() const { return done_; }

 private:
  z_stream zs_{};
  bool ok_ = false;
  bool done_ = false;
  bool full_ = false;
};

struct UploadContext {
  std::optional<std::string> user;  // ?username=
  uint64_t disk_cap = 0;            // 0: none
  uint64_t written = 0;             // bytes of this request's files so far
};

asio::awaitable<absl::StatusOr<FileSink>> OpenFile(EnvdCall& call, const std::string& path,
                                                   const UploadContext& up) {
  service::WriteRequest request;
  request.path = path;
  request.mkdirs = true;
  request.user = up.user;
  // The sandbox's disk cap, as sbx's own upload has it, over the whole request.
  if (up.disk_cap > 0) request.max_bytes = up.disk_cap > up.written ? up.disk_cap - up.written : 1;
  auto stream = co_await call.agent.Write(call.ctx.executor, std::move(request));
  if (!stream.ok()) co_return stream.status();
  co_return FileSink(std::move(*stream));
}

json WrittenInfo(const service::FileEntry& e) {
  return json{{"name", BaseName(e.path)}, {"path", e.path}, {"type", "file"}};
}

// Reads the next piece of the body; 0 at its end.
asio::awaitable<absl::StatusOr<size_t>> ReadBody(EnvdCall& call, std::string& buf,
                                                 bool& whole_body_taken) {
  if (call.ctx.body != nullptr) co_return co_await call.ctx.body->ReadSome(buf.data(), buf.size());
  // Not streamed (the gateway streams POST /files; kept for safety): the body in one piece.
  if (whole_body_taken) co_return size_t{0};
  whole_body_taken = true;
  buf = call.ctx.req.body();
  co_return buf.size();
}

asio::awaitable<absl::StatusOr<json>> UploadMultipart(EnvdCall& call, const std::string& boundary,
                                                      const std::optional<std::string>& path,
                                                      UploadContext& up) {
  MultipartReader reader(boundary);
  std::string buf(kReadChunk, '\0');
  bool taken = false;
  std::optional<FileSink> sink;
  json written = json::array();
  auto fail = [&](absl::Status s) -> absl::Status {
    if (sink) sink->Abort();
    return s;
  };
  for (;;) {
    auto ev = reader.Next();
    if (!ev.ok()) co_return fail(ev.status());
    switch (ev->kind) {
      case MultipartReader::Kind::kNeedMore: {
        buf.resize(kReadChunk);
        auto n = co_await ReadBody(call, buf, taken);
        if (!n.ok()) co_return fail(n.status());
        if (*n == 0) {
          reader.Finish();
        } else {
          reader.Feed(std::string_view(buf.data(), *n));
        }
        break;
      }
      case MultipartReader::Kind::kPart: {
        if (reader.part().name != "file") break;  // another field: its data is skipped
        // A single write names its destination in ?path= too; a multi-file write only in
        // each part's filename (envd: the query wins).
        std::optional<std::string> dest = path ? path : reader.part().filename;
        auto p = PathParam(dest, fmt::format("the filename of part {}", reader.parts()));
        if (!p.ok()) co_return fail(p.status());
        auto opened = co_await OpenFile(call, *p, up);
        if (!opened.ok()) co_return fail(opened.status());
        sink.emplace(std::move(*opened));
        break;
      }
      case MultipartReader::Kind::kData:
        if (sink) {
          auto st = co_await sink->Append(ev->data);
          if (!st.ok()) {
            sink.reset();  // the upload stream closed itself
            co_return fail(st);
          }
        }
        break;
      case MultipartReader::Kind::kPartEnd:
        if (sink) {
          auto entry = co_await sink->Finish();
          sink.reset();
          if (!entry.ok()) co_return entry.status();
          up.written += entry->size;
          written.push_back(WrittenInfo(*entry));
        }
        break;
      case MultipartReader::Kind::kEnd:
        if (written.empty()) {
          co_return Bad("the multipart body has no part named \"file\"");
        }
        co_return written;
    }
  }
}

asio::awaitable<absl::StatusOr<json>> UploadRaw(EnvdCall& call, const std::string& path,
                                                bool gzip, UploadContext& up) {
  auto opened = co_await OpenFile(call, path, up);
  if (!opened.ok()) co_return opened.status();
  FileSink sink = std::move(*opened);
  std::optional<Gunzip> gz;
  if (gzip) gz.emplace();
  std::string buf(kReadChunk, '\0'), inflated;
  bool taken = false;
  for (;;) {
    buf.resize(kReadChunk);
    auto n = co_await ReadBody(call, buf, taken);
    if (!n.ok()) {
      sink.Abort();
      co_return n.status();
    }
    if (*n == 0) break;
    std::string_view data(buf.data(), *n);
    if (!gz) {
      if (auto st = co_await sink.Append(data); !st.ok()) co_return st;
      continue;
    }
    gz->Feed(data);
    while (gz->pending()) {
      if (auto st = gz->Inflate(inflated); !st.ok()) {
        sink.Abort();
        co_return st;
      }
      if (auto st = co_await sink.Append(inflated); !st.ok()) co_return st;
    }
  }
  if (gz && !gz->done()) {
    sink.Abort();
    co_return Bad("the gzip body ended before its end");
  }
  auto entry = co_await sink.Finish();
  if (!entry.ok()) co_return entry.status();
  co_return json::array({WrittenInfo(*entry)});
}

Awaitable Upload(EnvdCall& call) {
  http::RequestContext& ctx = call.ctx;
  const http::Request& req = ctx.req;
  UploadContext up;
  if (auto u = call.target.Query("username"); u && !u->empty()) {
    auto user = PathParam(u, "username");
    if (!user.ok()) co_return RestError(ctx, user.status(), Side::kEnvd);
    up.user = *user;
  }
  std::optional<std::string> path;
  if (auto p = call.target.Query("path"); p && !p->empty()) {
    auto checked = PathParam(p, "path");
    if (!checked.ok()) co_return RestError(ctx, checked.status(), Side::kEnvd);
    path = *checked;
  }
  // The sandbox's disk cap (effective_resources.disk_mib), as sbx's own PUT has it: up front
  // from Content-Length, then as the bytes arrive (the agent's max_bytes).
  auto sb = Gateway::Service(call.api).GetSandbox(call.owner, call.sandbox_id);
  if (!sb.ok()) co_return RestError(ctx, sb.status(), Side::kEnvd);
  up.user = MakerOf(call, *sb, up.user);
  if (auto d = sb->effective_resources.find("disk_mib");
      d != sb->effective_resources.end() && d->is_number_integer() && d->get<int64_t>() > 0) {
    up.disk_cap = static_cast<uint64_t>(d->get<int64_t>()) << 20;
  }
  if (auto cl = req.find(bhttp::field::content_length); up.disk_cap > 0 && cl != req.end()) {
    uint64_t n = 0;
    const std::string_view v(cl->value().data(), cl->value().size());
    auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), n);
    if (ec == std::errc() && n > up.disk_cap + (64 << 10)) {  // multipart framing aside
      co_return RestError(ctx,
                          ApiError(absl::StatusCode::kInvalidArgument, "payload_too_large",
                                   fmt::format("the upload of {} bytes is larger than the "
                                               "sandbox's disk cap of {} bytes",
                                               n, up.disk_cap)),
                          Side::kEnvd);
    }
  }
  const std::string content_type = HeaderOr(req, bhttp::field::content_type);
  const std::string media = MediaTypeOf(content_type);
  auto awake = Gateway::Service(call.api).activity().StreamOpened(call.sandbox_id);
  absl::StatusOr<json> written = json::array();
  if (media == "multipart/form-data") {
    auto boundary = MultipartBoundary(content_type);
    if (!boundary.ok()) co_return RestError(ctx, boundary.status(), Side::kEnvd);
    written = co_await UploadMultipart(call, *boundary, path, up);
  } else if (media == "application/octet-stream" || media.empty()) {
    if (!path) {
      co_return RestError(ctx, Bad("an application/octet-stream upload needs ?path="),
                          Side::kEnvd);
    }
    const std::string encoding = Lower(HeaderOr(req, bhttp::field::content_encoding, "identity"));
    if (encoding != "identity" && encoding != "gzip") {
      co_return RestError(
          ctx, Bad(fmt::format("Content-Encoding {}: only gzip and identity are accepted", encoding)),
          Side::kEnvd);
    }
    written = co_await UploadRaw(call, *path, encoding == "gzip", up);
  } else {
    co_return RestError(ctx,
                        Bad(fmt::format("Content-Type {}: POST /files takes multipart/form-data "
                                        "or application/octet-stream",
                                        media)),
                        Side::kEnvd);
  }
  if (!written.ok()) co_return RestError(ctx, written.status(), Side::kEnvd);
  co_return RestJson(ctx, 200, written->dump(-1, ' ', false, json::error_handler_t::replace));
}

}  // namespace

std::optional<std::string> MakerOf(EnvdCall& call, const store::SandboxRecord& sb,
                                   const std::optional<std::string>& named) {
  if (named && !named->empty()) return named;
  if (call.user && !call.user->empty()) return call.user;
  // A template removed since the create leaves root, as for sessions (service/sessions.cc).
  auto tmpl = Gateway::Service(call.api).PinnedTemplate(sb);
  if (!tmpl.ok() || tmpl->default_user.empty() || tmpl->default_user == "root") {
    return std::nullopt;
  }
  return tmpl->default_user;
}

Awaitable FilesRest(EnvdCall& call) {
  const auto method = call.ctx.req.method();
  if (method == bhttp::verb::get) co_return co_await Download(call);
  if (method == bhttp::verb::post) co_return co_await Upload(call);
  co_return RestError(call.ctx, MethodNotAllowed(call.ctx.req, "GET, POST"), Side::kEnvd);
}

}  // namespace sbx::api::e2b
