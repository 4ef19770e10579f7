#pragma once
// A small DNS client: asks the upstream resolvers for the A or AAAA records of one name.
//
// One UDP socket per attempt, connected to the upstream (the kernel then drops datagrams from
// anyone else) and bound by the kernel to a random ephemeral port; a random 16-bit id per
// attempt. Replies whose id or question do not match are ignored and the wait goes on (a spoofer
// has to guess both port and id). A reply with TC set is retried over TCP to the same upstream.
// Upstreams are tried in order; SERVFAIL, REFUSED, a socket error or silence moves on to the next,
// and the whole resolution shares one deadline (each attempt gets an equal share of what is
// left). CNAMEs are followed inside the answer section only (dns_message.h).

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/ip/udp.hpp>
#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include "common/error.h"
#include "net/dns_message.h"
#include "net/socket_factory.h"

namespace airlock::net::dns {

struct ResolveResult {
  Rcode rcode = Rcode::kNoError;  // kNoError (addresses may be empty: NODATA) or kNxDomain
  std::vector<boost::asio::ip::address> addresses;
  uint32_t ttl = 0;  // as the upstream gave it (smallest on the CNAME chain), not capped
};

using ResolveHandler = std::function<void(Result<ResolveResult>)>;

// Starts resolving `name` (dotted, a trailing dot allowed) for `qtype` (kTypeA or kTypeAaaa) and
// returns at once. The sockets and timers of the resolution run on a strand of their own made
// from `executor`; `done` is called exactly once, through `executor` (post), never inline.
// Errors: kInvalidArgument (bad name, type, or no upstream), kDeadlineExceeded (no upstream
// answered in time), kUnavailable (every upstream failed: SERVFAIL, REFUSED, socket errors).
// `open_socket` makes the UDP and TCP sockets (unset: socket(2) here; a network namespace as the
// uplink sets it).
void AsyncResolve(const boost::asio::any_io_executor& executor, std::string name, uint16_t qtype,
                  std::vector<boost::asio::ip::udp::endpoint> upstream,
                  std::chrono::milliseconds timeout, ResolveHandler done,
                  SocketFactory open_socket = {});

// The same, blocking: runs a private io_context on the calling thread until the answer or the
// deadline. For callers that are not on an io_context (tools, tests); never call it from a
// handler, where it would stall every other handler of that thread.
[[nodiscard]] Result<ResolveResult> Resolve(
    std::string_view name, uint16_t qtype,
    const std::vector<boost::asio::ip::udp::endpoint>& upstream, std::chrono::milliseconds timeout,
    SocketFactory open_socket = {});

// A host's addresses, blocking as Resolve: its A records, or when it has none its AAAA records
// (not asked after NXDOMAIN). `ttl` is that of the records returned (or of the last answer when
// there are none). What the egress proxy dials.
[[nodiscard]] Result<ResolveResult> ResolveAddresses(
    std::string_view name, const std::vector<boost::asio::ip::udp::endpoint>& upstream,
    std::chrono::milliseconds timeout, SocketFactory open_socket = {});

}  // namespace airlock::net::dns
