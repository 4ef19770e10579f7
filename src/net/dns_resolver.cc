#include "net/dns_resolver.h"

#include <sys/random.h>
#include <sys/socket.h>

#include <array>
#include <boost/asio/buffer.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/write.hpp>
#include <memory>
#include <optional>
#include <random>

namespace airlock::net::dns {
namespace {

namespace asio = boost::asio;
using asio::ip::tcp;
using asio::ip::udp;
using boost::system::error_code;
using Clock = std::chrono::steady_clock;

constexpr size_t kMaxUdpResponse = 4096;

uint16_t RandomId() {
  uint16_t id = 0;
  if (getrandom(&id, sizeof(id), 0) == sizeof(id)) return id;
  // getrandom does not fail for 2 bytes once the pool is up; this is for exotic kernels.
  static thread_local std::mt19937 fallback{std::random_device{}()};
  return static_cast<uint16_t>(fallback());
}

std::string Describe(const udp::endpoint& ep) {
  return ep.address().to_string() + ":" + std::to_string(ep.port());
}

// One resolution. Everything below runs on `strand_`; each attempt (one upstream) has a number,
// and handlers of an earlier attempt (completed with operation_aborted after the sockets were
// closed) see a stale number and do nothing.
class ResolveOp : public std::enable_shared_from_this<ResolveOp> {
 public:
  ResolveOp(const asio::any_io_executor& executor, std::vector<std::string> labels, uint16_t qtype,
            std::vector<udp::endpoint> upstream, std::chrono::milliseconds timeout,
            ResolveHandler done, SocketFactory open_socket)
      : home_(executor),
        strand_(asio::make_strand(executor)),
        labels_(std::move(labels)),
        qtype_(qtype),
        upstream_(std::move(upstream)),
        deadline_(Clock::now() + timeout),
        done_(std::move(done)),
        open_socket_(std::move(open_socket)),
        udp_(strand_),
        tcp_(strand_),
        timer_(strand_) {}

  void Start() {
    asio::post(strand_, [self = shared_from_this()] { self->TryNext(); });
  }

 private:
  void TryNext() {
    CloseSockets();
    if (next_ >= upstream_.size()) {
      Finish(std::unexpected(
          last_error_.value_or(Error(ErrorCode::kUnavailable, "no upstream DNS server answered"))));
      return;
    }
    auto now = Clock::now();
    if (now >= deadline_) {
      Finish(std::unexpected(
          last_error_.value_or(Error(ErrorCode::kDeadlineExceeded, "DNS deadline passed"))));
      return;
    }
    const size_t left = upstream_.size() - next_;
    auto share = (deadline_ - now) / left;
    endpoint_ = upstream_[next_++];
    ++attempt_;
    id_ = RandomId();
    query_ = std::make_shared<std::vector<uint8_t>>(BuildQuery(id_, labels_, qtype_));

    error_code ec;
    Open(udp_, endpoint_.protocol(), SOCK_DGRAM, ec);
    if (!ec) udp_.connect(endpoint_, ec);  // local only: fixes the peer and the source port
    if (ec) {
      last_error_ =
          Error(ErrorCode::kUnavailable, "DNS to " + Describe(endpoint_) + ": " + ec.message());
      TryNext();
      return;
    }
    timer_.expires_after(share);
    timer_.async_wait([self = shared_from_this(), attempt = attempt_](error_code wait_ec) {
      if (wait_ec || attempt != self->attempt_ || self->finished_) return;
      self->last_error_ = Error(ErrorCode::kDeadlineExceeded,
                                "no DNS answer from " + Describe(self->endpoint_) + " in time");
      self->TryNext();
    });
    udp_.async_send(asio::buffer(*query_), [self = shared_from_this(), attempt = attempt_,
                                            query = query_](error_code send_ec, size_t) {
      if (attempt != self->attempt_ || self->finished_) return;
      // Aborted: the UDP socket was closed for the TCP retry.
      if (send_ec && send_ec != asio::error::operation_aborted)
        self->AttemptFailed("sending: " + send_ec.message());
    });
    Receive();
  }

  void Receive() {
    udp_.async_receive(asio::buffer(buffer_),
                       [self = shared_from_this(), attempt = attempt_](error_code ec, size_t n) {
                         if (attempt != self->attempt_ || self->finished_) return;
                         if (ec) {
                           // ECONNREFUSED: an ICMP port unreachable for the connected socket.
                           self->AttemptFailed("receiving: " + ec.message());
                           return;
                         }
                         self->OnDatagram(n);
                       });
  }

  void OnDatagram(size_t n) {
    auto answer = ParseResponse(std::span<const uint8_t>(buffer_.data(), n), id_, labels_, qtype_);
    if (!answer) {
      // Wrong id, another question, garbage: not our answer. Keep waiting for the real one.
      Receive();
      return;
    }
    if (answer->truncated) {
      StartTcp();
      return;
    }
    Accept(*answer);
  }

  void Accept(const UpstreamAnswer& answer) {
    if (answer.rcode != Rcode::kNoError && answer.rcode != Rcode::kNxDomain) {
      AttemptFailed(std::string("answered ") + RcodeName(answer.rcode));
      return;
    }
    ResolveResult result;
    result.rcode = answer.rcode;
    result.addresses = answer.addresses;
    result.ttl = answer.ttl;
    Finish(std::move(result));
  }

  // Opens `socket` for `protocol`: through open_socket_ when there is one (it may live in
  // another network namespace), else here.
  template <typename Socket, typename Protocol>
  void Open(Socket& socket, const Protocol& protocol, int type, error_code& ec) {
    if (!open_socket_) {
      socket.open(protocol, ec);
      return;
    }
    auto fd = open_socket_(protocol.family(), type);
    if (!fd) {
      ec = error_code(EIO, boost::system::system_category());
      return;
    }
    socket.assign(protocol, fd->get(), ec);
    if (!ec) (void)fd->Release();
  }

  // TC fallback: the same question to the same server over TCP, framed with a 2-byte length
  // (RFC 1035 4.2.2), still under the attempt's timer.
  void StartTcp() {
    error_code ignored;
    udp_.close(ignored);
    tcp::endpoint ep(endpoint_.address(), endpoint_.port());
    id_ = RandomId();
    auto framed = std::make_shared<std::vector<uint8_t>>();
    std::vector<uint8_t> q = BuildQuery(id_, labels_, qtype_);
    framed->push_back(static_cast<uint8_t>(q.size() >> 8));
    framed->push_back(static_cast<uint8_t>(q.size() & 0xFF));
    framed->insert(framed->end(), q.begin(), q.end());
    auto self = shared_from_this();
    int attempt = attempt_;
    error_code open_ec;
    Open(tcp_, ep.protocol(), SOCK_STREAM, open_ec);
    if (open_ec) return AttemptFailed("TCP socket: " + open_ec.message());
    tcp_.async_connect(ep, [self, attempt, framed](error_code ec) {
      if (attempt != self->attempt_ || self->finished_) return;
      if (ec) return self->AttemptFailed("TCP connect: " + ec.message());
      asio::async_write(self->tcp_, asio::buffer(*framed),
                        [self, attempt, framed](error_code write_ec, size_t) {
                          if (attempt != self->attempt_ || self->finished_) return;
                          if (write_ec)
                            return self->AttemptFailed("TCP write: " + write_ec.message());
                          self->ReadTcpLength(attempt);
                        });
    });
  }

  void ReadTcpLength(int attempt) {
    asio::async_read(tcp_, asio::buffer(length_prefix_),
                     [self = shared_from_this(), attempt](error_code ec, size_t) {
                       if (attempt != self->attempt_ || self->finished_) return;
                       if (ec) return self->AttemptFailed("TCP read: " + ec.message());
                       size_t len = static_cast<size_t>(self->length_prefix_[0]) << 8 |
                                    self->length_prefix_[1];
                       self->tcp_buffer_.assign(len, 0);
                       self->ReadTcpBody(attempt);
                     });
  }

  void ReadTcpBody(int attempt) {
    asio::async_read(tcp_, asio::buffer(tcp_buffer_),
                     [self = shared_from_this(), attempt](error_code ec, size_t) {
                       if (attempt != self->attempt_ || self->finished_) return;
                       if (ec) return self->AttemptFailed("TCP read: " + ec.message());
                       auto answer =
                           ParseResponse(self->tcp_buffer_, self->id_, self->labels_, self->qtype_);
                       if (!answer) return self->AttemptFailed(answer.error().message());
                       if (answer->truncated) return self->AttemptFailed("truncated over TCP");
                       self->Accept(*answer);
                     });
  }

  void AttemptFailed(const std::string& what) {
    last_error_ = Error(ErrorCode::kUnavailable, "DNS to " + Describe(endpoint_) + ": " + what);
    TryNext();
  }

  void CloseSockets() {
    error_code ignored;
    timer_.cancel();
    udp_.close(ignored);
    tcp_.close(ignored);
  }

  void Finish(Result<ResolveResult> result) {
    if (finished_) return;
    finished_ = true;
    CloseSockets();
    asio::post(home_, [done = std::move(done_), result = std::move(result)]() mutable {
      done(std::move(result));
    });
  }

  asio::any_io_executor home_;
  asio::strand<asio::any_io_executor> strand_;
  std::vector<std::string> labels_;
  uint16_t qtype_;
  std::vector<udp::endpoint> upstream_;
  Clock::time_point deadline_;
  ResolveHandler done_;
  SocketFactory open_socket_;

  udp::socket udp_;
  tcp::socket tcp_;
  asio::steady_timer timer_;
  size_t next_ = 0;
  int attempt_ = 0;
  bool finished_ = false;
  udp::endpoint endpoint_;
  uint16_t id_ = 0;
  std::shared_ptr<std::vector<uint8_t>> query_;
  std::array<uint8_t, kMaxUdpResponse> buffer_{};
  std::array<uint8_t, 2> length_prefix_{};
  std::vector<uint8_t> tcp_buffer_;
  std::optional<Error> last_error_;
};

}  // namespace

void AsyncResolve(const asio::any_io_executor& executor, std::string name, uint16_t qtype,
                  std::vector<udp::endpoint> upstream, std::chrono::milliseconds timeout,
                  ResolveHandler done, SocketFactory open_socket) {
  auto labels = SplitName(name);
  std::optional<Error> bad;
  if (!labels) {
    bad = std::move(labels.error());
  } else if (labels->empty()) {
    bad = Error(ErrorCode::kInvalidArgument, "resolving the root name");
  } else if (qtype != kTypeA && qtype != kTypeAaaa) {
    bad = Error(ErrorCode::kInvalidArgument,
                "resolving type " + std::to_string(qtype) + ": only A and AAAA");
  } else if (upstream.empty()) {
    bad = Error(ErrorCode::kInvalidArgument, "resolving " + name + ": no upstream DNS server");
  }
  if (bad) {
    asio::post(executor, [done = std::move(done), err = std::move(*bad)]() mutable {
      done(std::unexpected(std::move(err)));
    });
    return;
  }
  auto op = std::make_shared<ResolveOp>(executor, std::move(*labels), qtype, std::move(upstream),
                                        timeout, std::move(done), std::move(open_socket));
  op->Start();
}

Result<ResolveResult> Resolve(std::string_view name, uint16_t qtype,
                              const std::vector<udp::endpoint>& upstream,
                              std::chrono::milliseconds timeout, SocketFactory open_socket) {
  asio::io_context io;
  std::optional<Result<ResolveResult>> out;
  AsyncResolve(
      io.get_executor(), std::string(name), qtype, upstream, timeout,
      [&out](Result<ResolveResult> r) { out = std::move(r); }, std::move(open_socket));
  io.run();
  AIRLOCK_CHECK(out.has_value());
  return std::move(*out);
}

Result<ResolveResult> ResolveAddresses(std::string_view name,
                                       const std::vector<udp::endpoint>& upstream,
                                       std::chrono::milliseconds timeout,
                                       SocketFactory open_socket) {
  auto a = Resolve(name, kTypeA, upstream, timeout, open_socket);
  if (!a || !a->addresses.empty() || a->rcode == Rcode::kNxDomain) return a;
  return Resolve(name, kTypeAaaa, upstream, timeout, std::move(open_socket));
}

}  // namespace airlock::net::dns
