#pragma once
// WsClient: a small synchronous WebSocket client for airlockd's WebSocket routes (exec/ws,
// processes/{pid}/ws), used by the `airlock` CLI and the end-to-end tests.
//
// One IO thread per client runs the socket: it reads messages as they come into a small inbox
// (reading pauses while the inbox is full, so a slow caller holds the server back instead of
// growing memory) and performs the writes callers hand it. The calls below are thread-safe, so
// one thread may Read while another sends (a terminal: output one way, keystrokes the other).

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "client/http_client.h"
#include "common/error.h"

namespace airlock::client {

struct WsMessage {
  enum class Type { kText, kBinary, kClose };
  Type type = Type::kText;
  std::string data;         // kText, kBinary
  uint16_t close_code = 0;  // kClose: the server's close code (1005 when it sent none)
  std::string close_reason;
};

class WsClient {
 public:
  // Connects to `url` (http://HOST:PORT, as HttpClient::Open takes it) and upgrades `target`
  // ("/v1/sandboxes/ID/exec/ws"), sending "Authorization: Bearer KEY" when `api_key` is not
  // empty. When the server answers with an HTTP status instead of switching protocols, the error
  // says so, and `refusal` (when given) gets the status and body. `timeout` bounds the connect
  // and the handshake.
  [[nodiscard]] static Result<std::unique_ptr<WsClient>> Connect(
      const std::string& url, const std::string& api_key, const std::string& target,
      HttpResponse* refusal = nullptr,
      std::chrono::milliseconds timeout = std::chrono::seconds(30));
  WsClient(const WsClient&) = delete;
  WsClient& operator=(const WsClient&) = delete;
  // Drops the connection (no close handshake) and joins the IO thread.
  ~WsClient();

  // Sends one message and waits until it is written; kDeadlineExceeded (and the connection is
  // dropped) when the server takes none of it for a minute; kUnavailable once it has ended.
  [[nodiscard]] Status SendText(std::string_view text);
  [[nodiscard]] Status SendBinary(std::string_view bytes);

  // The next message: text, binary, or the server's close (once; the connection has ended
  // then). kDeadlineExceeded when none came within `timeout`; kUnavailable after the end, or
  // when the connection broke (the message says how).
  [[nodiscard]] Result<WsMessage> Read(std::chrono::milliseconds timeout);

  // Sends a close with `code` and waits (up to 10 s) for the server's; the connection has
  // ended afterwards. Messages that arrived before the server's close can still be Read.
  Status Close(uint16_t code = 1000);
  // Drops the TCP connection at once, without a close handshake (a client that vanishes).
  void Abort();

 private:
  struct Impl;
  explicit WsClient(std::unique_ptr<Impl> impl);
  Status Send(std::string_view data, bool binary);
  std::unique_ptr<Impl> impl_;
};

}  // namespace airlock::client
