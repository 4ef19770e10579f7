#pragma once
// An interactive session over the daemon's WebSocket (exec -it, attach): the remote process's
// events go to our stdout and stderr as they come, our stdin goes to it, our window size follows
// SIGWINCH, and the local terminal is in raw mode for the session's length (restored on every
// way out, our own SIGTERM and SIGHUP included).

#include <nlohmann/json.hpp>
#include <optional>

#include "cli/outcome.h"
#include "client/ws_client.h"

namespace airlock::cli {

struct WindowSize {
  int cols = 80, rows = 24;
};
// The size of the terminal on stdout (else stdin, else stderr); nullopt when none is one.
std::optional<WindowSize> LocalWindowSize();

struct InteractiveOptions {
  bool read_stdin = false;          // read our stdin (for input and the detach key)
  bool send_stdin = false;          // send what was read to the process
  bool raw = false;                 // put our terminal (stdin) in raw mode
  bool resize = false;              // the process has a terminal: SIGWINCH sends our size
  bool resize_at_start = false;     // ... and send it once at the start (attach)
  bool close_stdin_at_eof = false;  // at the end of our stdin, close the process's (exec)
  bool detach_key = false;          // Ctrl-] in the input detaches (attach)
  // SIGINT / SIGQUIT: detach (attach: the process is not ours) instead of forwarding them to
  // the process as signals (exec -i without a terminal).
  bool signals_detach = false;
};

struct InteractiveEnd {
  std::optional<nlohmann::json> exit;  // the "exit" event, when the process ended
  bool detached = false;               // Ctrl-] or a signal ended an attach
  int local_signal = 0;                // our SIGTERM / SIGHUP dropped the connection
};

// Runs the session on `ws` (already connected; for exec/ws the request already sent) until the
// process's exit and the server's close, a detach, or a failure: an "error" event, or the
// connection ending first, is a Failure with the daemon's message. Call from the main thread,
// with no other threads of ours running (the WebSocket client's takes no signals): the
// session's signals (SIGWINCH, SIGINT, SIGQUIT, SIGTERM, SIGHUP) are blocked from here on and
// taken by a thread of the session's with sigwait; they stay blocked after.
[[nodiscard]] Outcome<InteractiveEnd> RunInteractive(client::WsClient& ws,
                                                     const InteractiveOptions& options);

}  // namespace airlock::cli
