#pragma once
// The daemon's certificate authority for intercepted TLS (issue 21: credentials are added at the
// egress proxy, so the proxy must read a sandbox's HTTPS requests, and a sandbox that trusts this
// CA lets it), and the client side the proxy dials upstream servers with.
//
// The CA lives in a directory of the daemon's (ca.key 0600, ca.crt 0644): made once, then loaded
// on every start, so the certificate given to sandboxes stays valid across restarts. Leaf
// certificates are made in memory per host name and never written anywhere.

#include <openssl/ssl.h>
#include <openssl/x509.h>

#include <boost/asio/ssl/context.hpp>
#include <chrono>
#include <cstddef>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include "common/error.h"

namespace airlock::net {

// A leaf certificate and its private key, PEM.
struct IssuedCertificate {
  std::string certificate_pem;
  std::string key_pem;
};

// How long the things the CA makes are valid, and what ServerContext keeps.
inline constexpr std::chrono::hours kCaLifetime{24 * 3653};  // ten years
inline constexpr std::chrono::hours kLeafLifetime{24 * 30};
// Both are back-dated by this much, for clients whose clock is behind the host's.
inline constexpr std::chrono::hours kBackdate{1};
// A cached server context whose leaf has less than this left is replaced by a new one.
inline constexpr std::chrono::hours kRenewBefore{24 * 7};
inline constexpr size_t kMaxCachedContexts = 1024;

// The daemon's certificate authority for intercepted TLS.
// Thread-safe: every method may be called from any thread (ServerContext's cache takes one
// mutex, never held while a certificate is made).
class CertificateAuthority {
 public:
  using WallClock = std::function<std::chrono::system_clock::time_point()>;

  // Loads DIR/ca.key and DIR/ca.crt, or makes both (ECDSA P-256, self-signed CA cert with
  // basicConstraints critical CA:TRUE pathlen:0, keyUsage keyCertSign+cRLSign, subject CN
  // "Airlock egress CA <short random id>", valid 10 years). DIR is made 0700, ca.key 0600,
  // ca.crt 0644. A key that is not 0600-or-stricter, a cert that does not match the key, an
  // expired CA cert, or a half-present pair is a clear error (never silently replaced).
  // kFailedPrecondition for those; the message names the file and what to do.
  [[nodiscard]] static Result<std::unique_ptr<CertificateAuthority>> LoadOrCreate(
      const std::string& dir);
  // The same, with the time taken from `now` instead of the system clock (tests move it).
  [[nodiscard]] static Result<std::unique_ptr<CertificateAuthority>> LoadOrCreate(
      const std::string& dir, WallClock now);
  CertificateAuthority(const CertificateAuthority&) = delete;
  CertificateAuthority& operator=(const CertificateAuthority&) = delete;

  // ca.crt's contents: what a sandbox is given to trust.
  const std::string& certificate_pem() const;
  // A leaf for a DNS name (SAN DNS:host only, CN host, extendedKeyUsage serverAuth, keyUsage
  // digitalSignature, fresh P-256 key, random 128-bit serial, notBefore now-1h, notAfter
  // now+30 days (never beyond the CA's), signed SHA-256). kInvalidArgument for a host that is
  // not a valid DNS name (an IP literal, empty, over 253 chars, bad labels, wildcard). The name
  // is lowercased and a trailing dot dropped first; a name over 64 bytes (the most a CN may
  // hold) gets no CN, and its SAN is critical (RFC 5280 4.2.1.6). kFailedPrecondition once the
  // CA certificate has expired.
  [[nodiscard]] Result<IssuedCertificate> Issue(const std::string& host);
  // A TLS server context (TLS 1.2 and 1.3, ALPN: offers only "http/1.1" — the interceptor
  // speaks HTTP/1.1, so a client asking for h2 must get http/1.1 or no ALPN, never h2)
  // presenting Issue(host)'s leaf followed by the CA certificate. Cached by host (bounded:
  // at most 1024 entries, least recently used evicted) and renewed when under 7 days are left.
  // Thread-safe; a cache hit costs microseconds.
  [[nodiscard]] Result<std::shared_ptr<boost::asio::ssl::context>> ServerContext(
      const std::string& host);
  // Contexts in ServerContext's cache.
  size_t cached_contexts() const;

 private:
  struct FreeKey {
    void operator()(EVP_PKEY* key) const { EVP_PKEY_free(key); }
  };
  struct FreeCert {
    void operator()(X509* cert) const { X509_free(cert); }
  };
  struct CachedContext {
    std::string host;
    std::shared_ptr<boost::asio::ssl::context> context;
    std::chrono::system_clock::time_point not_after;
  };

  CertificateAuthority(EVP_PKEY* key, X509* cert, std::string cert_pem,
                       std::chrono::system_clock::time_point not_after, WallClock now);

  // Read-only once made, so every thread may sign with them at once.
  const std::unique_ptr<EVP_PKEY, FreeKey> key_;
  const std::unique_ptr<X509, FreeCert> cert_;
  const std::string cert_pem_;
  const std::chrono::system_clock::time_point not_after_;  // the CA certificate's
  const WallClock now_;

  mutable std::mutex mu_;
  std::list<CachedContext> lru_;  // most recently used first
  std::unordered_map<std::string, std::list<CachedContext>::iterator> by_host_;
};

// A TLS client context for dialling upstream servers: verify_peer against the system trust
// store (default paths) plus every certificate in `extra_ca_file` when it is not empty (an
// unreadable or empty file is an error), TLS 1.2 minimum, ALPN "http/1.1". Host name
// checking is per connection: callers set SNI and boost::asio::ssl::host_name_verification
// on each stream — PrepareUpstream does both.
[[nodiscard]] Result<std::shared_ptr<boost::asio::ssl::context>> UpstreamContext(
    const std::string& extra_ca_file);
// Sets SNI to `host` and verification of the peer's name against `host` on `stream`'s SSL
// (`stream.native_handle()`), before its handshake. A name is checked against the certificate's
// DNS names (no partial wildcards); an IP address (no SNI is sent for one, RFC 6066) against its
// IP addresses. kInvalidArgument for a host that is neither.
[[nodiscard]] Status PrepareUpstream(SSL* ssl, const std::string& host);

}  // namespace airlock::net
