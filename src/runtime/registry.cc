#include "runtime/registry.h"

#include <algorithm>

namespace airlock::runtime {

EngineRegistry::~EngineRegistry() = default;

void EngineRegistry::Add(std::unique_ptr<Engine> engine, std::string description) {
  EngineStatus status;
  status.name = std::string(engine->name());
  status.description = std::move(description);
  if (auto probed = engine->Probe(); !probed) {
    status.reason = "its probe failed: " + probed.error().message();
  } else {
    status.available = true;
    status.capabilities = engine->capabilities();
    engines_.emplace(status.name, std::move(engine));
  }
  statuses_.push_back(std::move(status));
}

Result<std::unique_ptr<EngineRegistry>> EngineRegistry::Open(
    EngineContext context, const std::map<std::string, EngineConfig>& configs,
    const std::string& default_engine) {
  std::unique_ptr<EngineRegistry> r(new EngineRegistry());
  for (const auto& [name, config] : configs) {
    const auto& known = RegisteredEngines();
    if (std::none_of(known.begin(), known.end(),
                     [&](const EngineRegistration& e) { return e.name == name; })) {
      return Fail(ErrorCode::kInvalidArgument,
                  "[engine." + name + "]: this airlockd has no engine called " + name);
    }
  }
  r->layers_ = std::make_unique<LayerStore>(context.state_dir + "/layers",
                                            context.state_dir + "/staging");
  if (auto st = r->layers_->Prepare(); !st) {
    return std::unexpected(st.error().Wrap("preparing the layer store"));
  }
  context.layers = r->layers_.get();
  for (const EngineRegistration& e : RegisteredEngines()) {
    const std::string name(e.name);
    auto config = configs.find(name);
    EngineStatus status;
    status.name = name;
    status.description = std::string(e.description);
    if (config != configs.end() && !config->second.enabled) {
      status.enabled = false;
      status.reason = "turned off in the config ([engine." + name + "] enabled = false)";
      r->statuses_.push_back(std::move(status));
      continue;
    }
    static const std::map<std::string, std::string> kNoOptions;
    auto made = e.make(context, config == configs.end() ? kNoOptions : config->second.options);
    if (!made) {
      if (made.error().code() == ErrorCode::kInvalidArgument) {
        return std::unexpected(made.error().Wrap("[engine." + name + "]"));
      }
      status.reason = made.error().message();
      r->statuses_.push_back(std::move(status));
      continue;
    }
    r->Add(std::move(*made), status.description);
  }
  if (!r->Knows(default_engine)) {
    return Fail(ErrorCode::kInvalidArgument,
                "default_engine: this airlockd has no engine called " + default_engine);
  }
  r->default_ = default_engine;
  return r;
}

std::unique_ptr<EngineRegistry> EngineRegistry::With(std::vector<std::unique_ptr<Engine>> engines,
                                                     std::unique_ptr<LayerStore> layers,
                                                     const std::string& default_engine) {
  std::unique_ptr<EngineRegistry> r(new EngineRegistry());
  r->layers_ = std::move(layers);
  for (auto& engine : engines) r->Add(std::move(engine), "");
  r->default_ = default_engine;
  return r;
}

bool EngineRegistry::Knows(std::string_view name) const {
  return std::any_of(statuses_.begin(), statuses_.end(),
                     [&](const EngineStatus& s) { return s.name == name; });
}

Result<Engine*> EngineRegistry::Get(std::string_view name) const {
  if (auto it = engines_.find(name); it != engines_.end()) return it->second.get();
  for (const EngineStatus& s : statuses_) {
    if (s.name == name) {
      return Fail(ErrorCode::kFailedPrecondition,
                  "the " + s.name + " engine is unavailable on this host: " + s.reason);
    }
  }
  std::string names;
  for (const EngineStatus& s : statuses_) names += (names.empty() ? "" : ", ") + s.name;
  return Fail(ErrorCode::kInvalidArgument,
              "no engine is called '" + std::string(name.substr(0, 64)) + "' (there are: " +
                  names + ")");
}

std::vector<Engine*> EngineRegistry::Available() const {
  std::vector<Engine*> out;
  for (const auto& [name, engine] : engines_) out.push_back(engine.get());
  return out;
}

}  // namespace airlock::runtime
