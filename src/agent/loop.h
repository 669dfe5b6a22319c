// The inside of sbx-agent's event loop (agent.h describes what it does), shared by the files
// it is cut into: agent.cc (the loop, connections, requests, reaping, shutdown), output.cc
// (output and flow control), session_start.cc (attach and starting sessions),
// session_control.cc (status, signals, stdin, resize, timeouts) and processes.cc. The request
// fields of each op are read in requests.cc. Not for use outside the agent.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "agent/agent.h"
#include "agent/event_log.h"
#include "agent/requests.h"
#include "common/unique_fd.h"
#include "protocol/messages.h"
#include "protocol/protocol.h"

namespace sbx::agent {

inline constexpr size_t kReadChunk = 64 * 1024;  // one pipe read (a pipe holds 64 KiB)
// Reads that pile up while every connection is busy are merged into events of up to this many
// bytes (EventLog::AppendOutput): per-event costs (frame, SSE event, write) then shrink as the
// load grows. An SSE data line carries 4/3 of it in base64.
inline constexpr size_t kMaxEventBytes = 256 * 1024;
inline constexpr size_t kOutBufferTarget = 256 * 1024;  // frames queued per connection at a time
// Output events at least this large are sent from the log's buffer (Connection::spliced);
// smaller ones are copied next to their frame header, which costs less than an iovec.
inline constexpr size_t kSpliceFrom = 4096;
inline constexpr int kReadsPerWakeup = 16;              // fairness between pipes and sockets
// What each output pipe is grown to when first watched: a writer then blocks (and the agent
// wakes) once per 1 MiB instead of once per 64 KiB. Best effort: an unprivileged agent past
// the kernel's pipe-user-pages limits keeps the default size.
inline constexpr int kOutputPipeBytes = 1 << 20;
// Output moderation (Agent::OnPipe): a writer that keeps a pipe busy with small writes (coreutils
// write 8 KiB at a time) would wake the agent, and through it sbxd and the client, once per
// write. When a wakeup finds less than kModerateBelow bytes and the pipe was read less than
// kModerateGap ago, the pipe is left for kModerateDelay instead, so the next read takes what
// piled up in that time. Output a process writes now and then is read at once; a grown pipe
// (kOutputPipeBytes) absorbs kModerateDelay of any writer this machine runs, so the writer
// does not block for it.
inline constexpr size_t kModerateBelow = 128 * 1024;
inline constexpr std::chrono::microseconds kModerateGap{1000};
inline constexpr std::chrono::microseconds kModerateDelay{200};
inline constexpr size_t kMaxConnections = 1024;
// Bytes of stdin a session may have queued and not yet taken by its process. Bounded because
// the agent lives inside the sandbox's memory limit; a full queue is the host's signal to wait
// (resource_exhausted), not a reason to block the loop.
inline constexpr size_t kMaxStdinQueue = 1 << 20;
inline constexpr size_t kMaxFileWorkers = 64;

// The wire dump (invalid UTF-8 replaced, never thrown about): the protocol's own.
using protocol::DumpJson;

// agent.log gets the JSON lines of sbxd's own log (common/log_format.h), so that one tool reads
// both: every line names the sandbox, a session's lines the session too.
void WriteLogLine(const AgentOptions& opts, std::string_view level, std::string_view msg,
                  std::string_view session);

// The message is cut: it may embed what a guest chose (a path, a name), and every reply but
// "processes" and "list" must stay under kMaxSmallResponseBytes (8 KiB even at JSON's six
// bytes per escaped byte is well under it).
protocol::Json ErrorJson(const absl::Status& s);

struct Session {
  explicit Session(size_t budget) : log(budget, kMaxEventBytes) {}
  std::string id;
  pid_t pid = -1;
  bool exited = false;
  int wait_status = 0;
  uint64_t oom_kills_at_start = 0;  // the sandbox's OOM counter before the spawn
  bool oom_killed = false;
  std::string started_at;
  std::string exited_at;
  EventLog log;
  UniqueFd pipe_fd[2];      // stdout, stderr read ends; closed at EOF or exit
  uint64_t pipe_token[2] = {0, 0};  // epoll registration, 0 = not watched (paused or closed)
  bool pipe_grown[2] = {false, false};  // F_SETPIPE_SZ tried (Agent::ResumePipes)
  bool pipe_large[2] = {false, false};  // ... and the pipe holds kOutputPipeBytes
  std::chrono::steady_clock::time_point pipe_read_at[2];  // the last wakeup that read bytes
  bool pipe_deferred[2] = {false, false};  // in Agent::deferred_: not watched until due
  std::vector<uint64_t> conns;      // ids of attached connections
  bool finished = false;            // exit event delivered: in Agent::finished_

  bool tty = false;            // pipe_fd[0] is the pty master (one output stream)
  bool stdin_enabled = false;  // created with stdin (always for a tty)
  UniqueFd stdin_fd;           // pipe write end or a dup of the pty master
  uint64_t stdin_token = 0;    // EPOLLOUT registration while the queue waits for room
  std::string stdin_buf;       // queued bytes from stdin_off on
  size_t stdin_off = 0;
  bool stdin_close_requested = false;  // stdin_close seen: fd closes once the queue drained
  std::string stdin_error;     // why stdin stopped early (the process closed its end)

  UniqueFd timer_fd;           // the timeout, then the kill grace period
  uint64_t timer_token = 0;
  int kill_grace_s = kDefaultKillGraceS;
  bool timed_out = false;      // SIGTERM of the timeout sent
  bool kill_sent = false;
};

struct Connection {
  uint64_t id = 0;
  UniqueFd fd;
  uint64_t token = 0;
  bool want_out = false;  // EPOLLOUT registered
  protocol::FrameDecoder decoder;
  int frames_seen = 0;  // hello, then request; anything later is ignored for now
  // What is queued to send, in order: frames built here (`out`), and after `out`'s first `at`
  // bytes each large output event's bytes, sent from the log's own buffer (Agent::Pump, one
  // sendmsg for all) instead of copied in: shared, so that eviction cannot free them midway.
  std::string out;
  struct Spliced {
    size_t at;
    std::shared_ptr<const OutputBytes> bytes;
  };
  std::vector<Spliced> spliced;
  size_t out_off = 0;       // bytes of `out` sent
  size_t spliced_next = 0;  // the first of `spliced` not wholly sent
  size_t spliced_off = 0;   // ... and how much of it was
  uint64_t out_last_id = 0;  // highest event id queued
  bool AllSent() const { return out_off == out.size() && spliced_next == spliced.size(); }
  bool close_after_flush = false;
  Session* session = nullptr;  // set while streaming an attach
  uint64_t cursor = 0;         // next event id to queue
  bool exit_queued = false;
};

class Agent {
 public:
  explicit Agent(AgentOptions opts) : opts_(std::move(opts)) {}
  absl::Status Init();
  int Run();

 private:
  absl::Status OpenListenSocket();
  enum class Kind { kListen, kSignal, kConn, kPipe, kStdin, kTimer };
  struct Watch {
    Kind kind;
    uint64_t conn_id = 0;
    Session* session = nullptr;
    int stream_index = 0;
  };

  void Log(std::string_view level, std::string_view msg, std::string_view session = {}) {
    WriteLogLine(opts_, level, msg, session);
  }

  uint64_t AddWatch(int fd, uint32_t events, Watch w);
  void DelWatch(int fd, uint64_t& token);

  void OnListen();
  void OnSignal();
  void OnConnReadable(Connection& c);
  void OnPipe(Session& s, int idx);
  // Reads what the pipe holds (up to kReadsPerWakeup reads) into the log; closes it at EOF.
  size_t ReadPipe(Session& s, int idx);
  void FlushStdin(Session& s);
  void CloseStdin(Session& s);
  void OnTimer(Session& s);
  void ArmTimer(Session& s, int64_t seconds);

  void HandleFrame(Connection& c, protocol::Frame frame);
  void HandleRequest(Connection& c, const std::string& payload, protocol::FrameDecoder& rest);
  // Hands a file request (files.h) to a forked worker child; the loop forgets the connection.
  void ForkFileWorker(Connection& c, const protocol::Json& req, protocol::FrameDecoder& rest);
  protocol::Json HandleAttach(Connection& c, const protocol::Json& req, bool& streaming);
  protocol::Json HandleStatus(const protocol::Json& req);
  protocol::Json HandleSignal(const protocol::Json& req);
  protocol::Json HandleStdin(const protocol::Json& req, bool close);
  protocol::Json HandleResize(const protocol::Json& req);
  // The payload itself, built as text (bounded.h): the list is guest-sized.
  std::string HandleProcesses();
  absl::StatusOr<Session*> FindSession(const protocol::Json& req, std::string_view op);
  absl::StatusOr<Session*> StartSession(const std::string& id, const protocol::Json& spec);

  void Pump(Connection& c);
  void Refill(Connection& c);
  void PumpSession(Session& s);
  void CloseConn(uint64_t id);
  void UpdateConnEvents(Connection& c, bool want_out);

  void PausePipe(Session& s, int idx);
  // Output moderation (kModerateDelay): leaves the pipe unwatched until due.
  void DeferPipe(Session& s, int idx, std::chrono::steady_clock::time_point now);
  void ResumeDuePipes(std::chrono::steady_clock::time_point now);
  void ResumePipes(Session& s);
  void ClosePipe(Session& s, int idx);
  void DrainPipe(Session& s, int idx);
  void Reap();
  void OnSessionExit(Session& s, int status);
  void OnDelivered(Session& s);
  void Shutdown();

  AgentOptions opts_;
  UniqueFd epoll_;
  UniqueFd signal_fd_;
  UniqueFd listen_fd_;
  UniqueFd oom_fd_;
  UniqueFd root_fd_;  // O_PATH fd of opts_.root, for file workers
  std::unordered_map<pid_t, bool> file_workers_;  // live worker pids (not sessions)
  bool listen_paused_ = false;
  std::chrono::steady_clock::time_point listen_resume_at_;
  bool bound_path_ = false;
  bool stop_ = false;
  uint64_t next_token_ = 1;
  uint64_t next_conn_id_ = 1;
  std::unordered_map<uint64_t, Watch> watches_;
  std::unordered_map<uint64_t, std::unique_ptr<Connection>> conns_;
  std::map<std::string, std::unique_ptr<Session>> sessions_;
  std::unordered_map<pid_t, Session*> by_pid_;  // running sessions only
  std::vector<Session*> finished_;  // sessions whose exit event was delivered, oldest first
  struct DeferredPipe {
    Session* session;  // sessions live as long as the agent
    int index;
    std::chrono::steady_clock::time_point due;
  };
  std::deque<DeferredPipe> deferred_;  // due times in order: one delay for all
  bool have_pwait2_ = true;            // until epoll_pwait2 fails (ENOSYS before 5.11)
  char read_buf_[kReadChunk];
};

}  // namespace sbx::agent
