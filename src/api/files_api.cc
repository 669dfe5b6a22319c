// The files API: /v1/sandboxes/{id}/files[:list|:stat|:mkdir|:move] (docs/api.md, "Files").
// sbxd only checks what the JSON transport needs (a non-empty, UTF-8 path without NUL) and the
// sandbox's state; every path is resolved by the agent inside the sandbox's root
// (src/common/path_resolve.h). Downloads and uploads are streamed: neither sits in sbxd's memory.
#include <algorithm>
#include <cctype>
#include <charconv>

#include <fmt/format.h>

#include "api/api.h"
#include "api/e2b/e2b.h"
#include "api/handler_util.h"
#include "api/status_to_http.h"
#include "api/requests.h"
#include "common/json_util.h"
#include "common/log.h"
#include "common/status_util.h"
#include "service/agent_client.h"

namespace sbx::api {
namespace {

namespace bhttp = http::bhttp;
using nlohmann::json;
using Awaitable = http::asio::awaitable<std::optional<http::Response>>;

// An upload chunk becomes an agent frame (EncodeFrame: the chunk and an 8-byte header) in a
// fresh allocation. At 256 KiB that frame was just over sbxd's fixed mmap threshold
// (daemon/main.cc): an mmap and a munmap per chunk (strace of a 64 MiB PUT: 258 and 278). A
// few KiB less keeps it on the heap: one madvise per chunk instead (272), as glibc trims the
// arena; the pages are still faulted in again, which only a send of a pre-framed buffer avoids.
constexpr size_t kUploadChunk = 252 * 1024;

std::string JsonText(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

http::Response JsonOk(bhttp::status status, const json& body) {
  return JsonResponse(status, JsonText(body));
}

constexpr std::string_view kTarType = "application/x-tar";

// Whether a header (Accept, Content-Type) names `media` (parameters and other types aside).
bool MediaIs(const http::Request& req, bhttp::field f, std::string_view media) {
  auto it = req.find(f);
  if (it == req.end()) return false;
  std::string_view v(it->value().data(), it->value().size());
  while (!v.empty()) {
    const size_t comma = v.find(',');
    std::string_view item = v.substr(0, comma);
    item = item.substr(0, item.find(';'));
    while (!item.empty() && item.front() == ' ') item.remove_prefix(1);
    while (!item.empty() && item.back() == ' ') item.remove_suffix(1);
    if (item.size() == media.size() &&
        std::equal(item.begin(), item.end(), media.begin(),
                   [](char a, char b) { return std::tolower(a) == std::tolower(b); })) {
      return true;
    }
    if (comma == std::string_view::npos) break;
    v.remove_prefix(comma + 1);
  }
  return false;
}

absl::StatusOr<std::string> PathValue(const std::optional<std::string>& v, std::string_view field) {
  if (!v || v->empty()) {
    return ApiError(absl::StatusCode::kInvalidArgument, "invalid_path",
                    fmt::format("{} is required", field), field);
  }
  if (v->find('\0') != std::string::npos) {
    return ApiError(absl::StatusCode::kInvalidArgument, "invalid_path",
                    fmt::format("{} contains a NUL byte", field), field);
  }
  // The agent speaks JSON, which holds UTF-8 only; it validates everything else itself.
  try {
    (void)json(*v).dump();
  } catch (const json::exception&) {
    return ApiError(absl::StatusCode::kInvalidArgument, "invalid_path",
                    fmt::format("{} is not valid UTF-8", field), field);
  }
  return *v;
}

absl::StatusOr<bool> BoolParam(const Target& t, const std::string& key) {
  auto v = t.Query(key);
  if (!v || *v == "false" || *v == "0") return false;
  if (*v == "true" || *v == "1" || v->empty()) return true;
  return FieldError(key, fmt::format("{} must be true or false", key));
}

absl::StatusOr<std::optional<uint64_t>> UintParam(const std::optional<std::string>& v,
                                                  const std::string& key, int base, uint64_t max) {
  if (!v) return std::optional<uint64_t>();
  uint64_t out = 0;
  auto [p, ec] = std::from_chars(v->data(), v->data() + v->size(), out, base);
  if (v->empty() || ec != std::errc() || p != v->data() + v->size() || out > max) {
    return FieldError(key, fmt::format("{} must be {} between 0 and {}", key,
                                       base == 8 ? "an octal number" : "an integer",
                                       base == 8 ? fmt::format("{:o}", max) : std::to_string(max)));
  }
  return std::optional<uint64_t>(out);
}

// A JSON mode: an integer, or a string of octal digits ("0755").
absl::StatusOr<std::optional<uint64_t>> ModeField(const json& body) {
  auto it = body.find("mode");
  if (it == body.end() || it->is_null()) return std::optional<uint64_t>();
  if (it->is_number_unsigned() && it->get<uint64_t>() <= 07777) {
    return std::optional<uint64_t>(it->get<uint64_t>());
  }
  if (it->is_string()) return UintParam(it->get<std::string>(), "mode", 8, 07777);
  return FieldError("mode", "mode must be an integer or an octal string up to 7777");
}

absl::StatusOr<json> JsonBody(const http::Request& req, std::initializer_list<std::string_view> known) {
  auto parsed = ParseUntrustedJson(req.body(), kMaxRequestJsonDepth);
  if (!parsed.ok() && IsJsonTooDeep(parsed.status())) {
    return ApiError(absl::StatusCode::kInvalidArgument, "invalid_argument",
                    fmt::format("the request body is not valid JSON: it nests deeper than {} "
                                "levels",
                                kMaxRequestJsonDepth));
  }
  if (!parsed.ok() || !parsed->is_object()) {
    return FieldError("", "the request body must be a JSON object");
  }
  json body = std::move(*parsed);
  for (const auto& [k, v] : body.items()) {
    if (std::find(known.begin(), known.end(), k) == known.end()) {
      return FieldError(k, fmt::format("unknown field \"{}\"", k));
    }
  }
  return body;
}

absl::StatusOr<bool> JsonBool(const json& body, const char* key) {
  auto it = body.find(key);
  if (it == body.end() || it->is_null()) return false;
  if (!it->is_boolean()) return FieldError(key, fmt::format("{} must be a boolean", key));
  return it->get<bool>();
}

absl::StatusOr<std::optional<std::string>> JsonString(const json& body, const char* key) {
  auto it = body.find(key);
  if (it == body.end() || it->is_null()) return std::optional<std::string>();
  if (!it->is_string()) return FieldError(key, fmt::format("{} must be a string", key));
  return std::optional<std::string>(it->get<std::string>());
}

// "bytes=a-b", "bytes=a-", "bytes=-n". Anything else (several ranges, other units, junk) is
// ignored and the whole file is sent, as RFC 9110 allows.
struct ByteRange {
  std::optional<uint64_t> first, last, suffix;
};
std::optional<ByteRange> ParseRange(std::string_view v) {
  constexpr std::string_view kPrefix = "bytes=";
  if (v.substr(0, kPrefix.size()) != kPrefix) return std::nullopt;
  v.remove_prefix(kPrefix.size());
  if (v.find(',') != std::string_view::npos) return std::nullopt;
  const size_t dash = v.find('-');
  if (dash == std::string_view::npos) return std::nullopt;
  auto num = [](std::string_view s) -> std::optional<uint64_t> {
    uint64_t out = 0;
    auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
    if (s.empty() || ec != std::errc() || p != s.data() + s.size()) return std::nullopt;
    return out;
  };
  ByteRange r;
  const std::string_view a = v.substr(0, dash), b = v.substr(dash + 1);
  if (a.empty()) {
    r.suffix = num(b);
    if (!r.suffix) return std::nullopt;
    return r;
  }
  r.first = num(a);
  if (!r.first) return std::nullopt;
  if (!b.empty()) {
    r.last = num(b);
    if (!r.last || *r.last < *r.first) return std::nullopt;
  }
  return r;
}

// POST files:mkdir {"path","parents","mode"}.
absl::StatusOr<service::MkdirRequest> MkdirBody(const http::Request& req) {
  SBX_ASSIGN_OR_RETURN(json body, JsonBody(req, {"path", "parents", "mode"}));
  SBX_ASSIGN_OR_RETURN(auto path, JsonString(body, "path"));
  auto p = PathValue(path, "path");
  auto parents = JsonBool(body, "parents");
  auto mode = ModeField(body);
  SBX_RETURN_IF_ERROR(p.status());
  SBX_RETURN_IF_ERROR(parents.status());
  SBX_RETURN_IF_ERROR(mode.status());
  return service::MkdirRequest{*p, *parents, *mode};
}

// POST files:move {"from","to","overwrite"}.
absl::StatusOr<service::MoveRequest> MoveBody(const http::Request& req) {
  SBX_ASSIGN_OR_RETURN(json body, JsonBody(req, {"from", "to", "overwrite"}));
  auto from = JsonString(body, "from");
  auto to = JsonString(body, "to");
  SBX_RETURN_IF_ERROR(from.status());
  SBX_RETURN_IF_ERROR(to.status());
  auto f = PathValue(*from, "from");
  auto to_path = PathValue(*to, "to");
  auto overwrite = JsonBool(body, "overwrite");
  SBX_RETURN_IF_ERROR(f.status());
  SBX_RETURN_IF_ERROR(to_path.status());
  SBX_RETURN_IF_ERROR(overwrite.status());
  return service::MoveRequest{*f, *to_path, *overwrite};
}

// DELETE files, files:stat, files:mkdir and files:move: one short agent call each.
http::asio::awaitable<absl::StatusOr<http::Response>> ShortFileOp(http::RequestContext& ctx,
                                                                  service::AgentClient& agent,
                                                                  const std::string& what,
                                                                  const Target& t) {
  absl::StatusOr<service::FileEntry> entry = absl::UnknownError("no file operation");
  bhttp::status ok_status = bhttp::status::ok;
  if (what == "files" || what == "files:stat") {
    auto path = PathValue(t.Query("path"), "path");
    if (!path.ok()) co_return path.status();
    if (what == "files") {
      auto recursive = BoolParam(t, "recursive");
      if (!recursive.ok()) co_return recursive.status();
      absl::Status st = co_await agent.Delete(ctx.executor, *path, *recursive);
      if (!st.ok()) co_return st;
      co_return JsonOk(bhttp::status::ok, json::object());
    }
    entry = co_await agent.Stat(ctx.executor, *path);
  } else if (what == "files:mkdir") {
    auto request = MkdirBody(ctx.req);
    if (!request.ok()) co_return request.status();
    entry = co_await agent.Mkdir(ctx.executor, std::move(*request));
    ok_status = bhttp::status::created;
  } else {  // files:move
    auto request = MoveBody(ctx.req);
    if (!request.ok()) co_return request.status();
    entry = co_await agent.Move(ctx.executor, std::move(*request));
  }
  if (!entry.ok()) co_return entry.status();
  co_return JsonOk(ok_status, json{{"entry", entry->ToJson()}});
}

}  // namespace

bool Api::StreamsBody(const http::Request& req) {
  if (e2b::Gateway::StreamsBody(req)) return true;
  const bool put = req.method() == bhttp::verb::put, post = req.method() == bhttp::verb::post;
  if (!put && !post) return false;
  auto t = ParseTarget(req.target());
  if (!t.ok() || t->segments.empty() || t->segments[0] != "v1") return false;
  // An image archive for POST /v1/templates:import, a build context for :build
  // (template_routes.cc).
  if (post) {
    return t->segments.size() == 2 &&
           (t->segments[1] == "templates:import" || t->segments[1] == "templates:build");
  }
  return t->segments.size() == 4 && t->segments[1] == "sandboxes" && t->segments[3] == "files";
}

Awaitable Api::Files(http::RequestContext& ctx, const service::Caller& caller,
                     const std::string& sandbox_id, const std::string& what, const Target& t) {
  const auto method = ctx.req.method();
  auto fail = [&](const absl::Status& s) -> std::optional<http::Response> {
    return Fail(ctx, s);
  };
  const bool known = what == "files" || what == "files:list" || what == "files:stat" ||
                     what == "files:mkdir" || what == "files:move" || what == "files:watch";
  if (!known) {
    co_return fail(ApiError(absl::StatusCode::kNotFound, "not_found",
                            fmt::format("no route for {}", t.path)));
  }
  const bool want_post = what == "files:mkdir" || what == "files:move";
  const bool method_ok =
      what == "files" ? (method == bhttp::verb::get || method == bhttp::verb::put ||
                         method == bhttp::verb::delete_)
                      : method == (want_post ? bhttp::verb::post : bhttp::verb::get);
  if (!method_ok) {
    co_return fail(MethodNotAllowed(ctx.req, what == "files" ? "GET, PUT, DELETE"
                                             : want_post      ? "POST"
                                                              : "GET"));
  }
  // Tenancy first (another tenant's sandbox is 404), then state: like sessions, only a
  // running, unfrozen sandbox has an agent to talk to.
  auto sb = log::With(ctx.log, [&] { return svc_.GetSandbox(caller, sandbox_id); });
  if (!sb.ok()) co_return fail(sb.status());
  std::optional<service::AgentClient> agent = svc_.AgentFor(sandbox_id);
  if (!agent) {
    co_return fail(ApiError(absl::StatusCode::kFailedPrecondition, "sandbox_not_running",
                            fmt::format("sandbox {} is {}, not running", sandbox_id,
                                        sb->state == "running" ? "being paused" : sb->state)));
  }
  uint64_t disk_cap = 0;
  if (auto d = sb->effective_resources.find("disk_mib");
      d != sb->effective_resources.end() && d->is_number_integer() && d->get<int64_t>() > 0) {
    disk_cap = static_cast<uint64_t>(d->get<int64_t>()) << 20;
  }

  const bool streamed = what == "files:watch" || what == "files:list" ||
                        (what == "files" && method != bhttp::verb::delete_);
  if (!streamed) {
    auto res = co_await ShortFileOp(ctx, *agent, what, t);
    if (!res.ok()) co_return fail(res.status());
    co_return std::move(*res);
  }
  auto path = PathValue(t.Query("path"), "path");
  if (!path.ok()) co_return fail(path.status());
  if (what == "files:watch") {
    auto recursive = BoolParam(t, "recursive");
    if (!recursive.ok()) co_return fail(recursive.status());
    // Named values, not temporaries, across co_await (GCC 12 coroutine frames).
    service::WatchRequest request{*path, *recursive};
    co_return co_await FileWatch(ctx, *agent, std::move(request));
  }
  if (what == "files:list") {
    auto depth = UintParam(t.Query("depth"), "depth", 10, 32);
    if (!depth.ok()) co_return fail(depth.status());
    if (*depth && **depth == 0) co_return fail(FieldError("depth", "depth must be between 1 and 32"));
    service::ListRequest request{*path, depth->value_or(1)};
    GuestSizedFetch fetch = [&, request]() {
      return agent->ListBody(ctx.executor, request, "{");
    };
    co_return co_await GuestSizedReply(ctx, sandbox_id, std::move(fetch));
  }
  if (method == bhttp::verb::get) co_return co_await FileDownload(ctx, sandbox_id, *agent, *path);
  auto request = UploadRequest(ctx.req, t, std::move(*path));
  if (!request.ok()) co_return fail(request.status());
  co_return co_await FileUpload(ctx, sandbox_id, *agent, std::move(*request), disk_cap);
}

absl::StatusOr<service::WriteRequest> Api::UploadRequest(const http::Request& req,
                                                         const Target& t, std::string path) {
  service::WriteRequest request;
  request.tar = MediaIs(req, bhttp::field::content_type, kTarType);
  request.path = std::move(path);
  SBX_ASSIGN_OR_RETURN(request.mode, UintParam(t.Query("mode"), "mode", 8, 07777));
  SBX_ASSIGN_OR_RETURN(request.uid, UintParam(t.Query("uid"), "uid", 10, 0xFFFFFFFEu));
  SBX_ASSIGN_OR_RETURN(request.gid, UintParam(t.Query("gid"), "gid", 10, 0xFFFFFFFEu));
  SBX_ASSIGN_OR_RETURN(request.mkdirs, BoolParam(t, "mkdirs"));
  if (auto owner = t.Query("owner")) {
    SBX_ASSIGN_OR_RETURN(request.user, PathValue(owner, "owner"));  // the same transport rules
  }
  return request;
}

Awaitable Api::FileDownload(http::RequestContext& ctx, const std::string& sandbox_id,
                            service::AgentClient& agent, const std::string& path) {
  // A directory as a tar stream when the client asks for one (no ranges then).
  service::ReadRequest request;
  request.tar = MediaIs(ctx.req, bhttp::field::accept, kTarType);
  request.path = path;
  const bool tar = request.tar;
  std::optional<ByteRange> range;
  if (auto it = ctx.req.find(bhttp::field::range); !tar && it != ctx.req.end()) {
    range = ParseRange(std::string_view(it->value().data(), it->value().size()));
  }
  if (range) {
    if (range->suffix) {
      request.suffix = *range->suffix;
    } else {
      request.offset = *range->first;
      if (range->last) request.length = *range->last - *range->first + 1;
    }
  }
  auto awake = svc_.activity().StreamOpened(sandbox_id);
  auto stream = co_await agent.Read(ctx.executor, std::move(request));
  if (!stream.ok()) co_return ErrorResponse(stream.status(), ctx.request_id);
  const auto& reply = stream->reply();
  const uint64_t size = reply.entry.size;
  if (!reply.satisfiable) {
    stream->Close();
    http::Response res = ErrorResponse(
        ApiError(absl::StatusCode::kOutOfRange, "range_not_satisfiable",
                 fmt::format("the range is outside the file's {} bytes", size)),
        ctx.request_id);
    res.set(bhttp::field::content_range, fmt::format("bytes */{}", size));
    co_return res;
  }
  bhttp::response_header<> header;
  header.result(range ? bhttp::status::partial_content : bhttp::status::ok);
  header.version(ctx.req.version());
  header.set(bhttp::field::content_type, tar ? kTarType : "application/octet-stream");
  header.set(bhttp::field::cache_control, "no-store");
  header.set("X-Request-Id", ctx.request_id);
  if (!tar) {
    header.set(bhttp::field::accept_ranges, "bytes");
    header.set("X-Sbx-File-Size", std::to_string(size));
  }
  if (range) {
    header.set(bhttp::field::content_range,
               fmt::format("bytes {}-{}/{}", reply.offset, reply.offset + reply.length - 1, size));
  }
  if (!ctx.req.keep_alive()) header.set(bhttp::field::connection, "close");
  if (!co_await ctx.stream.Begin(std::move(header))) {
    stream->Close();
    co_return std::nullopt;
  }
  for (;;) {
    auto chunk = co_await stream->NextChunk();
    if (!chunk.ok()) {
      SBX_LOG_WARN(ctx.log, "download of {} from {} failed midway: {}", path, sandbox_id,
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
  // Midway failure: the chunked body is never ended, so the connection closes and the client
  // sees a truncated transfer instead of a short file that looks whole.
  stream->Close();
  co_return std::nullopt;
}

Awaitable Api::FileWatch(http::RequestContext& ctx, service::AgentClient& agent,
                         service::WatchRequest request) {
  auto stream = co_await agent.Watch(ctx.executor, std::move(request));
  if (!stream.ok()) co_return ErrorResponse(stream.status(), ctx.request_id);
  bhttp::response_header<> header;
  header.result(bhttp::status::ok);
  header.version(ctx.req.version());
  header.set(bhttp::field::content_type, "text/event-stream");
  header.set(bhttp::field::cache_control, "no-store");
  header.set("X-Accel-Buffering", "no");
  header.set("X-Request-Id", ctx.request_id);
  if (!ctx.req.keep_alive()) header.set(bhttp::field::connection, "close");
  if (!co_await ctx.stream.Begin(std::move(header))) {
    stream->Close();
    co_return std::nullopt;
  }
  // The watch worker in the agent lives as long as this connection to it: closing it (client
  // gone, found at the latest by the next keep-alive) makes the worker exit.
  uint64_t id = 0;
  for (;;) {
    auto ev = co_await stream->Next(opts_.keepalive_interval);
    if (!ev.ok()) {
      json err = {{"code", "agent_unavailable"}, {"message", std::string(ev.status().message())}};
      co_await ctx.stream.Write(SseEvent(0, "error", err.dump()));
      break;
    }
    if (!*ev && stream->ended()) break;  // the directory itself went away
    const bool written =
        *ev ? co_await ctx.stream.Write(SseEvent(++id, (*ev)->type, JsonText((*ev)->ToJson())))
            : co_await ctx.stream.Write(": keepalive\n\n");
    if (!written) {
      stream->Close();
      co_return std::nullopt;
    }
  }
  stream->Close();
  co_await ctx.stream.End();
  co_return std::nullopt;
}

// An upload's stream outlives the client's explainer (AgentClient::Explained): a suspend or
// delete that ends the agent mid-upload is told as the sandbox's state, not a 503.
absl::Status Api::AfterAgentLoss(const std::string& sandbox_id, absl::Status s) {
  if (s.code() != absl::StatusCode::kUnavailable) return s;
  return svc_.ExplainAgentLoss(sandbox_id, std::move(s));
}

Awaitable Api::FileUpload(http::RequestContext& ctx, const std::string& sandbox_id,
                          service::AgentClient& agent, service::WriteRequest request,
                          uint64_t disk_cap) {
  if (disk_cap > 0) {
    if (auto cl = ctx.req.find(bhttp::field::content_length); cl != ctx.req.end()) {
      uint64_t n = 0;
      const std::string_view v(cl->value().data(), cl->value().size());
      auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), n);
      if (ec == std::errc() && n > disk_cap) {
        co_return ErrorResponse(
            ApiError(absl::StatusCode::kInvalidArgument, "payload_too_large",
                     fmt::format("the upload of {} bytes is larger than the sandbox's disk cap "
                                 "of {} bytes",
                                 n, disk_cap)),
            ctx.request_id);
      }
    }
    request.max_bytes = disk_cap;
  }
  auto awake = svc_.activity().StreamOpened(sandbox_id);
  auto stream = co_await agent.Write(ctx.executor, std::move(request));
  if (!stream.ok()) co_return ErrorResponse(stream.status(), ctx.request_id);
  std::string buf(kUploadChunk, '\0');
  for (;;) {
    // Fill the chunk before forwarding it: a socket read returns what one or two TCP segments
    // brought (~16 KiB), and a frame per read made the agent hop dominate (8 MiB/s uploads).
    size_t n = 0;
    while (ctx.body != nullptr && n < buf.size()) {
      auto r = co_await ctx.body->ReadSome(buf.data() + n, buf.size() - n);
      if (!r.ok()) {
        stream->Abort();  // the agent sees EOF and removes its temporary file
        co_return ErrorResponse(r.status(), ctx.request_id);
      }
      if (*r == 0) break;
      n += *r;
    }
    if (n == 0) break;
    auto sent = co_await stream->Send(std::string_view(buf.data(), n));
    if (!sent.ok()) co_return ErrorResponse(AfterAgentLoss(sandbox_id, sent), ctx.request_id);
  }
  auto end = co_await stream->Finish();
  if (!end.ok()) co_return ErrorResponse(AfterAgentLoss(sandbox_id, end.status()), ctx.request_id);
  json body = end->entry ? json{{"entry", end->entry->ToJson()}}
                         : json{{"entries", end->tar->entries}, {"skipped", end->tar->skipped}};
  co_return JsonOk(bhttp::status::ok, body);
}

}  // namespace sbx::api
