#pragma once
// Secrets bound to a sandbox (docs/design/credentials.md): the API's `secrets` list, and the pure
// work the egress proxy does with it on an intercepted request: put the real value where the
// sandbox wrote its placeholder, refuse placeholders headed for a host they are not bound to,
// and take the value back out of what the host answers.
//
//   "secrets": [{"name": "GITHUB_TOKEN", "hosts": ["api.github.com"], "env": "GITHUB_TOKEN",
//                "inject": {"header": "Authorization", "format": "Bearer {value}"}}]
//
// The sandbox sees only a placeholder (a random string the daemon makes per binding); the value
// lives in the tenant's secret store and reaches only the bound hosts, over TLS the proxy
// terminates and re-originates itself. No I/O, no clock: any thread.

#include <cstddef>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/error.h"

namespace airlock::net {

inline constexpr size_t kMaxSecretBindings = 32;
inline constexpr size_t kMaxHostsPerBinding = 16;
inline constexpr std::string_view kPlaceholderPrefix = "airlock-secret-";

struct SecretBinding {
  std::string secret;              // its name in the tenant's store
  std::vector<std::string> hosts;  // exact DNS names, normalised: where the value may go
  std::string env;                 // the variable that holds the placeholder ("" for none)
  std::string placeholder;         // what the sandbox has instead of the value
  // Set on every request to a bound host (replacing the client's own), "{value}" replaced by
  // the value; "" for none: the value goes only where the placeholder was written.
  std::string header;
  std::string format;

  bool BoundTo(std::string_view normalised_host) const {
    for (const std::string& h : hosts) {
      if (h == normalised_host) return true;
    }
    return false;
  }
  bool operator==(const SecretBinding&) const = default;
};

// The API's `secrets` array. Placeholders: a binding that has one keeps it (a stored record, a
// PATCH that keeps a secret), else `make_placeholder` makes one. kInvalidArgument naming the
// field: `secrets[1].hosts[0]: ...`. Hosts must be names (an address or a wildcard is refused:
// the proxy must be able to tell the host by the TLS server name it terminates).
[[nodiscard]] Result<std::vector<SecretBinding>> ParseSecretBindings(
    const nlohmann::json& value, const std::vector<SecretBinding>& existing,
    const std::function<std::string()>& make_placeholder);
// The API's form, placeholders included (they are no secret: the sandbox has them).
nlohmann::json SecretBindingsToJson(const std::vector<SecretBinding>& bindings);
// A fresh placeholder: kPlaceholderPrefix and 32 random hex digits.
std::string NewPlaceholder();
// Bindings as a record stores them (SecretBindingsToJson's text, placeholders kept; "" for
// none). A record that does not parse has none.
std::vector<SecretBinding> StoredSecretBindings(std::string_view text);

// Inside a sandbox with secrets bound: the system's CA bundle with the daemon's CA added, and the
// daemon's CA alone. SecretEnv points the usual variables at them.
inline constexpr std::string_view kSandboxCaBundle = "/etc/ssl/certs/ca-certificates.crt";
inline constexpr std::string_view kSandboxCaFile = "/etc/ssl/certs/airlock-egress-ca.pem";
// What every command in a sandbox with `bindings` carries, KEY=VALUE: each binding's variable
// with its placeholder, and SSL_CERT_FILE, REQUESTS_CA_BUNDLE, CURL_CA_BUNDLE (the bundle) and
// NODE_EXTRA_CA_CERTS (the daemon's CA). None without bindings.
std::vector<std::string> SecretEnv(const std::vector<SecretBinding>& bindings);

// Replaces each `from` with its `to` in a stream of bytes that may split a `from` anywhere: the
// value back to its placeholder in what a host answers.
class Scrubber {
 public:
  struct Pair {
    std::string from, to;
  };
  Scrubber() = default;
  explicit Scrubber(std::vector<Pair> pairs);  // each `from` non-empty
  // The part of what came so far that can no longer be the start of a `from`, scrubbed.
  std::string Feed(std::string_view bytes);
  // The rest, at the end of the stream.
  std::string Finish();
  // Everything at once (a header value).
  std::string All(std::string_view text) const;
  bool empty() const { return pairs_.empty(); }
  const std::vector<Pair>& pairs() const { return pairs_; }

 private:
  std::vector<Pair> pairs_;
  size_t longest_ = 0;
  std::string pending_;
};

// Finds any of a set of strings in a stream of bytes that may split one anywhere.
class Finder {
 public:
  Finder() = default;
  explicit Finder(std::vector<std::string> needles);
  // The first needle seen so far (this call's bytes with what earlier calls held back), or "".
  std::string Feed(std::string_view bytes);
  // How many of the last bytes fed may still be the start of a needle: what a caller that
  // forwards the bytes holds back until the next Feed (or the end of the stream).
  size_t held_back() const { return longest_ == 0 ? 0 : longest_ - 1; }

 private:
  std::vector<std::string> needles_;
  size_t longest_ = 0;
  std::string tail_;
};

// The header fields of a request to `host` (normalised), rewritten for upstream: each placeholder
// of a secret bound to `host` replaced by its value (in any field, and inside an Authorization
// "Basic" credential), each binding's own header set. A placeholder of a secret NOT bound to
// `host`, in a field or in `target`, is a refusal (kPermissionDenied naming the secret and the
// host). `value_of` gives a secret's value (an error refuses the request).
struct Injected {
  std::vector<std::pair<std::string, std::string>> fields;
  std::vector<std::string> secrets;   // the names whose value went in
  std::vector<Scrubber::Pair> scrub;  // what was put in -> what the client wrote
};
[[nodiscard]] Result<Injected> InjectSecrets(
    const std::vector<std::pair<std::string, std::string>>& fields, std::string_view target,
    std::string_view host, const std::vector<SecretBinding>& bindings,
    const std::function<Result<std::string>(const std::string& secret)>& value_of);

// The placeholders of bindings not bound to `host` (all of them for host ""): what a request to
// `host` must not carry, in its body either.
std::vector<std::string> ForeignPlaceholders(const std::vector<SecretBinding>& bindings,
                                             std::string_view host);
// The first binding not bound to `host` (any, for host "") whose placeholder a request head
// names: in its target, a field's name or value, or Basic credentials. nullptr: none.
const SecretBinding* ForeignPlaceholderIn(
    const std::vector<std::pair<std::string, std::string>>& fields, std::string_view target,
    std::string_view host, const std::vector<SecretBinding>& bindings);
// Basic credentials decoded ("user:password"), for an Authorization field that has them.
std::optional<std::string> BasicCredentials(const std::pair<std::string, std::string>& field);

}  // namespace airlock::net
