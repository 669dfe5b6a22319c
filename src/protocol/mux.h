// Many agent connections over one byte stream: the microVM runtime's virtio-serial port.
//
// The agent protocol (protocol.h) wants one connection per request, and a microVM without
// vhost-vsock has one virtio-serial port per sandbox. Two pumps bridge them, one on each side,
// and leave the agent and sbxd unchanged:
//   - the host pump (sbx-agent --vm-bridge) listens on the sandbox's agent.sock, as the ns
//     runtime's agent does, and opens a stream on the port for every connection it accepts;
//   - the guest pump (forked by the guest's init) connects every stream opened on the port to
//     the agent's own unix socket inside the guest.
// Bytes are relayed as they are, so the agent protocol's framing and limits apply unchanged.
//
// Wire format: frames of an 8-byte header, then the payload:
//   u8 type, u8 reserved (0), u16 stream id (big-endian), u32 payload length (big-endian).
//   kHello  (stream 0, empty)  first frame of a host pump: the guest drops every stream, since
//                              they belonged to an earlier host pump (sbxd restarted it)
//   kOpen   (empty, or 3 bytes) host → guest: a new connection with this id (1..65535), to
//                              the agent; or, with a port target (u16 port, big-endian, not
//                              0; u8 address family 4 or 6), to that port on the guest's own
//                              loopback: port exposure of a microVM. The guest answers a
//                              port stream's connect with kWindow 0 (then the host's client
//                              gets one byte, 1) or kClose (refused: the client sees EOF)
//   kData   (1..kMaxMuxPayload bytes)
//   kEof    (empty)            the sender's side will send no more (a socket's shutdown(WR))
//   kClose  (empty)            the stream is gone (error or reset): drop it, no answer
//   kWindow (u32, big-endian)  the receiver wrote that many more bytes out: the sender may
//                              have that many more in flight
// Flow control: each direction of a stream may have kMuxWindow bytes unacknowledged, so a
// client that stops reading stalls only its own stream, never the port.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace sbx::protocol {

enum class MuxType : uint8_t {
  kHello = 1,
  kOpen = 2,
  kData = 3,
  kEof = 4,
  kClose = 5,
  kWindow = 6,
};

inline constexpr size_t kMuxHeaderBytes = 8;
inline constexpr uint32_t kMaxMuxPayload = 64 * 1024;
inline constexpr uint32_t kMuxWindow = 1024 * 1024;
inline constexpr size_t kMuxPortOpenBytes = 3;  // a kOpen's port target

struct MuxFrame {
  MuxType type = MuxType::kData;
  uint16_t stream = 0;
  std::string payload;
};

// Appends one encoded frame to `out`.
void AppendMuxFrame(std::string& out, MuxType type, uint16_t stream, std::string_view payload);
// Parses one frame from the front of `in`. Returns the bytes it used (0: `in` holds less than a
// whole frame), or InvalidArgument for bytes that are no frame: an unknown type, a reserved
// byte set, a length over kMaxMuxPayload or wrong for its type, stream 0 on a stream frame.
absl::StatusOr<size_t> ParseMuxFrame(std::string_view in, MuxFrame* frame);

struct MuxPumpOptions {
  // The byte stream (a connected unix socket to QEMU's chardev on the host, /dev/vportNpM in
  // the guest). Owned by the caller; made non-blocking by the pump.
  int port_fd = -1;
  // Host: the listening socket whose connections become streams (kOpen). Owned by the caller.
  int listen_fd = -1;
  // Host, optional: a listening socket whose clients first send a port target
  // (kMuxPortOpenBytes), then talk to that port in the guest. Owned by the caller.
  int port_listen_fd = -1;
  // Guest: where a kOpen connects (the agent's unix socket).
  std::string connect_path;
  // The guest's port: its host end may be absent (no bridge yet, or one that went away). Then
  // reads see end-of-file or POLLHUP, which the guest pump waits out instead of exiting.
  bool port_reconnects = false;
};

// Runs until the port ends (host: QEMU's end closed, i.e. the VM is gone) or fails. Never
// returns on the guest, where the port outlives every host pump.
absl::Status RunMuxPump(const MuxPumpOptions& opts);

}  // namespace sbx::protocol
