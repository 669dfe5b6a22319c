// The agent's file operations through the real sbx-agent binary (an ordinary child process with
// --root pointing at a temporary directory): the forked workers serve the requests, are reaped,
// and never disturb the sessions' bookkeeping.
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "archive/tar.h"
#include "common/unique_fd.h"
#include "protocol/limits.h"
#include "protocol/protocol.h"

#ifndef SBX_AGENT_PATH
#error "SBX_AGENT_PATH must point at the sbx-agent binary"
#endif

namespace sbx::agent {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using protocol::EncodeFrame;
using protocol::Frame;
using protocol::FrameType;
using protocol::Json;

class Agent {
 public:
  // `upper`: files made in <dir>/upper, which the agent gets as --upper-fd (a microVM build
  // step's agent), and a child it has from before its exec, spared (as the guest's mux pump).
  explicit Agent(const std::function<void(const fs::path&)>& upper = {}) {
    char tmpl[] = "/tmp/sbx-agent-files-XXXXXX";
    dir_ = ::mkdtemp(tmpl);
    fs::create_directories(dir_ / "root" / "srv");
    socket_ = (dir_ / "agent.sock").string();
    std::vector<std::string> args = {SBX_AGENT_PATH, "--listen", socket_, "--no-user-switch",
                                     "--root", (dir_ / "root").string()};
    UniqueFd upper_fd;
    if (upper) {
      fs::create_directories(dir_ / "upper");
      upper(dir_ / "upper");
      upper_fd = UniqueFd(::open((dir_ / "upper").c_str(), O_RDONLY | O_DIRECTORY));  // inherited
      args.insert(args.end(), {"--upper-fd", std::to_string(upper_fd.get())});
    }
    char path_env[] = "PATH=/usr/bin:/bin";
    char* envp[] = {path_env, nullptr};
    const std::string log = (dir_ / "agent.log").string();
    if (upper) {
      // fork, fork the spared child, exec the agent: the child is then the agent's, as init's
      // pump is in a guest.
      int p[2];
      if (::pipe(p) != 0 || (pid_ = ::fork()) < 0) {
        ADD_FAILURE() << "pipe or fork: " << std::strerror(errno);
        return;
      }
      if (pid_ == 0) {
        const pid_t kept = ::fork();
        if (kept == 0) {
          ::pause();
          ::_exit(0);
        }
        (void)!::write(p[1], &kept, sizeof(kept));
        args.insert(args.end(), {"--spare-pid", std::to_string(kept)});
        std::vector<char*> argv;
        for (auto& a : args) argv.push_back(a.data());
        argv.push_back(nullptr);
        const int err = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0600);
        ::dup2(err, 2);
        ::execve(SBX_AGENT_PATH, argv.data(), envp);
        ::_exit(127);
      }
      ::close(p[1]);
      EXPECT_EQ(::read(p[0], &spared_, sizeof(spared_)), static_cast<ssize_t>(sizeof(spared_)));
      ::close(p[0]);
    } else {
      std::vector<char*> argv;
      for (auto& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      posix_spawn_file_actions_t fa;
      posix_spawn_file_actions_init(&fa);
      posix_spawn_file_actions_addopen(&fa, 2, log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0600);
      EXPECT_EQ(posix_spawn(&pid_, SBX_AGENT_PATH, &fa, nullptr, argv.data(), envp), 0);
      posix_spawn_file_actions_destroy(&fa);
    }
    for (int i = 0; i < 500; ++i) {
      if (protocol::CallAgent(socket_, Json{{"op", "ping"}}, 1000).ok()) return;
      std::this_thread::sleep_for(10ms);
    }
    ADD_FAILURE() << "agent did not answer a ping";
  }
  ~Agent() {
    if (spared_ > 0) ::kill(spared_, SIGKILL);
    ::kill(pid_, SIGTERM);
    int status = 0;
    ::waitpid(pid_, &status, 0);
    fs::remove_all(dir_);
  }

  // Sends hello, the request and `then` (more frames), and returns every frame the agent sent
  // until it closed the connection.
  std::vector<Frame> Exchange(const Json& request, const std::string& then = "") {
    UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strncpy(addr.sun_path, socket_.c_str(), sizeof(addr.sun_path) - 1);
    EXPECT_EQ(::connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    std::string out = EncodeFrame(FrameType::kHello, R"({"version":1,"role":"host"})") +
                      EncodeFrame(FrameType::kRequest, request.dump()) + then;
    EXPECT_EQ(::send(fd.get(), out.data(), out.size(), MSG_NOSIGNAL),
              static_cast<ssize_t>(out.size()));
    protocol::FrameDecoder dec;
    std::vector<Frame> frames;
    char buf[65536];
    for (;;) {
      ssize_t n = ::recv(fd.get(), buf, sizeof(buf), 0);
      if (n <= 0) break;
      dec.Feed(std::string_view(buf, static_cast<size_t>(n)));
      for (;;) {
        auto f = dec.Next();
        if (!f.ok() || !*f) break;
        frames.push_back(std::move(**f));
      }
    }
    return frames;
  }

  // Children of the agent that are zombies (unreaped workers).
  int Zombies() const {
    int n = 0;
    for (const auto& e : fs::directory_iterator("/proc")) {
      std::ifstream f(e.path() / "stat");
      std::string line;
      if (!std::getline(f, line)) continue;
      const size_t close = line.rfind(')');
      if (close == std::string::npos) continue;
      char state = 0;
      int ppid = 0;
      if (std::sscanf(line.c_str() + close + 1, " %c %d", &state, &ppid) == 2 && ppid == pid_ &&
          state == 'Z') {
        ++n;
      }
    }
    return n;
  }

  const fs::path& root_parent() const { return dir_; }
  fs::path root() const { return dir_ / "root"; }
  pid_t spared() const { return spared_; }

 private:
  pid_t spared_ = -1;
  fs::path dir_;
  std::string socket_;
  pid_t pid_ = -1;
};

Json Payload(const Frame& f) { return Json::parse(f.payload); }

// The signal the attached session's exit names ("" when the stream ends first).
std::string ExitSignal(protocol::AgentConnection& c) {
  for (;;) {
    auto f = c.ReadFrame();
    if (!f.ok()) return "";
    if (f->type != FrameType::kExit) continue;
    auto ev = protocol::DecodeExit(f->payload);
    return ev.ok() ? ev->signal.value_or("") : "";
  }
}

TEST(AgentFiles, WriteReadStatThroughWorkers) {
  Agent a;
  // Bytes that differ from position to position, so that a chunk lost, repeated or moved (the
  // upload splices each frame's payload from the socket into the file) shows in the content.
  std::string data(600 * 1024, 'x');
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>(i * 31 + (i >> 12));
  std::string frames;
  for (size_t off = 0; off < data.size(); off += 100000) {
    frames += EncodeFrame(FrameType::kData, data.substr(off, 100000));
  }
  frames += EncodeFrame(FrameType::kEnd, "{}");
  auto w = a.Exchange(Json{{"op", "write"}, {"path", "/srv/f.bin"}, {"mode", 0600}}, frames);
  ASSERT_EQ(w.size(), 3u);  // hello, response, end
  EXPECT_TRUE(Payload(w[1])["ok"].get<bool>()) << w[1].payload;
  ASSERT_EQ(w[2].type, FrameType::kEnd);
  EXPECT_EQ(Payload(w[2])["entry"]["size"], data.size()) << w[2].payload;
  EXPECT_EQ(Payload(w[2])["entry"]["mode"], 0600);
  {
    std::ifstream in(a.root() / "srv" / "f.bin", std::ios::binary);
    const std::string written((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    EXPECT_TRUE(written == data) << "the uploaded file differs from the bytes sent";
  }

  auto r = a.Exchange(Json{{"op", "read"}, {"path", "srv/f.bin"}, {"offset", 10}, {"length", 5}});
  ASSERT_GE(r.size(), 3u);
  EXPECT_EQ(Payload(r[1])["length"], 5);
  std::string got;
  for (const Frame& f : r) {
    if (f.type == FrameType::kData) got += f.payload;
  }
  EXPECT_EQ(got, data.substr(10, 5));
  EXPECT_EQ(r.back().type, FrameType::kEnd);

  // The host's "/" is not the agent's root.
  auto s = a.Exchange(Json{{"op", "stat"}, {"path", a.root_parent().string() + "/agent.log"}});
  ASSERT_EQ(s.size(), 2u);
  EXPECT_EQ(Payload(s[1])["error"]["reason"], "not_found") << s[1].payload;

  // No temporary file is left next to the target.
  int files = 0;
  for (const auto& e : fs::directory_iterator(a.root() / "srv")) {
    (void)e;
    ++files;
  }
  EXPECT_EQ(files, 1);
}

TEST(AgentFiles, WorkersDoNotDisturbSessions) {
  Agent a;
  // A session that outlives many file workers, each of which exits and is reaped meanwhile.
  protocol::AgentConnection c = *protocol::AgentConnection::Connect(
      (a.root_parent() / "agent.sock").string(), 10000);
  auto started = c.Call(Json{{"op", "attach"},
                             {"session_id", "s1"},
                             {"spec", {{"argv", {"sleep", "30"}}}}});
  ASSERT_TRUE(started.ok()) << started.status();
  for (int i = 0; i < 50; ++i) {
    auto f = a.Exchange(Json{{"op", "mkdir"}, {"path", "/srv/d" + std::to_string(i)}});
    ASSERT_EQ(f.size(), 2u);
    ASSERT_TRUE(Payload(f[1])["ok"].get<bool>()) << f[1].payload;
  }
  auto st = protocol::CallAgent((a.root_parent() / "agent.sock").string(),
                                Json{{"op", "status"}, {"session_id", "s1"}});
  ASSERT_TRUE(st.ok());
  EXPECT_EQ((*st)["state"], "running") << st->dump();
  // Every worker has been reaped (the loop reaps on SIGCHLD; allow it a moment).
  for (int i = 0; i < 200 && a.Zombies() > 0; ++i) std::this_thread::sleep_for(10ms);
  EXPECT_EQ(a.Zombies(), 0);
  // The session's own exit is still reported as its own.
  auto sig = protocol::CallAgent((a.root_parent() / "agent.sock").string(),
                                 Json{{"op", "signal"}, {"session_id", "s1"}, {"signal", "TERM"}});
  ASSERT_TRUE(sig.ok()) << sig.status();
  EXPECT_EQ(ExitSignal(c), "SIGTERM");
}

// A microVM build step's layer: the agent ends what the step left running (but the processes it
// is told to spare), then streams its upper as an OCI layer tar the host can unpack, and counts
// what it sent; more entries than asked for end the stream with the reason.
TEST(AgentFiles, ExportLayerEndsLeftoversAndStreamsTheUpper) {
  std::string big(700 * 1024, 'b');  // more than one kData frame
  Agent a(
      [&](const fs::path& up) {
        fs::create_directories(up / "etc" / "app");
        std::ofstream(up / "etc" / "app" / "conf") << "x=1\n";
        std::ofstream(up / "big") << big;
        fs::create_symlink("/etc/app/conf", up / "link");
        fs::create_hard_link(up / "big", up / "big2");
      });
  protocol::AgentConnection c = *protocol::AgentConnection::Connect(
      (a.root_parent() / "agent.sock").string(), 10000);
  auto started = c.Call(Json{{"op", "attach"}, {"session_id", "left"}, {"spec", {{"argv", {"sleep", "300"}}}}});
  ASSERT_TRUE(started.ok()) << started.status();

  auto frames = a.Exchange(Json{{"op", "export_layer"}, {"max_entries", 100}});
  ASSERT_GE(frames.size(), 4u);  // hello, response, data..., end
  EXPECT_TRUE(Payload(frames[1])["ok"].get<bool>()) << frames[1].payload;
  std::string tar;
  for (size_t i = 2; i + 1 < frames.size(); ++i) {
    ASSERT_EQ(frames[i].type, FrameType::kData);
    EXPECT_LE(frames[i].payload.size(), protocol::kMaxDataFrameBytes);
    tar += frames[i].payload;
  }
  ASSERT_EQ(frames.back().type, FrameType::kEnd);
  const Json end = Payload(frames.back());
  ASSERT_TRUE(end["ok"].get<bool>()) << end.dump();
  EXPECT_EQ(end["tar_bytes"], tar.size());
  std::map<std::string, archive::TarType> seen;
  bool given = false;
  archive::TarReader r([&]() -> absl::StatusOr<std::string_view> {
    if (given) return std::string_view();
    given = true;
    return std::string_view(tar);
  });
  for (;;) {
    auto e = r.Next();
    ASSERT_TRUE(e.ok()) << e.status();
    if (!e->has_value()) break;
    seen[(*e)->name] = (*e)->type;
  }
  EXPECT_EQ(end["entries"], seen.size());
  EXPECT_EQ(seen["etc/app/conf"], archive::TarType::kFile);
  EXPECT_EQ(seen["link"], archive::TarType::kSymlink);
  EXPECT_EQ(seen["big"], archive::TarType::kFile);
  EXPECT_EQ(seen["big2"], archive::TarType::kHardLink);
  // The step's leftover is gone; the spared process is not.
  EXPECT_EQ(ExitSignal(c), "SIGKILL");
  // The agent reaps its children: a spared one killed would be gone from /proc by now.
  std::ifstream st(fmt::format("/proc/{}/stat", a.spared()));
  std::string line;
  ASSERT_TRUE(std::getline(st, line)) << "the spared child was ended";
  EXPECT_EQ(line.substr(line.rfind(')') + 2, 1), "S") << line;

  auto few = a.Exchange(Json{{"op", "export_layer"}, {"max_entries", 2}});
  ASSERT_GE(few.size(), 3u);
  ASSERT_EQ(few.back().type, FrameType::kEnd);
  EXPECT_EQ(Payload(few.back())["error"]["code"], "resource_exhausted") << few.back().payload;
}

TEST(AgentFiles, ExportLayerIsRefusedWithoutAnUpper) {
  Agent a;
  auto frames = a.Exchange(Json{{"op", "export_layer"}});
  ASSERT_EQ(frames.size(), 2u);
  EXPECT_EQ(Payload(frames[1])["error"]["code"], "failed_precondition") << frames[1].payload;
  auto bad = a.Exchange(Json{{"op", "export_layer"}, {"max_entries", 0}});
  ASSERT_EQ(bad.size(), 2u);
  EXPECT_EQ(Payload(bad[1])["error"]["code"], "invalid_argument") << bad[1].payload;
}

// Issue 13 audit: the agent's only recursive walks of guest-made trees (recursive delete, tar
// download; files:list is capped at depth 32 by the request) stop at a fixed depth instead of
// following a guest's directory chain down the worker's stack.
TEST(AgentFiles, RecursiveWalksOfDeepTreesAreBounded) {
  Agent a;
  fs::path p = a.root() / "srv" / "deep";
  for (int i = 0; i < 200; ++i) p /= "d";
  fs::create_directories(p);
  auto tar = a.Exchange(Json{{"op", "read_tar"}, {"path", "/srv/deep"}});
  ASSERT_GE(tar.size(), 3u);
  EXPECT_TRUE(Payload(tar[1])["ok"].get<bool>()) << tar[1].payload;
  ASSERT_EQ(tar.back().type, FrameType::kEnd);
  EXPECT_EQ(Payload(tar.back())["error"]["reason"], "too_deep") << tar.back().payload;
  auto del = a.Exchange(Json{{"op", "delete"}, {"path", "/srv/deep"}, {"recursive", true}});
  ASSERT_EQ(del.size(), 2u);
  EXPECT_EQ(Payload(del[1])["error"]["reason"], "too_deep") << del[1].payload;
  EXPECT_TRUE(fs::is_directory(p));
  auto list = a.Exchange(Json{{"op", "list"}, {"path", "/srv/deep"}, {"depth", 33}});
  ASSERT_EQ(list.size(), 2u);
  EXPECT_FALSE(Payload(list[1])["ok"].get<bool>()) << list[1].payload;
  EXPECT_TRUE(protocol::CallAgent((a.root_parent() / "agent.sock").string(),
                                  Json{{"op", "ping"}}).ok());
  fs::remove_all(a.root() / "srv" / "deep");
}


// Issue 13 (finding 6): a guest's tree whose listing would pass the reply bound is cut before
// it, flagged, and still a valid reply; the first entries in path order are the ones kept.
TEST(AgentFiles, ListOfAHugeTreeIsCutAtTheReplyBound) {
  Agent a;
  const std::string longname(197, 'n');
  fs::path p = a.root() / "srv" / "big";
  // 16 levels of 200 files with 200-byte names: ~3200 entries of ~2 KiB (paths stay under
  // PATH_MAX), about 6 MiB of listing in all.
  for (int level = 0; level < 16; ++level) {
    fs::create_directories(p);
    for (int i = 0; i < 200; ++i) {
      std::ofstream(p / fmt::format("{:03d}{}", i, longname)) << "x";
    }
    p /= "d" + longname + "dd";
  }
  auto list = a.Exchange(Json{{"op", "list"}, {"path", "/srv/big"}, {"depth", 32}});
  ASSERT_EQ(list.size(), 2u);
  EXPECT_LE(list[1].payload.size(), protocol::kMaxGuestReplyBytes);
  Json r = Payload(list[1]);
  EXPECT_TRUE(r["ok"].get<bool>()) << list[1].payload.substr(0, 300);
  EXPECT_EQ(r["truncated"], true);
  ASSERT_GT(r["entries"].size(), 100u);
  EXPECT_LT(r["entries"].size(), 16u * 201u);
  EXPECT_EQ(r["entries"][0]["path"], "/srv/big/000" + longname);
  fs::remove_all(a.root() / "srv" / "big");
}

TEST(AgentFiles, ListOfAHugeDirectoryKeepsTheFirstEntriesInOrder) {
  Agent a;
  const fs::path dir = a.root() / "srv" / "many";
  fs::create_directories(dir);
  const size_t n = protocol::kMaxListEntries + 500;
  for (size_t i = 0; i < n; ++i) {
    // Created in reverse, so that readdir's order is not already the sorted one.
    UniqueFd f(::open((dir / fmt::format("f{:06d}", n - 1 - i)).c_str(),
                      O_WRONLY | O_CREAT | O_CLOEXEC, 0644));
    ASSERT_TRUE(f) << std::strerror(errno);
  }
  auto list = a.Exchange(Json{{"op", "list"}, {"path", "/srv/many"}});
  ASSERT_EQ(list.size(), 2u);
  Json r = Payload(list[1]);
  EXPECT_EQ(r["truncated"], true);
  ASSERT_EQ(r["entries"].size(), protocol::kMaxListEntries);
  for (size_t i = 0; i < r["entries"].size(); ++i) {
    ASSERT_EQ(r["entries"][i]["name"], fmt::format("f{:06d}", i)) << i;
  }
  auto small = a.Exchange(Json{{"op", "list"}, {"path", "/srv"}});
  ASSERT_EQ(small.size(), 2u);
  EXPECT_EQ(Payload(small[1])["truncated"], false) << small[1].payload;
  fs::remove_all(dir);
}

// The file ops take their typed requests (protocol/messages.h); a request its decoder refuses
// is still answered as the agent's own field readers answered it, path first, and what those
// readers let through (a boolean of another type, a field the op does not use) still goes.
TEST(AgentFiles, RefusedFieldsKeepTheAgentsAnswers) {
  Agent a;
  auto error = [&](const Json& request) {
    auto f = a.Exchange(request);
    EXPECT_EQ(f.size(), 2u) << request.dump();
    return f.size() < 2 ? Json() : Payload(f[1])["error"];
  };
  Json e = error(Json{{"op", "stat"}});
  EXPECT_EQ(e["code"], "invalid_argument") << e.dump();
  EXPECT_EQ(e["reason"], "invalid_path");
  EXPECT_EQ(e["message"], "\"path\" must be a string");
  e = error(Json{{"op", "move"}, {"from", "/srv"}, {"to", 7}});
  EXPECT_EQ(e["reason"], "invalid_path") << e.dump();
  EXPECT_EQ(e["message"], "\"to\" must be a string");
  e = error(Json{{"op", "read"}, {"path", "/srv/f"}, {"offset", (uint64_t{1} << 62) + 1}});
  EXPECT_EQ(e["code"], "invalid_argument") << e.dump();
  EXPECT_EQ(e["reason"], "invalid_argument");
  EXPECT_EQ(e["message"], "\"offset\" must be an integer between 0 and 4611686018427387904");
  e = error(Json{{"op", "write"}, {"path", "/srv/f"}, {"max_bytes", -1}});
  EXPECT_EQ(e["message"], "\"max_bytes\" must be an integer between 0 and 4611686018427387904")
      << e.dump();
  // The path is judged before the other fields.
  e = error(Json{{"op", "read"}, {"path", "../../etc/passwd"}, {"offset", "x"}});
  EXPECT_EQ(e["reason"], "path_outside_root") << e.dump();
  e = error(Json{{"op", "list"}, {"path", "/srv"}, {"depth", 0}});
  EXPECT_EQ(e["message"], "depth must be at least 1") << e.dump();

  auto mkdir = a.Exchange(Json{{"op", "mkdir"}, {"path", "/srv/m"}, {"parents", "yes"}});
  ASSERT_EQ(mkdir.size(), 2u);
  EXPECT_TRUE(Payload(mkdir[1])["ok"].get<bool>()) << mkdir[1].payload;
  auto tar = a.Exchange(Json{{"op", "read_tar"}, {"path", "/srv"}, {"offset", "x"}});
  ASSERT_GE(tar.size(), 3u);
  EXPECT_TRUE(Payload(tar[1])["ok"].get<bool>()) << tar[1].payload;
  EXPECT_TRUE(Payload(tar.back())["ok"].get<bool>()) << tar.back().payload;
}

}  // namespace
}  // namespace sbx::agent
