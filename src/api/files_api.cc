// The files API: /v1/sandboxes/{id}/files[:list|:stat|:mkdir|:move] (docs/api.md, "Files").
// sbxd only checks what the JSON transport needs (a non-empty, UTF-8 path without NUL) and the
// sandbox's state; every path is resolved by the agent inside the sandbox's root
// (src/agent/path_resolve.h). Downloads and uploads are streamed: neither sits in sbxd's memory.
#include <algorithm>
#include <cctype>
#include <charconv>

#include <fmt/format.h>

#include "api/api.h"
#include "api/handler_util.h"
#include "api/status_to_http.h"
#include "api/requests.h"
#include "common/json_util.h"
#include "common/log.h"
#include "common/status_util.h"
#include "service/agent_stream.h"

namespace sbx::api {
namespace {

namespace bhttp = http::bhttp;
using nlohmann::json;
using Awaitable = http::asio::awaitable<std::optional<http::Response>>;

constexpr auto kAgentCallTimeout = std::chrono::seconds(10);
// How long a transfer may see nothing from the agent (a slow disk, an fsync of a large file)
// before it is abandoned.
constexpr auto kAgentIdle = std::chrono::seconds(30);
constexpr int kMaxIdlePeriods = 10;
constexpr size_t kUploadChunk = 256 * 1024;

http::Response JsonOk(bhttp::status status, const json& body) {
  return JsonResponse(status, body.dump(-1, ' ', false, json::error_handler_t::replace));
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

// A frame payload from the agent (untrusted: the guest may have replaced it) as a JSON object,
// depth-checked so that what is forwarded or logged can be dumped; nullopt if it is not one.
std::optional<json> AgentObject(std::string_view payload) {
  auto j = protocol::ParseObjectPayload(payload, "agent frame");
  if (!j.ok()) return std::nullopt;
  return std::move(*j);
}

// A non-negative integer field of an agent response, or `fallback` when it is missing or of
// another type (json::value() would throw on a string).
uint64_t U64Field(const json& obj, const char* key, uint64_t fallback) {
  auto it = obj.find(key);
  return it != obj.end() && it->is_number_unsigned() ? it->get<uint64_t>() : fallback;
}

// The agent's final kEnd (or an error frame) after a transfer.
http::asio::awaitable<absl::StatusOr<json>> ReadEnd(service::AgentStream& s) {
  for (int idle = 0; idle < kMaxIdlePeriods;) {
    auto f = co_await s.Next(kAgentIdle);
    if (!f.ok()) co_return f.status();
    if (!*f) {
      ++idle;
      continue;
    }
    if ((*f)->type == protocol::FrameType::kData) continue;
    if ((*f)->type != protocol::FrameType::kEnd) {
      co_return absl::InternalError("agent protocol: expected the end of a file transfer");
    }
    auto end = AgentObject((*f)->payload);
    if (!end) co_return absl::InternalError("agent protocol: the end frame is not a JSON object");
    if (!protocol::ResponseOk(*end)) co_return service::AgentErrorStatus(*end);
    co_return std::move(*end);
  }
  co_return absl::DeadlineExceededError("the agent did not finish the transfer in time");
}

}  // namespace

bool Api::StreamsBody(const http::Request& req) {
  if (req.method() != bhttp::verb::put) return false;
  auto t = ParseTarget(req.target());
  return t.ok() && t->segments.size() == 4 && t->segments[0] == "v1" &&
         t->segments[1] == "sandboxes" && t->segments[3] == "files";
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
    co_return fail(ApiError(absl::StatusCode::kInvalidArgument, "method_not_allowed",
                            fmt::format("method {} is not allowed on {}",
                                        std::string(ctx.req.method_string()), t.path)));
  }
  // Tenancy first (another tenant's sandbox is 404), then state: like sessions, only a
  // running, unfrozen sandbox has an agent to talk to.
  auto sb = log::With(ctx.log, [&] { return svc_.GetSandbox(caller, sandbox_id); });
  if (!sb.ok()) co_return fail(sb.status());
  auto sock = svc_.AgentSocketFor(sandbox_id);
  if (!sock) {
    co_return fail(ApiError(absl::StatusCode::kFailedPrecondition, "sandbox_not_running",
                            fmt::format("sandbox {} is {}, not running", sandbox_id,
                                        sb->state == "running" ? "being paused" : sb->state)));
  }
  uint64_t disk_cap = 0;
  if (auto d = sb->effective_resources.find("disk_mib");
      d != sb->effective_resources.end() && d->is_number_integer() && d->get<int64_t>() > 0) {
    disk_cap = static_cast<uint64_t>(d->get<int64_t>()) << 20;
  }

  json request;
  bhttp::status ok_status = bhttp::status::ok;
  if (what == "files" || what == "files:list" || what == "files:stat" || what == "files:watch") {
    auto path = PathValue(t.Query("path"), "path");
    if (!path.ok()) co_return fail(path.status());
    request["path"] = *path;
  }
  if (what == "files:watch") {
    auto recursive = BoolParam(t, "recursive");
    if (!recursive.ok()) co_return fail(recursive.status());
    request["op"] = "watch";
    request["recursive"] = *recursive;
    co_return co_await FileWatch(ctx, *sock, std::move(request));
  }
  if (what == "files") {
    if (method == bhttp::verb::get) co_return co_await FileDownload(ctx, sandbox_id, *sock,
                                                         request["path"].get<std::string>());
    if (method == bhttp::verb::put) {
      request["op"] = MediaIs(ctx.req, bhttp::field::content_type, kTarType) ? "write_tar" : "write";
      auto mode = UintParam(t.Query("mode"), "mode", 8, 07777);
      auto uid = UintParam(t.Query("uid"), "uid", 10, 0xFFFFFFFEu);
      auto gid = UintParam(t.Query("gid"), "gid", 10, 0xFFFFFFFEu);
      auto mkdirs = BoolParam(t, "mkdirs");
      if (!mode.ok()) co_return fail(mode.status());
      if (!uid.ok()) co_return fail(uid.status());
      if (!gid.ok()) co_return fail(gid.status());
      if (!mkdirs.ok()) co_return fail(mkdirs.status());
      if (*mode) request["mode"] = **mode;
      if (*uid) request["uid"] = **uid;
      if (*gid) request["gid"] = **gid;
      if (auto owner = t.Query("owner")) {
        auto o = PathValue(owner, "owner");  // the same transport rules
        if (!o.ok()) co_return fail(o.status());
        request["user"] = *o;
      }
      request["mkdirs"] = *mkdirs;
      co_return co_await FileUpload(ctx, sandbox_id, *sock, std::move(request), disk_cap);
    }
    auto recursive = BoolParam(t, "recursive");
    if (!recursive.ok()) co_return fail(recursive.status());
    request["op"] = "delete";
    request["recursive"] = *recursive;
  } else if (what == "files:stat") {
    request["op"] = "stat";
  } else if (what == "files:list") {
    request["op"] = "list";
    auto depth = UintParam(t.Query("depth"), "depth", 10, 32);
    if (!depth.ok()) co_return fail(depth.status());
    if (*depth && **depth == 0) co_return fail(FieldError("depth", "depth must be between 1 and 32"));
    request["depth"] = depth->value_or(1);
    co_return co_await GuestSizedReply(ctx, sandbox_id, *sock, std::move(request),
                                       protocol::ListReplySchema(), "{");
  } else if (what == "files:mkdir") {
    auto body = JsonBody(ctx.req, {"path", "parents", "mode"});
    if (!body.ok()) co_return fail(body.status());
    auto path = JsonString(*body, "path");
    if (!path.ok()) co_return fail(path.status());
    auto p = PathValue(*path, "path");
    auto parents = JsonBool(*body, "parents");
    auto mode = ModeField(*body);
    if (!p.ok()) co_return fail(p.status());
    if (!parents.ok()) co_return fail(parents.status());
    if (!mode.ok()) co_return fail(mode.status());
    request = {{"op", "mkdir"}, {"path", *p}, {"parents", *parents}};
    if (*mode) request["mode"] = **mode;
    ok_status = bhttp::status::created;
  } else {  // files:move
    auto body = JsonBody(ctx.req, {"from", "to", "overwrite"});
    if (!body.ok()) co_return fail(body.status());
    auto from = JsonString(*body, "from");
    auto to = JsonString(*body, "to");
    if (!from.ok()) co_return fail(from.status());
    if (!to.ok()) co_return fail(to.status());
    auto f = PathValue(*from, "from");
    auto to_path = PathValue(*to, "to");
    auto overwrite = JsonBool(*body, "overwrite");
    if (!f.ok()) co_return fail(f.status());
    if (!to_path.ok()) co_return fail(to_path.status());
    if (!overwrite.ok()) co_return fail(overwrite.status());
    request = {{"op", "move"}, {"from", *f}, {"to", *to_path}, {"overwrite", *overwrite}};
  }
  auto resp = co_await service::AsyncCallAgent(ctx.executor, *sock, std::move(request),
                                               kAgentCallTimeout);
  if (!resp.ok()) co_return fail(resp.status());
  resp->erase("ok");
  co_return JsonOk(ok_status, *resp);
}

Awaitable Api::FileDownload(http::RequestContext& ctx, const std::string& sandbox_id,
                            const std::string& socket, const std::string& path) {
  // A directory as a tar stream when the client asks for one (no ranges then).
  const bool tar = MediaIs(ctx.req, bhttp::field::accept, kTarType);
  json request = {{"op", tar ? "read_tar" : "read"}, {"path", path}};
  std::optional<ByteRange> range;
  if (auto it = ctx.req.find(bhttp::field::range); !tar && it != ctx.req.end()) {
    range = ParseRange(std::string_view(it->value().data(), it->value().size()));
  }
  if (range) {
    if (range->suffix) {
      request["suffix"] = *range->suffix;
    } else {
      request["offset"] = *range->first;
      if (range->last) request["length"] = *range->last - *range->first + 1;
    }
  }
  auto awake = svc_.activity().StreamOpened(sandbox_id);
  auto stream = co_await service::AgentStream::Open(ctx.executor, socket, request,
                                                    kAgentCallTimeout);
  if (!stream.ok()) co_return ErrorResponse(stream.status(), ctx.request_id);
  const json& resp = (*stream)->response();
  auto entry = resp.find("entry");
  const uint64_t size =
      entry != resp.end() && entry->is_object() ? U64Field(*entry, "size", 0) : 0;
  const uint64_t offset = U64Field(resp, "offset", 0);
  const uint64_t length = U64Field(resp, "length", 0);
  auto satisfiable = resp.find("satisfiable");
  if (satisfiable != resp.end() && satisfiable->is_boolean() && !satisfiable->get<bool>()) {
    (*stream)->Close();
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
               fmt::format("bytes {}-{}/{}", offset, offset + length - 1, size));
  }
  if (!ctx.req.keep_alive()) header.set(bhttp::field::connection, "close");
  if (!co_await ctx.stream.Begin(std::move(header))) {
    (*stream)->Close();
    co_return std::nullopt;
  }
  for (int idle = 0; idle < kMaxIdlePeriods;) {
    auto f = co_await (*stream)->Next(kAgentIdle);
    if (!f.ok()) break;
    if (!*f) {
      ++idle;
      continue;
    }
    idle = 0;
    if ((*f)->type == protocol::FrameType::kData) {
      if (!co_await ctx.stream.Write(std::move((*f)->payload))) break;
      continue;
    }
    if ((*f)->type == protocol::FrameType::kEnd) {
      auto end = AgentObject((*f)->payload);
      if (end && protocol::ResponseOk(*end)) {
        (*stream)->Close();
        co_await ctx.stream.End();
        co_return std::nullopt;
      }
      SBX_LOG_WARN(ctx.log, "download of {} from {} failed midway: {}", path, sandbox_id,
                   end ? std::string(service::AgentErrorStatus(*end).message())
                       : std::string("malformed end frame"));
    }
    break;
  }
  // Midway failure: the chunked body is never ended, so the connection closes and the client
  // sees a truncated transfer instead of a short file that looks whole.
  (*stream)->Close();
  co_return std::nullopt;
}

Awaitable Api::FileWatch(http::RequestContext& ctx, const std::string& socket, json request) {
  auto stream = co_await service::AgentStream::Open(ctx.executor, socket, std::move(request),
                                                    kAgentCallTimeout);
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
    (*stream)->Close();
    co_return std::nullopt;
  }
  // The watch worker in the agent lives as long as this connection to it: closing it (client
  // gone, found at the latest by the next keep-alive) makes the worker exit.
  uint64_t id = 0;
  for (;;) {
    auto f = co_await (*stream)->Next(opts_.keepalive_interval);
    if (!f.ok()) {
      json err = {{"code", "agent_unavailable"}, {"message", std::string(f.status().message())}};
      co_await ctx.stream.Write(SseEvent(0, "error", err.dump()));
      break;
    }
    if (!*f) {
      if (!co_await ctx.stream.Write(": keepalive\n\n")) {
        (*stream)->Close();
        co_return std::nullopt;
      }
      continue;
    }
    if ((*f)->type == protocol::FrameType::kEnd) break;  // the directory itself went away
    if ((*f)->type != protocol::FrameType::kData) continue;
    auto parsed = AgentObject((*f)->payload);
    if (!parsed || !parsed->contains("type") || !(*parsed)["type"].is_string()) continue;
    const json& ev = *parsed;
    const std::string type = ev["type"].get<std::string>();
    if (!co_await ctx.stream.Write(SseEvent(++id, type, ev.dump(-1, ' ', false,
                                                                 json::error_handler_t::replace)))) {
      (*stream)->Close();
      co_return std::nullopt;
    }
  }
  (*stream)->Close();
  co_await ctx.stream.End();
  co_return std::nullopt;
}

Awaitable Api::FileUpload(http::RequestContext& ctx, const std::string& sandbox_id,
                          const std::string& socket, json request, uint64_t disk_cap) {
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
    request["max_bytes"] = disk_cap;
  }
  auto awake = svc_.activity().StreamOpened(sandbox_id);
  auto stream = co_await service::AgentStream::Open(ctx.executor, socket, std::move(request),
                                                    kAgentCallTimeout);
  if (!stream.ok()) co_return ErrorResponse(stream.status(), ctx.request_id);
  auto& s = **stream;
  std::string buf(kUploadChunk, '\0');
  for (;;) {
    // Fill the chunk before forwarding it: a socket read returns what one or two TCP segments
    // brought (~16 KiB), and a frame per read made the agent hop dominate (8 MiB/s uploads).
    size_t n = 0;
    while (ctx.body != nullptr && n < buf.size()) {
      auto r = co_await ctx.body->ReadSome(buf.data() + n, buf.size() - n);
      if (!r.ok()) {
        s.Close();  // the agent sees EOF and removes its temporary file
        co_return ErrorResponse(r.status(), ctx.request_id);
      }
      if (*r == 0) break;
      n += *r;
    }
    const bool last = n == 0;
    // A named frame, not a temporary in the call: GCC 12 destroys a prvalue argument of a
    // coroutine twice when it comes from a conditional expression.
    std::string frame =
        last ? protocol::EncodeFrame(protocol::FrameType::kEnd, "{}")
             : protocol::EncodeFrame(protocol::FrameType::kData, std::string_view(buf.data(), n));
    auto sent = co_await s.Send(std::move(frame), kAgentIdle * kMaxIdlePeriods);
    if (!sent.ok()) {
      // The agent stopped reading: it failed (disk full, too large) and said why.
      auto end = co_await ReadEnd(s);
      s.Close();
      co_return ErrorResponse(end.ok() ? sent : end.status(), ctx.request_id);
    }
    if (last) break;
  }
  auto end = co_await ReadEnd(s);
  s.Close();
  if (!end.ok()) co_return ErrorResponse(end.status(), ctx.request_id);
  end->erase("ok");
  co_return JsonOk(bhttp::status::ok, *end);
}

}  // namespace sbx::api
