// Output and flow control: pipes are read into the session's EventLog while it has room
// (paused otherwise), and each attached connection is refilled from its cursor and written
// non-blocking; what every connection has taken frees room and resumes the pipes.
#include <fcntl.h>
#include <sys/epoll.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <span>
#include <string_view>

#include <fmt/format.h>

#include "agent/loop.h"
#include "common/status_util.h"

namespace sbx::agent {

using protocol::EncodeFrame;
using protocol::FrameType;
using protocol::Stream;

void Agent::DrainPipe(Session& s, int idx) {
  if (!s.pipe_fd[idx]) return;
  const Stream stream = idx == 0 ? Stream::kStdout : Stream::kStderr;
  int capacity = ::fcntl(s.pipe_fd[idx].get(), F_GETPIPE_SZ);
  size_t left = capacity > 0 ? static_cast<size_t>(capacity) : 1u << 20;
  while (left > 0) {
    ssize_t n = ::read(s.pipe_fd[idx].get(), read_buf_, std::min(left, sizeof(read_buf_)));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    s.log.AppendOutput(stream, std::string_view(read_buf_, static_cast<size_t>(n)));
    left -= static_cast<size_t>(n);
  }
  ClosePipe(s, idx);
}

void Agent::ClosePipe(Session& s, int idx) {
  DelWatch(s.pipe_fd[idx].get(), s.pipe_token[idx]);
  s.pipe_fd[idx].Reset();
}

void Agent::PausePipe(Session& s, int idx) { DelWatch(s.pipe_fd[idx].get(), s.pipe_token[idx]); }

void Agent::ResumePipes(Session& s) {
  for (int idx = 0; idx < 2; ++idx) {
    const Stream stream = idx == 0 ? Stream::kStdout : Stream::kStderr;
    if (s.pipe_fd[idx] && s.pipe_token[idx] == 0 && !s.pipe_deferred[idx] &&
        s.log.CanRead(stream)) {
      if (!s.pipe_grown[idx]) {
        s.pipe_grown[idx] = true;
        // A pty's buffer is the line discipline's (a few KiB): never moderated.
        const int fd = s.pipe_fd[idx].get();
        s.pipe_large[idx] =
            !s.tty && ::fcntl(fd, F_SETPIPE_SZ, kOutputPipeBytes) >= kOutputPipeBytes;
      }
      Watch w{Kind::kPipe};
      w.session = &s;
      w.stream_index = idx;
      s.pipe_token[idx] = AddWatch(s.pipe_fd[idx].get(), EPOLLIN, w);
    }
  }
}

size_t Agent::ReadPipe(Session& s, int idx) {
  const Stream stream = idx == 0 ? Stream::kStdout : Stream::kStderr;
  size_t got = 0;
  // What the pipe holds (FIONREAD) is read straight into the log, in events sized to fit (a
  // small write must not hold a large buffer), and once it is read the wake-up is over: the
  // watch is level-triggered, so what came meanwhile wakes the loop again, and no read is
  // spent on EAGAIN. An empty pipe (EOF, or bytes that came after the count) and a pty take
  // the copying read.
  size_t held = 0;
  bool counted = s.tty;
  for (int i = 0; i < kReadsPerWakeup && s.pipe_fd[idx]; ++i) {
    if (!s.log.CanRead(stream)) {
      PausePipe(s, idx);
      break;
    }
    const int fd = s.pipe_fd[idx].get();
    if (!counted) {
      int n = 0;
      if (::ioctl(fd, FIONREAD, &n) == 0 && n > 0) held = static_cast<size_t>(n);
      counted = true;
    }
    if (held > 0) {
      std::span<char> room = s.log.ReserveOutput(stream, std::min(held, kMaxEventBytes));
      ssize_t n = ::read(fd, room.data(), room.size());
      if (n > 0) {
        s.log.CommitOutput(stream, static_cast<size_t>(n));
        got += static_cast<size_t>(n);
        held -= std::min(held, static_cast<size_t>(n));
        if (held == 0) break;
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      held = 0;  // the copying read below says what happened
    }
    ssize_t n = ::read(fd, read_buf_, sizeof(read_buf_));
    if (n > 0) {
      s.log.AppendOutput(stream, std::string_view(read_buf_, static_cast<size_t>(n)));
      got += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
    // EIO is how a pty master says that every slave fd is closed: the tty's EOF.
    if (n < 0 && !(s.tty && errno == EIO)) {
      Log("warn", fmt::format("session {}: read pipe: {}", s.id, ErrnoMessage(errno)), s.id);
    }
    ClosePipe(s, idx);  // EOF: every writer is gone
  }
  return got;
}

void Agent::OnPipe(Session& s, int idx) {
  // What the other stream holds back (moderation) was written before what woke us: read it
  // first, so events keep the order the process wrote in as well as they did unmoderated.
  const int other = 1 - idx;
  const size_t held = s.pipe_deferred[other] && s.pipe_fd[other] ? ReadPipe(s, other) : 0;
  const size_t got = ReadPipe(s, idx);
  if (got > 0) {
    const auto now = std::chrono::steady_clock::now();
    // A busy writer of small chunks: let its output pile up for a moment (loop.h).
    if (s.pipe_large[idx] && s.pipe_token[idx] != 0 && got < kModerateBelow &&
        now - s.pipe_read_at[idx] < kModerateGap) {
      DeferPipe(s, idx, now);
    }
    s.pipe_read_at[idx] = now;
  }
  if (held + got > 0) PumpSession(s);
  // The pump may have freed room for a pipe paused above.
  if (s.pipe_fd[idx] && s.pipe_token[idx] == 0) ResumePipes(s);
}

void Agent::DeferPipe(Session& s, int idx, std::chrono::steady_clock::time_point now) {
  PausePipe(s, idx);
  s.pipe_deferred[idx] = true;
  deferred_.push_back(DeferredPipe{&s, idx, now + kModerateDelay});
}

void Agent::ResumeDuePipes(std::chrono::steady_clock::time_point now) {
  while (!deferred_.empty() && deferred_.front().due <= now) {
    Session& s = *deferred_.front().session;
    s.pipe_deferred[deferred_.front().index] = false;
    deferred_.pop_front();
    // Closed meanwhile (the exit drained it), or held by flow control: ResumePipes decides.
    ResumePipes(s);
  }
}

void Agent::Refill(Connection& c) {
  if (!c.session || c.exit_queued) return;
  EventLog& log = c.session->log;
  if (c.cursor < log.oldest_id()) {
    // Events this connection has not seen were evicted (after an old after_event_id, or
    // because a faster connection let them go): say where the retained data starts.
    auto resync = log.ResyncFor(c.cursor - 1);
    if (resync) c.out += EncodeFrame(FrameType::kResync, protocol::EncodeResync(*resync));
    c.cursor = log.oldest_id();
  }
  // Pump refills only what it has wholly sent and cleared: nothing is spliced yet.
  size_t queued = c.out.size() - c.out_off;
  while (queued < kOutBufferTarget) {
    const LogEvent* e = log.Get(c.cursor);
    if (!e) break;
    log.Seal(e->id);  // from now on its bytes are what every attach replays
    const size_t before = c.out.size();
    if (e->is_exit) {
      c.out += EncodeFrame(FrameType::kExit, protocol::EncodeExit(e->exit));
      c.exit_queued = true;
    } else if (e->data().size() < kSpliceFrom) {
      protocol::AppendOutputFrame(c.out, e->id, e->stream, e->offset, e->data());
    } else {
      protocol::AppendOutputFrameHeader(c.out, e->id, e->stream, e->offset, e->data().size());
      c.spliced.push_back(Connection::Spliced{c.out.size(), e->bytes});
      queued += e->data().size();
    }
    queued += c.out.size() - before;
    c.out_last_id = e->id;
    ++c.cursor;
    if (c.exit_queued) break;
  }
}

namespace {

// Up to `max` iovecs for what `c` has queued and not sent, in order; returns how many.
int GatherUnsent(const Connection& c, iovec* iov, int max) {
  int k = 0;
  size_t text = c.out_off;
  size_t next = c.spliced_next;
  size_t skip = c.spliced_off;
  while (k < max) {
    const size_t text_end = next < c.spliced.size() ? c.spliced[next].at : c.out.size();
    if (text < text_end) {
      iov[k++] = {const_cast<char*>(c.out.data()) + text, text_end - text};
      text = text_end;
      continue;
    }
    if (next == c.spliced.size()) break;
    const std::string_view bytes = c.spliced[next].bytes->view();
    iov[k++] = {const_cast<char*>(bytes.data()) + skip, bytes.size() - skip};
    skip = 0;
    ++next;
  }
  return k;
}

// Marks `n` more bytes of what GatherUnsent listed as sent.
void AdvanceSent(Connection& c, size_t n) {
  while (n > 0) {
    const size_t text_end =
        c.spliced_next < c.spliced.size() ? c.spliced[c.spliced_next].at : c.out.size();
    if (c.out_off < text_end) {
      const size_t take = std::min(n, text_end - c.out_off);
      c.out_off += take;
      n -= take;
      continue;
    }
    if (c.spliced_next == c.spliced.size()) break;  // more than was queued: not from sendmsg
    const size_t left = c.spliced[c.spliced_next].bytes->size() - c.spliced_off;
    const size_t take = std::min(n, left);
    c.spliced_off += take;
    n -= take;
    if (take == left) {
      ++c.spliced_next;
      c.spliced_off = 0;
    }
  }
}

}  // namespace

void Agent::Pump(Connection& c) {
  const uint64_t id = c.id;
  // Refill queues up to kOutBufferTarget in frames of at least kSpliceFrom bytes of output
  // or of a header: well under this many pieces, or they go in the next sendmsg.
  constexpr int kMaxIov = 128;
  iovec iov[kMaxIov];
  for (;;) {
    if (c.AllSent()) {
      c.out.clear();
      c.out_off = 0;
      c.spliced.clear();  // lets go of the log's bytes
      c.spliced_next = 0;
      c.spliced_off = 0;
      Refill(c);
      if (c.AllSent()) {
        const bool done =
            c.close_after_flush || c.exit_queued ||
            (c.session && c.session->log.has_exit() && c.cursor > c.session->log.exit_id());
        if (done) {
          CloseConn(id);
        } else {
          UpdateConnEvents(c, false);
        }
        return;
      }
    }
    msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = static_cast<size_t>(GatherUnsent(c, iov, kMaxIov));
    ssize_t n = ::sendmsg(c.fd.get(), &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        UpdateConnEvents(c, true);
        return;
      }
      CloseConn(id);  // EPIPE/ECONNRESET: the client is gone
      return;
    }
    AdvanceSent(c, static_cast<size_t>(n));
    if (c.AllSent() && c.out_last_id != 0 && c.session) {
      Session& s = *c.session;
      s.log.MarkDelivered(c.out_last_id);
      c.out_last_id = 0;
      OnDelivered(s);
    }
  }
}

void Agent::OnDelivered(Session& s) {
  ResumePipes(s);
  if (s.finished || !s.log.has_exit() || s.log.delivered() < s.log.exit_id()) return;
  // The host has had everything of this session. Its log stays for replays, but the agent
  // lives inside the sandbox's memory limit, so finished sessions share a total of twice the
  // per-stream budget; beyond it the oldest lose their output (a later attach then gets a
  // kResync straight to the exit event). Exit status and times are kept for good, so a
  // re-sent attach never restarts the command.
  s.finished = true;
  finished_.push_back(&s);
  size_t total = 0;
  for (Session* f : finished_) {
    total += f->log.retained_bytes(Stream::kStdout) + f->log.retained_bytes(Stream::kStderr);
  }
  for (Session* f : finished_) {
    if (total <= 2 * opts_.buffer_bytes) break;
    total -= f->log.DropDelivered();
  }
  // Keep the vector from growing with sessions that hold nothing any more.
  std::erase_if(finished_, [](Session* f) {
    return f->log.retained_bytes(Stream::kStdout) + f->log.retained_bytes(Stream::kStderr) == 0;
  });
}

void Agent::PumpSession(Session& s) {
  // Pump may close connections and so edit s.conns: iterate over a copy.
  const std::vector<uint64_t> ids = s.conns;
  for (uint64_t id : ids) {
    auto it = conns_.find(id);
    if (it == conns_.end()) continue;
    Connection& c = *it->second;
    if (!c.want_out) Pump(c);  // a connection waiting for EPOLLOUT resumes from there
  }
}

void Agent::UpdateConnEvents(Connection& c, bool want_out) {
  if (c.want_out == want_out) return;
  epoll_event ev{};
  ev.events = EPOLLIN | EPOLLRDHUP | (want_out ? uint32_t{EPOLLOUT} : 0u);
  ev.data.u64 = c.token;
  ::epoll_ctl(epoll_.get(), EPOLL_CTL_MOD, c.fd.get(), &ev);
  c.want_out = want_out;
}

void Agent::CloseConn(uint64_t id) {
  auto it = conns_.find(id);
  if (it == conns_.end()) return;
  Connection& c = *it->second;
  if (c.session) {
    auto& v = c.session->conns;
    v.erase(std::remove(v.begin(), v.end(), id), v.end());
  }
  DelWatch(c.fd.get(), c.token);
  conns_.erase(it);  // closes the socket
}

}  // namespace sbx::agent
