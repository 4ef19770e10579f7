// API keys (docs/design/tenancy.md): keys create / list / revoke, for admin keys.

#include <charconv>

#include "cli/commands.h"
#include "cli/table.h"

namespace airlock::cli {
namespace {

using nlohmann::json;

Outcome<int> Create(const Args& args, Globals& globals) {
  if (args.positional.size() != 2) return UsageError("keys", "create wants one NAME");
  auto tenant = args.Last("tenant");
  if (!tenant) return UsageError("keys", "create needs --tenant TENANT");
  const json request = {
      {"name", args.positional[1]}, {"tenant", *tenant}, {"admin", args.Has("admin")}};
  auto api = Api::Connect(globals);
  if (!api) return std::unexpected(api.error());
  auto doc = api->CallJson("POST", "/v1/keys", &request);
  if (!doc) return std::unexpected(doc.error());
  if (globals.json) return PrintJson(*doc);
  // The key alone on stdout (it is shown this once); what it is on stderr.
  std::fprintf(stderr, "key %lld (%s) of tenant %s%s; store it now, it is not shown again\n",
               static_cast<long long>(doc->value("id", int64_t{0})), Text(*doc, "name").c_str(),
               Text(*doc, "tenant").c_str(), doc->value("admin", false) ? ", admin" : "");
  std::printf("%s\n", Text(*doc, "key").c_str());
  return 0;
}

Outcome<int> List(Globals& globals) {
  auto api = Api::Connect(globals);
  if (!api) return std::unexpected(api.error());
  auto doc = api->CallJson("GET", "/v1/keys");
  if (!doc) return std::unexpected(doc.error());
  if (!doc->is_object() || !(*doc)["keys"].is_array()) {
    return CommandError("the daemon's reply has no keys array");
  }
  const json& list = (*doc)["keys"];
  if (globals.json) return PrintJson(list);
  std::vector<std::vector<std::string>> rows;
  for (const json& k : list) {
    rows.push_back({std::to_string(k.value("id", int64_t{0})), Text(k, "name"), Text(k, "tenant"),
                    k.value("admin", false) ? "yes" : "no",
                    k.value("revoked", false) ? "yes" : "no", Text(k, "created_at")});
  }
  PrintText(FormatTable({"ID", "NAME", "TENANT", "ADMIN", "REVOKED", "CREATED"}, rows));
  return 0;
}

Outcome<int> Revoke(const Args& args, Globals& globals) {
  if (args.positional.size() < 2) return UsageError("keys", "revoke wants key IDs");
  for (size_t i = 1; i < args.positional.size(); ++i) {
    const std::string& id = args.positional[i];
    int64_t n = 0;
    auto [end, ec] = std::from_chars(id.data(), id.data() + id.size(), n);
    if (ec != std::errc() || end != id.data() + id.size() || n <= 0) {
      return UsageError("keys", "a key ID is a number (see airlock keys list), got '" + id + "'");
    }
  }
  auto api = Api::Connect(globals);
  if (!api) return std::unexpected(api.error());
  for (size_t i = 1; i < args.positional.size(); ++i) {
    auto gone = api->Call("DELETE", "/v1/keys/" + args.positional[i]);
    if (!gone) return std::unexpected(gone.error());
  }
  return 0;
}

}  // namespace

Outcome<int> CmdKeys(const CommandArgs& in, Globals& globals) {
  static const FlagSpec kFlags[] = {{"tenant", true}, {"admin", false}};
  auto args = Parse("keys", in, kFlags, globals);
  if (!args) return std::unexpected(args.error());
  if (args->help || args->positional.empty()) return PrintUsage("keys");
  const std::string sub = args->positional[0];
  if (sub == "create") return Create(*args, globals);
  if (sub == "list" || sub == "ls") {
    if (args->positional.size() != 1) return UsageError("keys", "list takes no arguments");
    return List(globals);
  }
  if (sub == "revoke") return Revoke(*args, globals);
  return UsageError("keys", "unknown subcommand '" + sub + "' (create, list, revoke)");
}

}  // namespace airlock::cli
