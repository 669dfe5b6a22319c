// What the service's state-changing calls answer: typed results. src/api renders each (its
// HTTP status and body); the service knows neither. With an Idempotency-Key the rendering of
// the first answer is stored, in the same transaction as the change, and a retry gets it back
// as it was.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <variant>

#include "service/attach_token.h"
#include "store/store.h"

namespace sbx::service {

// A create accepted: the new sandbox, and its create operation (finished already when a warm
// pool served it).
struct SandboxCreated {
  store::SandboxRecord sandbox;
  store::OperationRecord operation;
};
// A delete, pause, suspend or wake accepted: its operation (a new one, the one in flight, or
// the delete that already removed the sandbox).
struct OperationStarted {
  store::OperationRecord operation;
};
// A session created, with the attach token minted for it.
struct SessionCreated {
  store::SessionRecord session;
  AttachTokens::Minted attach;
};
using Result = std::variant<SandboxCreated, OperationStarted, SessionCreated>;

// A result as the caller rendered it for its client; opaque to the service, which stores it
// and hands it back.
struct Rendered {
  int status = 0;
  std::string body;
};

// An Idempotency-Key with its scope, in the caller's words (its method and route), and how the
// caller renders a result: a key is found again only in its scope, and the request's body hash
// tells a replay from a conflict.
struct Idempotency {
  std::string key;
  std::string method;
  std::string route;
  std::function<Rendered(const Result&)> render;
};

// A state-changing call's answer: its result, or (a repeated Idempotency-Key) the first
// call's rendering.
template <typename T>
struct Answer {
  std::optional<T> result;
  std::optional<Rendered> replay;
};

}  // namespace sbx::service
