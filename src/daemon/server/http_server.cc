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
#include <chrono>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "common/log.h"
#include "daemon/api/json.h"
#include "daemon/api/render.h"

namespace airlock::daemon {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;
using boost::system::error_code;

constexpr auto kIdleTimeout = std::chrono::seconds(60);   // waiting for (the rest of) a request
constexpr auto kWriteTimeout = std::chrono::seconds(60);  // a client that does not read
constexpr uint32_t kMaxHeaderBytes = 16 * 1024;
constexpr auto kLingerTimeout = std::chrono::seconds(2);  // after an error answer, before close
constexpr size_t kMaxLingerBytes = 16u << 20;

// Runs `fn` on `pool` and resumes the awaiting coroutine on its own executor with the result.
// `fn` is taken by reference and must live until the await completes (a local of the awaiting
// coroutine does). Not a coroutine itself, and only pointers are captured: g++ 12 destroys
// non-trivial temporaries inside co_await expressions twice.
template <typename Fn>
asio::awaitable<std::invoke_result_t<Fn&>> OnPool(asio::thread_pool& pool, Fn& fn) {
  using R = std::invoke_result_t<Fn&>;
  return asio::async_initiate<const asio::use_awaitable_t<>&, void(R)>(
      [pool_ptr = &pool, fn_ptr = &fn](auto handler) {
        auto work = asio::make_work_guard(asio::get_associated_executor(handler));
        asio::post(*pool_ptr, [fn_ptr, handler = std::move(handler),
                               work = std::move(work)]() mutable {
          R result = (*fn_ptr)();
          auto home = work.get_executor();
          asio::post(home, [handler = std::move(handler), result = std::move(result)]() mutable {
            handler(std::move(result));
          });
        });
      },
      asio::use_awaitable);
}

HttpReply ErrorReply(ErrorCode code, std::string message) {
  api::HttpError e = api::ErrorBody(Error(code, std::move(message)));
  HttpReply reply{static_cast<unsigned>(e.status), std::move(e.body), ""};
  reply.error_code = std::string(ErrorCodeName(code));
  return reply;
}

http::response<http::string_body> MakeResponse(HttpReply reply, unsigned version, bool keep_alive) {
  http::response<http::string_body> res{static_cast<http::status>(reply.status), version};
  res.set(http::field::server, "airlockd");
  if (!reply.body.empty()) res.set(http::field::content_type, reply.content_type);
  if (!reply.allow.empty()) res.set(http::field::allow, reply.allow);
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
          reply = ErrorReply(ErrorCode::kTooLarge,
                             "request body over " + std::to_string(body_limit) + " bytes");
        } else if (ec == http::error::header_limit) {
          reply = ErrorReply(ErrorCode::kTooLarge,
                             "request header over " + std::to_string(kMaxHeaderBytes) + " bytes");
        } else if (ec.category() ==
                       error_code(http::error::bad_target).category() &&  // a parse error
                   ec != http::error::end_of_stream &&
                   ec != http::error::partial_message) {
          reply =
              ErrorReply(ErrorCode::kInvalidArgument, "malformed HTTP request: " + ec.message());
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
    res.keep_alive(keep_alive);
    res.chunked(true);
    http::response_serializer<http::empty_body> sr{res};
    stream.expires_after(kWriteTimeout);
    co_await http::async_write_header(stream, sr, asio::redirect_error(asio::use_awaitable, ec));
    while (!ec) {
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
      signals_(io_, SIGTERM, SIGINT) {}

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
  std::vector<std::thread> threads;
  for (int i = 1; i < options_.io_threads; ++i) threads.emplace_back([this] { io_.run(); });
  io_.run();
  for (auto& t : threads) t.join();
  pool_.join();
}

}  // namespace airlock::daemon
