// Bounds on what the agent may send to sbxd (issue 13, finding 6). The agent sits on the guest's
// side of the boundary: what it reports (process lists, directory listings) is chosen by guest
// code, and a guest that makes sbxd hold it whole can grow sbxd's memory outside every cgroup.
// The agent keeps its replies inside these bounds (cutting and flagging "truncated"), and sbxd
// refuses a reply that exceeds them (a compromised or buggy agent) with 502 bad_agent_reply
// before it builds anything from it. Both sides include this one header so they cannot drift.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "protocol/protocol.h"

namespace sbx::protocol {

// The output the agent retains per session and stream when sbxd does not say (its
// --buffer-bytes; sbxd's sessions.output_buffer_bytes): one copy for sbxd, runtimes and agent.
inline constexpr size_t kDefaultOutputBufferBytes = 8u << 20;

// The largest payload of one frame, per type, as sbxd reads it. kMaxPayload (16 MiB) remains
// the codec's absolute bound (and what the agent accepts from sbxd, which is trusted).
inline constexpr uint32_t kMaxHelloBytes = 4 << 10;
inline constexpr uint32_t kMaxEventBytes = 4 << 10;          // kExit, kResync
inline constexpr uint32_t kMaxOutputFrameBytes = 1 << 20;    // kOutput (the agent sends <= 64 KiB of data)
inline constexpr uint32_t kMaxDataFrameBytes = 1 << 20;      // kData (the agent sends 256 KiB)
inline constexpr uint32_t kMaxEndBytes = 64 << 10;           // kEnd
inline constexpr uint32_t kMaxSmallResponseBytes = 64 << 10; // kResponse of every other op
// kResponse of "processes" and "list": the agent stops adding entries before its reply
// would pass this and sets "truncated": true.
inline constexpr uint32_t kMaxGuestReplyBytes = 4 << 20;
// A frame's limit by type, for a reader that expects guest-sized replies (`large_response`)
// or not.
uint32_t MaxFrameBytes(FrameType type, bool large_response);
// The ops whose reply is guest-sized: "processes" and "list".
bool IsGuestSizedOp(std::string_view op);

// "processes": at most this many entries; per process at most kMaxArgvEntries argv entries,
// kMaxArgBytes bytes per entry and kMaxArgvBytes in all ("argv_truncated": true when cut).
inline constexpr size_t kMaxProcessEntries = 4096;
inline constexpr size_t kMaxArgvEntries = 256;
inline constexpr size_t kMaxArgBytes = 4096;
inline constexpr size_t kMaxArgvBytes = 32 << 10;
// "list": at most this many entries (then "truncated": true).
inline constexpr size_t kMaxListEntries = 10000;
// Any one string field of an entry (a path, a name, a symlink target, a user name, comm).
inline constexpr size_t kMaxFieldBytes = 8 << 10;

}  // namespace sbx::protocol
