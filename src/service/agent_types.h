// The agent protocol's value types and signal table as the service's callers (the API) see
// them, without the client's Asio machinery: src/api depends on the service, never on
// src/protocol directly (docs/architecture.md).
#pragma once

#include "protocol/messages.h"

namespace sbx::service {

using SessionSpec = protocol::SessionSpec;
using TtySize = protocol::TtySize;
using SessionStatus = protocol::StatusReply;
using SessionExit = protocol::ExitEvent;
using OutputResync = protocol::ResyncEvent;
using OutputStream = protocol::Stream;
using FileEntry = protocol::FileEntry;
using FileWatchEvent = protocol::WatchEvent;
using MkdirRequest = protocol::MkdirRequest;
using MoveRequest = protocol::MoveRequest;
using ReadRequest = protocol::ReadRequest;
using WriteRequest = protocol::WriteRequest;
using WatchRequest = protocol::WatchRequest;
using ListRequest = protocol::ListRequest;

// Signal names <-> numbers as the agent decodes them: the API checks a client's signal
// against the same table.
using protocol::SignalName;    // 15 -> "SIGTERM"
using protocol::SignalNumber;  // "TERM" or "SIGTERM" -> 15

}  // namespace sbx::service
