// `sbx cp` and `sbx files ls|stat|rm|mkdir`: the files API (docs/api.md, "Files").
//
// Transfers stream: a file is read and sent (or received and written) in pieces, a directory
// goes as a tar built or extracted on the fly, so neither side holds a whole transfer. They
// use a connection of their own (blocking; Ctrl-C ends the process). A directory downloaded
// from a sandbox is untrusted: it is extracted with the local directory as the root of every
// lookup (archive/untar.h), so its symlinks and names cannot write outside it.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <boost/asio.hpp>
#include <boost/beast.hpp>
#include <fmt/format.h>

#include "archive/tar.h"
#include "archive/untar.h"
#include "cli/cli_common.h"
#include "cli/tls.h"
#include "common/unique_fd.h"

namespace sbx::cli {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
namespace fs = std::filesystem;
using nlohmann::json;

constexpr size_t kChunk = 256 * 1024;

// "sbx_…:/path" -> (id, path); nullopt for a local path.
std::optional<std::pair<std::string, std::string>> RemoteRef(const std::string& arg) {
  const size_t colon = arg.find(':');
  if (arg.rfind("sbx_", 0) != 0 || colon == std::string::npos) return std::nullopt;
  return std::make_pair(arg.substr(0, colon), arg.substr(colon + 1));
}

std::string FilesTarget(const std::string& id, std::string_view what, const std::string& path,
                        std::string_view extra = {}) {
  return fmt::format("/v1/sandboxes/{}/{}?path={}{}", id, what, UrlEncode(path), extra);
}

std::string Base(const std::string& p) {
  std::string s = p;
  while (s.size() > 1 && s.back() == '/') s.pop_back();
  const size_t slash = s.rfind('/');
  return slash == std::string::npos ? s : s.substr(slash + 1);
}

std::string Join(const std::string& dir, const std::string& name) {
  return dir.empty() || dir.back() == '/' ? dir + name : dir + "/" + name;
}

class Progress {
 public:
  Progress(std::string what, bool on) : what_(std::move(what)), on_(on) {}
  ~Progress() {
    if (on_ && shown_) std::fprintf(stderr, "\r%s: %.1f MiB done\n", what_.c_str(), Mib());
  }
  void Add(size_t n) {
    bytes_ += n;
    if (!on_) return;
    const auto now = std::chrono::steady_clock::now();
    if (now - last_ < std::chrono::milliseconds(500)) return;
    last_ = now;
    shown_ = true;
    std::fprintf(stderr, "\r%s: %.1f MiB", what_.c_str(), Mib());
  }
  uint64_t bytes() const { return bytes_; }

 private:
  double Mib() const { return static_cast<double>(bytes_) / (1 << 20); }
  std::string what_;
  bool on_;
  bool shown_ = false;
  uint64_t bytes_ = 0;
  std::chrono::steady_clock::time_point last_{};
};

// One blocking request/response on a fresh connection, with a streamed body either way.
class Transfer {
 public:
  Transfer(const Client& client, std::string token) : ep_(client.endpoint()), token_(std::move(token)) {}

  absl::Status Connect() {
    boost::system::error_code ec;
    asio::ip::tcp::resolver resolver(ioc_);
    auto results = resolver.resolve(ep_.host, ep_.port, ec);
    if (!ec) asio::connect(sock_.tcp().socket(), results, ec);
    if (ec) return absl::UnavailableError(fmt::format("connect to {}: {}", ep_.url, ec.message()));
    if (!ep_.https()) return absl::OkStatus();
    SBX_RETURN_IF_ERROR(PrepareTls(sock_, ep_));
    sock_.tls()->handshake(asio::ssl::stream_base::client, ec);
    if (ec) return TlsHandshakeError(ec, sock_, ep_);
    return absl::OkStatus();
  }

  absl::Status SendHeader(std::string_view method, const std::string& target,
                          std::string_view content_type, std::optional<uint64_t> length,
                          std::string_view accept) {
    std::string h = fmt::format("{} {}{} HTTP/1.1\r\nHost: {}:{}\r\nAuthorization: Bearer {}\r\n"
                                "User-Agent: sbx-cli\r\nConnection: close\r\n",
                                method, ep_.base_path, target, ep_.host, ep_.port, token_);
    if (!accept.empty()) h += fmt::format("Accept: {}\r\n", accept);
    if (!content_type.empty()) {
      h += fmt::format("Content-Type: {}\r\n", content_type);
      h += length ? fmt::format("Content-Length: {}\r\n", *length)
                  : std::string("Transfer-Encoding: chunked\r\n");
    }
    h += "\r\n";
    chunked_ = !content_type.empty() && !length;
    return Write(h);
  }

  absl::Status SendBody(std::string_view data) {
    if (data.empty()) return absl::OkStatus();
    if (chunked_) SBX_RETURN_IF_ERROR(Write(fmt::format("{:x}\r\n", data.size())));
    SBX_RETURN_IF_ERROR(Write(data));
    return chunked_ ? Write("\r\n") : absl::OkStatus();
  }
  absl::Status EndBody() { return chunked_ ? Write("0\r\n\r\n") : absl::OkStatus(); }

  // Reads the response; a 2xx body goes to `consume` as a source of pieces (or into
  // `json_out` when the caller wants the JSON), anything else becomes the API's error.
  absl::Status ReadResponse(const std::function<absl::Status(const archive::ByteSource&)>& consume,
                            json* json_out) {
    boost::system::error_code ec;
    parser_.emplace();
    parser_->body_limit(boost::none);
    http::read_header(sock_, buf_, *parser_, ec);
    if (ec) return absl::UnavailableError(fmt::format("read response: {}", ec.message()));
    const unsigned status = parser_->get().result_int();
    const std::string rid(parser_->get()["X-Request-Id"]);
    if (status < 300 && json_out == nullptr) {
      SBX_RETURN_IF_ERROR(consume([this] { return NextBody(); }));
      // The consumer read to the end: a short body is an error of the transfer.
      return NextBody().status();
    }
    std::string body;
    for (;;) {
      SBX_ASSIGN_OR_RETURN(std::string_view piece, NextBody());
      if (piece.empty()) break;
      if (body.size() < (1u << 20)) body.append(piece);
    }
    if (status >= 300) return DecodeHttpError(status, body, rid);
    auto parsed = ParseUntrustedJson(body, kMaxResponseJsonDepth);
    if (!parsed.ok()) return absl::InternalError("the response is not JSON");
    *json_out = std::move(*parsed);
    return absl::OkStatus();
  }

 private:
  // The next piece of the response's body (valid until the next call), empty at its end.
  absl::StatusOr<std::string_view> NextBody() {
    while (!parser_->is_done()) {
      parser_->get().body().data = chunk_.data();
      parser_->get().body().size = chunk_.size();
      boost::system::error_code ec;
      http::read(sock_, buf_, *parser_, ec);
      if (ec == http::error::need_buffer) ec = {};
      if (ec) {
        return absl::UnavailableError(
            fmt::format("read response body: {} (the transfer is incomplete)", ec.message()));
      }
      const size_t n = chunk_.size() - parser_->get().body().size;
      if (n > 0) return std::string_view(chunk_.data(), n);
    }
    return std::string_view();
  }

  absl::Status Write(std::string_view data) {
    boost::system::error_code ec;
    asio::write(sock_, asio::buffer(data.data(), data.size()), ec);
    // The server may answer early (an error) and stop reading: the response tells why.
    if (ec) return absl::AbortedError(fmt::format("send: {}", ec.message()));
    return absl::OkStatus();
  }

  Endpoint ep_;
  std::string token_;
  asio::io_context ioc_;
  MaybeTlsStream sock_{ioc_};
  beast::flat_buffer buf_;
  bool chunked_ = false;
  std::optional<http::response_parser<http::buffer_body>> parser_;
  std::vector<char> chunk_ = std::vector<char>(kChunk);
};

absl::StatusOr<std::optional<json>> RemoteStat(Client& client, const std::string& id,
                                               const std::string& path) {
  auto r = client.Get(FilesTarget(id, "files:stat", path));
  if (!r.ok()) {
    if (absl::IsNotFound(r.status())) return std::optional<json>();
    return r.status();
  }
  return std::optional<json>((*r)["entry"]);
}

// Appends a tar of the local directory `dir` (names relative to it) to the transfer.
absl::Status TarLocal(Transfer& t, const fs::path& dir, const std::string& prefix,
                      std::string& out, Progress& progress) {
  std::vector<fs::path> names;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) names.push_back(e.path());
  if (ec) return absl::UnavailableError(fmt::format("read {}: {}", dir.string(), ec.message()));
  std::sort(names.begin(), names.end());
  for (const fs::path& p : names) {
    struct stat st {};
    if (::lstat(p.c_str(), &st) != 0) continue;
    archive::TarEntry e;
    e.name = prefix + p.filename().string();
    e.mode = st.st_mode & 07777;
    e.mtime = st.st_mtim.tv_sec;
    if (S_ISDIR(st.st_mode)) {
      e.type = archive::TarType::kDirectory;
      SBX_RETURN_IF_ERROR(archive::AppendTarHeader(out, e));
      SBX_RETURN_IF_ERROR(TarLocal(t, p, e.name + "/", out, progress));
    } else if (S_ISLNK(st.st_mode)) {
      e.type = archive::TarType::kSymlink;
      e.linkname = fs::read_symlink(p, ec).string();
      SBX_RETURN_IF_ERROR(archive::AppendTarHeader(out, e));
    } else if (S_ISREG(st.st_mode)) {
      UniqueFd fd(::open(p.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW));
      if (!fd || ::fstat(fd.get(), &st) != 0) {
        return ErrnoStatus(errno, fmt::format("open {}", p.string()));
      }
      e.type = archive::TarType::kFile;
      e.size = static_cast<uint64_t>(st.st_size);
      SBX_RETURN_IF_ERROR(archive::AppendTarHeader(out, e));
      uint64_t left = e.size;
      std::vector<char> buf(kChunk);
      while (left > 0) {
        ssize_t n = ::read(fd.get(), buf.data(), std::min<uint64_t>(buf.size(), left));
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return absl::AbortedError(fmt::format("{} shrank while being sent", p.string()));
        out.append(buf.data(), static_cast<size_t>(n));
        left -= static_cast<uint64_t>(n);
        progress.Add(static_cast<size_t>(n));
        if (out.size() >= kChunk) {
          SBX_RETURN_IF_ERROR(t.SendBody(out));
          out.clear();
        }
      }
      out.append(archive::TarPadding(e.size));
    }
    if (out.size() >= kChunk) {
      SBX_RETURN_IF_ERROR(t.SendBody(out));
      out.clear();
    }
  }
  return absl::OkStatus();
}

// Sends `size` bytes of `fd` as the body. The outer error is the local file's (it shrank); the
// inner one the transfer's, which the caller reports after reading the server's answer.
absl::StatusOr<absl::Status> SendFileBody(Transfer& t, int fd, uint64_t size,
                                          const std::string& local, Progress& progress) {
  absl::Status sent;
  std::vector<char> buf(kChunk);
  uint64_t left = size;
  while (sent.ok() && left > 0) {
    ssize_t n = ::read(fd, buf.data(), std::min<uint64_t>(buf.size(), left));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return absl::AbortedError(fmt::format("{} shrank while being sent", local));
    sent = t.SendBody(std::string_view(buf.data(), static_cast<size_t>(n)));
    left -= static_cast<uint64_t>(n);
    progress.Add(static_cast<size_t>(n));
  }
  return sent;
}

absl::StatusOr<int> Upload(Client& client, const std::string& token, const std::string& local,
                           const std::string& id, std::string path, bool progress_on) {
  struct stat st {};
  if (::stat(local.c_str(), &st) != 0) return ErrnoStatus(errno, fmt::format("stat {}", local));
  SBX_ASSIGN_OR_RETURN(auto remote, RemoteStat(client, id, path));
  if (remote && (*remote)["type"] == "directory") path = Join(path, Base(local));
  Progress progress(fmt::format("{} -> {}:{}", local, id, path), progress_on);
  Transfer t(client, token);
  SBX_RETURN_IF_ERROR(t.Connect());
  json result;
  absl::Status sent;
  if (S_ISDIR(st.st_mode)) {
    SBX_RETURN_IF_ERROR(t.SendHeader("PUT", FilesTarget(id, "files", path, "&mkdirs=true"),
                                     "application/x-tar", std::nullopt, ""));
    std::string out;
    sent = TarLocal(t, local, "", out, progress);
    if (sent.ok()) {
      out.append(archive::TarTrailer());
      sent = t.SendBody(out);
    }
    if (sent.ok()) sent = t.EndBody();
  } else {
    UniqueFd fd(::open(local.c_str(), O_RDONLY | O_CLOEXEC));
    if (!fd) return ErrnoStatus(errno, fmt::format("open {}", local));
    const std::string mode = fmt::format("&mode={:o}", st.st_mode & 0777);
    SBX_RETURN_IF_ERROR(t.SendHeader("PUT", FilesTarget(id, "files", path, mode),
                                     "application/octet-stream",
                                     static_cast<uint64_t>(st.st_size), ""));
    SBX_ASSIGN_OR_RETURN(sent, SendFileBody(t, fd.get(), static_cast<uint64_t>(st.st_size),
                                            local, progress));
  }
  // Read the answer even after a failed send: an early error response says what went wrong.
  absl::Status got = t.ReadResponse({}, &result);
  if (!got.ok()) return got;
  SBX_RETURN_IF_ERROR(sent);
  return 0;
}

absl::StatusOr<int> Download(Client& client, const std::string& token, const std::string& id,
                             const std::string& path, std::string local, bool progress_on) {
  SBX_ASSIGN_OR_RETURN(auto remote, RemoteStat(client, id, path));
  if (!remote) return absl::NotFoundError(fmt::format("{}:{}: no such file or directory", id, path));
  const bool is_dir = (*remote)["type"] == "directory";
  std::error_code ec;
  if (fs::is_directory(local, ec)) local = Join(local, Base(path));
  Progress progress(fmt::format("{}:{} -> {}", id, path, local), progress_on);
  Transfer t(client, token);
  SBX_RETURN_IF_ERROR(t.Connect());
  if (is_dir) {
    if (::mkdir(local.c_str(), 0755) != 0 && errno != EEXIST) {
      return ErrnoStatus(errno, fmt::format("mkdir {}", local));
    }
    UniqueFd base(::open(local.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
    if (!base) return ErrnoStatus(errno, fmt::format("open {}", local));
    archive::Extractor x(base.get(), local, std::nullopt);
    SBX_RETURN_IF_ERROR(t.SendHeader("GET", FilesTarget(id, "files", path), "", std::nullopt,
                                     "application/x-tar"));
    SBX_RETURN_IF_ERROR(t.ReadResponse(
        [&](const archive::ByteSource& body) {
          return x.Run([&]() -> absl::StatusOr<std::string_view> {
            SBX_ASSIGN_OR_RETURN(std::string_view piece, body());
            progress.Add(piece.size());
            return piece;
          });
        },
        nullptr));
    return 0;
  }
  // A file: written to a temporary next to the target and renamed at the end, so a broken
  // transfer never leaves a short file under the target's name.
  const std::string tmp = local + ".sbx-partial";
  UniqueFd fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0644));
  if (!fd) return ErrnoStatus(errno, fmt::format("create {}", tmp));
  SBX_RETURN_IF_ERROR(t.SendHeader("GET", FilesTarget(id, "files", path), "", std::nullopt, ""));
  absl::Status s = t.ReadResponse(
      [&](const archive::ByteSource& body) {
        for (;;) {
          SBX_ASSIGN_OR_RETURN(std::string_view piece, body());
          if (piece.empty()) return absl::OkStatus();
          progress.Add(piece.size());
          SBX_RETURN_IF_ERROR(WriteAll(fd.get(), piece));
        }
      },
      nullptr);
  if (s.ok() && fd.Close() != 0) s = ErrnoStatus(errno, fmt::format("close {}", tmp));
  if (s.ok() && ::rename(tmp.c_str(), local.c_str()) != 0) {
    s = ErrnoStatus(errno, fmt::format("rename {} to {}", tmp, local));
  }
  if (!s.ok()) ::unlink(tmp.c_str());
  SBX_RETURN_IF_ERROR(s);
  (void)::chmod(local.c_str(), (*remote).value("mode", 0644u) & 0777);
  return 0;
}

std::string ModeString(const json& e) {
  const std::string type = e.value("type", "");
  std::string s = type == "directory" ? "d" : type == "symlink" ? "l" : type == "file" ? "-" : "?";
  const unsigned m = e.value("mode", 0u);
  for (int shift = 6; shift >= 0; shift -= 3) {
    s += (m >> shift) & 4 ? 'r' : '-';
    s += (m >> shift) & 2 ? 'w' : '-';
    s += (m >> shift) & 1 ? 'x' : '-';
  }
  return s;
}

// Registers a subcommand taking one ID:PATH argument.
struct RemoteArg {
  std::string ref, id, path;
};
bool ParseRemote(Context& ctx, std::string_view cmd, RemoteArg& a) {
  auto r = RemoteRef(a.ref);
  if (!r) {
    ctx.usage_errors.push_back({fmt::format("{}: expected SANDBOX_ID:PATH, got \"{}\"", cmd, a.ref)});
    return false;
  }
  if (absl::Status s = CheckId(r->first, "sbx"); !s.ok()) {
    ctx.usage_errors.push_back({fmt::format("{}: {}", cmd, Msg(s))});
    return false;
  }
  a.id = r->first;
  a.path = r->second.empty() ? "/" : r->second;
  return true;
}

}  // namespace

std::optional<std::pair<std::string, std::string>> ParseRemotePath(const std::string& arg) {
  auto r = RemoteRef(arg);
  if (!r || !CheckId(r->first, "sbx").ok()) return std::nullopt;
  if (r->second.empty()) r->second = "/";
  return r;
}

absl::StatusOr<nlohmann::json> PostDirectoryTar(Client& client, const std::string& token,
                                                const std::string& target, const std::string& dir,
                                                bool progress_on) {
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0) return ErrnoStatus(errno, fmt::format("stat {}", dir));
  if (!S_ISDIR(st.st_mode)) return absl::InvalidArgumentError(dir + " is not a directory");
  Progress progress(fmt::format("{}: sending", dir), progress_on);
  Transfer t(client, token);
  SBX_RETURN_IF_ERROR(t.Connect());
  SBX_RETURN_IF_ERROR(t.SendHeader("POST", target, "application/x-tar", std::nullopt, ""));
  std::string out;
  absl::Status sent = TarLocal(t, dir, "", out, progress);
  if (sent.ok()) {
    out.append(archive::TarTrailer());
    sent = t.SendBody(out);
  }
  if (sent.ok()) sent = t.EndBody();
  json result;
  SBX_RETURN_IF_ERROR(t.ReadResponse({}, &result));
  SBX_RETURN_IF_ERROR(sent);
  return result;
}

absl::StatusOr<nlohmann::json> PostFile(Client& client, const std::string& token,
                                        const std::string& target, const std::string& local,
                                        const std::string& content_type, bool progress_on) {
  UniqueFd fd(::open(local.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd) return ErrnoStatus(errno, fmt::format("open {}", local));
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) return ErrnoStatus(errno, fmt::format("stat {}", local));
  if (!S_ISREG(st.st_mode)) return absl::InvalidArgumentError(local + " is not a file");
  Progress progress(fmt::format("{}: sending", local), progress_on);
  Transfer t(client, token);
  SBX_RETURN_IF_ERROR(t.Connect());
  SBX_RETURN_IF_ERROR(t.SendHeader("POST", target, content_type,
                                   static_cast<uint64_t>(st.st_size), ""));
  SBX_ASSIGN_OR_RETURN(absl::Status sent,
                       SendFileBody(t, fd.get(), static_cast<uint64_t>(st.st_size), local, progress));
  // Read the answer even after a failed send: an early error response says what went wrong.
  json result;
  SBX_RETURN_IF_ERROR(t.ReadResponse({}, &result));
  SBX_RETURN_IF_ERROR(sent);
  return result;
}

absl::StatusOr<int> ListFiles(Client& client, const std::string& id, const std::string& path,
                              int depth, bool json_out) {
  SBX_ASSIGN_OR_RETURN(json r, client.Get(FilesTarget(id, "files:list", path,
                                                      fmt::format("&depth={}", depth))));
  if (json_out) {
    PrintJson(r);
    return 0;
  }
  std::string out;
  for (const json& e : r["entries"]) {
    out += fmt::format("{} {:>5} {:>5} {:>12} {} {}{}\n", ModeString(e), e.value("uid", 0u),
                       e.value("gid", 0u), e.value("size", uint64_t{0}), e.value("mtime", ""),
                       e.value("path", ""),
                       e.contains("symlink_target")
                           ? " -> " + e["symlink_target"].get<std::string>()
                           : std::string());
  }
  if (r.value("truncated", false)) out += "(truncated)\n";
  SBX_RETURN_IF_ERROR(WriteAll(1, out));
  return 0;
}

void RegisterFilesCommands(CLI::App& app, Context& ctx, const std::string* token) {
  {
    struct Opts {
      std::string src, dst;
      bool progress = false;
    };
    auto o = std::make_shared<Opts>();
    CLI::App* cmd = app.add_subcommand(
        "cp", "Copy files or directories between here and a sandbox (SANDBOX_ID:PATH on one side)");
    cmd->add_option("src", o->src, "LOCAL_PATH or SANDBOX_ID:PATH")->required();
    cmd->add_option("dst", o->dst, "LOCAL_PATH or SANDBOX_ID:PATH")->required();
    cmd->add_flag("--progress", o->progress,
                  "Show progress on stderr (the default when stderr is a terminal)");
    cmd->footer("Directories are copied recursively (as tar). An existing directory as the "
                "destination receives the source under its own name.\n"
                "Example: sbx cp ./data sbx_abc:/srv    sbx cp sbx_abc:/srv/out.csv .");
    cmd->callback([o, &ctx, token] {
      auto from = RemoteRef(o->src), to = RemoteRef(o->dst);
      if (static_cast<bool>(from) == static_cast<bool>(to)) {
        ctx.usage_errors.push_back({"cp: exactly one of src and dst must be SANDBOX_ID:PATH"});
        return;
      }
      const auto& remote = from ? *from : *to;
      if (absl::Status s = CheckId(remote.first, "sbx"); !s.ok()) {
        ctx.usage_errors.push_back({fmt::format("cp: {}", Msg(s))});
        return;
      }
      const bool progress = o->progress || ::isatty(2);
      ctx.action = [o, from, to, token, progress](Client& client) -> absl::StatusOr<int> {
        if (to) return Upload(client, *token, o->src, to->first, to->second.empty() ? "/" : to->second, progress);
        return Download(client, *token, from->first, from->second.empty() ? "/" : from->second,
                        o->dst, progress);
      };
    });
  }
  CLI::App* files = app.add_subcommand("files", "List, inspect, delete and create files in a sandbox");
  files->require_subcommand(1);
  {
    struct Opts {
      RemoteArg a;
      int depth = 1;
      bool json_out = false;
    };
    auto o = std::make_shared<Opts>();
    CLI::App* cmd = files->add_subcommand("ls", "List a directory of a sandbox");
    cmd->add_option("path", o->a.ref, "SANDBOX_ID:PATH")->required();
    cmd->add_option("--depth", o->depth, "Levels to descend (1-32)")->check(CLI::Range(1, 32));
    cmd->add_flag("--json", o->json_out, "Print the API's JSON");
    cmd->callback([o, &ctx] {
      if (!ParseRemote(ctx, "files ls", o->a)) return;
      ctx.action = [o](Client& client) {
        return ListFiles(client, o->a.id, o->a.path, o->depth, o->json_out);
      };
    });
  }
  {
    auto a = std::make_shared<RemoteArg>();
    CLI::App* cmd = files->add_subcommand("stat", "Describe a file of a sandbox (JSON)");
    cmd->add_option("path", a->ref, "SANDBOX_ID:PATH")->required();
    cmd->callback([a, &ctx] {
      if (!ParseRemote(ctx, "files stat", *a)) return;
      ctx.action = [a](Client& client) -> absl::StatusOr<int> {
        SBX_ASSIGN_OR_RETURN(json r, client.Get(FilesTarget(a->id, "files:stat", a->path)));
        PrintJson(r["entry"]);
        return 0;
      };
    });
  }
  {
    struct Opts {
      RemoteArg a;
      bool recursive = false;
    };
    auto o = std::make_shared<Opts>();
    CLI::App* cmd = files->add_subcommand("rm", "Delete a file or directory of a sandbox");
    cmd->add_option("path", o->a.ref, "SANDBOX_ID:PATH")->required();
    cmd->add_flag("-r,--recursive", o->recursive, "Delete a non-empty directory");
    cmd->callback([o, &ctx] {
      if (!ParseRemote(ctx, "files rm", o->a)) return;
      ctx.action = [o](Client& client) -> absl::StatusOr<int> {
        SBX_RETURN_IF_ERROR(client.Request("DELETE", FilesTarget(o->a.id, "files", o->a.path,
                                                                 o->recursive ? "&recursive=true" : ""))
                                .status());
        return 0;
      };
    });
  }
  {
    struct Opts {
      RemoteArg a;
      bool parents = false;
    };
    auto o = std::make_shared<Opts>();
    CLI::App* cmd = files->add_subcommand("mkdir", "Create a directory in a sandbox");
    cmd->add_option("path", o->a.ref, "SANDBOX_ID:PATH")->required();
    cmd->add_flag("-p,--parents", o->parents, "Create missing parents; an existing directory is fine");
    cmd->callback([o, &ctx] {
      if (!ParseRemote(ctx, "files mkdir", o->a)) return;
      ctx.action = [o](Client& client) -> absl::StatusOr<int> {
        json body = {{"path", o->a.path}, {"parents", o->parents}};
        SBX_RETURN_IF_ERROR(
            client.Request("POST", fmt::format("/v1/sandboxes/{}/files:mkdir", o->a.id), &body)
                .status());
        return 0;
      };
    });
  }
}

}  // namespace sbx::cli
