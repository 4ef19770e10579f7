#include "client/ws_client.h"

#include <pthread.h>
#include <signal.h>

#include <boost/asio/connect.hpp>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/websocket.hpp>
#include <cctype>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <optional>
#include <thread>

namespace airlock::client {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
namespace websocket = beast::websocket;
using tcp = asio::ip::tcp;
using boost::system::error_code;

namespace {

constexpr size_t kInboxMessages = 64;  // reading pauses past this many unread messages
constexpr uint64_t kMaxMessageBytes = 64u << 20;
constexpr auto kWriteTimeout = std::chrono::minutes(1);
constexpr auto kCloseTimeout = std::chrono::seconds(10);

ErrorCode CodeForStatus(int status) {
  switch (status) {
    case 400:
      return ErrorCode::kInvalidArgument;
    case 401:
      return ErrorCode::kUnauthenticated;
    case 403:
      return ErrorCode::kPermissionDenied;
    case 404:
      return ErrorCode::kNotFound;
    case 409:
      return ErrorCode::kFailedPrecondition;
    default:
      return status >= 500 ? ErrorCode::kUnavailable : ErrorCode::kProtocol;
  }
}

}  // namespace

struct WsClient::Impl {
  asio::io_context io;
  websocket::stream<beast::tcp_stream> ws{io};
  std::optional<asio::executor_work_guard<asio::io_context::executor_type>> work;
  std::thread thread;  // runs `io` once connected; everything on `ws` happens there after

  beast::flat_buffer read_buffer;  // the IO thread's
  std::mutex mu;
  std::condition_variable cv;
  std::deque<WsMessage> inbox;  // guarded by mu
  bool read_paused = false;     // guarded by mu: the inbox was full, no read is pending
  bool ended = false;           // guarded by mu: no message will come any more
  std::string end_reason;       // guarded by mu: why, when it was not a close

  std::mutex send_mu;  // one Send at a time: at most one write is pending on `ws`

  // On the IO thread: reads the next message into the inbox, and again, until the end.
  void StartRead() {
    ws.async_read(read_buffer, [this](const error_code& ec, size_t) {
      std::lock_guard lock(mu);
      if (ec) {
        if (ec == websocket::error::closed) {
          WsMessage close;
          close.type = WsMessage::Type::kClose;
          close.close_code = static_cast<uint16_t>(ws.reason().code);
          close.close_reason = std::string(ws.reason().reason.c_str());
          inbox.push_back(std::move(close));
        } else {
          end_reason = ec.message();
        }
        ended = true;
        cv.notify_all();
        return;
      }
      WsMessage msg;
      msg.type = ws.got_binary() ? WsMessage::Type::kBinary : WsMessage::Type::kText;
      msg.data = beast::buffers_to_string(read_buffer.data());
      read_buffer.consume(read_buffer.size());
      inbox.push_back(std::move(msg));
      cv.notify_all();
      if (inbox.size() >= kInboxMessages) {
        read_paused = true;
      } else {
        StartRead();
      }
    });
  }

  // Drops the TCP connection; pending operations end with errors. Any thread.
  void Drop() {
    asio::post(io, [this] {
      error_code ignored;
      beast::get_lowest_layer(ws).socket().shutdown(tcp::socket::shutdown_both, ignored);
      beast::get_lowest_layer(ws).socket().close(ignored);
    });
  }
};

WsClient::WsClient(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

WsClient::~WsClient() {
  impl_->Drop();
  impl_->work.reset();
  if (impl_->thread.joinable()) impl_->thread.join();
}

Result<std::unique_ptr<WsClient>> WsClient::Connect(const std::string& url,
                                                    const std::string& api_key,
                                                    const std::string& target,
                                                    HttpResponse* refusal,
                                                    std::chrono::milliseconds timeout) {
  auto where = ParseHttpUrl(url);
  if (!where) return std::unexpected(std::move(where.error()));
  auto impl = std::make_unique<Impl>();
  auto& ws = impl->ws;
  error_code ec;
  tcp::resolver resolver(impl->io);
  auto endpoints = resolver.resolve(where->host, where->port, ec);
  if (ec) return Fail(ErrorCode::kUnavailable, "resolving " + where->host + ": " + ec.message());

  // Connect and handshake on this thread, bounded by the TCP stream's timer.
  beast::get_lowest_layer(ws).expires_after(timeout);
  beast::get_lowest_layer(ws).async_connect(
      endpoints, [&ec](const error_code& e, const tcp::endpoint&) { ec = e; });
  impl->io.run();
  impl->io.restart();
  if (ec) {
    return Fail(ec == beast::error::timeout ? ErrorCode::kDeadlineExceeded
                                            : ErrorCode::kUnavailable,
                "cannot connect to " + url + ": " + ec.message());
  }
  ws.set_option(websocket::stream_base::decorator([api_key](websocket::request_type& req) {
    req.set(http::field::user_agent, "airlock-client");
    if (!api_key.empty()) req.set(http::field::authorization, "Bearer " + api_key);
  }));
  websocket::response_type response;
  const std::string host = where->host.find(':') != std::string::npos
                               ? "[" + where->host + "]:" + where->port
                               : where->host + ":" + where->port;
  ws.async_handshake(response, host, target, [&ec](const error_code& e) { ec = e; });
  impl->io.run();
  impl->io.restart();
  if (ec) {
    if (ec == websocket::error::upgrade_declined && response.result_int() != 0) {
      const int status = static_cast<int>(response.result_int());
      if (refusal != nullptr) {
        refusal->status = status;
        refusal->body = response.body();
        refusal->headers.clear();
        for (const auto& field : response) {
          std::string name(field.name_string());
          for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
          refusal->headers[name] = std::string(field.value());
        }
      }
      return Fail(CodeForStatus(status), "the server refused the WebSocket upgrade of " + target +
                                             " with HTTP " + std::to_string(status) + ": " +
                                             response.body().substr(0, 200));
    }
    return Fail(ec == beast::error::timeout ? ErrorCode::kDeadlineExceeded
                                            : ErrorCode::kUnavailable,
                "WebSocket handshake with " + url + target + ": " + ec.message());
  }
  // From here the WebSocket's own timeouts apply (a close handshake is bounded; the client
  // does not ping: the server does).
  beast::get_lowest_layer(ws).expires_never();
  ws.set_option(websocket::stream_base::timeout::suggested(beast::role_type::client));
  ws.read_message_max(kMaxMessageBytes);

  Impl* raw = impl.get();
  raw->work.emplace(raw->io.get_executor());
  raw->StartRead();
  // The IO thread takes no signals: they stay with the caller's threads (a terminal session
  // waits for SIGWINCH and SIGINT in a thread of its own).
  sigset_t all, old;
  sigfillset(&all);
  ::pthread_sigmask(SIG_SETMASK, &all, &old);
  raw->thread = std::thread([raw] { raw->io.run(); });
  ::pthread_sigmask(SIG_SETMASK, &old, nullptr);
  return std::unique_ptr<WsClient>(new WsClient(std::move(impl)));
}

Status WsClient::SendText(std::string_view text) { return Send(text, false); }
Status WsClient::SendBinary(std::string_view bytes) { return Send(bytes, true); }

Status WsClient::Send(std::string_view data, bool binary) {
  std::lock_guard send_lock(impl_->send_mu);
  struct Pending {
    std::string data;
    bool done = false;
    error_code ec;
  };
  // Shared with the write's handler, which may run after a timed-out Send has returned.
  auto pending = std::make_shared<Pending>();
  pending->data = std::string(data);
  Impl* impl = impl_.get();
  asio::post(impl->io, [impl, pending, binary] {
    impl->ws.binary(binary);
    impl->ws.async_write(asio::buffer(pending->data),
                         [impl, pending](const error_code& ec, size_t) {
                           std::lock_guard lock(impl->mu);
                           pending->done = true;
                           pending->ec = ec;
                           impl->cv.notify_all();
                         });
  });
  std::unique_lock lock(impl->mu);
  if (!impl->cv.wait_for(lock, kWriteTimeout, [&] { return pending->done; })) {
    lock.unlock();
    impl->Drop();
    return Fail(ErrorCode::kDeadlineExceeded, "the server took no message for a minute");
  }
  if (pending->ec) {
    return Fail(ErrorCode::kUnavailable, "sending to the server: " + pending->ec.message());
  }
  return {};
}

Result<WsMessage> WsClient::Read(std::chrono::milliseconds timeout) {
  Impl* impl = impl_.get();
  std::unique_lock lock(impl->mu);
  impl->cv.wait_for(lock, timeout, [impl] { return !impl->inbox.empty() || impl->ended; });
  if (!impl->inbox.empty()) {
    WsMessage msg = std::move(impl->inbox.front());
    impl->inbox.pop_front();
    if (impl->read_paused && !impl->ended && impl->inbox.size() < kInboxMessages / 2) {
      impl->read_paused = false;
      asio::post(impl->io, [impl] { impl->StartRead(); });
    }
    return msg;
  }
  if (impl->ended) {
    return Fail(ErrorCode::kUnavailable,
                impl->end_reason.empty() ? "the connection is closed"
                                         : "the connection ended: " + impl->end_reason);
  }
  return Fail(ErrorCode::kDeadlineExceeded, "no message within " +
                                                std::to_string(timeout.count()) + " ms");
}

Status WsClient::Close(uint16_t code) {
  Impl* impl = impl_.get();
  struct Pending {
    bool done = false;
    error_code ec;
  };
  auto pending = std::make_shared<Pending>();
  asio::post(impl->io, [impl, pending, code] {
    impl->ws.async_close(websocket::close_reason(code), [impl, pending](const error_code& ec) {
      std::lock_guard lock(impl->mu);
      pending->done = true;
      pending->ec = ec;
      impl->ended = true;
      impl->cv.notify_all();
    });
  });
  std::unique_lock lock(impl->mu);
  // The close completes once the server's close has come back (read by the pending read, or by
  // the close itself while reading is paused).
  const bool closed = impl->cv.wait_for(lock, kCloseTimeout, [&] { return pending->done; });
  lock.unlock();
  impl->Drop();
  if (!closed) return Fail(ErrorCode::kDeadlineExceeded, "the server did not answer the close");
  if (pending->ec && pending->ec != websocket::error::closed &&
      pending->ec != asio::error::operation_aborted) {
    return Fail(ErrorCode::kUnavailable, "closing: " + pending->ec.message());
  }
  return {};
}

void WsClient::Abort() { impl_->Drop(); }

}  // namespace airlock::client
