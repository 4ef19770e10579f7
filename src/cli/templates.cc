// Templates, snapshots and forks (docs/design/templates.md): template build / ls / rm,
// snapshot, fork.

#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <toml++/toml.h>

#include "cli/commands.h"
#include "cli/table.h"
#include "daemon/api/base64.h"

namespace airlock::cli {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// A copy step of the file: its bytes as base64, its permission bits unless the step gives some.
Outcome<json> CopyOf(const fs::path& file, const std::string& path, const json& mode) {
  std::ifstream in(file, std::ios::binary);
  if (!in) return CommandError("cannot read " + file.string());
  std::ostringstream bytes;
  bytes << in.rdbuf();
  json copy = {{"path", path}, {"content", api::Base64Encode(bytes.str())}, {"encoding", "base64"}};
  if (!mode.is_null()) {
    copy["mode"] = mode;
  } else {
    std::error_code ec;
    const auto perms = fs::status(file, ec).permissions();
    char octal[8];
    std::snprintf(octal, sizeof octal, "%04o", static_cast<unsigned>(perms) & 07777u);
    copy["mode"] = octal;
  }
  return json{{"copy", std::move(copy)}};
}

// The template request a TOML file describes: the same fields as the API's, with copy steps
// that name a local file or directory as `src` (relative to the file) instead of `content`.
// A directory becomes one copy step per regular file under it.
Outcome<json> RequestFromToml(const std::string& file) {
  json doc;
  try {
    toml::table table = toml::parse_file(file);
    std::ostringstream text;
    text << toml::json_formatter{table};
    doc = json::parse(text.str());
  } catch (const toml::parse_error& e) {
    std::ostringstream where;
    where << e.source().begin;
    return UsageError("template build", file + ": " + std::string(e.description()) + " (" +
                                            where.str() + ")");
  } catch (const std::exception& e) {
    return UsageError("template build", file + ": " + e.what());
  }
  const fs::path dir = fs::path(file).parent_path();
  // A relative path as the base is an image archive next to the file; the daemon (on this
  // host) is given its absolute path.
  if (doc.contains("base") && doc["base"].is_string()) {
    const std::string base = doc["base"].get<std::string>();
    if (base.find('/') != std::string::npos && !base.starts_with('/')) {
      doc["base"] = fs::absolute(dir / base).lexically_normal().string();
    }
  }
  if (!doc.contains("steps")) return doc;
  if (!doc["steps"].is_array()) return UsageError("template build", "steps must be an array");
  json steps = json::array();
  for (json& step : doc["steps"]) {
    if (!step.is_object() || !step.contains("copy") || !step["copy"].is_object() ||
        !step["copy"].contains("src")) {
      steps.push_back(std::move(step));
      continue;
    }
    const json& copy = step["copy"];
    if (!copy["src"].is_string() || !copy.contains("path") || !copy["path"].is_string()) {
      return UsageError("template build", "a copy step with src needs src and path strings");
    }
    const fs::path src = dir / copy["src"].get<std::string>();
    const std::string path = copy["path"].get<std::string>();
    const json mode = copy.value("mode", json());
    std::error_code ec;
    if (fs::is_directory(src, ec)) {
      std::vector<fs::path> files;
      for (const auto& entry : fs::recursive_directory_iterator(src, ec)) {
        if (entry.is_regular_file()) files.push_back(entry.path());
      }
      if (ec) return CommandError("reading " + src.string() + ": " + ec.message());
      std::sort(files.begin(), files.end());
      for (const fs::path& f : files) {
        auto one = CopyOf(f, path + "/" + fs::relative(f, src).string(), mode);
        if (!one) return std::unexpected(one.error());
        steps.push_back(std::move(*one));
      }
    } else {
      auto one = CopyOf(src, path, mode);
      if (!one) return std::unexpected(one.error());
      steps.push_back(std::move(*one));
    }
  }
  doc["steps"] = std::move(steps);
  return doc;
}

// Builds with streamed events: each step named on stderr, its output as it comes.
Outcome<int> Build(const std::string& file, const std::optional<std::string>& name,
                   Globals& globals) {
  auto request = RequestFromToml(file);
  if (!request) return std::unexpected(request.error());
  if (name) (*request)["name"] = *name;
  if (!request->contains("name")) return UsageError("template build", "the template needs a name");
  (*request)["stream"] = true;
  auto api = Api::Connect(globals);
  if (!api) return std::unexpected(api.error());
  api->AllowAtLeast(std::chrono::hours(6));
  std::optional<json> done;
  std::optional<Failure> failure;
  auto streamed = api->CallStreamed("POST", "/v1/templates", &*request, [&](std::string_view line) {
    json event = json::parse(line, nullptr, /*allow_exceptions=*/false);
    const std::string type = Text(event, "type");
    if (type == "base") {
      std::fprintf(stderr, "base: %s\n", Text(event, "message").c_str());
    } else if (type == "step") {
      const json& step = event.value("step", json::object());
      std::string what = step.contains("run") ? "run " + Text(step, "run")
                                              : "copy " + Text(step.value("copy", json()), "path");
      std::fprintf(stderr, "step %d: %s\n", event.value("index", 0) + 1, what.c_str());
    } else if (type == "stdout" || type == "stderr") {
      std::string data = Text(event, "data");
      if (event.value("data_encoding", "") == "base64") {
        auto decoded = api::Base64Decode(data);
        data = decoded ? *decoded : "";
      }
      WriteAll(STDERR_FILENO, data);
    } else if (type == "snapshot") {
      std::fprintf(stderr, "saving the layer\n");
    } else if (type == "memory_snapshot") {
      std::fprintf(stderr, "memory snapshot: %s\n", Text(event, "message").c_str());
    } else if (type == "done") {
      done = event.value("template", json::object());
      return false;
    } else if (type == "error") {
      const json& err = event.value("error", json::object());
      failure = Failure{kExitFailure, Text(err, "code") + ": " + Text(err, "message")};
      return false;
    }
    return true;
  });
  if (!streamed) return std::unexpected(streamed.error());
  if (failure) return std::unexpected(*failure);
  if (!done) return CommandError("the daemon's build stream ended without a result");
  if (globals.json) return PrintJson(*done);
  std::printf("%s\n", Text(*done, "name").c_str());
  return 0;
}

Outcome<int> List(Globals& globals) {
  auto api = Api::Connect(globals);
  if (!api) return std::unexpected(api.error());
  auto doc = api->CallJson("GET", "/v1/templates");
  if (!doc) return std::unexpected(doc.error());
  if (!doc->is_object() || !(*doc)["templates"].is_array()) {
    return CommandError("the daemon's reply has no templates array");
  }
  const json& list = (*doc)["templates"];
  if (globals.json) return PrintJson(list);
  std::vector<std::vector<std::string>> rows;
  for (const json& t : list) {
    const json memory = t.value("memory_snapshot", json::object());
    const std::string memory_bytes =
        memory.contains("bytes") ? std::to_string(memory.value("bytes", uint64_t{0})) : "-";
    rows.push_back({Text(t, "name"), Text(t, "state"),
                    std::to_string(t.value("layers", json::array()).size()), memory_bytes,
                    Text(t, "created_at"), Text(t, "source")});
  }
  PrintText(FormatTable({"NAME", "STATE", "LAYERS", "MEMORY", "CREATED", "SOURCE"}, rows));
  return 0;
}

}  // namespace

Outcome<int> CmdTemplate(const CommandArgs& in, Globals& globals) {
  static const FlagSpec kFlags[] = {{"file", true, 'f'}, {"name", true}};
  auto args = Parse("template", in, kFlags, globals);
  if (!args) return std::unexpected(args.error());
  if (args->help || args->positional.empty()) return PrintUsage("template");
  const std::string sub = args->positional[0];
  if (sub == "build") {
    if (args->positional.size() != 1) return UsageError("template", "build takes no arguments");
    return Build(args->Last("file").value_or("airlock.toml"), args->Last("name"), globals);
  }
  if (sub == "ls") return List(globals);
  if (sub == "rm") {
    if (args->positional.size() < 2) return UsageError("template", "rm wants template names");
    auto api = Api::Connect(globals);
    if (!api) return std::unexpected(api.error());
    for (size_t i = 1; i < args->positional.size(); ++i) {
      auto gone = api->Call("DELETE", "/v1/templates/" + args->positional[i]);
      if (!gone) return std::unexpected(gone.error());
    }
    return 0;
  }
  return UsageError("template", "unknown subcommand '" + sub + "' (build, ls, rm)");
}

Outcome<int> CmdSnapshot(const CommandArgs& in, Globals& globals) {
  auto args = Parse("snapshot", in, {}, globals);
  if (!args) return std::unexpected(args.error());
  if (args->help) return PrintUsage("snapshot");
  if (args->positional.size() != 2) return UsageError("snapshot", "wants a sandbox ID and a NAME");
  auto api = Api::Connect(globals);
  if (!api) return std::unexpected(api.error());
  const json request = {{"name", args->positional[1]}};
  auto doc = api->CallJson("POST", SandboxTarget(args->positional[0], "/snapshot"), &request);
  if (!doc) return std::unexpected(doc.error());
  if (globals.json) return PrintJson(*doc);
  std::printf("%s\n", Text(*doc, "name").c_str());
  return 0;
}

Outcome<int> CmdFork(const CommandArgs& in, Globals& globals) {
  static const FlagSpec kFlags[] = {{"count", true, 'n'}, {"memory", false}};
  auto args = Parse("fork", in, kFlags, globals);
  if (!args) return std::unexpected(args.error());
  if (args->help) return PrintUsage("fork");
  if (args->positional.size() != 1) return UsageError("fork", "wants one sandbox ID");
  json request = json::object();
  if (auto count = args->Last("count")) {
    int n = 0;
    auto [end, ec] = std::from_chars(count->data(), count->data() + count->size(), n);
    if (ec != std::errc() || end != count->data() + count->size()) {
      return UsageError("fork", "--count takes a number, got '" + *count + "'");
    }
    request["count"] = n;
  }
  if (args->Has("memory")) request["memory"] = true;
  auto api = Api::Connect(globals);
  if (!api) return std::unexpected(api.error());
  auto doc = api->CallJson("POST", SandboxTarget(args->positional[0], "/fork"), &request);
  if (!doc) return std::unexpected(doc.error());
  if (globals.json) return PrintJson(*doc);
  for (const json& s : doc->value("sandboxes", json::array())) {
    std::printf("%s\n", Text(s, "id").c_str());
  }
  return 0;
}

}  // namespace airlock::cli
