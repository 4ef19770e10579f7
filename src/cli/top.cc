// airlock top and airlock metrics: what sandboxes use, from the samples the daemon takes every
// few seconds (GET /v1/sandboxes/{id}/metrics, docs/design/metrics.md).

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <thread>

#include "cli/commands.h"
#include "cli/table.h"

namespace airlock::cli {
namespace {

using nlohmann::json;

std::string Bytes(const json& sample, const char* key) {
  const double b = sample.value(key, 0.0);
  char buf[32];
  if (b >= 1024.0 * 1024 * 1024) {
    std::snprintf(buf, sizeof buf, "%.1fG", b / (1024.0 * 1024 * 1024));
  } else if (b >= 1024.0 * 1024) {
    std::snprintf(buf, sizeof buf, "%.1fM", b / (1024.0 * 1024));
  } else if (b >= 1024.0) {
    std::snprintf(buf, sizeof buf, "%.1fK", b / 1024.0);
  } else {
    std::snprintf(buf, sizeof buf, "%.0fB", b);
  }
  return buf;
}

std::string Fixed(double v, const char* format) {
  char buf[32];
  std::snprintf(buf, sizeof buf, format, v);
  return buf;
}

// The columns of one sample: CPU% (of one core), CPU-S, MEM, PEAK, PIDS, DISK, NET-IN, NET-OUT.
std::vector<std::string> SampleCells(const json& m) {
  return {Fixed(m.value("cpu_cores", 0.0) * 100, "%.1f"), Fixed(m.value("cpu_seconds", 0.0), "%.2f"),
          Bytes(m, "memory_bytes"), Bytes(m, "memory_peak_bytes"),
          std::to_string(m.value("pids", 0)), Bytes(m, "disk_bytes"), Bytes(m, "net_rx_bytes"),
          Bytes(m, "net_tx_bytes")};
}

const std::vector<std::string> kSampleHeader = {"CPU%", "CPU-S", "MEM",    "PEAK",
                                                "PIDS", "DISK",  "NET-IN", "NET-OUT"};

// One screen of `airlock top`: every sandbox the key sees with its newest sample.
Outcome<std::string> TopScreen(Api& api) {
  auto doc = api.CallJson("GET", "/v1/sandboxes");
  if (!doc) return std::unexpected(doc.error());
  if (!doc->is_object() || !(*doc)["sandboxes"].is_array()) {
    return CommandError("the daemon's list reply has no sandboxes array");
  }
  std::vector<std::vector<std::string>> rows;
  for (const json& s : (*doc)["sandboxes"]) {
    const std::string id = Text(s, "id");
    std::vector<std::string> row = {id, Text(s, "state"), Text(s, "engine")};
    auto metrics = api.CallJson("GET", "/v1/sandboxes/" + id + "/metrics?limit=1");
    const json* newest = nullptr;
    if (metrics && metrics->is_object() && (*metrics)["samples"].is_array() &&
        !(*metrics)["samples"].empty()) {
      newest = &(*metrics)["samples"].back();
    }
    if (newest) {
      for (std::string& cell : SampleCells(*newest)) row.push_back(std::move(cell));
    } else {
      row.insert(row.end(), kSampleHeader.size(), "-");  // not sampled yet, or gone meanwhile
    }
    rows.push_back(std::move(row));
  }
  std::vector<std::string> header = {"ID", "STATE", "ENGINE"};
  header.insert(header.end(), kSampleHeader.begin(), kSampleHeader.end());
  return FormatTable(header, rows);
}

}  // namespace

Outcome<int> CmdTop(const CommandArgs& in, Globals& globals) {
  static const std::vector<FlagSpec> kFlags = {{"once", false}, {"interval", true}};
  auto args = Parse("top", in, kFlags, globals);
  if (!args) return std::unexpected(args.error());
  if (args->help) return PrintUsage("top");
  if (!args->positional.empty()) {
    return UsageError("top", "unexpected argument '" + args->positional[0] + "'");
  }
  double interval = 2;
  if (auto v = args->Last("interval")) {
    auto n = ParseNumber("top", "interval", *v);
    if (!n) return std::unexpected(n.error());
    if (*n < 0.2 || *n > 3600) return UsageError("top", "--interval must be 0.2 to 3600 seconds");
    interval = *n;
  }
  auto api = Api::Connect(globals);
  if (!api) return std::unexpected(api.error());
  const bool once = args->Has("once") || globals.json || !::isatty(STDOUT_FILENO);
  while (true) {
    auto screen = TopScreen(*api);
    if (!screen) return std::unexpected(screen.error());
    if (once) {
      PrintText(*screen);
      return 0;
    }
    // Clear the terminal, home the cursor, draw.
    PrintText("\x1b[H\x1b[2J" + *screen);
    std::this_thread::sleep_for(std::chrono::duration<double>(interval));
  }
}

Outcome<int> CmdMetrics(const CommandArgs& in, Globals& globals) {
  static const std::vector<FlagSpec> kFlags = {{"start", true}, {"end", true}, {"limit", true}};
  auto args = Parse("metrics", in, kFlags, globals);
  if (!args) return std::unexpected(args.error());
  if (args->help) return PrintUsage("metrics");
  if (args->positional.size() != 1) return UsageError("metrics", "takes one sandbox id");
  std::string query;
  for (const char* key : {"start", "end", "limit"}) {
    if (auto v = args->Last(key)) {
      auto n = ParseInteger("metrics", key, *v);
      if (!n) return std::unexpected(n.error());
      query += (query.empty() ? "?" : "&") + std::string(key) + "=" + std::to_string(*n);
    }
  }
  auto api = Api::Connect(globals);
  if (!api) return std::unexpected(api.error());
  auto doc = api->CallJson("GET", "/v1/sandboxes/" + args->positional[0] + "/metrics" + query);
  if (!doc) return std::unexpected(doc.error());
  if (!doc->is_object() || !(*doc)["samples"].is_array()) {
    return CommandError("the daemon's reply has no samples array");
  }
  if (globals.json) return PrintJson(*doc);
  std::vector<std::vector<std::string>> rows;
  for (const json& m : (*doc)["samples"]) {
    std::vector<std::string> row = {std::to_string(m.value("at_ms", int64_t{0}))};
    for (std::string& cell : SampleCells(m)) row.push_back(std::move(cell));
    rows.push_back(std::move(row));
  }
  std::vector<std::string> header = {"AT_MS"};
  header.insert(header.end(), kSampleHeader.begin(), kSampleHeader.end());
  PrintText(FormatTable(header, rows));
  return 0;
}

}  // namespace airlock::cli
