#pragma once
// Where the proxy's and the resolver's upstream sockets come from. Unset: socket(2) on the
// calling thread, in the daemon's own network namespace. With a network namespace as the uplink
// the daemon passes one that makes them inside that namespace (uplink.h, NetnsThread): a socket
// stays in the namespace it was made in, whichever thread uses it later.

#include <functional>

#include "common/error.h"
#include "common/unique_fd.h"

namespace airlock::net {

// (domain, type) as for socket(2), e.g. (AF_INET, SOCK_STREAM); the fd is close-on-exec.
using SocketFactory = std::function<Result<UniqueFd>(int domain, int type)>;

}  // namespace airlock::net
