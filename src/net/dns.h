#pragma once
// The sandbox DNS library (airlock_net_dns): the message codec (dns_message.h), the upstream
// resolver client (dns_resolver.h) and the per-gateway stub server (dns_stub.h).
// docs/design/network.md, "DNS stub", says what is answered and what never leaves the host.

#include "net/dns_message.h"   // IWYU pragma: export
#include "net/dns_resolver.h"  // IWYU pragma: export
#include "net/dns_stub.h"      // IWYU pragma: export
