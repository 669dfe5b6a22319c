// Progress and cancellation of long template work (an import, a pull, a build), shared by the
// image store (src/image), the registry client (src/registry) and the service, which copies
// each snapshot into the operation's `progress` and its log lines into the operation's event
// stream (GET /v1/operations/{id}/events).
#pragma once

#include <cstdint>
#include <functional>
#include <string>

namespace sbx::image {

struct Progress {
  // What runs now: "reading" (an archive or manifest), "fetching" (blobs from a registry),
  // "unpacking" (layers into the store), "verifying", "building" (a build's steps), "done".
  std::string stage;
  int layers_done = 0;
  int layers_total = 0;
  // Bytes of the blobs (as stored: compressed) fetched or read so far, and in all; total 0
  // while unknown.
  uint64_t bytes_done = 0;
  uint64_t bytes_total = 0;
  // One line for the operation's log ("layer sha256:ab12… unpacked: 1,204 entries, 31 MiB"),
  // or empty when only the counters moved.
  std::string message;
  // A build's steps (template_build): the one running now, and how many there are; 0 otherwise.
  int steps_done = 0;
  int steps_total = 0;
  // A line of a build step's output: it joins the log but waits for the next throttled write
  // (a chatty RUN must not write the store per line). The work's last call flushes.
  bool quiet = false;
};

// Called on the working thread whenever a counter moves or a line is logged; it must be cheap
// (the caller throttles what it stores).
using ProgressFn = std::function<void(const Progress&)>;
// True once the work should stop (its operation was deleted, sbxd is stopping): checked between
// pieces of input, so a cancel takes effect within one read. The work then returns Cancelled
// and leaves nothing partial behind.
using CancelFn = std::function<bool()>;

}  // namespace sbx::image
