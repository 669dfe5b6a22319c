// One keep-alive HTTP/1.1 connection to sbxd (Boost.Beast), used by one thread at a time. JSON
// requests and SSE attach streams share it, the way a client library would: sbxd keeps the
// connection open after a chunked event stream ends, so a benchmark loop pays for TCP set-up
// once, not once per attach. Every socket step has a deadline.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include <boost/system/error_code.hpp>
#include <nlohmann/json.hpp>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "cli/client.h"
#include "cli/sse_parser.h"

namespace sbx::load {

struct HttpResponse {
  unsigned status = 0;
  std::string body;
  std::string request_id;
  // The body as an error status (DecodeHttpError), for callers that did not expect `status`.
  absl::Status AsError() const;
};

// Receives each SSE event as soon as its bytes arrive: true to continue, false to stop reading
// (the connection is then dropped), an error to abort.
using EventHandler = std::function<absl::StatusOr<bool>(const cli::SseEvent&)>;
// Receives the body bytes of a streamed response as they arrive (same return convention).
using BytesHandler = std::function<absl::StatusOr<bool>(std::string_view)>;

class HttpConn {
 public:
  HttpConn(cli::Endpoint endpoint, std::string token);
  ~HttpConn();
  HttpConn(const HttpConn&) = delete;
  HttpConn& operator=(const HttpConn&) = delete;

  const cli::Endpoint& endpoint() const { return endpoint_; }
  const std::string& token() const { return token_; }

  // Opens the connection now (so that a timed request does not pay for connect).
  absl::Status Connect();

  // Sends one request (JSON body when non-null) and returns whatever status came back;
  // only transport failures are errors here.
  absl::StatusOr<HttpResponse> Call(std::string_view method, std::string_view target,
                                    const nlohmann::json* body = nullptr);

  // A request that must answer 2xx: returns the parsed JSON body (null when empty).
  absl::StatusOr<nlohmann::json> Json(std::string_view method, std::string_view target,
                                      const nlohmann::json* body = nullptr);

  // GET `target` as text/event-stream with `bearer` as the token and feeds every event to
  // `handler`. OK when the response ended or the handler stopped.
  // With `post_json`, a POST of that JSON body instead (a create that answers with its
  // stream, `?attach=true`).
  absl::Status Stream(std::string_view target, std::string_view bearer,
                      const EventHandler& handler, std::string_view post_json = {});
  // The same for any streamed body: GET `target` with `accept` and feed the raw body bytes.
  absl::Status StreamBytes(std::string_view target, std::string_view bearer,
                           std::string_view accept, const BytesHandler& handler,
                           std::string_view post_json = {});

  std::chrono::seconds timeout{90};  // per socket step; above the 30 s long polls we send

 private:
  struct Impl;
  void Close();
  absl::Status TransportError(std::string_view what, const boost::system::error_code& ec);

  cli::Endpoint endpoint_;
  std::string token_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace sbx::load
