// Fuzz target for what decodes a WebSocket client's bytes in sbxd (GET /v1/sessions/{id}/ws,
// src/api/session_ws.cc): Beast's server-side frame decoder, with sbxd's message limit, and
// the control-message parser every text message goes to (api::ParseWsControl). Properties:
// never crashes or throws; no message longer than the limit is handed out; an accepted control
// message has values in range.
//
// Input: byte 0 'R' sends the rest raw after the handshake (frame headers as the bytes say).
// Otherwise the rest is a list of frames separated by '\x1f', each built here as a client
// would (so that mutations reach the message layer, not only the header checks): the first
// byte of each is opcode = b & 0x0f, FIN = b & 0x10, unmasked = b & 0x40, RSV1 = b & 0x80;
// the rest is the payload. '1' is a final masked text frame, '!' a first fragment, '0' the
// last continuation, '8' a close, '9' a ping.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include <boost/asio/io_context.hpp>
#include <boost/beast/_experimental/test/stream.hpp>
#include <boost/beast/core/buffers_to_string.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/websocket.hpp>

#include "api/requests.h"
#include "deep_json_seeds.h"

namespace {
namespace beast = boost::beast;
namespace websocket = beast::websocket;

void Check(bool cond) {
  if (!cond) std::abort();
}

constexpr std::string_view kHandshake =
    "GET /v1/sessions/ses_aaaaaaaaaaaaaaaaaaaa/ws HTTP/1.1\r\nHost: 127.0.0.1\r\n"
    "Upgrade: websocket\r\nConnection: Upgrade\r\n"
    "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n";

std::string Frame(std::string_view spec) {
  if (spec.empty()) return "";
  const auto b = static_cast<uint8_t>(spec[0]);
  const std::string_view payload = spec.substr(1);
  const bool masked = !(b & 0x40);
  std::string out;
  out.push_back(static_cast<char>((b & 0x0f) | ((b & 0x10) ? 0x80 : 0) | ((b & 0x80) ? 0x40 : 0)));
  const uint8_t mask_bit = masked ? 0x80 : 0;
  const uint64_t n = payload.size();
  if (n < 126) {
    out.push_back(static_cast<char>(mask_bit | n));
  } else if (n < 65536) {
    out.push_back(static_cast<char>(mask_bit | 126));
    out.push_back(static_cast<char>(n >> 8));
    out.push_back(static_cast<char>(n));
  } else {
    out.push_back(static_cast<char>(mask_bit | 127));
    for (int shift = 56; shift >= 0; shift -= 8) out.push_back(static_cast<char>(n >> shift));
  }
  const char key[4] = {'\x37', '\xfa', '\x21', '\x3d'};
  if (masked) out.append(key, 4);
  for (size_t i = 0; i < n; ++i) {
    out.push_back(masked ? static_cast<char>(payload[i] ^ key[i % 4]) : payload[i]);
  }
  return out;
}

std::string Wire(std::string_view in) {
  std::string wire(kHandshake);
  if (!in.empty() && in[0] == 'R') {
    wire.append(in.substr(1));
    return wire;
  }
  size_t pos = 0;
  while (pos <= in.size()) {
    size_t sep = in.find('\x1f', pos);
    if (sep == std::string_view::npos) sep = in.size();
    wire += Frame(in.substr(pos, sep - pos));
    pos = sep + 1;
  }
  return wire;
}

void CheckControl(std::string_view text) {
  auto c = sbx::api::ParseWsControl(text);
  if (!c.ok()) {
    Check(c.status().code() == absl::StatusCode::kInvalidArgument);
    return;
  }
  using Type = sbx::api::WsControl::Type;
  if (c->type == Type::kResize) {
    Check(c->rows >= 1 && c->rows <= 1000 && c->cols >= 1 && c->cols <= 1000);
  } else if (c->type == Type::kSignal) {
    Check(c->signal >= 1 && c->signal <= 64);
  }
}

const std::string kSeeds[] = {
    "1" + sbx::fuzz::DeepResize(), "1" + sbx::fuzz::DeepSignal(),
    "!" + sbx::fuzz::DeepResize().substr(0, 70000) + "\x1f" + "0" +
        sbx::fuzz::DeepResize().substr(70000),
    "1{\"type\":\"signal\",\"x\":" + sbx::fuzz::DeepObjects(100000) + "}",
    "1{\"type\":\"resize\",\"rows\":" + sbx::fuzz::DeepArrays(65) + ",\"cols\":1}",
    "1{\"type\":\"resize\",\"rows\":" + sbx::fuzz::DeepArrays(64) + ",\"cols\":1}",
};
}  // namespace

extern const char* const kFuzzSeeds[] = {
    kSeeds[0].c_str(), kSeeds[1].c_str(), kSeeds[2].c_str(), kSeeds[3].c_str(),
    kSeeds[4].c_str(), kSeeds[5].c_str(),
    "1{\"type\":\"resize\",\"rows\":24,\"cols\":80}",
    "1{\"type\":\"signal\",\"signal\":\"TERM\"}\x1f" "1{\"type\":\"signal\",\"signal\":9}",
    "1{\"type\":\"stdin_close\"}", "1{\"type\":\"dance\"}", "1not json", "2binary stdin\n",
    "!{\"type\":\x1f" " \"resize\",\x1f" "0\"rows\":1,\"cols\":1}",
    "9ping\x1f" "1{\"type\":\"stdin_close\"}\x1f" "8\x03\xe8",
    "q{\"type\":\"stdin_close\"}", "\xb1{\"type\":\"stdin_close\"}", "1\xff\xfe",
    "R\x81\x85\x01\x02\x03\x04zzzzz", "R\x88\x80\x01\x02\x03\x04",
};
extern const size_t kFuzzSeedCount = sizeof(kFuzzSeeds) / sizeof(kFuzzSeeds[0]);

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  boost::asio::io_context ioc;
  beast::test::stream client(ioc), server(ioc);
  server.connect(client);
  server.append(Wire(in));
  server.close_remote();  // EOF once the input is consumed
  websocket::stream<beast::test::stream&> ws(server);
  ws.read_message_max(sbx::api::kMaxWsClientMessage);
  beast::error_code ec;
  ws.accept(ec);
  Check(!ec);  // the handshake is fixed and valid
  for (int messages = 0; messages < 10000; ++messages) {
    beast::flat_buffer buf;
    ws.read(buf, ec);
    if (ec) break;
    Check(buf.size() <= sbx::api::kMaxWsClientMessage);
    if (ws.got_text()) CheckControl(beast::buffers_to_string(buf.data()));
  }
  return 0;
}
