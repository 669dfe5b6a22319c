#include "api/cluster_router.h"

#include <algorithm>
#include <cctype>

#include <boost/asio/experimental/awaitable_operators.hpp>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "api/e2b/e2b.h"
#include "api/handler_util.h"
#include "api/http_relay.h"
#include "api/port_target.h"
#include "api/render.h"
#include "common/json_util.h"
#include "common/log.h"
#include "common/status_util.h"
#include "common/unique_fd.h"

namespace sbx::api {
namespace {

namespace asio = http::asio;
namespace bhttp = http::bhttp;
using tcp = asio::ip::tcp;
using namespace asio::experimental::awaitable_operators;

constexpr auto kTuple = asio::as_tuple(asio::use_awaitable);

std::vector<std::string_view> Segments(std::string_view path) {
  std::vector<std::string_view> out;
  size_t i = 0;
  while (i < path.size()) {
    while (i < path.size() && path[i] == '/') ++i;
    size_t j = path.find('/', i);
    if (j == std::string_view::npos) j = path.size();
    if (j > i) out.push_back(path.substr(i, j - i));
    i = j;
  }
  return out;
}

// "sbx_abc:pause" or "sbx_abc" -> "sbx_abc" (routes write verbs after a colon too).
std::string IdOf(std::string_view seg) {
  const size_t colon = seg.find(':');
  return std::string(seg.substr(0, colon));
}

absl::Status NodeUnreachable(const service::Cluster::Target& to, std::string_view why) {
  return ApiError(absl::StatusCode::kUnavailable, "node_unreachable",
                  fmt::format("node {} ({}): {}", to.node, to.url, why));
}

// "http://host:port" -> host, port.
absl::StatusOr<std::pair<std::string, std::string>> HostPortOf(std::string_view url) {
  constexpr std::string_view kScheme = "http://";
  if (url.substr(0, kScheme.size()) != kScheme) {
    return absl::InvalidArgumentError(fmt::format("node URL {} is not http://", url));
  }
  url.remove_prefix(kScheme.size());
  if (const size_t slash = url.find('/'); slash != std::string_view::npos) url = url.substr(0, slash);
  std::string_view host = url, port = "80";
  if (!url.empty() && url.front() == '[') {
    const size_t close = url.find(']');
    if (close == std::string_view::npos) return absl::InvalidArgumentError("bad IPv6 node URL");
    host = url.substr(1, close - 1);
    if (close + 1 < url.size() && url[close + 1] == ':') port = url.substr(close + 2);
  } else if (const size_t colon = url.rfind(':'); colon != std::string_view::npos) {
    host = url.substr(0, colon);
    port = url.substr(colon + 1);
  }
  if (host.empty() || port.empty()) {
    return absl::InvalidArgumentError(fmt::format("node URL http://{} has no host or port", url));
  }
  return std::make_pair(std::string(host), std::string(port));
}

asio::awaitable<absl::StatusOr<tcp::socket>> Dial(asio::any_io_executor ex,
                                                  const service::Cluster::Target& to,
                                                  std::chrono::milliseconds timeout, bool* ipv6) {
  auto hp = HostPortOf(to.url);
  if (!hp.ok()) co_return NodeUnreachable(to, std::string(hp.status().message()));
  tcp::resolver resolver(ex);
  auto [rec, endpoints] = co_await resolver.async_resolve(hp->first, hp->second, kTuple);
  if (rec) co_return NodeUnreachable(to, fmt::format("resolve: {}", rec.message()));
  tcp::socket sock(ex);
  asio::steady_timer deadline(ex);
  deadline.expires_after(timeout);
  auto r = co_await (asio::async_connect(sock, endpoints, kTuple) || deadline.async_wait(kTuple));
  if (r.index() == 1) {
    co_return NodeUnreachable(to, fmt::format("connect did not complete within {} ms",
                                              timeout.count()));
  }
  auto [cec, ep] = std::get<0>(r);
  if (cec) co_return NodeUnreachable(to, fmt::format("connect: {}", cec.message()));
  (void)SetCloseOnExec(sock.native_handle());  // asio opened it without SOCK_CLOEXEC
  boost::system::error_code ignored;
  sock.set_option(tcp::no_delay(true), ignored);
  *ipv6 = ep.address().is_v6();
  co_return std::move(sock);
}

}  // namespace

namespace {

// An id that can name a stored object: anything else goes to any node, which answers 404.
RouteKey Keyed(RouteKey::Kind kind, std::string id) {
  const bool ok = !id.empty() && id.size() <= 128 &&
                  std::all_of(id.begin(), id.end(), [](unsigned char c) {
                    return std::isalnum(c) || c == '_' || c == '-';
                  });
  if (!ok) return {RouteKey::Kind::kAny, ""};
  return {kind, std::move(id)};
}

RouteKey ClassifyRaw(const http::Request& req, std::string_view ports_domain);

}  // namespace

RouteKey Classify(const http::Request& req, std::string_view ports_domain) {
  RouteKey k = ClassifyRaw(req, ports_domain);
  using Kind = RouteKey::Kind;
  if (k.kind == Kind::kSandbox || k.kind == Kind::kSession || k.kind == Kind::kOperation) {
    return Keyed(k.kind, std::move(k.id));
  }
  return k;
}

namespace {

RouteKey ClassifyRaw(const http::Request& req, std::string_view ports_domain) {
  using Kind = RouteKey::Kind;
  const std::string_view target(req.target().data(), req.target().size());
  const std::string_view path = target.substr(0, target.find('?'));
  // Port traffic by host name, and E2B's envd by host name or header, before any path: their
  // paths are the application's.
  if (!ports_domain.empty()) {
    if (auto host = req.find(bhttp::field::host); host != req.end()) {
      auto m = MatchPortHost(std::string_view(host->value().data(), host->value().size()),
                             target, ports_domain);
      if (m && m->ok()) return {Kind::kSandbox, e2b::SbxSandboxId((*m)->sandbox_id)};
    }
  }
  if (auto h = req.find("E2b-Sandbox-Id"); h != req.end()) {
    return {Kind::kSandbox, e2b::SbxSandboxId(std::string_view(h->value().data(), h->value().size()))};
  }
  const auto seg = Segments(path);
  if (seg.size() == 1 && (seg[0] == "healthz" || seg[0] == "readyz" || seg[0] == "metrics")) {
    return {Kind::kLocal, ""};
  }
  const bool post = req.method() == bhttp::verb::post;
  if (seg.size() >= 2 && seg[0] == "v1") {
    if (seg[1] == "sandboxes") {
      if (seg.size() == 2) return {post ? Kind::kCreate : Kind::kAny, ""};
      return {Kind::kSandbox, IdOf(seg[2])};
    }
    if (seg[1] == "sessions" && seg.size() >= 3) return {Kind::kSession, IdOf(seg[2])};
    if (seg[1] == "operations" && seg.size() >= 3) return {Kind::kOperation, IdOf(seg[2])};
    return {Kind::kAny, ""};
  }
  // E2B's control plane (e2b/control_plane.cc): /sandboxes, /sandboxes/{id}/..., /v2/sandboxes.
  size_t s = !seg.empty() && seg[0] == "v2" ? 1 : 0;
  if (seg.size() > s && seg[s] == "sandboxes") {
    if (seg.size() == s + 1) return {post && s == 0 ? Kind::kCreate : Kind::kAny, ""};
    return {Kind::kSandbox, e2b::SbxSandboxId(IdOf(seg[s + 1]))};
  }
  return {Kind::kAny, ""};
}

}  // namespace

std::optional<service::PlacementRequest> PlacementOf(const http::Request& req, bool e2b) {
  auto body = ParseUntrustedJson(req.body());
  if (!body.ok() || !body->is_object()) return std::nullopt;
  service::PlacementRequest p;
  const char* tkey = e2b ? "templateID" : "template";
  if (auto t = body->find(tkey); t != body->end()) {
    if (!t->is_string()) return std::nullopt;
    p.template_ref = t->get<std::string>();
  } else {
    p.template_ref = "base";
  }
  // As nodes report templates: "name:tag" (latest when no tag), or a digest.
  if (p.template_ref.find(':') == std::string::npos && p.template_ref.find('@') == std::string::npos &&
      p.template_ref != "base") {
    p.template_ref += ":latest";
  }
  if (auto r = body->find("runtime"); r != body->end() && r->is_string()) {
    p.runtime = r->get<std::string>();
  }
  if (auto res = body->find("resources"); res != body->end() && res->is_object()) {
    auto num = [&](const char* k) {
      auto it = res->find(k);
      return it != res->end() && it->is_number_integer() ? it->get<int64_t>() : int64_t{0};
    };
    p.vcpu = num("vcpu");
    p.memory_mib = num("memory_mib");
    p.disk_mib = num("disk_mib");
  }
  // sbx's own create only (E2B's has no such field); the node checks the rest of it.
  if (auto pl = body->find("placement"); !e2b && pl != body->end() && pl->is_object()) {
    auto key = pl->find("anti_affinity");
    auto labels = body->find("labels");
    if (key != pl->end() && key->is_string() && labels != body->end() && labels->is_object()) {
      auto value = labels->find(key->get<std::string>());
      if (value != labels->end() && value->is_string()) {
        p.anti_affinity = true;
        p.group_key = key->get<std::string>();
        p.group_value = value->get<std::string>();
      }
    }
  }
  return p;
}

void ClusterRouter::RememberMade(const std::string& body, const std::string& served_by) {
  auto j = ParseUntrustedJson(body);
  if (!j.ok() || !j->is_object()) return;
  // The sandbox's own view says where it is: a create replayed under its Idempotency-Key by
  // another node answers for a sandbox the first node made.
  std::string node = served_by;
  if (auto sb = j->find("sandbox"); sb != j->end() && sb->is_object()) {
    if (auto n = sb->find("node"); n != sb->end() && n->is_string()) node = n->get<std::string>();
  }
  auto remember = [&](const char* object, const char* field) {
    auto o = j->find(object);
    if (o == j->end() || !o->is_object()) return;
    auto id = o->find(field);
    if (id != o->end() && id->is_string()) cluster_.RememberOwner(id->get<std::string>(), node);
  };
  remember("sandbox", "id");
  remember("operation", "id");
  if (auto s = j->find("session_id"); s != j->end() && s->is_string()) {
    cluster_.RememberOwner(s->get<std::string>(), node);
  }
}

ClusterRouter::ClusterRouter(service::Cluster& cluster, ClusterRouterOptions opts)
    : cluster_(cluster),
      opts_(std::move(opts)),
      registry_(opts_.metrics != nullptr ? *opts_.metrics : metrics::Default()),
      forwarded_(registry_.AddCounter(
          "sbx_api_forwarded_total",
          "Requests an api replica forwarded, by node and outcome (ok: the node answered; "
          "unreachable: it could not be reached or broke off).",
          {"node", "outcome"})) {}

bool ClusterRouter::StreamsBody(const http::Request& req) {
  return Classify(req, "").kind != RouteKey::Kind::kCreate;
}

absl::StatusOr<service::Cluster::Target> ClusterRouter::TargetOf(const RouteKey& key,
                                                                 const http::Request& req,
                                                                 bool* any) {
  *any = false;
  using Kind = RouteKey::Kind;
  absl::StatusOr<std::optional<service::Cluster::Target>> owner = std::nullopt;
  switch (key.kind) {
    case Kind::kCreate: {
      const std::string_view target(req.target().data(), req.target().size());
      const bool e2b = target.rfind("/v1/", 0) != 0;
      auto p = PlacementOf(req, e2b);
      if (!p) {
        *any = true;
        return cluster_.AnyNode();  // the node says what is wrong with the body
      }
      if (p->anti_affinity) {
        auto tenant = opts_.tenant_of ? opts_.tenant_of(req)
                                      : absl::StatusOr<std::string>(absl::UnavailableError(""));
        if (tenant.ok()) {
          p->tenant = std::move(*tenant);
        } else {
          p->anti_affinity = false;
        }
      }
      std::string why;
      auto placed = cluster_.Place(*p, &why);
      if (placed.ok()) spdlog::debug("placed on {}: {}", placed->node, why);
      return placed;
    }
    case Kind::kSandbox:
      owner = cluster_.NodeOfSandbox(key.id);
      break;
    case Kind::kSession:
      owner = cluster_.NodeOfSession(key.id);
      break;
    case Kind::kOperation:
      owner = cluster_.NodeOfOperation(key.id);
      break;
    default:
      break;
  }
  if (!owner.ok()) return owner.status();
  // GET of the object itself (/v1/sandboxes/{id}, /v1/sessions/{id}, /v1/operations/{id}) is
  // a read of the store: any node answers it when the owner does not take the connection (it
  // died and is not declared lost yet).
  const std::string_view target(req.target().data(), req.target().size());
  *any = (req.method() == bhttp::verb::get || req.method() == bhttp::verb::head) &&
         Segments(target.substr(0, target.find('?'))).size() == 3;
  if (owner->has_value()) return **owner;
  *any = true;
  return cluster_.AnyNode();
}

asio::awaitable<std::optional<http::Response>> ClusterRouter::Handle(http::RequestContext& ctx) {
  const RouteKey key = Classify(ctx.req, opts_.ports_domain);
  if (key.kind == RouteKey::Kind::kLocal) {
    const std::string_view target(ctx.req.target().data(), ctx.req.target().size());
    if (target.rfind("/metrics", 0) == 0) {
      http::Response res{bhttp::status::ok, 11};
      res.set(bhttp::field::content_type, metrics::kContentType);
      res.set(bhttp::field::cache_control, "no-store");
      res.body() = registry_.Expose();
      co_return res;
    }
    if (target.rfind("/readyz", 0) == 0) {
      auto any = cluster_.AnyNode();
      if (!any.ok()) co_return Fail(ctx, any.status());
      co_return RenderJson(bhttp::status::ok, {{"status", "ready"}, {"role", "api"}});
    }
    co_return RenderJson(bhttp::status::ok, {{"status", "ok"}, {"role", "api"}});
  }
  bool any = false;
  auto to = TargetOf(key, ctx.req, &any);
  if (!to.ok()) co_return Fail(ctx, to.status());
  const std::string_view target(ctx.req.target().data(), ctx.req.target().size());
  const bool node_change =
      ctx.req.method() == bhttp::verb::post && target.rfind("/v1/admin/nodes/", 0) == 0;
  std::string node;
  auto res = co_await Forward(ctx, *to, any, &node);
  // What a create or a new session made lives on the node that answered: its next requests
  // (the operation's wait, the attach) go there without a store lookup.
  if (res && (res->result_int() == 201 || res->result_int() == 202) && !node.empty() &&
      (key.kind == RouteKey::Kind::kCreate || key.kind == RouteKey::Kind::kSandbox)) {
    RememberMade(res->body(), node);
  }
  // A drain or activate through this replica counts for its next create at once (other
  // replicas see it when their view of the nodes is next read, within Options::node_cache).
  if (node_change) cluster_.Invalidate();
  co_return res;
}

asio::awaitable<absl::StatusOr<tcp::socket>> ClusterRouter::Connect(
    http::RequestContext& ctx, const service::Cluster::Target& to, bool* reused, bool* ipv6) {
  *reused = false;
  if (auto kept = kept_.Take(to.url, 0, UpstreamPool::Clock::now(), ctx.executor)) {
    *reused = true;
    *ipv6 = kept->ipv6;
    co_return std::move(kept->sock);
  }
  co_return co_await Dial(ctx.executor, to, opts_.connect_timeout, ipv6);
}

asio::awaitable<std::optional<http::Response>> ClusterRouter::Forward(
    http::RequestContext& ctx, service::Cluster::Target to, bool any, std::string* served_by) {
  const http::Request& req = ctx.req;
  UpstreamHeadOptions ho;
  ho.keep_credentials = true;  // the node authenticates: every credential goes on to it
  ho.request_id = ctx.request_id;
  ho.upgrade = relay::WantsUpgrade(req) && ctx.connection != nullptr;
  std::string whole;
  if (ctx.body != nullptr) {
    ho.has_body = req.chunked() || req.has_content_length();
    if (ho.has_body && !req.chunked()) {
      auto cl = req.find(bhttp::field::content_length);
      if (cl != req.end()) {
        ho.content_length = std::strtoull(std::string(cl->value()).c_str(), nullptr, 10);
      }
    }
  } else if (!req.body().empty()) {
    ho.has_body = true;
    ho.content_length = req.body().size();
    whole = req.body();
  }
  if (ctx.connection != nullptr) {
    ho.forwarded_for = ctx.peer_address;
    ho.forwarded_proto = ctx.connection->is_tls() ? "https" : "http";
  }
  std::string head = UpstreamHead(req, std::string(req.target()), ho);
  head += whole;  // a create's body, read whole for placement
  if (!whole.empty()) ho.has_body = false;  // nothing left to stream

  bool reused = false;
  bool ipv6 = false;
  auto up = co_await Connect(ctx, to, &reused, &ipv6);
  // A node that died since its last heartbeat: for a request any node may answer, the others
  // are tried in turn (a few: each failed dial costs up to connect_timeout).
  std::vector<std::string> tried;
  for (int tries = 0; !up.ok() && any && tries < 3; ++tries) {
    forwarded_.WithLabels({to.node, "unreachable"}).Inc();
    tried.push_back(to.node);
    auto next = cluster_.AnyNode(tried);
    if (!next.ok()) break;
    to = *next;
    up = co_await Connect(ctx, to, &reused, &ipv6);
  }
  if (!up.ok() && !any) {
    // Back from a restart at another address (a new port, a new pod IP) since this replica
    // last read the nodes: the store has it already.
    auto now = cluster_.CurrentTarget(to.node);
    if (now.ok() && now->has_value() && (*now)->url != to.url) {
      forwarded_.WithLabels({to.node, "unreachable"}).Inc();
      to = **now;
      up = co_await Connect(ctx, to, &reused, &ipv6);
    }
  }
  if (!up.ok()) {
    forwarded_.WithLabels({to.node, "unreachable"}).Inc();
    co_return Fail(ctx, up.status());
  }
  if (ho.upgrade) {
    auto [ec, n] = co_await asio::async_write(*up, asio::buffer(head), kTuple);
    if (ec) {
      forwarded_.WithLabels({to.node, "unreachable"}).Inc();
      co_return Fail(ctx, NodeUnreachable(to, fmt::format("send request: {}", ec.message())));
    }
    forwarded_.WithLabels({to.node, "ok"}).Inc();
    co_await relay::Tunnel(ctx, *up, opts_.idle_timeout);
    co_return std::nullopt;
  }
  auto unreachable = [&to](std::string_view why) { return NodeUnreachable(to, why); };
  auto out = co_await relay::Exchange(ctx, *up, head, ho, opts_.idle_timeout, unreachable);
  // A kept connection the node closed meanwhile fails before any byte of an answer: a request
  // whose body is not streamed (it is all in `head`) goes once more on a new connection.
  if (out.stale && reused && !ho.has_body) {
    up = co_await Dial(ctx.executor, to, opts_.connect_timeout, &ipv6);
    if (!up.ok()) {
      forwarded_.WithLabels({to.node, "unreachable"}).Inc();
      co_return Fail(ctx, up.status());
    }
    out = co_await relay::Exchange(ctx, *up, head, ho, opts_.idle_timeout, unreachable);
  }
  if (out.reusable) {
    kept_.Put(to.url, 0, UpstreamPool::Conn{std::move(*up), ipv6}, UpstreamPool::Clock::now());
  }
  forwarded_.WithLabels({to.node, out.whole || out.began ? "ok" : "unreachable"}).Inc();
  *served_by = to.node;
  if (out.whole) co_return std::move(out.whole);
  if (!out.began) co_return Fail(ctx, out.error.ok() ? NodeUnreachable(to, "no answer") : out.error);
  co_return std::nullopt;
}

}  // namespace sbx::api
