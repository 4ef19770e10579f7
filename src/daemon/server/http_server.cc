#include "daemon/server/http_server.h"

#include <sys/socket.h>

#include <boost/asio/async_result.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/websocket.hpp>
#include <chrono>
#include <cstdio>
#include <random>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "common/log.h"
#include "common/on_pool.h"
#include "daemon/api/json.h"
#include "daemon/api/render.h"
#include "daemon/api/types.h"
#include "daemon/server/ws_session.h"

namespace airlock::daemon {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
namespace websocket = beast::websocket;
using tcp = asio::ip::tcp;
using boost::system::error_code;

constexpr auto kIdleTimeout = std::chrono::seconds(60);   // waiting for (the rest of) a request
constexpr auto kWriteTimeout = std::chrono::seconds(60);  // a client that does not read
constexpr uint32_t kMaxHeaderBytes = 16 * 1024;
constexpr auto kLingerTimeout = std::chrono::seconds(2);  // after an error answer, before close
constexpr size_t kMaxLingerBytes = 16u << 20;

constexpr const char* kRequestIdHeader = "X-Request-Id";

// The client's X-Request-Id when it is 1-64 letters, digits, '-', '_' or '.' (so that it can go
// in a log line as it is), else a new random one.
std::string RequestIdOf(std::string_view given) {
  const bool sound = !given.empty() && given.size() <= 64 &&
                     given.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                             "0123456789-_.") == std::string_view::npos;
  if (sound) return std::string(given);
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  char id[24];
  std::snprintf(id, sizeof id, "req-%016llx", static_cast<unsigned long long>(rng()));
  return id;
}

http::response<http::string_body> MakeResponse(HttpReply reply, unsigned version, bool keep_alive) {
  http::response<http::string_body> res{static_cast<http::status>(reply.status), version};
  res.set(http::field::server, "airlockd");
  if (!reply.body.empty()) res.set(http::field::content_type, reply.content_type);
  if (!reply.allow.empty()) res.set(http::field::allow, reply.allow);
  if (!reply.request_id.empty()) res.set(kRequestIdHeader, reply.request_id);
  res.keep_alive(keep_alive);
  res.body() = std::move(reply.body);
  res.prepare_payload();
  return res;
}

}  // namespace

struct HttpServer::Impl {
  static asio::awaitable<void> Session(HttpServer& server, tcp::socket socket) {
    beast::tcp_stream stream(std::move(socket));
    beast::flat_buffer buffer;
    error_code ec;
    while (!server.stopping_) {
      http::request_parser<http::string_body> parser;
      parser.header_limit(kMaxHeaderBytes);
      uint64_t body_limit = api::kMaxJsonBodyBytes;
      parser.body_limit(body_limit);
      stream.expires_after(kIdleTimeout);
      co_await http::async_read_header(stream, buffer, parser,
                                       asio::redirect_error(asio::use_awaitable, ec));
      if (!ec) {
        // The header says which route: file and tar uploads may be larger than JSON.
        const auto& header = parser.get();
        body_limit = BodyLimit(std::string_view(header.method_string().data(),
                                                header.method_string().size()),
                               std::string_view(header.target().data(), header.target().size()));
        parser.body_limit(body_limit);
        if (beast::iequals(header[http::field::expect], "100-continue") &&
            parser.content_length().value_or(0) <= body_limit) {
          http::response<http::empty_body> go_on{http::status::continue_, header.version()};
          co_await http::async_write(stream, go_on, asio::redirect_error(asio::use_awaitable, ec));
        }
      }
      if (!ec && !parser.is_done()) {
        co_await http::async_read(stream, buffer, parser,
                                  asio::redirect_error(asio::use_awaitable, ec));
      }
      if (ec) {
        // Answer what the client got wrong; just close on EOF, timeouts and socket errors.
        std::optional<HttpReply> reply;
        if (ec == http::error::body_limit) {
          reply = ErrorReply(Error(ErrorCode::kTooLarge,
                                   "request body over " + std::to_string(body_limit) + " bytes"));
        } else if (ec == http::error::header_limit) {
          reply = ErrorReply(Error(ErrorCode::kTooLarge, "request header over " +
                                                             std::to_string(kMaxHeaderBytes) +
                                                             " bytes"));
        } else if (ec.category() ==
                       error_code(http::error::bad_target).category() &&  // a parse error
                   ec != http::error::end_of_stream &&
                   ec != http::error::partial_message) {
          reply =
              ErrorReply(Error(ErrorCode::kInvalidArgument, "malformed HTTP request: " + ec.message()));
        }
        if (reply) {
          auto res = MakeResponse(std::move(*reply), 11, false);
          stream.expires_after(kWriteTimeout);
          co_await http::async_write(stream, res, asio::redirect_error(asio::use_awaitable, ec));
          // Lingering close: read (and drop) what the client is still sending for a moment, so
          // closing with unread data does not reset the connection and lose the answer.
          stream.socket().shutdown(tcp::socket::shutdown_send, ec);
          stream.expires_after(kLingerTimeout);
          std::vector<char> sink(64 * 1024);
          for (size_t drained = 0; !ec && drained < kMaxLingerBytes;) {
            drained += co_await stream.async_read_some(
                asio::buffer(sink), asio::redirect_error(asio::use_awaitable, ec));
          }
        }
        break;
      }
      ++server.in_flight_;
      http::request<http::string_body> req = parser.release();
      HttpRequest request{std::string(req.method_string()), std::string(req.target()),
                          std::string(req[http::field::authorization]), std::move(req.body())};
      request.websocket = websocket::is_upgrade(req);
      const auto given = req[kRequestIdHeader];
      request.request_id = RequestIdOf(std::string_view(given.data(), given.size()));
      if (IsWebSocketPath(request.target.substr(0, request.target.find('?')))) {
        // The connection is the WebSocket's from here (or closes after a refusal).
        co_await WebSocket(server, stream, req, request);
        --server.in_flight_;
        co_return;
      }
      Router& router = server.router_;
      auto handle = [&router, &request] { return router.Handle(request); };
      HttpReply reply = co_await OnPool(server.pool_, handle);
      const bool keep_alive = req.keep_alive() && !server.stopping_;
      if (reply.next_chunk) {
        co_await Stream(server, stream, reply, req.version(), keep_alive, ec);
      } else {
        auto res = MakeResponse(std::move(reply), req.version(), keep_alive);
        stream.expires_after(kWriteTimeout);
        co_await http::async_write(stream, res, asio::redirect_error(asio::use_awaitable, ec));
      }
      --server.in_flight_;
      if (ec || !keep_alive) break;
    }
    stream.socket().shutdown(tcp::socket::shutdown_send, ec);
  }

  // A chunked response: each piece the reply's producer returns (on the worker pool, where it
  // may block) goes out as one chunk at once. The producer is not asked for the next piece
  // until the client has taken this one, so a slow reader holds back the source, not memory.
  // A write error ends the stream; the producer (and what it holds) is dropped with the reply.
  static asio::awaitable<void> Stream(HttpServer& server, beast::tcp_stream& stream,
                                      HttpReply& reply, unsigned version, bool keep_alive,
                                      error_code& ec) {
    http::response<http::empty_body> res{static_cast<http::status>(reply.status), version};
    res.set(http::field::server, "airlockd");
    res.set(http::field::content_type, reply.content_type);
    if (!reply.request_id.empty()) res.set(kRequestIdHeader, reply.request_id);
    res.keep_alive(keep_alive);
    res.chunked(true);
    http::response_serializer<http::empty_body> sr{res};
    stream.expires_after(kWriteTimeout);
    co_await http::async_write_header(stream, sr, asio::redirect_error(asio::use_awaitable, ec));
    while (!ec) {
      if (server.stopping_) {
        // A stream may never end by itself (output followed for hours): at shutdown it is cut
        // (the client sees the response end without its last chunk), or the drain would wait
        // for it forever and the sandboxes would never be destroyed.
        ec = asio::error::shut_down;
        break;
      }
      std::optional<std::string> piece = co_await OnPool(server.pool_, reply.next_chunk);
      stream.expires_after(kWriteTimeout);
      if (!piece) {
        co_await asio::async_write(stream, http::make_chunk_last(),
                                   asio::redirect_error(asio::use_awaitable, ec));
        break;
      }
      if (piece->empty()) {
        // Nothing to send yet: a client that has gone away is noticed here (end of file on a
        // peek), not only at the next write, so its command does not run on unwatched.
        char probe;
        if (::recv(stream.socket().native_handle(), &probe, 1, MSG_PEEK | MSG_DONTWAIT) == 0) {
          ec = asio::error::eof;
        }
        continue;
      }
      co_await asio::async_write(stream, http::make_chunk(asio::buffer(*piece)),
                                 asio::redirect_error(asio::use_awaitable, ec));
    }
  }

  // One WebSocket session (ws_session.h), on its connection's strand: the writer below sends
  // each event Next() returns; WsReader, beside it, hands each client message to Input(). All
  // writes (events, the error event, the close) are the writer's, so they never overlap; the
  // reader reports to it through `WsConn`.
  //
  // Next() blocks for up to a second at a time for as long as the session lasts (an idle
  // terminal, for hours), so it runs on a thread of the session's own, not on the shared worker
  // pool: a few open terminals must not hold up every REST request. Input(), Upgrade and the
  // drop are short and use the pool.
  struct WsConn {
    WsConn(beast::tcp_stream&& stream, std::unique_ptr<WsSession> s)
        : ws(std::move(stream)), session(std::move(s)), reader_finished(ws.get_executor()) {}
    websocket::stream<beast::tcp_stream> ws;
    std::unique_ptr<WsSession> session;
    bool reader_done = false;          // the client closed, went away, or sent a bad message
    std::optional<Error> input_error;  // Input refused a message: send it, close
    asio::steady_timer reader_finished;  // cancelled when the reader has returned
  };

  static asio::awaitable<void> WebSocket(HttpServer& server, beast::tcp_stream& stream,
                                         http::request<http::string_body>& req,
                                         const HttpRequest& request) {
    Router& router = server.router_;
    auto upgrade = [&router, &request] { return router.Upgrade(request); };
    auto made = co_await OnPool(server.pool_, upgrade);
    error_code ec;
    if (!made) {
      auto res = MakeResponse(std::move(made.error()), req.version(), /*keep_alive=*/false);
      stream.expires_after(kWriteTimeout);
      co_await http::async_write(stream, res, asio::redirect_error(asio::use_awaitable, ec));
      stream.socket().shutdown(tcp::socket::shutdown_send, ec);
      co_return;
    }
    if (++server.websockets_ > kMaxWebSockets) {
      --server.websockets_;
      auto drop = [&made] {
        made->reset();
        return true;
      };
      co_await OnPool(server.pool_, drop);
      auto res = MakeResponse(
          ErrorReply(Error(ErrorCode::kUnavailable, "too many open WebSocket sessions (" +
                                                        std::to_string(kMaxWebSockets) +
                                                        "); try again when some have closed")),
          req.version(), /*keep_alive=*/false);
      stream.expires_after(kWriteTimeout);
      co_await http::async_write(stream, res, asio::redirect_error(asio::use_awaitable, ec));
      stream.socket().shutdown(tcp::socket::shutdown_send, ec);
      co_return;
    }
    auto conn = std::make_shared<WsConn>(std::move(stream), std::move(*made));
    auto& ws = conn->ws;
    // The WebSocket stream keeps its own timeouts: pings when idle, and the connection is
    // dropped when the client answers nothing for the idle timeout (a client that vanished
    // without closing its socket). A close handshake gets 10 s, not 30, so shutdown is brisk.
    beast::get_lowest_layer(ws).expires_never();
    auto timeouts = websocket::stream_base::timeout::suggested(beast::role_type::server);
    timeouts.handshake_timeout = std::chrono::seconds(10);
    ws.set_option(timeouts);
    ws.set_option(websocket::stream_base::decorator(
        [](websocket::response_type& res) { res.set(http::field::server, "airlockd"); }));
    ws.read_message_max(api::kMaxWsMessageBytes);
    co_await ws.async_accept(req, asio::redirect_error(asio::use_awaitable, ec));
    if (!ec) {
      asio::co_spawn(ws.get_executor(), WsReader(server, conn), [conn](std::exception_ptr) {
        conn->reader_done = true;
        conn->reader_finished.cancel();
      });
      asio::thread_pool events(1);  // runs Next(); idle (and so joined at once) after the writer
      if (!co_await WsWriter(server, *conn, events)) {
        // The connection failed under the writer: make sure the reader's read fails too.
        beast::get_lowest_layer(ws).socket().close(ec);
      }
      if (!conn->reader_done) {
        // The close (or the socket's end) completes the reader's pending read; an Input under
        // way on the pool finishes first.
        conn->reader_finished.expires_at(asio::steady_timer::time_point::max());
        co_await conn->reader_finished.async_wait(asio::redirect_error(asio::use_awaitable, ec));
      }
    }
    // Dropping the session may talk to the agent (detach, close channels): on the pool. An
    // exec/ws command is killed here, as a streaming exec's is when its client goes.
    auto drop = [&conn] {
      conn->session.reset();
      return true;
    };
    co_await OnPool(server.pool_, drop);
    --server.websockets_;
  }

  // Sends events until the session or the connection ends; false if a write or the close
  // failed.
  static asio::awaitable<bool> WsWriter(HttpServer& server, WsConn& conn,
                                        asio::thread_pool& events) {
    auto& ws = conn.ws;
    WsSession* session = conn.session.get();
    auto next = [session] { return session->Next(); };
    error_code ec;
    websocket::close_code close_code = websocket::close_code::normal;
    // reader_done: the client has gone, or its close was answered; input_error: see below.
    while (!conn.reader_done && !conn.input_error) {
      if (server.stopping_) {
        close_code = websocket::close_code::going_away;
        break;
      }
      std::optional<std::string> event = co_await OnPool(events, next);
      if (conn.reader_done || conn.input_error) break;
      if (!event) break;            // the last event was sent: close normally
      if (event->empty()) continue;  // nothing yet
      ws.text(true);
      co_await ws.async_write(asio::buffer(*event), asio::redirect_error(asio::use_awaitable, ec));
      if (ec) co_return false;
    }
    if (conn.input_error) {
      // A bad message from the client (1008), or a failure acting on a good one (1011).
      const ErrorCode code = conn.input_error->code();
      close_code = code == ErrorCode::kInvalidArgument || code == ErrorCode::kTooLarge ||
                           code == ErrorCode::kFailedPrecondition
                       ? websocket::close_code::policy_error
                       : websocket::close_code::internal_error;
      const std::string event = ErrorEventMessage(*conn.input_error);
      ws.text(true);
      co_await ws.async_write(asio::buffer(event), asio::redirect_error(asio::use_awaitable, ec));
      if (ec) co_return false;
    }
    if (ws.is_open()) {
      co_await ws.async_close(close_code, asio::redirect_error(asio::use_awaitable, ec));
    }
    co_return !ec;
  }

  static asio::awaitable<void> WsReader(HttpServer& server, std::shared_ptr<WsConn> conn) {
    auto& ws = conn->ws;
    WsSession* session = conn->session.get();
    beast::flat_buffer buffer;
    error_code ec;
    while (true) {
      buffer.consume(buffer.size());
      // Ends with an error when the client closes (its close frame is answered here), goes
      // away, times out, or sends a message over the cap (closed with 1009).
      co_await ws.async_read(buffer, asio::redirect_error(asio::use_awaitable, ec));
      if (ec) co_return;
      std::string message = beast::buffers_to_string(buffer.data());
      const bool binary = ws.got_binary();
      auto input = [session, &message, binary] { return session->Input(message, binary); };
      Status st = co_await OnPool(server.pool_, input);
      if (!st) {
        conn->input_error = std::move(st.error());
        co_return;
      }
    }
  }

  static asio::awaitable<void> Accept(HttpServer& server) {
    asio::steady_timer backoff(server.accept_strand_);
    while (true) {
      error_code ec;
      tcp::socket socket = co_await server.acceptor_.async_accept(
          asio::make_strand(server.io_), asio::redirect_error(asio::use_awaitable, ec));
      if (server.stopping_ || ec == asio::error::operation_aborted) co_return;
      if (ec) {  // EMFILE and the like: wait a little instead of spinning
        spdlog::warn("accept: {}", ec.message());
        backoff.expires_after(std::chrono::milliseconds(100));
        co_await backoff.async_wait(asio::redirect_error(asio::use_awaitable, ec));
        continue;
      }
      // Small pieces (a streamed line, a WebSocket frame) go out at once: without this, Nagle
      // holds each behind the client's delayed ACK, some 40 ms.
      socket.set_option(tcp::no_delay(true), ec);
      auto executor = socket.get_executor();
      asio::co_spawn(executor, Session(server, std::move(socket)), asio::detached);
    }
  }

  // After a signal: no new connections, answer what is in flight, then stop the IO threads.
  static asio::awaitable<void> Drain(HttpServer& server) {
    asio::steady_timer timer(server.accept_strand_);
    while (server.in_flight_ > 0) {
      timer.expires_after(std::chrono::milliseconds(20));
      error_code ec;
      co_await timer.async_wait(asio::redirect_error(asio::use_awaitable, ec));
    }
    server.io_.stop();
  }
};

HttpServer::HttpServer(const HttpServerOptions& options, Router& router)
    : options_(options),
      router_(router),
      pool_(static_cast<size_t>(options.workers)),
      accept_strand_(asio::make_strand(io_)),
      acceptor_(accept_strand_),
      signals_(io_, SIGTERM, SIGINT),
      reload_signals_(io_, SIGHUP) {}

HttpServer::~HttpServer() {
  io_.stop();
  pool_.join();
}

Result<std::unique_ptr<HttpServer>> HttpServer::Listen(const HttpServerOptions& options,
                                                       Router& router) {
  std::unique_ptr<HttpServer> server(new HttpServer(options, router));
  const tcp::endpoint endpoint(options.address, options.port);
  error_code ec;
  auto& acceptor = server->acceptor_;
  const std::string where = options.address.to_string() + ":" + std::to_string(options.port);
  if (acceptor.open(endpoint.protocol(), ec); ec) {
    return Fail(ErrorCode::kInternal, "opening a socket for " + where + ": " + ec.message());
  }
  acceptor.set_option(tcp::acceptor::reuse_address(true), ec);
  if (acceptor.bind(endpoint, ec); ec) {
    return Fail(ErrorCode::kUnavailable, "binding " + where + ": " + ec.message());
  }
  if (acceptor.listen(asio::socket_base::max_listen_connections, ec); ec) {
    return Fail(ErrorCode::kUnavailable, "listening on " + where + ": " + ec.message());
  }
  server->port_ = acceptor.local_endpoint(ec).port();
  return server;
}

void HttpServer::WaitForReload() {
  reload_signals_.async_wait([this](const error_code& ec, int) {
    if (ec || stopping_) return;
    if (options_.on_reload) {
      // On a worker: a reload reads files and takes the controller's locks.
      asio::post(pool_, [this] { options_.on_reload(); });
    } else {
      spdlog::info("SIGHUP: nothing to reload");
    }
    WaitForReload();
  });
}

void HttpServer::Run() {
  asio::co_spawn(accept_strand_, Impl::Accept(*this), asio::detached);
  signals_.async_wait([this](const error_code& ec, int signo) {
    if (ec) return;
    spdlog::info("signal {}: stopping (answering {} request(s) in flight)", signo,
                 in_flight_.load());
    stopping_ = true;
    asio::post(accept_strand_, [this] {
      error_code ignored;
      acceptor_.close(ignored);
      asio::co_spawn(accept_strand_, Impl::Drain(*this), asio::detached);
    });
  });
  WaitForReload();
  std::vector<std::thread> threads;
  for (int i = 1; i < options_.io_threads; ++i) threads.emplace_back([this] { io_.run(); });
  io_.run();
  for (auto& t : threads) t.join();
  pool_.join();
}

}  // namespace airlock::daemon
