// How many guest-sized agent replies ("processes", "list") sbxd holds at once (issue 13,
// finding 6). Each one costs sbxd up to twice kMaxGuestReplyBytes (the agent's payload and the
// body written from it, protocol/guest_reply.h) for as long as the client takes to read it, so
// without a bound a client — or many, against one sandbox whose guest filled its process table
// — multiplies that by the number of connections. The gate gives out a fixed number of slots
// per sandbox (a request beyond them waits, in a bounded queue, for one to free) and in all (a
// request finding none is shed at once as unavailable, like the HTTP front door): sbxd's memory for
// guest replies is at most `in_flight` x 2 x kMaxGuestReplyBytes under any guest behaviour.
#pragma once

#include <chrono>
#include <cstddef>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include <boost/asio.hpp>

#include "absl/status/statusor.h"

namespace sbx::service {

struct ReplyGateSettings {
  size_t in_flight = 8;        // guest-sized replies held by sbxd at once (server.guest_replies_in_flight)
  size_t per_sandbox = 2;      // of them, for one sandbox (server.guest_replies_per_sandbox)
  size_t queue_per_sandbox = 16;  // requests waiting for one of the sandbox's slots
  std::chrono::milliseconds max_wait{10000};
};

class ReplyGate {
 public:
  explicit ReplyGate(ReplyGateSettings settings) : settings_(settings) {}

  // Held while a reply is fetched, rewritten and written to the client; frees the slot (and
  // wakes the next waiter of the sandbox) when destroyed.
  class Slot {
   public:
    Slot() = default;
    Slot(ReplyGate* gate, std::string sandbox_id) : gate_(gate), id_(std::move(sandbox_id)) {}
    Slot(Slot&& o) noexcept : gate_(std::exchange(o.gate_, nullptr)), id_(std::move(o.id_)) {}
    Slot& operator=(Slot&& o) noexcept;
    ~Slot();

   private:
    ReplyGate* gate_ = nullptr;
    std::string id_;
  };

  // A slot for a reply of `sandbox_id`. ResourceExhausted "too_many_requests" when the
  // sandbox's queue is full or no slot of it freed within max_wait; Unavailable "server_busy"
  // when all in_flight slots are taken.
  boost::asio::awaitable<absl::StatusOr<Slot>> Acquire(boost::asio::any_io_executor ex,
                                                       std::string sandbox_id);

  size_t in_flight() const;

 private:
  struct Waiter {
    explicit Waiter(boost::asio::any_io_executor ex) : timer(ex) {}
    boost::asio::steady_timer timer;
    bool granted = false;  // under mu_: the releaser handed its slot over
  };
  struct PerSandbox {
    size_t held = 0;
    std::deque<std::shared_ptr<Waiter>> waiting;
  };

  void Release(const std::string& sandbox_id);

  const ReplyGateSettings settings_;
  mutable std::mutex mu_;
  size_t in_flight_ = 0;
  std::map<std::string, PerSandbox> sandboxes_;
};

}  // namespace sbx::service
