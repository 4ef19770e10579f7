// Tenants (docs/design/tenancy.md, "Quotas"): tenants quota NAME ... (admin) and tenants show
// NAME (an admin for any tenant, another key for its own).

#include <charconv>
#include <cmath>

#include "cli/commands.h"
#include "cli/table.h"

namespace airlock::cli {
namespace {

using nlohmann::json;

// The flags of `tenants quota` and the quota's fields they set.
struct QuotaFlag {
  const char* flag;
  const char* field;
  bool fraction;  // a number (cpus); the others are whole numbers
};
constexpr QuotaFlag kQuotaFlags[] = {{"sandboxes", "sandboxes", false},
                                     {"cpus", "cpus", true},
                                     {"memory", "memory_mb", false},
                                     {"disk", "disk_mb", false},
                                     {"creates-per-minute", "creates_per_minute", false}};

std::string Number(const json& v) {
  if (v.is_number_integer()) return std::to_string(v.get<int64_t>());
  if (v.is_number()) {
    std::string s = std::to_string(v.get<double>());
    while (s.back() == '0') s.pop_back();
    if (s.back() == '.') s.pop_back();
    return s;
  }
  return "?";
}

// KIND, USED, QUOTA rows of a tenant ("unlimited" for 0).
Outcome<int> PrintTenant(const json& doc, Globals& globals) {
  if (globals.json) return PrintJson(doc);
  if (!doc.is_object() || !doc["quota"].is_object() || !doc["usage"].is_object()) {
    return CommandError("the daemon's reply has no quota and usage");
  }
  const json& quota = doc["quota"];
  const json& usage = doc["usage"];
  auto limit = [&](const char* field, const char* unit) {
    const json& v = quota.value(field, json(0));
    return v.is_number() && v.get<double>() > 0 ? Number(v) + unit : std::string("unlimited");
  };
  std::vector<std::vector<std::string>> rows = {
      {"sandboxes", Number(usage.value("sandboxes", json(0))), limit("sandboxes", "")},
      {"cpus", Number(usage.value("cpus", json(0))), limit("cpus", "")},
      {"memory", Number(usage.value("memory_mb", json(0))) + " MiB", limit("memory_mb", " MiB")},
      {"disk", Number(usage.value("disk_mb", json(0))) + " MiB", limit("disk_mb", " MiB")},
      {"creates/min", Number(usage.value("creates_last_minute", json(0))),
       limit("creates_per_minute", "")}};
  std::printf("tenant %s\n", Text(doc, "name").c_str());
  PrintText(FormatTable({"KIND", "USED", "QUOTA"}, rows));
  return 0;
}

Outcome<int> Quota(const Args& args, Globals& globals) {
  if (args.positional.size() != 2) return UsageError("tenants", "quota wants one tenant NAME");
  json request = json::object();
  for (const QuotaFlag& f : kQuotaFlags) {
    auto value = args.Last(f.flag);
    if (!value) continue;
    const std::string& text = *value;
    if (f.fraction) {
      char* end = nullptr;
      const double v = std::strtod(text.c_str(), &end);
      if (text.empty() || *end != '\0' || !std::isfinite(v) || v < 0) {
        return UsageError("tenants",
                          std::string("--") + f.flag + " takes a number >= 0, got '" + text + "'");
      }
      request[f.field] = v;
    } else {
      int64_t v = 0;
      auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
      if (ec != std::errc() || end != text.data() + text.size() || v < 0) {
        return UsageError("tenants", std::string("--") + f.flag +
                                         " takes a whole number >= 0, got '" + text + "'");
      }
      request[f.field] = v;
    }
  }
  auto api = Api::Connect(globals);
  if (!api) return std::unexpected(api.error());
  const std::string path = "/v1/tenants/" + args.positional[1] + "/quota";
  if (args.Has("remove")) {
    if (!request.empty()) return UsageError("tenants", "--remove takes no other flag");
    auto gone = api->Call("DELETE", path);
    if (!gone) return std::unexpected(gone.error());
    return 0;
  }
  if (request.empty()) {
    return UsageError("tenants",
                      "quota wants at least one of --sandboxes, --cpus, --memory, "
                      "--disk, --creates-per-minute (or --remove)");
  }
  auto doc = api->CallJson("PUT", path, &request);
  if (!doc) return std::unexpected(doc.error());
  return PrintTenant(*doc, globals);
}

Outcome<int> Show(const Args& args, Globals& globals) {
  if (args.positional.size() != 2) return UsageError("tenants", "show wants one tenant NAME");
  auto api = Api::Connect(globals);
  if (!api) return std::unexpected(api.error());
  auto doc = api->CallJson("GET", "/v1/tenants/" + args.positional[1]);
  if (!doc) return std::unexpected(doc.error());
  return PrintTenant(*doc, globals);
}

}  // namespace

Outcome<int> CmdTenants(const CommandArgs& in, Globals& globals) {
  static const FlagSpec kFlags[] = {
      {"sandboxes", true},          {"cpus", true},   {"memory", true}, {"disk", true},
      {"creates-per-minute", true}, {"remove", false}};
  auto args = Parse("tenants", in, kFlags, globals);
  if (!args) return std::unexpected(args.error());
  if (args->help || args->positional.empty()) return PrintUsage("tenants");
  const std::string sub = args->positional[0];
  if (sub == "quota") return Quota(*args, globals);
  if (sub == "show") return Show(*args, globals);
  return UsageError("tenants", "unknown subcommand '" + sub + "' (quota, show)");
}

}  // namespace airlock::cli
