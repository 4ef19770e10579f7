// airlock engines: the daemon's isolation engines (GET /v1/engines, docs/design/engines.md).

#include "cli/commands.h"
#include "cli/table.h"

namespace airlock::cli {
namespace {

using nlohmann::json;

// What an engine can do, as one cell: the capabilities it has, by name.
std::string CanDo(const json& capabilities) {
  std::string out;
  for (const char* name : {"limits", "pause", "live_limits", "layer_snapshot", "memory_checkpoint",
                           "memory_checkpoint_network", "memory_fork", "host_usr_root",
                           "networking", "process_events"}) {
    if (capabilities.value(name, false)) out += (out.empty() ? "" : ",") + std::string(name);
  }
  return out + (out.empty() ? "" : ",") + "max_layers=" +
         std::to_string(capabilities.value("max_layers", 0));
}

}  // namespace

Outcome<int> CmdEngines(const CommandArgs& in, Globals& globals) {
  auto args = Parse("engines", in, {}, globals);
  if (!args) return std::unexpected(args.error());
  if (args->help) return PrintUsage("engines");
  if (!args->positional.empty()) return UsageError("engines", "takes no arguments");
  auto api = Api::Connect(globals);
  if (!api) return std::unexpected(api.error());
  auto doc = api->CallJson("GET", "/v1/engines");
  if (!doc) return std::unexpected(doc.error());
  if (!doc->is_object() || !(*doc)["engines"].is_array()) {
    return CommandError("the daemon's reply has no engines array");
  }
  const json& list = (*doc)["engines"];
  if (globals.json) return PrintJson(list);
  std::vector<std::vector<std::string>> rows;
  for (const json& e : list) {
    const bool available = e.value("available", false);
    rows.push_back({Text(e, "name"), available ? "yes" : "no",
                    e.value("default", false) ? "yes" : "",
                    available ? CanDo(e.value("capabilities", json::object())) : Text(e, "reason")});
  }
  PrintText(FormatTable({"NAME", "AVAILABLE", "DEFAULT", "CAPABILITIES / WHY NOT"}, rows));
  return 0;
}

}  // namespace airlock::cli
