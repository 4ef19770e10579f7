#pragma once
// The server name (SNI) of a TLS ClientHello, read from the first bytes a client sends. Untrusted
// bytes: every length is checked against what it sits in, nothing is read past the buffer.

#include <cstddef>
#include <string>
#include <string_view>

namespace airlock::net {

// The most a ClientHello may take before the proxy gives up on it (record headers included).
inline constexpr size_t kMaxClientHelloBytes = 16 * 1024;

struct ClientHelloScan {
  enum class State {
    kNeedMore,  // a valid prefix: read more bytes and scan again
    kInvalid,   // not a ClientHello, or a malformed one
    kComplete,  // the whole ClientHello was read; `sni` is its host_name, empty when absent
  };
  State state = State::kNeedMore;
  std::string sni;
  std::string error;  // kInvalid: what was wrong
};

// True when `bytes` starts like a TLS handshake record (content type 22, version 3.x).
bool LooksLikeTls(std::string_view bytes);
// Scans the handshake records at the start of `bytes` (a ClientHello may span records). SNI with
// more than one host_name, or two server_name extensions, is kInvalid.
ClientHelloScan ScanClientHello(std::string_view bytes);

}  // namespace airlock::net
