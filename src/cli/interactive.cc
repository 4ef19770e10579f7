#include "cli/interactive.h"

#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <termios.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>

#include "cli/api.h"
#include "cli/commands.h"
#include "daemon/api/base64.h"

namespace airlock::cli {
namespace {

using nlohmann::json;

constexpr char kDetachKey = 0x1d;  // Ctrl-], as telnet's escape
constexpr auto kReadPoll = std::chrono::seconds(1);

sigset_t SessionSignals() {
  sigset_t set;
  sigemptyset(&set);
  for (int sig : {SIGWINCH, SIGINT, SIGQUIT, SIGTERM, SIGHUP}) sigaddset(&set, sig);
  return set;
}

// The local terminal in raw mode while this lives: keystrokes go to the remote terminal as they
// are typed (Ctrl-C included), and it does the echo and the line editing.
class RawTerminal {
 public:
  RawTerminal() = default;
  RawTerminal(const RawTerminal&) = delete;
  ~RawTerminal() { Restore(); }

  bool Enter(int fd) {
    if (::tcgetattr(fd, &saved_) != 0) return false;
    termios raw = saved_;
    ::cfmakeraw(&raw);
    if (::tcsetattr(fd, TCSADRAIN, &raw) != 0) return false;
    fd_ = fd;
    return true;
  }
  void Restore() {
    if (fd_ < 0) return;
    ::tcsetattr(fd_, TCSADRAIN, &saved_);
    fd_ = -1;
  }

 private:
  int fd_ = -1;
  termios saved_{};
};

// What the input and signal threads share with the session's main loop.
struct Shared {
  explicit Shared(client::WsClient& client) : ws(client) {}
  client::WsClient& ws;
  std::mutex mu;
  bool finished = false;  // guarded by mu: the threads stop
  bool detached = false;  // guarded by mu
  int local_signal = 0;   // guarded by mu
};

std::string Message(const json& doc) { return doc.dump(); }

void SendResize(client::WsClient& ws) {
  if (auto size = LocalWindowSize()) {
    (void)ws.SendText(Message({{"type", "resize"}, {"cols", size->cols}, {"rows", size->rows}}));
  }
}

// The input thread: our stdin to the process, until EOF, a detach, the end of the session
// (`wake_fd` readable) or a failed send.
void PumpInput(Shared& shared, const InteractiveOptions& options, int wake_fd) {
  std::string buf(64 * 1024, '\0');
  while (true) {
    pollfd fds[2] = {{STDIN_FILENO, POLLIN, 0}, {wake_fd, POLLIN, 0}};
    if (::poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      return;
    }
    if (fds[1].revents != 0) return;
    ssize_t n = ::read(STDIN_FILENO, buf.data(), buf.size());
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (n <= 0) {  // the end of our input (or our terminal went away): the process's, if ours
      if (options.send_stdin && options.close_stdin_at_eof) {
        (void)shared.ws.SendText(Message({{"type", "stdin_close"}}));
      }
      return;
    }
    std::string_view data(buf.data(), static_cast<size_t>(n));
    const size_t key = options.detach_key ? data.find(kDetachKey) : std::string_view::npos;
    if (key != std::string_view::npos) data = data.substr(0, key);
    if (options.send_stdin && !data.empty() && !shared.ws.SendBinary(data)) return;
    if (key != std::string_view::npos) {
      {
        std::lock_guard lock(shared.mu);
        shared.detached = true;
      }
      (void)shared.ws.Close();
      return;
    }
  }
}

// The signal thread: takes the session's signals (blocked everywhere) until `finished`.
void PumpSignals(Shared& shared, const InteractiveOptions& options) {
  const sigset_t set = SessionSignals();
  while (true) {
    int sig = 0;
    if (::sigwait(&set, &sig) != 0) continue;
    {
      std::lock_guard lock(shared.mu);
      if (shared.finished) return;
      if (sig == SIGTERM || sig == SIGHUP) {
        shared.local_signal = sig;
      } else if ((sig == SIGINT || sig == SIGQUIT) && options.signals_detach) {
        shared.detached = true;
      }
    }
    switch (sig) {
      case SIGWINCH:
        if (options.resize) SendResize(shared.ws);
        break;
      case SIGINT:
      case SIGQUIT:
        if (options.signals_detach) {
          (void)shared.ws.Close();
        } else {
          (void)shared.ws.SendText(
              Message({{"type", "signal"}, {"signal", sig == SIGINT ? "INT" : "QUIT"}}));
        }
        break;
      default:  // SIGTERM, SIGHUP: leave at once; for exec/ws that ends the command too
        shared.ws.Abort();
        break;
    }
  }
}

Outcome<std::string> EventData(const json& event) {
  const std::string data = event.value("data", "");
  if (event.value("data_encoding", "utf-8") != "base64") return data;
  auto decoded = api::Base64Decode(data);
  if (!decoded) return CommandError("the daemon sent bad base64 in an output event");
  return std::move(*decoded);
}

}  // namespace

std::optional<WindowSize> LocalWindowSize() {
  for (int fd : {STDOUT_FILENO, STDIN_FILENO, STDERR_FILENO}) {
    winsize ws{};
    if (::ioctl(fd, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0 && ws.ws_row > 0) {
      // The API takes 1..1000 each.
      return WindowSize{std::min<int>(ws.ws_col, 1000), std::min<int>(ws.ws_row, 1000)};
    }
  }
  return std::nullopt;
}

Outcome<InteractiveEnd> RunInteractive(client::WsClient& ws, const InteractiveOptions& options) {
  const sigset_t session_signals = SessionSignals();
  ::pthread_sigmask(SIG_BLOCK, &session_signals, nullptr);
  Shared shared(ws);
  RawTerminal raw;
  if (options.raw && !raw.Enter(STDIN_FILENO)) {
    return CommandError("cannot put the terminal in raw mode: " + std::string(strerror(errno)));
  }
  if (options.resize && options.resize_at_start) SendResize(ws);
  int wake[2] = {-1, -1};
  if (options.read_stdin && ::pipe2(wake, O_CLOEXEC) != 0) {
    return CommandError("pipe: " + std::string(strerror(errno)));
  }
  std::thread input;
  if (options.read_stdin) input = std::thread(PumpInput, std::ref(shared), std::cref(options), wake[0]);
  std::thread signals(PumpSignals, std::ref(shared), std::cref(options));

  InteractiveEnd end;
  std::optional<Failure> failure;
  std::optional<client::WsMessage> close;
  std::string broken;  // why the connection ended without a close
  const bool crlf = options.raw;  // our own notes need "\r\n" while the terminal is raw
  while (true) {
    auto msg = ws.Read(kReadPoll);
    if (!msg) {
      if (msg.error().code() == ErrorCode::kDeadlineExceeded) continue;
      broken = msg.error().message();
      break;
    }
    if (msg->type == client::WsMessage::Type::kClose) {
      close = std::move(*msg);
      break;
    }
    if (msg->type != client::WsMessage::Type::kText) continue;
    const json event = json::parse(msg->data, nullptr, /*allow_exceptions=*/false);
    if (!event.is_object()) {
      failure = Failure{kExitFailure, "the daemon sent a message that is not a JSON object"};
      break;
    }
    const std::string type = event.value("type", "");
    if (type == "stdout" || type == "stderr") {
      auto data = EventData(event);
      if (!data) {
        failure = data.error();
        break;
      }
      WriteAll(type == "stdout" ? STDOUT_FILENO : STDERR_FILENO, *data);
    } else if (type == "dropped") {
      const std::string note = "[airlock: " + std::to_string(event.value("bytes", uint64_t{0})) +
                               " bytes of output were lost before they could be shown]";
      WriteAll(STDERR_FILENO, note + (crlf ? "\r\n" : "\n"));
    } else if (type == "exit") {
      end.exit = event;
    } else if (type == "error") {
      const json err = event.value("error", json::object());
      failure = Failure{kExitFailure, err.value("code", std::string("error")) + ": " +
                                          err.value("message", std::string())};
    }
    // "start", and event types this CLI does not know yet, show nothing.
  }

  {
    std::lock_guard lock(shared.mu);
    shared.finished = true;
    end.detached = shared.detached;
    end.local_signal = shared.local_signal;
  }
  ws.Abort();  // ends a send the input thread may be blocked in
  if (input.joinable()) {
    (void)!::write(wake[1], "x", 1);
    input.join();
  }
  ::pthread_kill(signals.native_handle(), SIGWINCH);  // sigwait returns; `finished` stops it
  signals.join();
  for (int fd : wake) {
    if (fd >= 0) ::close(fd);
  }
  raw.Restore();

  if (end.local_signal != 0) return end;
  if (failure) return std::unexpected(*failure);
  if (end.exit || end.detached) return end;
  if (close && close->close_code != 1000) {
    return CommandError("the daemon closed the session (WebSocket code " +
                        std::to_string(close->close_code) +
                        (close->close_reason.empty() ? "" : ": " + close->close_reason) + ")");
  }
  return CommandError(broken.empty() ? "the session ended before the process did"
                                     : "the session ended before the process did: " + broken);
}

}  // namespace airlock::cli
