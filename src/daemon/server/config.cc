#include "daemon/server/config.h"

#include <algorithm>
#include <charconv>
#include <set>

#include "daemon/api/types.h"

namespace airlock::daemon {
namespace {

std::string_view Trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r')) s.remove_suffix(1);
  return s;
}

std::string Normalize(std::string_view key) {
  std::string k(key);
  for (char& c : k) {
    if (c == '.') break;  // after a dot comes a name (pool.<template>), kept as written
    if (c == '-') c = '_';
  }
  return k;
}

// An engine's name as the config and the API take it: 1-32 of [a-z0-9-].
bool ValidEngineName(std::string_view name) {
  return !name.empty() && name.size() <= 32 &&
         std::all_of(name.begin(), name.end(), [](char c) {
           return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-';
         });
}

Result<bool> ParseBool(std::string_view key, std::string_view value) {
  if (value == "true") return true;
  if (value == "false") return false;
  return Fail(ErrorCode::kInvalidArgument,
              std::string(key) + " must be true or false, got '" + std::string(value) + "'");
}

// A TOML value: "quoted string" (with \" and \\), or a bare word / number. Trailing comments
// after the value are allowed.
Result<std::string> ParseValue(std::string_view raw) {
  raw = Trim(raw);
  if (raw.empty()) return Fail(ErrorCode::kInvalidArgument, "missing value");
  if (raw.front() != '"') {
    if (size_t hash = raw.find('#'); hash != std::string_view::npos) raw = raw.substr(0, hash);
    raw = Trim(raw);
    if (raw.find_first_of(" \t\"'") != std::string_view::npos) {
      return Fail(ErrorCode::kInvalidArgument, "strings must be double-quoted");
    }
    return std::string(raw);
  }
  std::string out;
  size_t i = 1;
  for (; i < raw.size() && raw[i] != '"'; ++i) {
    if (raw[i] == '\\') {
      if (i + 1 >= raw.size() || (raw[i + 1] != '"' && raw[i + 1] != '\\')) {
        return Fail(ErrorCode::kInvalidArgument, "only \\\" and \\\\ escapes are supported");
      }
      ++i;
    }
    out += raw[i];
  }
  if (i >= raw.size()) return Fail(ErrorCode::kInvalidArgument, "unterminated string");
  std::string_view rest = Trim(raw.substr(i + 1));
  if (!rest.empty() && rest.front() != '#') {
    return Fail(ErrorCode::kInvalidArgument, "unexpected text after the value");
  }
  return out;
}

// A whole decimal number from lo to hi, or an error naming the setting.
Result<int> ParseIntIn(const std::string& key, std::string_view value, int lo, int hi) {
  int n = 0;
  auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), n);
  if (ec != std::errc() || end != value.data() + value.size() || n < lo || n > hi) {
    return Fail(ErrorCode::kInvalidArgument, key + " must be a number from " + std::to_string(lo) +
                                                 " to " + std::to_string(hi));
  }
  return n;
}

// "0", or a whole number followed by s, m, h or d ("90s", "12h", "7d"), up to 10 years.
Result<int64_t> ParseDuration(const std::string& key, std::string_view value) {
  auto bad = [&] {
    return Fail(ErrorCode::kInvalidArgument,
                key + " must be 0 or a number followed by s, m, h or d (\"7d\"), at most 3650d");
  };
  if (value == "0") return 0;
  if (value.size() < 2) return bad();
  int64_t unit = 0;
  switch (value.back()) {
    case 's':
      unit = 1;
      break;
    case 'm':
      unit = 60;
      break;
    case 'h':
      unit = 3600;
      break;
    case 'd':
      unit = 86400;
      break;
    default:
      return bad();
  }
  value.remove_suffix(1);
  int64_t n = 0;
  auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), n);
  if (ec != std::errc() || end != value.data() + value.size() || n < 0 ||
      n > 3650 * 86400 / unit) {
    return bad();
  }
  return n * unit;
}

}  // namespace

Status Config::Set(std::string_view raw_key, std::string_view value) {
  const std::string key = Normalize(raw_key);
  if (key == "listen") {
    listen = value;
  } else if (key == "state_dir") {
    if (value.empty()) return Fail(ErrorCode::kInvalidArgument, "state_dir must not be empty");
    state_dir = value;
  } else if (key == "no_auth") {
    auto b = ParseBool(key, value);
    if (!b) return std::unexpected(b.error());
    no_auth = *b;
  } else if (key == "base_usr_local") {  // an older name of engine.jail.base_usr_local
    auto b = ParseBool(key, value);
    if (!b) return std::unexpected(b.error());
    engines["jail"]["base_usr_local"] = *b ? "true" : "false";
  } else if (key == "image_dir") {
    if (!value.starts_with('/')) {
      return Fail(ErrorCode::kInvalidArgument, "image_dir must be an absolute path");
    }
    image_dir = value;
  } else if (key == "debian_mirror") {
    if (!value.starts_with("http://") && !value.starts_with("https://") &&
        !value.starts_with("file:/")) {
      return Fail(ErrorCode::kInvalidArgument, "debian_mirror must be an http(s):// or file: URL");
    }
    debian_mirror = value;
  } else if (key == "network_id") {
    network_id = value;
  } else if (key == "network_subnet") {
    network_subnet = value;
  } else if (key == "network_uplink") {
    network_uplink = value;
  } else if (key == "network_dns") {
    network_dns = value;
  } else if (key == "network_upstream_ca") {
    if (!value.starts_with('/')) {
      return Fail(ErrorCode::kInvalidArgument, "network_upstream_ca must be an absolute path");
    }
    network_upstream_ca = value;
  } else if (key == "network_ipv6") {
    if (value != "auto" && value != "on" && value != "off") {
      return Fail(ErrorCode::kInvalidArgument, "network_ipv6 must be auto, on or off");
    }
    network_ipv6 = value;
  } else if (key == "network_subnet6") {
    network_subnet6 = value;
  } else if (key == "network_bandwidth_mbps") {
    auto n = ParseIntIn(key, value, 0, 100'000);
    if (!n) return std::unexpected(n.error());
    network_bandwidth_mbps = *n;
  } else if (key == "network_max_connections") {
    auto n = ParseIntIn(key, value, 1, 65'536);
    if (!n) return std::unexpected(n.error());
    network_max_connections = *n;
  } else if (key == "network_warm_links") {
    auto n = ParseIntIn(key, value, 0, 256);
    if (!n) return std::unexpected(n.error());
    network_warm_links = *n;
  } else if (key == "network_events_keep") {
    auto n = ParseIntIn(key, value, 1, 1'000'000);
    if (!n) return std::unexpected(n.error());
    network_events_keep = *n;
  } else if (key == "network_events_flush_ms") {
    auto n = ParseIntIn(key, value, 10, 60'000);
    if (!n) return std::unexpected(n.error());
    network_events_flush_ms = *n;
  } else if (key == "events") {
    if (value != "on" && value != "off") {
      return Fail(ErrorCode::kInvalidArgument, "events: expected on or off, got '" + std::string(value) + "'");
    }
    events = value == "on";
  } else if (key == "events_keep") {
    auto n = ParseIntIn(key, value, 1, 10'000'000);
    if (!n) return std::unexpected(n.error());
    events_keep = *n;
  } else if (key == "events_rate") {
    auto n = ParseIntIn(key, value, 1, 1'000'000);
    if (!n) return std::unexpected(n.error());
    events_rate = *n;
  } else if (key == "events_burst") {
    auto n = ParseIntIn(key, value, 1, 1'000'000);
    if (!n) return std::unexpected(n.error());
    events_burst = *n;
  } else if (key == "metrics_interval_ms") {
    auto n = ParseIntIn(key, value, 0, 3'600'000);
    if (!n) return std::unexpected(n.error());
    if (*n > 0 && *n < 100) {
      return Fail(ErrorCode::kInvalidArgument, "metrics_interval_ms must be 0 (off) or 100 or more");
    }
    metrics_interval_ms = *n;
  } else if (key == "metrics_keep") {
    auto n = ParseIntIn(key, value, 1, 100'000);
    if (!n) return std::unexpected(n.error());
    metrics_keep = *n;
  } else if (key == "destroyed_keep") {
    auto seconds = ParseDuration(key, value);
    if (!seconds) return std::unexpected(seconds.error());
    destroyed_keep_seconds = *seconds;
  } else if (key == "agent") {
    agent = value;
  } else if (key == "launcher") {  // an older name of engine.jail.launcher
    engines["jail"]["launcher"] = value;
  } else if (key == "default_engine") {
    if (!ValidEngineName(value)) {
      return Fail(ErrorCode::kInvalidArgument, "default_engine must be an engine's name");
    }
    default_engine = value;
  } else if (key == "log_level") {
    static const std::set<std::string_view> kLevels = {"trace", "debug", "info",
                                                       "warn",  "error", "off"};
    if (!kLevels.contains(value)) {
      return Fail(ErrorCode::kInvalidArgument,
                  "log_level must be trace, debug, info, warn, error or off");
    }
    log_level = value;
  } else if (key == "log_format") {
    if (value != "text" && value != "json") {
      return Fail(ErrorCode::kInvalidArgument, "log_format must be text or json");
    }
    log_format = value;
  } else if (key == "log_requests") {
    auto b = ParseBool(key, value);
    if (!b) return std::unexpected(b.error());
    log_requests = *b;
  } else if (key == "on_shutdown") {
    if (value == "keep") {
      on_shutdown = OnShutdown::kKeep;
    } else if (value == "destroy") {
      on_shutdown = OnShutdown::kDestroy;
    } else {
      return Fail(ErrorCode::kInvalidArgument, "on_shutdown must be keep or destroy");
    }
  } else if (key == "workers") {
    auto n = ParseIntIn(key, value, 1, 1024);
    if (!n) return std::unexpected(n.error());
    workers = *n;
  } else if (key.starts_with("engine.")) {
    // engine.<name>.<option>: the option goes to that engine, which checks it at start;
    // `enabled` is the registry's.
    const std::string rest = key.substr(7);
    const size_t dot = rest.find('.');
    const std::string name = rest.substr(0, dot);
    if (dot == std::string::npos || !ValidEngineName(name) || dot + 1 == rest.size()) {
      return Fail(ErrorCode::kInvalidArgument,
                  key + ": want engine.<name>.<option> (or an [engine.<name>] table)");
    }
    const std::string option = Normalize(rest.substr(dot + 1));
    if (option == "enabled") {
      auto b = ParseBool(key, value);
      if (!b) return std::unexpected(b.error());
    }
    engines[name][option] = value;
  } else if (key.starts_with("pool.")) {
    // A TOML dotted key: pool.<template>. The template must exist; main checks that.
    const std::string name = key.substr(5);
    if (auto valid = api::CheckTemplateName(name); !valid) {
      return Fail(ErrorCode::kInvalidArgument, key + ": " + valid.error().message());
    }
    auto n = ParseIntIn(key, value, 0, static_cast<int>(api::kMaxPoolSize));
    if (!n) return std::unexpected(n.error());
    pools[name] = *n;
  } else {
    return Fail(ErrorCode::kInvalidArgument, "unknown setting '" + std::string(raw_key) + "'");
  }
  return {};
}

Status Config::ApplyFile(std::string_view text) {
  std::set<std::string> seen;
  std::string table;  // "engine.<name>." inside an [engine.<name>] table
  int line_no = 0;
  while (!text.empty()) {
    ++line_no;
    const size_t nl = text.find('\n');
    std::string_view line = Trim(text.substr(0, nl));
    text.remove_prefix(nl == std::string_view::npos ? text.size() : nl + 1);
    auto fail = [&](const std::string& why) {
      return Fail(ErrorCode::kInvalidArgument, "line " + std::to_string(line_no) + ": " + why);
    };
    if (line.empty() || line.front() == '#') continue;
    if (line.front() == '[') {
      // Only [engine.<name>]: the keys after it are that engine's, until the next table.
      const size_t close = line.find(']');
      const std::string_view name = close == std::string_view::npos ? "" : line.substr(1, close - 1);
      if (close == std::string_view::npos || !name.starts_with("engine.") ||
          !ValidEngineName(name.substr(7)) || !Trim(line.substr(close + 1)).empty()) {
        return fail("the only tables are [engine.<name>]");
      }
      table = std::string(name) + ".";
      continue;
    }
    const size_t eq = line.find('=');
    if (eq == std::string_view::npos) return fail("expected key = value");
    const std::string key = table + Normalize(Trim(line.substr(0, eq)));
    if (key.empty()) return fail("missing key");
    if (!seen.insert(key).second) return fail(key + " is set twice");
    auto value = ParseValue(line.substr(eq + 1));
    if (!value) return fail(key + ": " + value.error().message());
    if (auto st = Set(key, *value); !st) return fail(st.error().message());
  }
  return {};
}

}  // namespace airlock::daemon
