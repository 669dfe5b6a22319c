// `sbx template ls|inspect|import|pull|build|tag|rm|gc` (docs/templates.md).
#include <filesystem>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <memory>

#include <fmt/format.h>

#include "cli/cli_common.h"

namespace sbx::cli {
namespace fs = std::filesystem;

namespace {

using json = nlohmann::json;

// Imports and pulls of big images take minutes on a slow link.
constexpr std::chrono::seconds kTemplateTimeout{6 * 3600};

// "name[:tag]" of -t into (name, tag); the server checks the characters.
std::pair<std::string, std::string> SplitTarget(const std::string& t) {
  const size_t colon = t.rfind(':');
  if (colon == std::string::npos) return {t, "latest"};
  return {t.substr(0, colon), t.substr(colon + 1)};
}

std::string Mib(const json& j, const char* key) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_number()) return "-";
  return fmt::format("{:.1f} MiB", it->get<double>() / (1 << 20));
}

// One line on stderr, rewritten in place on a terminal: stage, layers and bytes.
class OperationProgress {
 public:
  explicit OperationProgress(bool on) : on_(on) {}
  ~OperationProgress() {
    if (shown_) std::fputc('\n', stderr);
  }
  void Show(const json& op) {
    if (!on_) return;
    auto p = op.find("progress");
    if (p == op.end() || !p->is_object()) return;
    std::string line = fmt::format("{}: {}", JsonString(op, "target"), JsonString(*p, "stage"));
    const int64_t lt = p->value("layers_total", int64_t{0});
    if (lt > 0) line += fmt::format(", layers {}/{}", p->value("layers_done", int64_t{0}), lt);
    const double bd = p->value("bytes_done", 0.0), bt = p->value("bytes_total", 0.0);
    if (bt > 0) {
      line += fmt::format(", {:.1f}/{:.1f} MiB", bd / (1 << 20), bt / (1 << 20));
    } else if (bd > 0) {
      line += fmt::format(", {:.1f} MiB", bd / (1 << 20));
    }
    std::fprintf(stderr, "\r%-79s", line.c_str());
    shown_ = true;
  }

 private:
  bool on_;
  bool shown_ = false;
};

// Waits for a template operation from a 202 answer and prints the template it made.
absl::StatusOr<int> FinishOperation(Client& client, const json& answer, bool wait, bool progress) {
  if (!answer.contains("operation")) {
    return absl::InternalError("sbxd answered without an operation");
  }
  const json& op = answer["operation"];
  if (!wait) {
    PrintJson(op);
    return 0;
  }
  json done;
  if (progress && JsonString(op, "kind") == "template_build") {
    // A build's log (each step, the RUN steps' output) as it happens: a build that fails says
    // why where the user looks. Any trouble with the stream falls back to polling.
    StreamOptions so;
    so.target = "/v1/operations/" + JsonString(op, "id") + "/events";
    absl::Status st = client.Stream(so, [&](const AttachEvent& ev) -> absl::StatusOr<bool> {
      auto j = json::parse(ev.data, nullptr, false);
      if (ev.type == "log" && j.is_object()) {
        std::fprintf(stderr, "%s\n", JsonString(j, "line").c_str());
      } else if (ev.type == "done" && j.is_object()) {
        done = std::move(j);
        return false;
      }
      return true;
    });
    if (!st.ok() && absl::IsCancelled(st)) return st;
  }
  {
    // After the stream's `done` this returns at once, with the same error for a failure.
    OperationProgress bar(progress && done.is_null());
    auto r = WaitOperation(client, done.is_null() ? op : done, kTemplateTimeout,
                           [&](const json& o) { bar.Show(o); });
    if (!r.ok()) return r.status();
    done = std::move(*r);
  }
  const json& t = done.contains("result") && done["result"].is_object()
                      ? done["result"].value("template", json::object())
                      : json::object();
  std::printf("%s:%s %s\n", JsonString(t, "name").c_str(), JsonString(t, "tag").c_str(),
              JsonString(t, "digest").c_str());
  return 0;
}

void RegisterList(CLI::App& tpl, Context& ctx) {
  auto as_json = std::make_shared<bool>(false);
  CLI::App* cmd = tpl.add_subcommand(
      "ls", "List templates (name, tag, digest, size, source; OWNER: yours, or the "
            "deployment's shared catalogue)");
  cmd->add_flag("--json", *as_json, "Print the JSON answer");
  cmd->callback([as_json, &ctx] {
    ctx.action = [as_json](Client& client) -> absl::StatusOr<int> {
      auto res = client.Get("/v1/templates");
      if (!res.ok()) return res.status();
      if (*as_json) {
        PrintJson(*res);
        return 0;
      }
      std::vector<std::array<std::string, 6>> rows;
      rows.push_back({"NAME:TAG", "OWNER", "DIGEST", "SIZE", "SOURCE", "CREATED"});
      const json templates = res->value("templates", json::array());
      for (const json& t : templates) {
        std::map<std::string, json> releases;
        const json rels = t.value("releases", json::array());
        for (const json& r : rels) releases[JsonString(r, "digest")] = r;
        const json tags = t.value("tags", json::object());
        for (const auto& [tag, digest] : tags.items()) {
          const std::string d = digest.is_string() ? digest.get<std::string>() : "";
          const json rel = releases.count(d) ? releases[d] : json::object();
          const json src = rel.value("source", t.value("source", json::object()));
          std::string source = src.is_object() ? JsonString(src, "kind") : "";
          if (src.is_object() && src.contains("image")) source += " " + JsonString(src, "image");
          const bool shared = t.value("shared", true);
          rows.push_back({JsonString(t, "name") + ":" + tag, shared ? "shared" : "yours",
                          d.substr(0, 19),
                          rel.empty() ? "-" : Mib(rel, "size"), source,
                          JsonString(rel, "created_at")});
        }
      }
      std::array<size_t, 6> w{};
      for (const auto& r : rows) {
        for (size_t i = 0; i < r.size(); ++i) w[i] = std::max(w[i], r[i].size());
      }
      std::string out;
      for (const auto& r : rows) {
        out += fmt::format("{:<{}}   {:<{}}   {:<{}}   {:>{}}   {:<{}}   {}\n", r[0], w[0], r[1],
                           w[1], r[2], w[2], r[3], w[3], r[4], w[4], r[5]);
      }
      SBX_RETURN_IF_ERROR(WriteAll(1, out));
      return 0;
    };
  });
}

void RegisterInspect(CLI::App& tpl, Context& ctx) {
  auto name = std::make_shared<std::string>();
  CLI::App* cmd = tpl.add_subcommand("inspect", "Print a template (its tags, releases, config)");
  cmd->add_option("name", *name, "Template name")->required();
  cmd->callback([name, &ctx] {
    ctx.action = [name](Client& client) -> absl::StatusOr<int> {
      auto res = client.Get("/v1/templates/" + UrlEncode(*name));
      if (!res.ok()) return res.status();
      PrintJson(*res);
      return 0;
    };
  });
}

struct SourceFlags {
  std::string source, target;
  bool no_wait = false;
  bool progress = false;
};

void AddSourceFlags(CLI::App* cmd, SourceFlags& f, const char* what) {
  cmd->add_option("source", f.source, what)->required();
  cmd->add_option("-t,--tag", f.target, "NAME[:TAG] to make (TAG defaults to latest)")->required();
  cmd->add_flag("--no-wait", f.no_wait, "Print the operation and return at once");
  cmd->add_flag("--progress", f.progress,
                "Show progress on stderr (the default when stderr is a terminal)");
}

void RegisterImport(CLI::App& tpl, Context& ctx, const std::string* token) {
  auto f = std::make_shared<SourceFlags>();
  CLI::App* cmd = tpl.add_subcommand(
      "import", "Import an image archive (docker save, skopeo docker-archive or oci-archive, or "
                "an OCI layout as a tar)");
  AddSourceFlags(cmd, *f, "Archive file");
  cmd->footer("Example: docker save python:3.12 -o py.tar && sbx template import py.tar -t py:3.12");
  cmd->callback([f, &ctx, token] {
    ctx.action = [f, token](Client& client) -> absl::StatusOr<int> {
      const auto [name, tag] = SplitTarget(f->target);
      const bool progress = f->progress || ::isatty(2);
      auto answer = PostFile(client, *token,
                             fmt::format("/v1/templates:import?name={}&tag={}", UrlEncode(name),
                                         UrlEncode(tag)),
                             f->source, "application/x-tar", progress);
      if (!answer.ok()) return answer.status();
      return FinishOperation(client, *answer, !f->no_wait, progress);
    };
  });
}

void RegisterBuild(CLI::App& tpl, Context& ctx, const std::string* token) {
  struct Flags {
    SourceFlags src;
    std::string file;
    std::vector<std::string> args;
    bool no_cache = false;
    std::string egress_profile;
    int64_t vcpu = 0, memory_mib = 0, disk_mib = 0;
  };
  auto f = std::make_shared<Flags>();
  CLI::App* cmd = tpl.add_subcommand(
      "build", "Build a template from a Dockerfile (FROM RUN COPY ADD ENV WORKDIR USER ARG LABEL "
               "CMD ENTRYPOINT) and a context directory");
  AddSourceFlags(cmd, f->src, "Context directory (sent as a tar)");
  cmd->add_option("-f,--file", f->file,
                  "The Dockerfile, inside the context (default: CONTEXT/Dockerfile)");
  cmd->add_option("--build-arg", f->args, "ARG value: NAME=VALUE (repeatable)");
  cmd->add_flag("--no-cache", f->no_cache, "Run every step again (the results are cached)");
  cmd->add_option("--egress-profile", f->egress_profile,
                  "Egress profile of the RUN steps (default none: no network)");
  cmd->add_option("--vcpu", f->vcpu, "vCPUs of the RUN steps' sandboxes");
  cmd->add_option("--memory-mib", f->memory_mib, "Memory of the RUN steps' sandboxes");
  cmd->add_option("--disk-mib", f->disk_mib, "Writable disk of the RUN steps' sandboxes");
  cmd->footer("Example: sbx template build -f Dockerfile . -t app:1 --build-arg V=2");
  cmd->callback([f, &ctx, token] {
    ctx.action = [f, token](Client& client) -> absl::StatusOr<int> {
      const auto [name, tag] = SplitTarget(f->src.target);
      json b = json::object();
      if (!f->file.empty()) {
        std::error_code ec;
        const fs::path ctxdir = fs::weakly_canonical(f->src.source, ec);
        const fs::path file = fs::weakly_canonical(f->file, ec);
        const fs::path rel = file.lexically_relative(ctxdir);
        if (ec || rel.empty() || *rel.begin() == "..") {
          return absl::InvalidArgumentError(fmt::format(
              "the Dockerfile {} must be inside the context {}", f->file, f->src.source));
        }
        b["dockerfile_path"] = rel.string();
      }
      for (const std::string& a : f->args) {
        const size_t eq = a.find('=');
        if (eq == std::string::npos || eq == 0) {
          return absl::InvalidArgumentError("--build-arg takes NAME=VALUE, not " + a);
        }
        b["args"][a.substr(0, eq)] = a.substr(eq + 1);
      }
      if (f->no_cache) b["no_cache"] = true;
      json sb = json::object();
      if (!f->egress_profile.empty()) sb["egress_profile"] = f->egress_profile;
      if (f->vcpu > 0) sb["resources"]["vcpu"] = f->vcpu;
      if (f->memory_mib > 0) sb["resources"]["memory_mib"] = f->memory_mib;
      if (f->disk_mib > 0) sb["resources"]["disk_mib"] = f->disk_mib;
      if (!sb.empty()) b["sandbox"] = sb;
      const bool progress = f->src.progress || ::isatty(2);
      auto answer = PostDirectoryTar(
          client, *token,
          fmt::format("/v1/templates:build?name={}&tag={}&build={}", UrlEncode(name),
                      UrlEncode(tag), UrlEncode(b.dump())),
          f->src.source, progress);
      if (!answer.ok()) return answer.status();
      return FinishOperation(client, *answer, !f->src.no_wait, progress);
    };
  });
}

void RegisterPull(CLI::App& tpl, Context& ctx) {
  auto f = std::make_shared<SourceFlags>();
  CLI::App* cmd = tpl.add_subcommand("pull", "Make a template from an image in a registry");
  AddSourceFlags(cmd, *f, "Image reference: REGISTRY/REPO:TAG or REGISTRY/REPO@sha256:…");
  cmd->footer("Credentials, insecure registries and proxies are sbxd's configuration "
              "([templates] in docs/config.md).\n"
              "Example: sbx template pull 127.0.0.1:5000/team/app:1.2 -t app:1.2");
  cmd->callback([f, &ctx] {
    ctx.action = [f](Client& client) -> absl::StatusOr<int> {
      const auto [name, tag] = SplitTarget(f->target);
      json body = {{"name", name}, {"tag", tag}, {"source", {{"image", f->source}}}};
      auto res = client.Request("POST", "/v1/templates", &body);
      if (!res.ok()) return res.status();
      return FinishOperation(client, res->body, !f->no_wait, f->progress || ::isatty(2));
    };
  });
}

void RegisterRemove(CLI::App& tpl, Context& ctx) {
  auto ref = std::make_shared<std::string>();
  CLI::App* cmd = tpl.add_subcommand(
      "rm", "Delete a tag (NAME:TAG) or every tag of a template (NAME); refused while a "
            "sandbox uses the release");
  cmd->add_option("ref", *ref, "NAME or NAME:TAG")->required();
  cmd->callback([ref, &ctx] {
    ctx.action = [ref](Client& client) -> absl::StatusOr<int> {
      auto res = client.Request("DELETE", "/v1/templates/" + UrlEncode(*ref));
      if (!res.ok()) return res.status();
      PrintJson(res->body);
      return 0;
    };
  });
}

void RegisterTag(CLI::App& tpl, Context& ctx) {
  auto src = std::make_shared<std::string>(), dst = std::make_shared<std::string>();
  CLI::App* cmd = tpl.add_subcommand(
      "tag", "Point NAME:TAG at the release SOURCE names (NAME:TAG or NAME@sha256:…); a tag "
             "that named another release moves, sandboxes keep theirs");
  cmd->add_option("source", *src, "NAME:TAG or NAME@sha256:…")->required();
  cmd->add_option("target", *dst, "NAME:TAG")->required();
  cmd->callback([src, dst, &ctx] {
    ctx.action = [src, dst](Client& client) -> absl::StatusOr<int> {
      json body = {{"from", *src}};
      auto res = client.Request("PUT", "/v1/templates/" + UrlEncode(*dst), &body);
      if (!res.ok()) return res.status();
      PrintJson(res->body);
      return 0;
    };
  });
}

void RegisterGc(CLI::App& tpl, Context& ctx) {
  CLI::App* cmd = tpl.add_subcommand(
      "gc", "Remove releases no tag names and no sandbox uses, then layers no release lists");
  cmd->callback([&ctx] {
    ctx.action = [](Client& client) -> absl::StatusOr<int> {
      json empty = json::object();
      auto res = client.Request("POST", "/v1/templates:gc", &empty);
      if (!res.ok()) return res.status();
      PrintJson(res->body);
      return 0;
    };
  });
}

}  // namespace

void RegisterTemplateCommands(CLI::App& app, Context& ctx, const std::string* token) {
  CLI::App* tpl = app.add_subcommand("template", "Templates: images users bring (docs/templates.md)");
  tpl->require_subcommand(1);
  RegisterList(*tpl, ctx);
  RegisterInspect(*tpl, ctx);
  RegisterImport(*tpl, ctx, token);
  RegisterPull(*tpl, ctx);
  RegisterBuild(*tpl, ctx, token);
  RegisterRemove(*tpl, ctx);
  RegisterTag(*tpl, ctx);
  RegisterGc(*tpl, ctx);
}

}  // namespace sbx::cli
