#pragma once
// HttpServer: airlockd's HTTP/1.1 listener on Boost.Beast with Asio C++20 coroutines. A few IO
// threads run the sockets; every request is handled by the Router on a separate worker pool, so
// no IO thread ever waits on SQLite, the engine or an agent. Keep-alive; header and body caps
// (413 past api::kMaxJsonBodyBytes); idle connections time out. The two WebSocket routes
// (ws_session.h) upgrade; each open session has a thread of its own for its events, and at most
// kMaxWebSockets are open at once (503 past that).

#include <atomic>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/thread_pool.hpp>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "common/error.h"
#include "daemon/server/router.h"

namespace airlock::daemon {

inline constexpr int64_t kMaxWebSockets = 256;

struct HttpServerOptions {
  boost::asio::ip::address address;
  uint16_t port = 0;  // 0: the kernel picks one (see local_port())
  int io_threads = 2;
  int workers = 16;  // concurrent blocking calls (creates, execs) before requests queue
  // Called on a worker at each SIGHUP while serving (airlockd: reload the config). Without it
  // SIGHUP is ignored.
  std::function<void()> on_reload;
};

class HttpServer {
 public:
  // Binds and listens; `router` outlives the server.
  [[nodiscard]] static Result<std::unique_ptr<HttpServer>> Listen(const HttpServerOptions& options,
                                                                  Router& router);
  ~HttpServer();

  uint16_t local_port() const { return port_; }
  // Serves until SIGTERM or SIGINT (SIGHUP calls options.on_reload), then stops accepting, waits for the requests in flight to be
  // answered, and returns with every IO thread and worker joined. Call once.
  void Run();

 private:
  HttpServer(const HttpServerOptions& options, Router& router);
  void WaitForReload();  // one SIGHUP, then the next

  HttpServerOptions options_;
  Router& router_;
  boost::asio::io_context io_;
  boost::asio::thread_pool pool_;
  boost::asio::strand<boost::asio::io_context::executor_type> accept_strand_;
  boost::asio::ip::tcp::acceptor acceptor_;
  boost::asio::signal_set signals_;
  boost::asio::signal_set reload_signals_;
  uint16_t port_ = 0;
  std::atomic<bool> stopping_{false};
  std::atomic<int64_t> in_flight_{0};
  std::atomic<int64_t> websockets_{0};  // open WebSocket sessions (each has a thread)

  struct Impl;  // the coroutines (http_server.cc)
};

}  // namespace airlock::daemon
