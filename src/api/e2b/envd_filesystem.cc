// envd's filesystem.Filesystem service (e2b-compat.md §9) over the agent's file calls: every
// RPC is one AgentClient call (the polling watchers: an agent watch pumped into watchers.h's
// table), with E2B's message shapes. Paths go to the agent as the client gave them: absolute
// ones as they are, relative ones against the template's workdir (the agent's rule, sbx's files
// API's too; docs/e2b.md says why that and not the user's home).
#include "api/e2b/envd_filesystem.h"

#include <charconv>

#include <fmt/format.h>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>

#include "api/e2b/connect.h"
#include "api/e2b/e2b.h"
#include "api/e2b/envd_process.h"
#include "api/e2b/errors.h"
#include "api/e2b/state.h"
#include "common/json_util.h"
#include "common/log.h"
#include "common/status_util.h"
#include "service/agent_client.h"

namespace sbx::api::e2b {
namespace {

namespace bhttp = http::bhttp;
namespace asio = http::asio;
using nlohmann::json;
using JsonCall = asio::awaitable<absl::StatusOr<json>>;

// Keep-alive frames of WatchDir: the SDKs ask for one every 50 s (Keepalive-Ping-Interval);
// sooner finds a client that went away sooner (and frees the agent's watch worker).
constexpr std::chrono::milliseconds kKeepaliveCap{15000};
// How often a polling watcher's pump looks whether it was removed or abandoned.
constexpr std::chrono::milliseconds kPumpTick{2000};
// sbx's listing depth bound (the agent's); E2B's depth is unbounded, deeper asks get 32.
constexpr int64_t kMaxListDepth = 32;

absl::Status Bad(std::string_view field, std::string_view message) {
  return ApiError(absl::StatusCode::kInvalidArgument, "invalid_argument",
                  fmt::format("{}: {}", field, message));
}

// A required path field: a non-empty string without NUL (the JSON parser has checked UTF-8).
absl::StatusOr<std::string> PathField(const json& msg, std::string_view name) {
  const json* v = Field(msg, name);
  if (!v || !v->is_string() || v->get_ref<const std::string&>().empty()) {
    return Bad(name, "is required (a path)");
  }
  const std::string& p = v->get_ref<const std::string&>();
  if (p.find('\0') != std::string::npos) return Bad(name, "contains a NUL byte");
  return p;
}

absl::StatusOr<bool> BoolField(const json& msg, std::string_view name) {
  const json* v = Field(msg, name);
  if (!v) return false;
  if (!v->is_boolean()) return Bad(name, "must be a boolean");
  return v->get<bool>();
}

// The stream's whole answer when it fails before its first message: HTTP 200, the error in
// the end-of-stream frame (a status would lose the code).
http::Response StreamFailure(const http::Request& req, const RpcError& e) {
  http::Response res{bhttp::status::ok, req.version()};
  for (const auto& f : StreamHeader(req)) res.set(f.name_string(), f.value());
  res.body() = EndStreamEnvelope(e);
  res.prepare_payload();
  return res;
}

// The watched directory, absolute and normalized (events are named relative to it), after
// checking that it is one: envd answers invalid_argument for a file.
asio::awaitable<absl::StatusOr<std::string>> WatchRoot(EnvdCall& call, const std::string& path) {
  auto entry = co_await call.agent.Stat(call.ctx.executor, path);
  if (!entry.ok()) co_return entry.status();
  if (entry->type != "directory") {
    co_return ApiError(absl::StatusCode::kInvalidArgument, "not_a_directory",
                       fmt::format("path {} is not a directory", entry->path));
  }
  co_return entry->path;
}

// At most `cap` bytes of a small file of the sandbox; "" when it has none.
asio::awaitable<absl::StatusOr<std::string>> ReadSmallFile(EnvdCall& call, std::string path,
                                                           size_t cap) {
  service::ReadRequest request;
  request.path = std::move(path);
  request.offset = 0;
  request.length = cap;
  auto stream = co_await call.agent.Read(call.ctx.executor, std::move(request));
  if (!stream.ok()) {
    if (stream.status().code() == absl::StatusCode::kNotFound) co_return std::string();
    co_return stream.status();
  }
  std::string out;
  for (;;) {
    auto chunk = co_await stream->NextChunk();
    if (!chunk.ok()) {
      stream->Close();
      co_return chunk.status();
    }
    if (!*chunk) break;
    out += **chunk;
    if (out.size() >= cap) break;
  }
  stream->Close();
  if (out.size() > cap) out.resize(cap);
  co_return out;
}

// The sandbox's user and group names, cached (guest_ids.h); null when they cannot be read
// (EntryInfo then keeps the numbers: a name is a nicety, never a reason to fail a call).
asio::awaitable<std::shared_ptr<const GuestIds>> Ids(EnvdCall& call) {
  if (auto cached = call.state.guest_ids.Get(call.sandbox_id, GuestIdsCache::Clock::now())) {
    co_return cached;
  }
  auto passwd = co_await ReadSmallFile(call, "/etc/passwd", kMaxIdFileBytes);
  if (!passwd.ok()) co_return nullptr;
  auto group = co_await ReadSmallFile(call, "/etc/group", kMaxIdFileBytes);
  if (!group.ok()) co_return nullptr;
  auto ids = std::make_shared<const GuestIds>(ParseGuestIds(*passwd, *group));
  call.state.guest_ids.Put(call.sandbox_id, ids, GuestIdsCache::Clock::now());
  co_return ids;
}

asio::awaitable<json> Named(EnvdCall& call, json info) {
  if (auto ids = co_await Ids(call)) NameOwners(info, *ids);
  co_return info;
}

JsonCall Stat(EnvdCall& call, const json& msg) {
  auto path = PathField(msg, "path");
  if (!path.ok()) co_return path.status();
  auto entry = co_await call.agent.Stat(call.ctx.executor, *path);
  if (!entry.ok()) co_return entry.status();
  // Two statements: GCC 12 miscompiles some co_await inside a larger expression.
  json info = co_await Named(call, EntryInfo(*entry));
  co_return json{{"entry", std::move(info)}};
}

JsonCall MakeDir(EnvdCall& call, const json& msg) {
  auto path = PathField(msg, "path");
  if (!path.ok()) co_return path.status();
  auto sb = Gateway::Service(call.api).GetSandbox(call.owner, call.sandbox_id);
  if (!sb.ok()) co_return sb.status();
  const std::optional<std::string> maker = MakerOf(call, *sb);
  // Without parents first: an existing directory (or file) is then already_exists, which the
  // SDKs read as "makeDir returned false" (with parents, mkdir -p, it would be success).
  service::MkdirRequest one{*path, false, std::nullopt, maker};
  auto entry = co_await call.agent.Mkdir(call.ctx.executor, std::move(one));
  if (!entry.ok() && entry.status().code() == absl::StatusCode::kNotFound) {
    service::MkdirRequest all{*path, true, std::nullopt, maker};
    entry = co_await call.agent.Mkdir(call.ctx.executor, std::move(all));
  }
  if (!entry.ok()) co_return entry.status();
  // Two statements: GCC 12 miscompiles some co_await inside a larger expression.
  json info = co_await Named(call, EntryInfo(*entry));
  co_return json{{"entry", std::move(info)}};
}

JsonCall Move(EnvdCall& call, const json& msg) {
  auto from = PathField(msg, "source");
  if (!from.ok()) co_return from.status();
  auto to = PathField(msg, "destination");
  if (!to.ok()) co_return to.status();
  // envd renames with os.Rename, which replaces an existing file.
  service::MoveRequest request{*from, *to, true};
  auto entry = co_await call.agent.Move(call.ctx.executor, std::move(request));
  if (!entry.ok()) co_return entry.status();
  // Two statements: GCC 12 miscompiles some co_await inside a larger expression.
  json info = co_await Named(call, EntryInfo(*entry));
  co_return json{{"entry", std::move(info)}};
}

JsonCall Remove(EnvdCall& call, const json& msg) {
  auto path = PathField(msg, "path");
  if (!path.ok()) co_return path.status();
  absl::Status st = co_await call.agent.Delete(call.ctx.executor, *path, true);
  if (!st.ok()) co_return st;
  co_return json::object();
}

JsonCall ListDir(EnvdCall& call, const json& msg) {
  auto path = PathField(msg, "path");
  if (!path.ok()) co_return path.status();
  int64_t depth = 1;
  if (const json* d = Field(msg, "depth")) {
    auto n = JsonInt(*d);
    if (!n || *n < 0 || *n > UINT32_MAX) co_return Bad("depth", "must be a uint32");
    depth = *n == 0 ? 1 : std::min(*n, kMaxListDepth);
  }
  // A listing is as large as the guest makes it (4 MiB at most): sbx's gate on such replies
  // holds only a few at once, as for its own files:list.
  auto slot = co_await Gateway::Service(call.api).guest_replies().Acquire(call.ctx.executor,
                                                                          call.sandbox_id);
  if (!slot.ok()) co_return slot.status();
  service::ListRequest request{*path, static_cast<uint64_t>(depth)};
  auto body = co_await call.agent.ListBody(call.ctx.executor, std::move(request), "{");
  if (!body.ok()) co_return body.status();
  auto listing = ParseUntrustedJson(*body);
  std::string().swap(*body);
  if (!listing.ok() || !listing->is_object() || !listing->contains("entries") ||
      !(*listing)["entries"].is_array()) {
    co_return ApiError(absl::StatusCode::kInternal, "bad_agent_reply",
                       "the agent's listing is not {\"entries\": [...]}");
  }
  json entries = json::array();
  auto ids = co_await Ids(call);
  for (const json& e : (*listing)["entries"]) {
    if (auto info = EntryInfoFromListing(e)) {
      if (ids) NameOwners(*info, *ids);
      entries.push_back(std::move(*info));
    }
  }
  if (listing->value("truncated", false)) {
    SBX_LOG_WARN(call.ctx.log, "ListDir {} in {}: the agent's listing was truncated at {} entries",
                 *path, call.sandbox_id, entries.size());
  }
  co_return json{{"entries", std::move(entries)}};
}

// ---- polling watchers ---------------------------------------------------------------------

asio::awaitable<void> PumpWatcher(std::shared_ptr<Watcher> w, service::WatchStream stream,
                                  std::string root) {
  for (;;) {
    if (w->Abandoned(Clock::now(), WatcherTable::kIdle)) {
      w->End(ApiError(absl::StatusCode::kNotFound, "not_found",
                      "the watcher was removed, or not polled for 5 minutes"));
      break;
    }
    auto ev = co_await stream.Next(kPumpTick);
    if (!ev.ok()) {
      w->End(ev.status());
      break;
    }
    if (!*ev) {
      if (stream.ended()) {
        w->End(absl::OkStatus());
        break;
      }
      continue;
    }
    for (json& e : FilesystemEvents(root, **ev)) w->Push(std::move(e));
  }
  stream.Close();
}

JsonCall CreateWatcher(EnvdCall& call, const json& msg) {
  auto path = PathField(msg, "path");
  if (!path.ok()) co_return path.status();
  auto recursive = BoolField(msg, "recursive");
  if (!recursive.ok()) co_return recursive.status();
  auto root = co_await WatchRoot(call, *path);
  if (!root.ok()) co_return root.status();
  service::WatchRequest request{*root, *recursive};
  auto stream = co_await call.agent.Watch(call.ctx.executor, std::move(request));
  if (!stream.ok()) co_return stream.status();
  auto added = call.state.watchers.Add(call.sandbox_id, Clock::now());
  if (!added.ok()) {
    stream->Close();
    co_return added.status();
  }
  asio::co_spawn(call.ctx.executor,
                 PumpWatcher(added->second, std::move(*stream), std::move(*root)),
                 asio::detached);
  co_return json{{"watcherId", added->first}};
}

absl::StatusOr<std::string> WatcherId(const json& msg) {
  const json* v = Field(msg, "watcherId", "watcher_id");
  if (!v || !v->is_string() || v->get_ref<const std::string&>().empty()) {
    return Bad("watcherId", "is required");
  }
  return v->get<std::string>();
}

absl::Status NoWatcher(const std::string& id) {
  return ApiError(absl::StatusCode::kNotFound, "not_found",
                  fmt::format("watcher {} not found", id));
}

absl::StatusOr<json> GetWatcherEvents(EnvdCall& call, const json& msg) {
  SBX_ASSIGN_OR_RETURN(std::string id, WatcherId(msg));
  auto w = call.state.watchers.Get(call.sandbox_id, id);
  if (!w) return NoWatcher(id);
  SBX_ASSIGN_OR_RETURN(std::vector<json> events, w->Drain(Clock::now()));
  return json{{"events", std::move(events)}};
}

absl::StatusOr<json> RemoveWatcher(EnvdCall& call, const json& msg) {
  SBX_ASSIGN_OR_RETURN(std::string id, WatcherId(msg));
  if (!call.state.watchers.Remove(call.sandbox_id, id)) return NoWatcher(id);
  return json::object();
}

// ---- WatchDir (a server stream) -------------------------------------------------------------

std::optional<std::string_view> HeaderValue(const http::Request& req, std::string_view name) {
  auto it = req.find(name);
  if (it == req.end()) return std::nullopt;
  return std::string_view(it->value().data(), it->value().size());
}

Awaitable WatchDir(EnvdCall& call) {
  http::RequestContext& ctx = call.ctx;
  const http::Request& req = ctx.req;
  auto msg = ParseStreamRequest(req.body());
  if (!msg.ok()) co_return StreamFailure(req, RpcErrorFor(msg.status()));
  auto path = PathField(*msg, "path");
  if (!path.ok()) co_return StreamFailure(req, RpcErrorFor(path.status()));
  auto recursive = BoolField(*msg, "recursive");
  if (!recursive.ok()) co_return StreamFailure(req, RpcErrorFor(recursive.status()));
  // includeEntry / allowNetworkMounts: refused by the SDKs below envd 0.6.3 / 0.6.4, which
  // sbxd does not claim; ignored if sent anyway.
  auto timeout_ms = ParseTimeoutMs(HeaderValue(req, "Connect-Timeout-Ms"));
  if (!timeout_ms.ok()) co_return StreamFailure(req, RpcErrorFor(timeout_ms.status()));
  const auto keepalive = KeepaliveInterval(HeaderValue(req, "Keepalive-Ping-Interval"),
                                           kKeepaliveCap);
  std::optional<Clock::time_point> deadline;
  if (*timeout_ms) deadline = Clock::now() + std::chrono::milliseconds(**timeout_ms);

  auto root = co_await WatchRoot(call, *path);
  if (!root.ok()) co_return StreamFailure(req, RpcErrorFor(root.status()));
  service::WatchRequest request{*root, *recursive};
  auto stream = co_await call.agent.Watch(ctx.executor, std::move(request));
  if (!stream.ok()) co_return StreamFailure(req, RpcErrorFor(stream.status()));

  auto header = StreamHeader(req);
  header.set("X-Request-Id", ctx.request_id);
  if (!req.keep_alive()) header.set(bhttp::field::connection, "close");
  json start = json::object();
  start["start"] = json::object();
  std::string start_frame = MessageEnvelope(start);
  if (!co_await ctx.stream.Begin(std::move(header)) ||
      !co_await ctx.stream.Write(std::move(start_frame))) {
    stream->Close();
    co_return std::nullopt;
  }
  std::optional<RpcError> end;
  for (;;) {
    auto wait = std::chrono::duration_cast<std::chrono::milliseconds>(keepalive);
    if (deadline) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(*deadline -
                                                                               Clock::now());
      if (left.count() <= 0) {
        end = RpcError{Code::kDeadlineExceeded,
                       std::string("the watch's deadline (Connect-Timeout-Ms) passed")};
        break;
      }
      wait = std::min(wait, left);
    }
    auto ev = co_await stream->Next(wait);
    if (!ev.ok()) {
      end = RpcErrorFor(ev.status());
      break;
    }
    std::string out;
    if (*ev) {
      for (json& e : FilesystemEvents(*root, **ev)) {
        json m = json::object();
        m["filesystem"] = std::move(e);
        out += MessageEnvelope(m);
      }
    } else if (stream->ended()) {
      break;  // the directory itself went away
    } else if (!deadline || Clock::now() < *deadline) {
      json m = json::object();
      m["keepalive"] = json::object();
      out = MessageEnvelope(m);
    }
    if (!out.empty() && !co_await ctx.stream.Write(std::move(out))) {
      stream->Close();
      co_return std::nullopt;
    }
  }
  stream->Close();
  if (co_await ctx.stream.Write(EndStreamEnvelope(end))) co_await ctx.stream.End();
  co_return std::nullopt;
}

}  // namespace

// ---- pure helpers -------------------------------------------------------------------------

std::string GoPermissions(std::string_view type, uint64_t mode) {
  std::string s;
  // Go's type letters, in its order ("dalTLDpSugct?"), for what sbx tells apart.
  if (type == "directory") s += 'd';
  if (type == "symlink") s += 'L';
  if (mode & 04000) s += 'u';
  if (mode & 02000) s += 'g';
  if (mode & 01000) s += 't';
  if (type == "other") s += '?';
  if (s.empty()) s += '-';
  constexpr std::string_view kRwx = "rwxrwxrwx";
  for (int i = 0; i < 9; ++i) s += (mode & (1u << (8 - i))) ? kRwx[i] : '-';
  return s;
}

json EntryInfo(const service::FileEntry& e) {
  std::string_view type = "FILE_TYPE_FILE";
  if (e.type == "directory") type = "FILE_TYPE_DIRECTORY";
  if (e.type == "symlink") type = "FILE_TYPE_SYMLINK";
  json j = {{"name", e.name},
            {"type", type},
            {"path", e.path},
            {"size", std::to_string(e.size)},
            {"mode", e.mode & 0777},
            {"permissions", GoPermissions(e.type, e.mode)},
            {"owner", std::to_string(e.uid)},
            {"group", std::to_string(e.gid)},
            {"modifiedTime", e.mtime}};
  if (e.symlink_target) j["symlinkTarget"] = *e.symlink_target;
  return j;
}

void NameOwners(json& info, const GuestIds& ids) {
  auto rename = [&](const char* field, const std::map<uint32_t, std::string>& names) {
    auto it = info.find(field);
    if (it == info.end() || !it->is_string()) return;
    uint32_t id = 0;
    const std::string& s = it->get_ref<const std::string&>();
    auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), id);
    if (ec != std::errc() || p != s.data() + s.size()) return;
    if (auto n = names.find(id); n != names.end()) *it = n->second;
  };
  rename("owner", ids.user_names);
  rename("group", ids.group_names);
}

std::optional<json> EntryInfoFromListing(const json& entry) {
  auto e = service::FileEntry::FromJson(entry, "list");
  if (!e.ok()) return std::nullopt;
  return EntryInfo(*e);
}

std::vector<json> FilesystemEvents(std::string_view root, const service::FileWatchEvent& ev) {
  constexpr std::string_view kUploadTemp = ".sbx-upload-";
  auto rel = [&](std::string_view p) -> std::optional<std::string> {
    if (p == root) return std::nullopt;
    const std::string prefix = root == "/" ? std::string("/") : std::string(root) + "/";
    if (p.substr(0, prefix.size()) != prefix) return std::nullopt;
    return std::string(p.substr(prefix.size()));
  };
  auto is_temp = [&](std::string_view p) {
    const size_t slash = p.rfind('/');
    return p.substr(slash == std::string_view::npos ? 0 : slash + 1).substr(0, kUploadTemp.size()) ==
           kUploadTemp;
  };
  auto event = [](std::string name, std::string_view type) {
    return json{{"name", std::move(name)}, {"type", type}};
  };
  std::vector<json> out;
  auto name = rel(ev.path);
  if (!name || ev.type == "overflow") return out;
  if (ev.type == "move") {
    if (ev.from && is_temp(*ev.from)) {
      // The agent closes the file after the rename: its modify (WRITE) follows.
      out.push_back(event(*name, "EVENT_TYPE_CREATE"));
      return out;
    }
    if (ev.from) {
      if (auto old = rel(*ev.from)) out.push_back(event(*old, "EVENT_TYPE_RENAME"));
    }
    out.push_back(event(*name, "EVENT_TYPE_CREATE"));
    return out;
  }
  if (is_temp(ev.path)) return out;
  if (ev.type == "create") out.push_back(event(*name, "EVENT_TYPE_CREATE"));
  if (ev.type == "modify") out.push_back(event(*name, "EVENT_TYPE_WRITE"));
  if (ev.type == "delete") out.push_back(event(*name, "EVENT_TYPE_REMOVE"));
  return out;
}

Awaitable FilesystemRpc(EnvdCall& call, std::string_view method) {
  const http::Request& req = call.ctx.req;
  const bool stream = ShapeOf(req) == Shape::kStream;
  if (method == "WatchDir") {
    if (!stream) {
      co_return UnaryError(req, RpcError{Code::kInvalidArgument,
                                         "WatchDir is a server stream: Content-Type "
                                         "application/connect+json"});
    }
    co_return co_await WatchDir(call);
  }
  const bool known = method == "Stat" || method == "MakeDir" || method == "Move" ||
                     method == "ListDir" || method == "Remove" || method == "CreateWatcher" ||
                     method == "GetWatcherEvents" || method == "RemoveWatcher";
  if (!known || stream) {
    RpcError e{Code::kUnimplemented,
               known ? fmt::format("filesystem.Filesystem/{} is a unary call", method)
                     : fmt::format("filesystem.Filesystem has no method {}", method)};
    if (stream) co_return StreamFailure(req, e);
    co_return UnaryError(req, e);
  }
  auto msg = ParseUnaryRequest(req.body());
  if (!msg.ok()) co_return UnaryError(req, RpcErrorFor(msg.status()));
  absl::StatusOr<json> out = json::object();
  if (method == "Stat") {
    out = co_await Stat(call, *msg);
  } else if (method == "MakeDir") {
    out = co_await MakeDir(call, *msg);
  } else if (method == "Move") {
    out = co_await Move(call, *msg);
  } else if (method == "ListDir") {
    out = co_await ListDir(call, *msg);
  } else if (method == "Remove") {
    out = co_await Remove(call, *msg);
  } else if (method == "CreateWatcher") {
    out = co_await CreateWatcher(call, *msg);
  } else if (method == "GetWatcherEvents") {
    out = GetWatcherEvents(call, *msg);
  } else {
    out = RemoveWatcher(call, *msg);
  }
  if (!out.ok()) co_return UnaryError(req, RpcErrorFor(out.status()));
  co_return UnaryReply(req, *out);
}

}  // namespace sbx::api::e2b
