#include "net/credentials.h"

#include <openssl/evp.h>
#include <openssl/rand.h>

#include <algorithm>
#include <cctype>
#include <optional>
#include <set>

#include "net/http_message.h"
#include "net/policy.h"

namespace airlock::net {
namespace {

using json = nlohmann::json;

constexpr size_t kMaxSecretName = 128;
constexpr size_t kMaxFormatBytes = 1024;
constexpr std::string_view kValueMark = "{value}";

bool IsIdentifier(std::string_view s, size_t max) {
  if (s.empty() || s.size() > max) return false;
  if (!(std::isalpha(static_cast<unsigned char>(s[0])) || s[0] == '_')) return false;
  return std::all_of(s.begin(), s.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '_';
  });
}

// RFC 9110 token characters.
bool IsFieldName(std::string_view s) {
  static constexpr std::string_view kSpecial = "!#$%&'*+-.^_`|~";
  return !s.empty() && s.size() <= 256 && std::all_of(s.begin(), s.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) ||
           kSpecial.find(c) != std::string_view::npos;
  });
}

void ReplaceAll(std::string& text, std::string_view from, std::string_view to) {
  for (size_t at = text.find(from); at != std::string::npos; at = text.find(from, at + to.size())) {
    text.replace(at, from.size(), to);
  }
}

std::string Base64(std::string_view bytes) {
  std::string out(4 * ((bytes.size() + 2) / 3), '\0');
  const int n = EVP_EncodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                                reinterpret_cast<const unsigned char*>(bytes.data()),
                                static_cast<int>(bytes.size()));
  out.resize(n < 0 ? 0 : static_cast<size_t>(n));
  return out;
}

// Standard padded base64 only (what clients send in Basic credentials); nullopt for anything else.
std::optional<std::string> Unbase64(std::string_view text) {
  if (text.empty() || text.size() % 4 != 0) return std::nullopt;
  const size_t pad = text.ends_with("==") ? 2 : text.ends_with('=') ? 1 : 0;
  for (size_t i = 0; i < text.size() - pad; ++i) {
    const char c = text[i];
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '+' || c == '/')) return std::nullopt;
  }
  std::string out(text.size() / 4 * 3, '\0');
  const int n = EVP_DecodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                                reinterpret_cast<const unsigned char*>(text.data()),
                                static_cast<int>(text.size()));
  if (n < 0 || static_cast<size_t>(n) < pad) return std::nullopt;
  out.resize(static_cast<size_t>(n) - pad);
  return out;
}

Error Bad(const std::string& where, const std::string& why) {
  return Error(ErrorCode::kInvalidArgument, where + ": " + why);
}

}  // namespace

std::string NewPlaceholder() {
  unsigned char bytes[16];
  AIRLOCK_CHECK(RAND_bytes(bytes, sizeof bytes) == 1);
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out(kPlaceholderPrefix);
  for (unsigned char b : bytes) {
    out += kHex[b >> 4];
    out += kHex[b & 15];
  }
  return out;
}

Result<std::vector<SecretBinding>> ParseSecretBindings(
    const json& value, const std::vector<SecretBinding>& existing,
    const std::function<std::string()>& make_placeholder) {
  if (!value.is_array()) return std::unexpected(Bad("secrets", "must be an array"));
  if (value.size() > kMaxSecretBindings) {
    return std::unexpected(
        Bad("secrets", "at most " + std::to_string(kMaxSecretBindings) + " bindings"));
  }
  std::vector<SecretBinding> out;
  std::set<std::string> names, envs;
  for (size_t i = 0; i < value.size(); ++i) {
    const std::string at = "secrets[" + std::to_string(i) + "]";
    const json& item = value[i];
    if (!item.is_object()) return std::unexpected(Bad(at, "must be an object"));
    for (const auto& [key, unused] : item.items()) {
      if (key != "name" && key != "hosts" && key != "env" && key != "inject" &&
          key != "placeholder") {
        return std::unexpected(Bad(at, "unknown field \"" + key + "\""));
      }
    }
    SecretBinding b;
    if (!item.contains("name") || !item["name"].is_string() ||
        !IsIdentifier(item["name"].get<std::string>(), kMaxSecretName)) {
      return std::unexpected(
          Bad(at + ".name", "the name of a secret ([A-Za-z_][A-Za-z0-9_]*, at most 128)"));
    }
    b.secret = item["name"];
    if (!names.insert(b.secret).second) {
      return std::unexpected(Bad(at + ".name", b.secret + " is bound twice"));
    }
    if (!item.contains("hosts") || !item["hosts"].is_array() || item["hosts"].empty() ||
        item["hosts"].size() > kMaxHostsPerBinding) {
      return std::unexpected(Bad(at + ".hosts", "1 to " + std::to_string(kMaxHostsPerBinding) +
                                                    " host names where the value may go"));
    }
    for (size_t h = 0; h < item["hosts"].size(); ++h) {
      const std::string where = at + ".hosts[" + std::to_string(h) + "]";
      const json& host = item["hosts"][h];
      if (!host.is_string()) return std::unexpected(Bad(where, "must be a string"));
      const std::string text = host;
      if (ParseIpLiteral(text) || LooksLikeIpv4(text)) {
        return std::unexpected(Bad(where, text + " is an address: bind a secret to host names"));
      }
      auto name = NormaliseName(text);
      if (!name || text.find('*') != std::string::npos) {
        return std::unexpected(Bad(where, "\"" + text +
                                              "\" is not a host name (exact names "
                                              "only, no wildcards or ports)"));
      }
      if (!b.BoundTo(*name)) b.hosts.push_back(*name);
    }
    if (item.contains("env")) {
      if (!item["env"].is_string() || !IsIdentifier(item["env"].get<std::string>(), 256)) {
        return std::unexpected(
            Bad(at + ".env", "an environment variable name ([A-Za-z_][A-Za-z0-9_]*)"));
      }
      b.env = item["env"];
      if (!envs.insert(b.env).second) {
        return std::unexpected(Bad(at + ".env", b.env + " holds two secrets' placeholders"));
      }
    }
    if (item.contains("inject")) {
      const json& inject = item["inject"];
      if (!inject.is_object() || !inject.contains("header") || !inject["header"].is_string() ||
          !IsFieldName(inject["header"].get<std::string>())) {
        return std::unexpected(Bad(at + ".inject",
                                   "{\"header\": NAME, \"format\": TEXT}, NAME "
                                   "an HTTP field name"));
      }
      for (const auto& [key, unused] : inject.items()) {
        if (key != "header" && key != "format") {
          return std::unexpected(Bad(at + ".inject", "unknown field \"" + key + "\""));
        }
      }
      b.header = inject["header"];
      if (http::IsHopByHop(b.header) || http::IEquals(b.header, "host") ||
          http::IEquals(b.header, "content-length")) {
        return std::unexpected(Bad(at + ".inject.header", b.header + " is set by the proxy"));
      }
      b.format = inject.contains("format") && inject["format"].is_string()
                     ? inject["format"].get<std::string>()
                     : std::string(kValueMark);
      const size_t mark = b.format.find(kValueMark);
      if (mark == std::string::npos || b.format.find(kValueMark, mark + 1) != std::string::npos ||
          b.format.size() > kMaxFormatBytes ||
          b.format.find_first_of(std::string_view("\r\n\0", 3)) != std::string::npos) {
        return std::unexpected(Bad(at + ".inject.format",
                                   "one line with {value} exactly once (e.g. \"Bearer {value}\")"));
      }
    }
    // A placeholder is kept from the binding of the same secret the sandbox had, never taken
    // from the request (the daemon makes them).
    for (const SecretBinding& old : existing) {
      if (old.secret == b.secret) b.placeholder = old.placeholder;
    }
    if (b.placeholder.empty()) b.placeholder = make_placeholder();
    out.push_back(std::move(b));
  }
  return out;
}

std::vector<SecretBinding> StoredSecretBindings(std::string_view text) {
  if (text.empty()) return {};
  const json doc = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!doc.is_array()) return {};
  std::vector<SecretBinding> out;
  for (const json& item : doc) {
    if (!item.is_object() || !item.contains("placeholder") || !item["placeholder"].is_string()) {
      continue;
    }
    const std::string placeholder = item["placeholder"];
    auto one = ParseSecretBindings(json::array({item}), {}, [&] { return placeholder; });
    if (one && one->size() == 1) out.push_back(std::move(one->front()));
  }
  return out;
}

std::vector<std::string> SecretEnv(const std::vector<SecretBinding>& bindings) {
  if (bindings.empty()) return {};
  std::vector<std::string> env;
  for (const SecretBinding& b : bindings) {
    if (!b.env.empty()) env.push_back(b.env + "=" + b.placeholder);
  }
  for (const char* key : {"SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE"}) {
    env.push_back(std::string(key) + "=" + std::string(kSandboxCaBundle));
  }
  env.push_back("NODE_EXTRA_CA_CERTS=" + std::string(kSandboxCaFile));
  return env;
}

json SecretBindingsToJson(const std::vector<SecretBinding>& bindings) {
  json out = json::array();
  for (const SecretBinding& b : bindings) {
    json item = {{"name", b.secret}, {"hosts", b.hosts}, {"placeholder", b.placeholder}};
    if (!b.env.empty()) item["env"] = b.env;
    if (!b.header.empty()) item["inject"] = {{"header", b.header}, {"format", b.format}};
    out.push_back(std::move(item));
  }
  return out;
}

Scrubber::Scrubber(std::vector<Pair> pairs) : pairs_(std::move(pairs)) {
  for (const Pair& p : pairs_) {
    AIRLOCK_CHECK(!p.from.empty());
    longest_ = std::max(longest_, p.from.size());
  }
}

std::string Scrubber::All(std::string_view text) const {
  std::string out;
  size_t pos = 0;
  while (true) {
    size_t best = std::string_view::npos;
    const Pair* which = nullptr;
    for (const Pair& p : pairs_) {
      const size_t at = text.find(p.from, pos);
      if (at < best ||
          (at == best && at != std::string_view::npos && p.from.size() > which->from.size())) {
        best = at;
        which = &p;
      }
    }
    if (!which) break;
    out.append(text.substr(pos, best - pos));
    out += which->to;
    pos = best + which->from.size();
  }
  out.append(text.substr(pos));
  return out;
}

std::string Scrubber::Feed(std::string_view bytes) {
  if (pairs_.empty()) return std::string(bytes);
  pending_.append(bytes);
  // Held back: a tail short enough to be the start of a `from` that the next bytes complete.
  // The split is moved left past any `from` it would cut.
  size_t cut = pending_.size() > longest_ - 1 ? pending_.size() - (longest_ - 1) : 0;
  for (bool moved = true; moved && cut > 0;) {
    moved = false;
    for (const Pair& p : pairs_) {
      const size_t from = cut >= p.from.size() ? cut - p.from.size() + 1 : 0;
      const size_t at = pending_.find(p.from, from);
      if (at != std::string::npos && at < cut && at + p.from.size() > cut) {
        cut = at;
        moved = true;
      }
    }
  }
  std::string out = All(std::string_view(pending_).substr(0, cut));
  pending_.erase(0, cut);
  return out;
}

std::string Scrubber::Finish() {
  std::string out = All(pending_);
  pending_.clear();
  return out;
}

Finder::Finder(std::vector<std::string> needles) : needles_(std::move(needles)) {
  for (const std::string& n : needles_) longest_ = std::max(longest_, n.size());
}

std::string Finder::Feed(std::string_view bytes) {
  if (needles_.empty()) return "";
  tail_.append(bytes);
  for (const std::string& n : needles_) {
    if (!n.empty() && tail_.find(n) != std::string::npos) return n;
  }
  if (tail_.size() >= longest_) tail_.erase(0, tail_.size() - (longest_ - 1));
  return "";
}

std::vector<std::string> ForeignPlaceholders(const std::vector<SecretBinding>& bindings,
                                             std::string_view host) {
  std::vector<std::string> out;
  for (const SecretBinding& b : bindings) {
    if (host.empty() || !b.BoundTo(host)) out.push_back(b.placeholder);
  }
  return out;
}

// Basic credentials decoded, for an Authorization field that has them.
std::optional<std::string> BasicCredentials(const std::pair<std::string, std::string>& f) {
  if (!http::IEquals(f.first, "authorization") && !http::IEquals(f.first, "proxy-authorization")) {
    return std::nullopt;
  }
  std::string_view v = f.second;
  if (v.size() < 6 || !http::IEquals(v.substr(0, 6), "basic ")) return std::nullopt;
  v.remove_prefix(6);
  while (!v.empty() && v.front() == ' ') v.remove_prefix(1);
  return Unbase64(v);
}

const SecretBinding* ForeignPlaceholderIn(
    const std::vector<std::pair<std::string, std::string>>& fields, std::string_view target,
    std::string_view host, const std::vector<SecretBinding>& bindings) {
  for (const SecretBinding& b : bindings) {
    if (!host.empty() && b.BoundTo(host)) continue;
    if (target.find(b.placeholder) != std::string_view::npos) return &b;
    for (const auto& f : fields) {
      auto plain = BasicCredentials(f);
      if (f.second.find(b.placeholder) != std::string::npos ||
          f.first.find(b.placeholder) != std::string::npos ||
          (plain && plain->find(b.placeholder) != std::string::npos)) {
        return &b;
      }
    }
  }
  return nullptr;
}

Result<Injected> InjectSecrets(
    const std::vector<std::pair<std::string, std::string>>& fields, std::string_view target,
    std::string_view host, const std::vector<SecretBinding>& bindings,
    const std::function<Result<std::string>(const std::string& secret)>& value_of) {
  if (const SecretBinding* b = ForeignPlaceholderIn(fields, target, host, bindings)) {
    return std::unexpected(Error(ErrorCode::kPermissionDenied,
                                 "the placeholder of secret " + b->secret + " is in a request to " +
                                     std::string(host) + ", a host it is not bound to"));
  }
  Injected out;
  out.fields = fields;
  for (const SecretBinding& b : bindings) {
    if (!b.BoundTo(host)) continue;
    auto value = value_of(b.secret);
    if (!value) {
      return std::unexpected(
          Error(ErrorCode::kFailedPrecondition,
                "secret " + b.secret + " cannot be used: " + value.error().message()));
    }
    if (value->empty() ||
        value->find_first_of(std::string_view("\r\n\0", 3)) != std::string::npos) {
      return std::unexpected(
          Error(ErrorCode::kFailedPrecondition, "secret " + b.secret +
                                                    " cannot go in an HTTP header (it is "
                                                    "empty or has a line break or NUL)"));
    }
    bool used = false;
    for (auto& f : out.fields) {
      if (auto plain = BasicCredentials(f);
          plain && plain->find(b.placeholder) != std::string::npos) {
        std::string credentials = *plain;
        ReplaceAll(credentials, b.placeholder, *value);
        const std::string before = Base64(*plain), after = Base64(credentials);
        f.second = f.second.substr(0, f.second.find(' ')) + " " + after;
        out.scrub.push_back({after, before});
        used = true;
      }
      if (f.second.find(b.placeholder) != std::string::npos) {
        ReplaceAll(f.second, b.placeholder, *value);
        used = true;
      }
    }
    if (!b.header.empty()) {
      std::erase_if(out.fields, [&](const auto& f) { return http::IEquals(f.first, b.header); });
      std::string line = b.format;
      ReplaceAll(line, kValueMark, *value);
      out.fields.emplace_back(b.header, std::move(line));
      used = true;
    }
    // The value is taken back out of whatever the host answers, used or not this time (the
    // client may have sent it in a body the proxy does not rewrite: it is the placeholder there).
    out.scrub.push_back({*value, b.placeholder});
    if (used) out.secrets.push_back(b.secret);
  }
  return out;
}

}  // namespace airlock::net
