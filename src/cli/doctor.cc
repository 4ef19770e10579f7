// airlock doctor: this host judged as airlockd would at start (`airlockd --doctor`, which builds
// and probes every engine), then the daemon asked whether it is up, which version it runs and
// whether its engines (GET /v1/engines) agree (docs/doctor.md).

#include <sys/wait.h>

#include <cstdio>

#include "cli/commands.h"
#include "cli/subprocess.h"
#include "common/build_id.h"
#include "common/helpers.h"

namespace airlock::cli {
namespace {

using nlohmann::json;

json Finding(std::string check, std::string_view verdict, std::string detail,
             std::string fix = "") {
  return {{"check", std::move(check)},
          {"verdict", verdict},
          {"detail", std::move(detail)},
          {"fix", std::move(fix)}};
}

std::string FirstLine(const std::string& text) { return text.substr(0, text.find('\n')); }

// The host's findings and engines from `airlockd --doctor --json`.
json HostReport(const Args& args) {
  const std::string airlockd = args.Last("airlockd").value_or(FindHelper("airlockd"));
  if (airlockd.empty()) {
    return {{"findings", json::array({Finding("airlockd", "fail",
                                              "not found beside airlock, in ../libexec/airlock/ "
                                              "or in its build tree",
                                              "reinstall the package, or give --airlockd PATH")})}};
  }
  std::vector<std::string> argv = {airlockd, "--doctor", "--json"};
  for (const char* flag : {"config", "state-dir"}) {
    if (auto value = args.Last(flag)) argv.insert(argv.end(), {std::string("--") + flag, *value});
  }
  auto ran = RunCaptured(argv, {});
  if (!ran) {
    return {{"findings", json::array({Finding("airlockd", "fail", ran.error().message)})}};
  }
  json doc = json::parse(ran->out, nullptr, /*allow_exceptions=*/false);
  if (!doc.is_object() || !doc["findings"].is_array()) {
    return {{"findings", json::array({Finding("airlockd", "fail",
                                              airlockd + " --doctor: " +
                                                  (ran->err.empty() ? std::string("no report")
                                                                    : FirstLine(ran->err)),
                                              "airlockd --check-config names a bad setting")})}};
  }
  return doc;
}

// The daemon: reachable, its version, and its engines against the host's.
void DaemonFindings(Globals& globals, const json& host_engines, json& findings) {
  auto api = Api::Connect(globals);
  if (!api) {
    findings.push_back(Finding("daemon", "warn", api.error().message));
    return;
  }
  auto health = api->CallJson("GET", "/healthz");
  if (!health) {
    findings.push_back(Finding("daemon", "warn", "not reachable: " + health.error().message,
                               "start it: systemctl start airlockd (docs/install.md), or airlockd "
                               "--state-dir DIR on a laptop (docs/quickstart.md)"));
    return;
  }
  const std::string version = health->is_object() ? health->value("version", "?") : "?";
  if (version != kBuildId) {
    findings.push_back(Finding("daemon", "warn",
                               "up, running airlockd " + version + "; this CLI is " + kBuildId,
                               "restart the daemon after an upgrade: systemctl restart airlockd"));
  } else {
    findings.push_back(Finding("daemon", "ok", "up, running airlockd " + version));
  }
  auto engines = api->CallJson("GET", "/v1/engines");
  if (!engines || !engines->is_object() || !(*engines)["engines"].is_array()) {
    findings.push_back(Finding(
        "daemon engines", "warn",
        "GET /v1/engines: " + (engines ? std::string("no engines array") : engines.error().message),
        "give the admin key (--api-key, or run as root beside the state "
        "dir's admin.key)"));
    return;
  }
  std::vector<std::string> disagree;
  std::string listed;
  for (const json& e : (*engines)["engines"]) {
    const std::string name = e.value("name", "?");
    const bool daemon_has = e.value("available", false);
    listed += (listed.empty() ? "" : ", ") + name + (daemon_has ? " available" : " unavailable");
    for (const json& h : host_engines) {
      if (h.value("name", "") != name || h.value("available", false) == daemon_has) continue;
      disagree.push_back(name +
                         (daemon_has ? " is available to the daemon but not here now ("
                                     : " is unavailable to the daemon (") +
                         (daemon_has ? h.value("reason", "") : e.value("reason", "")) + ")");
    }
  }
  if (disagree.empty()) {
    findings.push_back(Finding("daemon engines", "ok", "GET /v1/engines agrees: " + listed));
  } else {
    std::string detail = "GET /v1/engines disagrees with this host: ";
    for (size_t i = 0; i < disagree.size(); ++i) detail += (i ? "; " : "") + disagree[i];
    findings.push_back(Finding("daemon engines", "warn", detail,
                               "the daemon probes its engines at start: restart it "
                               "(systemctl restart airlockd) to pick up what changed"));
  }
}

std::string Render(const json& findings) {
  std::string out;
  for (const json& f : findings) {
    char head[64];
    std::snprintf(head, sizeof head, "%-5s %-16s ", f.value("verdict", "?").c_str(),
                  f.value("check", "?").c_str());
    out += head + f.value("detail", "") + "\n";
    if (const std::string fix = f.value("fix", ""); !fix.empty()) {
      out += std::string(23, ' ') + "fix: " + fix + "\n";
    }
  }
  return out;
}

}  // namespace

Outcome<int> CmdDoctor(const CommandArgs& in, Globals& globals) {
  static const FlagSpec kFlags[] = {{"config", true}, {"state-dir", true}, {"airlockd", true}};
  auto args = Parse("doctor", in, kFlags, globals);
  if (!args) return std::unexpected(args.error());
  if (args->help) return PrintUsage("doctor");
  if (!args->positional.empty()) return UsageError("doctor", "takes no arguments");
  json report = HostReport(*args);
  json findings = report["findings"];
  DaemonFindings(globals, report.value("engines", json::array()), findings);
  bool ready = true;
  for (const json& f : findings) ready = ready && f.value("verdict", "") != "fail";
  if (globals.json) {
    auto printed = PrintJson({{"ready", ready},
                              {"default_engine", report.value("default_engine", "")},
                              {"findings", findings},
                              {"engines", report.value("engines", json::array())}});
    if (!printed) return printed;
  } else {
    PrintText(Render(findings) +
              (ready ? "ready: airlockd can run its default engine here\n"
                     : "not ready: airlockd cannot run its default engine here (see the failures "
                       "above)\n"));
  }
  return ready ? 0 : 1;
}

}  // namespace airlock::cli
