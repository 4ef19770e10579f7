#pragma once
// WsSession: what runs behind one WebSocket connection (docs/design/processes.md, "WebSocket
// sessions"), apart from the socket: exec/ws (an interactive command, started by the client's
// first message) and processes/{pid}/ws (an attachment to a running process). http_server.cc
// owns the socket and the frames; Router::Upgrade (ws_session.cc) makes the session.
//
// The server drives a session from two loops at once: a writer that calls Next() and sends each
// event, and a reader that hands each client message to Input(). Both block on agent channels,
// so neither runs on an IO thread: Next() on a thread of the session's own (it is called for as
// long as the session lasts), Input() on the worker pool. Next() and Input() may run at the same
// time on different threads (the session keeps its input and output on separate channels), but
// Next() is never called concurrently with itself, nor Input() with itself. Destroying the
// session ends what it holds: an exec/ws command is killed (its channel closes, as a streaming
// exec's does); a processes/{pid}/ws attachment only detaches.

#include <optional>
#include <string>
#include <string_view>

#include "common/error.h"

namespace airlock::daemon {

class WsSession {
 public:
  virtual ~WsSession() = default;

  // The next event for the client, one JSON object (text, no newline). Blocks up to about a
  // second: "" means nothing happened yet (the server may check on its client and on shutdown,
  // then call again); nullopt means the session is over (the server closes with 1000).
  virtual std::optional<std::string> Next() = 0;

  // One message from the client: text (JSON) or binary (raw stdin bytes). An error means the
  // server must send it as an "error" event and close: kInvalidArgument, kTooLarge and
  // kFailedPrecondition are the client's fault (close 1008), anything else the server's (1011).
  [[nodiscard]] virtual Status Input(std::string_view message, bool binary) = 0;
};

// The "error" event for `error`, as a session's last message.
std::string ErrorEventMessage(const Error& error);

// The two WebSocket routes, by their path (no query): /v1/sandboxes/{id}/exec/ws and
// /v1/sandboxes/{id}/processes/{pid}/ws. Any {id} and {pid} text matches; Router::Upgrade
// validates them.
bool IsWebSocketPath(std::string_view path);

}  // namespace airlock::daemon
