// /v1/templates: imports (a streamed archive), pulls, the catalog, delete and gc
// (docs/templates.md). DELETE /v1/operations/{id} cancels a template operation.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "api/handler_util.h"
#include "api/render.h"
#include "api/requests.h"
#include "api/routes.h"
#include "archive/untar.h"
#include "common/json_util.h"
#include "common/log.h"
#include "common/status_util.h"
#include "common/unique_fd.h"
#include "service/template_service.h"
#include "service/tenancy.h"
#include "service/views.h"

namespace sbx::api {

namespace bhttp = http::bhttp;
using nlohmann::json;

namespace {

constexpr size_t kUploadChunk = 1 << 20;

absl::Status TemplatesOff() {
  return ApiError(absl::StatusCode::kUnimplemented, "not_implemented",
                  "this sbxd serves no templates but `base` (its template store did not open; "
                  "see its log)");
}

http::Response Started(const service::OperationStarted& started) {
  return RenderJson(bhttp::status::accepted,
                    json{{"operation", service::OperationView(started.operation)}});
}

// name and tag of an import (query) or a pull (body); tag defaults to latest.
absl::StatusOr<service::TemplateTarget> TargetOf(std::optional<std::string> name,
                                                 std::optional<std::string> tag) {
  if (!name) return FieldError("name", "name is required");
  service::TemplateTarget t;
  t.name = *name;
  if (tag) t.tag = *tag;
  return t;
}

// A release's start command: {"cmd": [argv] | true, "ready": [argv], "timeout_s": 1..3600}.
absl::StatusOr<json> ParseStart(const json& j, const std::string& field) {
  if (!j.is_object()) return FieldError(field, field + " must be an object");
  auto argv = [&](const json& v, const std::string& f) -> absl::Status {
    if (!v.is_array() || v.empty() || v.size() > 256) {
      return FieldError(f, f + " must be a non-empty array of strings (argv)");
    }
    for (const auto& a : v) {
      if (!a.is_string() || a.get_ref<const std::string&>().find('\0') != std::string::npos) {
        return FieldError(f, f + " must be a non-empty array of strings (argv)");
      }
    }
    if (v[0].get_ref<const std::string&>().empty()) return FieldError(f, f + "[0] is empty");
    return absl::OkStatus();
  };
  json out = json::object();  // without the null (left-out) fields
  for (const auto& [k, v] : j.items()) {
    const std::string f = field + "." + k;
    if (v.is_null() && (k == "cmd" || k == "ready" || k == "timeout_s")) continue;
    out[k] = v;
    if (k == "cmd") {
      if (!(v.is_boolean() && v.get<bool>())) SBX_RETURN_IF_ERROR(argv(v, f));
    } else if (k == "ready") {
      SBX_RETURN_IF_ERROR(argv(v, f));
    } else if (k == "timeout_s") {
      if (!v.is_number_integer() || v.get<int64_t>() < 1 || v.get<int64_t>() > 3600) {
        return FieldError(f, f + " must be an integer from 1 to 3600");
      }
    } else {
      return FieldError(f, "unknown field " + f);
    }
  }
  if (!out.contains("cmd")) {
    return FieldError(field + ".cmd", field + ".cmd is required: an argv, or true for the "
                                              "image's Entrypoint and Cmd");
  }
  return out;
}

// ?start=JSON of an import or a build.
absl::Status StartFromQuery(const Call& call, service::TemplateTarget& t) {
  auto q = call.target.Query("start");
  if (!q) return absl::OkStatus();
  auto j = ParseUntrustedJson(*q);
  if (!j.ok()) return FieldError("start", "start must be a JSON object");
  SBX_ASSIGN_OR_RETURN(t.start, ParseStart(*j, "start"));
  return absl::OkStatus();
}

// The body of an import or a build, streamed to a file of the template store (an archive's
// index may come after its layers); `what` names it in errors.
boost::asio::awaitable<absl::StatusOr<service::Upload>> ReceiveUpload(
    service::TemplateService* tpl, Call& call, std::string_view what) {
  auto upload = tpl->NewUpload();
  if (!upload.ok()) co_return upload.status();
  std::string buf(kUploadChunk, '\0');
  uint64_t total = 0;
  for (;;) {
    size_t n = 0;
    while (call.ctx.body != nullptr && n < buf.size()) {
      auto r = co_await call.ctx.body->ReadSome(buf.data() + n, buf.size() - n);
      if (!r.ok()) {
        tpl->Discard(*upload);
        co_return r.status();
      }
      if (*r == 0) break;
      n += *r;
    }
    if (n == 0) break;
    total += n;
    if (total > tpl->max_archive_bytes()) {
      tpl->Discard(*upload);
      co_return ApiError(absl::StatusCode::kInvalidArgument, "payload_too_large",
                         fmt::format("the {} is larger than templates.max_archive_mib ({} bytes)",
                                     what, tpl->max_archive_bytes()));
    }
    absl::Status w = archive::WriteAll(upload->fd, std::string_view(buf.data(), n), upload->path);
    if (!w.ok()) {
      tpl->Discard(*upload);
      co_return w;
    }
  }
  if (total == 0) {
    tpl->Discard(*upload);
    co_return FieldError("body", fmt::format("the body must be the {}", what));
  }
  co_return std::move(*upload);
}

// source.build of POST /v1/templates, or ?build= of POST /v1/templates:build:
// {"dockerfile", "dockerfile_path", "args", "sandbox", "no_cache"}.
absl::StatusOr<service::BuildSpec> ParseBuild(const json& b, const ResourceLimits& limits,
                                              const std::string& field) {
  if (!b.is_object()) return FieldError(field, field + " must be an object");
  service::BuildSpec spec;
  for (const auto& [k, v] : b.items()) {
    const std::string f = field + "." + k;
    const bool known = k == "dockerfile" || k == "dockerfile_path" || k == "args" ||
                       k == "no_cache" || k == "sandbox";
    if (known && v.is_null()) continue;  // left out
    if (k == "dockerfile" || k == "dockerfile_path") {
      if (!v.is_string()) return FieldError(f, f + " must be a string");
      (k == "dockerfile" ? spec.dockerfile : spec.dockerfile_path) = v.get<std::string>();
    } else if (k == "args") {
      if (!v.is_object()) return FieldError(f, f + " must be an object of strings");
      for (const auto& [ak, av] : v.items()) {
        if (!av.is_string() || ak.empty()) {
          return FieldError(f, f + " must be an object of strings, with non-empty names");
        }
        spec.args[ak] = av.get<std::string>();
      }
    } else if (k == "no_cache") {
      if (!v.is_boolean()) return FieldError(f, f + " must be a boolean");
      spec.no_cache = v.get<bool>();
    } else if (k == "sandbox") {
      // The RUN steps' sandboxes: the fields of a create (resources {vcpu, memory_mib,
      // disk_mib}, egress_profile, egress, runtime), checked as a create's are; timeout_s
      // bounds each RUN.
      if (!v.is_object()) return FieldError(f, f + " must be an object");
      for (const auto& [sk, sv] : v.items()) {
        if (sk != "resources" && sk != "egress_profile" && sk != "egress" && sk != "runtime" &&
            sk != "timeout_s") {
          return FieldError(f + "." + sk, fmt::format("unknown field {}.{}", f, sk));
        }
      }
      auto req = ParseCreateSandbox(v.dump(), limits);
      if (!req.ok()) {
        return ApiError(req.status().code(), ApiErrorCode(req.status()),
                        fmt::format("{}: {}", f, std::string(req.status().message())), f);
      }
      spec.sandbox = std::move(*req);
    } else {
      return FieldError(f, fmt::format("unknown field {}", f));
    }
  }
  return spec;
}

}  // namespace

// POST /v1/templates:import?name=N&tag=T, the archive as the body.
Awaitable Routes::ImportTemplate(Api& api, Call& call) {
  service::TemplateService* tpl = api.opts_.templates;
  if (tpl == nullptr) co_return Fail(call.ctx, TemplatesOff());
  auto target = TargetOf(call.target.Query("name"), call.target.Query("tag"));
  if (!target.ok()) co_return Fail(call.ctx, target.status());
  if (absl::Status st = StartFromQuery(call, *target); !st.ok()) co_return Fail(call.ctx, st);
  auto upload = co_await ReceiveUpload(
      tpl, call, "image archive (docker save, oci-archive, or an OCI layout as a tar)");
  if (!upload.ok()) co_return Fail(call.ctx, upload.status());
  auto started = log::With(call.ctx.log, [&] {
    return tpl->Import(call.caller, *target, std::move(*upload));
  });
  if (!started.ok()) co_return Fail(call.ctx, started.status());
  co_return Started(*started);
}

// POST /v1/templates:build?name=N&tag=T[&dockerfile=PATH][&no_cache=1][&build=JSON], the build
// context (a tar holding the Dockerfile) as the body.
Awaitable Routes::BuildTemplate(Api& api, Call& call) {
  service::TemplateService* tpl = api.opts_.templates;
  if (tpl == nullptr) co_return Fail(call.ctx, TemplatesOff());
  auto target = TargetOf(call.target.Query("name"), call.target.Query("tag"));
  if (!target.ok()) co_return Fail(call.ctx, target.status());
  if (absl::Status st = StartFromQuery(call, *target); !st.ok()) co_return Fail(call.ctx, st);
  json b = json::object();
  if (auto q = call.target.Query("build")) {
    auto j = ParseUntrustedJson(*q);
    if (!j.ok()) co_return Fail(call.ctx, FieldError("build", "build must be a JSON object"));
    b = std::move(*j);
  }
  if (auto q = call.target.Query("dockerfile"); q && b.is_object()) b["dockerfile_path"] = *q;
  if (auto q = call.target.Query("no_cache"); q && b.is_object()) {
    b["no_cache"] = *q == "1" || *q == "true";
  }
  if (b.is_object() && b.contains("dockerfile") && !b["dockerfile"].is_null()) {
    co_return Fail(call.ctx, FieldError("build.dockerfile",
                                        "the Dockerfile of POST /v1/templates:build is a file of "
                                        "the context (dockerfile=PATH)"));
  }
  auto spec = ParseBuild(b, api.limits(), "build");
  if (!spec.ok()) co_return Fail(call.ctx, spec.status());
  auto upload = co_await ReceiveUpload(tpl, call, "build context (a tar)");
  if (!upload.ok()) co_return Fail(call.ctx, upload.status());
  auto started = log::With(call.ctx.log, [&] {
    return tpl->Build(call.caller, *target, std::move(*spec), std::move(*upload));
  });
  if (!started.ok()) co_return Fail(call.ctx, started.status());
  co_return Started(*started);
}

// POST /v1/templates {"name","tag","source":{"image":"REF"}}
Awaitable Routes::CreateTemplate(Api& api, Call& call) {
  service::TemplateService* tpl = api.opts_.templates;
  if (tpl == nullptr) co_return Fail(call.ctx, TemplatesOff());
  auto body = ParseUntrustedJson(call.ctx.req.body());
  if (!body.ok()) co_return Fail(call.ctx, body.status());
  if (!body->is_object()) co_return Fail(call.ctx, FieldError("", "the body must be a JSON object"));
  auto str = [&](const json& j, const char* key) -> absl::StatusOr<std::optional<std::string>> {
    auto it = j.find(key);
    if (it == j.end() || it->is_null()) return std::optional<std::string>();
    if (!it->is_string()) return FieldError(key, fmt::format("{} must be a string", key));
    return std::optional<std::string>(it->get<std::string>());
  };
  for (const auto& [k, v] : body->items()) {
    if (k != "name" && k != "tag" && k != "source" && k != "start") {
      co_return Fail(call.ctx, FieldError(k, fmt::format("unknown field {}", k)));
    }
  }
  auto name = str(*body, "name");
  auto tag = str(*body, "tag");
  if (!name.ok()) co_return Fail(call.ctx, name.status());
  if (!tag.ok()) co_return Fail(call.ctx, tag.status());
  auto target = TargetOf(*name, *tag);
  if (!target.ok()) co_return Fail(call.ctx, target.status());
  if (auto st = body->find("start"); st != body->end() && !st->is_null()) {
    auto start = ParseStart(*st, "start");
    if (!start.ok()) co_return Fail(call.ctx, start.status());
    target->start = std::move(*start);
  }
  auto src = body->find("source");
  if (src == body->end() || !src->is_object()) {
    co_return Fail(call.ctx, FieldError("source", "source must be an object: {\"image\": REF}"));
  }
  if (auto build = src->find("build"); build != src->end() && !build->is_null()) {
    auto spec = ParseBuild(*build, api.limits(), "source.build");
    if (!spec.ok()) co_return Fail(call.ctx, spec.status());
    if (spec->dockerfile.empty()) {
      co_return Fail(call.ctx, FieldError("source.build.dockerfile",
                                          "source.build.dockerfile (the text) is required; a "
                                          "build with a context is POST /v1/templates:build"));
    }
    auto started = log::With(call.ctx.log, [&] {
      return tpl->Build(call.caller, *target, std::move(*spec), std::nullopt);
    });
    if (!started.ok()) co_return Fail(call.ctx, started.status());
    co_return Started(*started);
  }
  auto image = str(*src, "image");
  if (!image.ok()) co_return Fail(call.ctx, image.status());
  if (!*image) co_return Fail(call.ctx, FieldError("source.image", "source.image is required"));
  auto started = log::With(call.ctx.log, [&] {
    return tpl->Pull(call.caller, *target, **image);
  });
  if (!started.ok()) co_return Fail(call.ctx, started.status());
  co_return Started(*started);
}

Awaitable Routes::ListTemplates(Api& api, Call& call) {
  service::TemplateService* tpl = api.opts_.templates;
  if (tpl == nullptr) co_return Fail(call.ctx, TemplatesOff());
  auto list = log::With(call.ctx.log, [&] { return tpl->List(call.caller); });
  if (!list.ok()) co_return Fail(call.ctx, list.status());
  co_return RenderJson(bhttp::status::ok, *list);
}

Awaitable Routes::GetTemplate(Api& api, Call& call) {
  service::TemplateService* tpl = api.opts_.templates;
  if (tpl == nullptr) co_return Fail(call.ctx, TemplatesOff());
  auto t = log::With(call.ctx.log, [&] { return tpl->Get(call.caller, call.id); });
  if (!t.ok()) co_return Fail(call.ctx, t.status());
  co_return RenderJson(bhttp::status::ok, *t);
}

Awaitable Routes::DeleteTemplate(Api& api, Call& call) {
  service::TemplateService* tpl = api.opts_.templates;
  if (tpl == nullptr) co_return Fail(call.ctx, TemplatesOff());
  auto r = log::With(call.ctx.log, [&] { return tpl->Delete(call.caller, call.id); });
  if (!r.ok()) co_return Fail(call.ctx, r.status());
  co_return RenderJson(bhttp::status::ok, *r);
}

// GET /v1/admin/layers/{diff_id}: the blob a layer was unpacked from, as kept by a cluster
// node, for another node that lacks the layer (docs/scale.md, "Templates"). The other node
// verifies what it gets against the diff_id; the admin token guards tenants' layers.
Awaitable Routes::LayerBlob(Api& api, Call& call) {
  service::TemplateService* tpl = api.opts_.templates;
  if (tpl == nullptr) co_return Fail(call.ctx, TemplatesOff());
  if (auto st = service::RequireOperatorAdmin(call.caller, "the layer store"); !st.ok()) {
    co_return Fail(call.ctx, st);
  }
  auto path = tpl->LayerBlob(call.id);
  if (!path.ok()) co_return Fail(call.ctx, path.status());
  UniqueFd fd(::open(path->c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW));
  struct stat st {};
  if (!fd.valid() || ::fstat(fd.get(), &st) != 0) {
    co_return Fail(call.ctx, ErrnoStatus(errno, fmt::format("layer blob: open({})", *path)));
  }
  bhttp::response_header<> header;
  header.result(bhttp::status::ok);
  header.version(call.ctx.req.version());
  header.set(bhttp::field::content_type, "application/octet-stream");
  header.set(bhttp::field::content_length, std::to_string(st.st_size));
  header.set("X-Request-Id", call.ctx.request_id);
  if (!call.ctx.req.keep_alive()) header.set(bhttp::field::connection, "close");
  if (!co_await call.ctx.stream.Begin(std::move(header))) co_return std::nullopt;
  // Reads of a local file that is in the page cache as a rule: short enough for the I/O thread.
  std::string buf;
  for (off_t off = 0; off < st.st_size;) {
    buf.resize(256 << 10);
    const ssize_t n = ::pread(fd.get(), buf.data(), buf.size(), off);
    if (n <= 0) {
      // Short: End() closes the connection, and the other node sees a truncated transfer.
      SBX_LOG_WARN(call.ctx.log, "layer blob {}: read failed at {} of {} bytes", *path, off,
                   st.st_size);
      break;
    }
    buf.resize(static_cast<size_t>(n));
    off += n;
    if (!co_await call.ctx.stream.Write(std::move(buf))) co_return std::nullopt;
  }
  co_await call.ctx.stream.End();
  co_return std::nullopt;
}

// PUT /v1/templates/{name}:{tag} {"from": "name:tag" | "name@sha256:…"}
Awaitable Routes::TagTemplate(Api& api, Call& call) {
  service::TemplateService* tpl = api.opts_.templates;
  if (tpl == nullptr) co_return Fail(call.ctx, TemplatesOff());
  auto body = ParseUntrustedJson(call.ctx.req.body());
  if (!body.ok()) co_return Fail(call.ctx, body.status());
  auto from = body->is_object() ? body->find("from") : body->end();
  if (!body->is_object() || from == body->end() || !from->is_string() || body->size() != 1) {
    co_return Fail(call.ctx, FieldError("from", "the body must be {\"from\": \"name:tag\"} or "
                                                "{\"from\": \"name@sha256:…\"}"));
  }
  const std::string src = from->get<std::string>();
  auto r = log::With(call.ctx.log, [&] { return tpl->Tag(call.caller, call.id, src); });
  if (!r.ok()) co_return Fail(call.ctx, r.status());
  co_return RenderJson(bhttp::status::ok, *r);
}

Awaitable Routes::TemplateGc(Api& api, Call& call) {
  service::TemplateService* tpl = api.opts_.templates;
  if (tpl == nullptr) co_return Fail(call.ctx, TemplatesOff());
  // ?scope=node: what another node of a cluster asks of this one (its layer store only).
  const auto scope = call.target.Query("scope");
  if (scope && *scope != "node") {
    co_return Fail(call.ctx, FieldError("scope", "scope is `node` or absent"));
  }
  auto r = log::With(call.ctx.log, [&] { return tpl->Gc(call.caller, scope.has_value()); });
  if (!r.ok()) co_return Fail(call.ctx, r.status());
  co_return RenderJson(bhttp::status::ok, *r);
}

// DELETE /v1/operations/{id}: a template operation stops within one read and fails with code
// cancelled; the answer is the operation as it was when asked.
Awaitable Routes::CancelOperation(Api& api, Call& call) {
  service::TemplateService* tpl = api.opts_.templates;
  if (tpl == nullptr) co_return Fail(call.ctx, TemplatesOff());
  auto op = log::With(call.ctx.log, [&] { return tpl->Cancel(call.caller, call.id); });
  if (!op.ok()) co_return Fail(call.ctx, op.status());
  co_return RenderJson(bhttp::status::accepted, json{{"operation", service::OperationView(*op)}});
}

}  // namespace sbx::api
