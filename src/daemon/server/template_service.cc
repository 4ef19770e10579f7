#include "daemon/server/template_service.h"

#include <algorithm>
#include <chrono>
#include <climits>
#include <condition_variable>
#include <cstdlib>
#include <deque>
#include <future>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>
#include <utility>

#include "common/clock.h"
#include "common/log.h"
#include "runtime/images/debian.h"
#include "runtime/images/oci.h"

namespace airlock::daemon {
namespace {

using json = nlohmann::json;
using store::SandboxRecord;
using store::TemplateRecord;
using store::TemplateState;

// A build sandbox lives no longer than this (its TTL), whatever happens to the build.
constexpr int64_t kBuildTtlSeconds = 6 * 3600;
// How often ready_cmd is tried.
constexpr auto kReadyPoll = std::chrono::milliseconds(50);
// One try of ready_cmd may take this long.
constexpr double kReadyTryTimeoutSeconds = 10;

api::EnvMap EnvFromList(const std::vector<std::string>& list) {
  api::EnvMap env;
  for (const std::string& kv : list) {
    const size_t eq = kv.find('=');
    if (eq != std::string::npos) env[kv.substr(0, eq)] = kv.substr(eq + 1);
  }
  return env;
}

// The engine root a sandbox was made on.
std::string RootOf(const SandboxRecord& r) {
  auto root = r.resources.find(kRoot);
  return root == r.resources.end() ? std::string(api::kRootHostUsr) : root->second;
}

// The built-in template, as the API shows it.
TemplateRecord BaseTemplate() {
  TemplateRecord base;
  base.name = std::string(api::kDefaultTemplate);
  base.state = TemplateState::kReady;
  base.source =
      "built-in: the host's /usr/bin, /usr/lib, ..., read-only; a fresh /etc and /usr/local";
  base.spec = "{}";
  // Made afresh by each start of the daemon (by each engine that has it): its time is the
  // first look.
  static const int64_t made_at_ms = UnixNowMs();
  base.created_at_ms = base.updated_at_ms = made_at_ms;
  return base;
}

// Runs `exec` streamed, its events to `log`; an error unless it exits 0 (with the end of its
// output). `what` names it in errors ("step 3").
Status RunStreamed(ExecService& exec_service, const std::string& id, api::ExecRequest exec,
                   const std::string& what, const std::function<void(api::Event)>& log) {
  exec.stream = true;
  const std::string cmd = exec.cmd;
  auto stream = exec_service.StartExec(id, exec);
  if (!stream) return std::unexpected(stream.error().Wrap(what));
  std::string tail;                // the end of its output, for the error message
  std::optional<api::Event> last;  // its exit or error event
  while (auto events = (*stream)->Next()) {
    for (api::Event& event : *events) {
      if (auto* output = std::get_if<api::OutputEvent>(&event.what)) {
        tail += output->data;
        if (tail.size() > 2048) tail.erase(0, tail.size() - 2048);
      } else if (std::holds_alternative<api::ExitEvent>(event.what) ||
                 std::holds_alternative<api::ErrorEvent>(event.what)) {
        last = event;
      }
      log(std::move(event));
    }
  }
  if (!last) return Fail(ErrorCode::kInternal, what + ": the command's stream ended early");
  if (auto* error = std::get_if<api::ErrorEvent>(&last->what)) {
    return Fail(ErrorCode::kInternal, what + ": " + error->error.message());
  }
  const api::ExecResultView& exit = std::get<api::ExitEvent>(last->what).result;
  if (exit.signal != 0 || exit.exit_code != 0 || exit.timed_out) {
    std::string how = exit.timed_out     ? "timed out"
                      : exit.signal == 0 ? "exited " + std::to_string(exit.exit_code)
                                         : "was killed by signal " + std::to_string(exit.signal);
    if (tail.size() > 1024) tail = "..." + tail.substr(tail.size() - 1024);
    return Fail(ErrorCode::kFailedPrecondition,
                what + " (" + cmd + ") " + how + "; its output ended with: " + tail);
  }
  return {};
}

}  // namespace

api::TemplateView ToTemplateView(const TemplateRecord& r) {
  return {.name = r.name,
          .state = std::string(store::TemplateStateName(r.state)),
          .source = r.source,
          .settings = r.spec,
          .layers = r.layers,
          .created_at = FromUnixMs(r.created_at_ms),
          .updated_at = FromUnixMs(r.updated_at_ms),
          .error = r.error,
          .tenant = r.tenant};
}

Status TemplateService::Check(const std::string& name) {
  if (name == api::kDefaultTemplate) return {};  // built in (which engines take it, they say)
  auto t = store_.GetTemplate(name);
  if (!t) return std::unexpected(t.error());
  if (t->state != TemplateState::kReady) {
    return Fail(ErrorCode::kFailedPrecondition,
                "template '" + name + "' is " + std::string(store::TemplateStateName(t->state)) +
                    (t->error.empty() ? "" : ": " + t->error));
  }
  return {};
}

Result<ResolvedCreate> TemplateService::Resolve(const api::CreateSandboxRequest& request) {
  if (auto st = Check(request.template_name); !st) return std::unexpected(st.error());
  ResolvedCreate r;
  r.request = request;
  if (request.template_name == api::kDefaultTemplate) return r;
  auto t = store_.GetTemplate(request.template_name);
  if (!t) return std::unexpected(t.error());
  auto settings = api::TemplateSettings::FromJson(t->spec);
  if (!settings) return std::unexpected(settings.error().Wrap("template " + t->name));
  // The template's settings first, then the request's over them.
  api::EnvMap env = settings->env;
  for (const auto& [key, value] : request.env) env[key] = value;
  r.request.env = std::move(env);
  runtime::Limits limits;
  settings->limits_given.Apply(settings->limits, limits);
  request.limits_given.Apply(request.limits, limits);
  r.request.limits = limits;
  r.origin = {t->layers, settings->workdir, settings->root, settings->engine,
              settings->memory_image};
  // A memory snapshot was saved with start_cmd's processes running and ready_cmd passed.
  if (settings->memory_image.empty()) {
    r.start_cmd = settings->start_cmd;
    r.ready_cmd = settings->ready_cmd;
    r.ready_timeout_seconds = settings->ready_timeout_seconds;
  }
  return r;
}

Status TemplateService::StartCommands(const std::string& id, const ResolvedCreate& resolved) {
  if (!resolved.start_cmd.empty()) {
    api::ExecRequest start;
    start.cmd = resolved.start_cmd;
    start.background = true;
    if (auto started = exec_.StartBackground(id, start); !started) {
      return std::unexpected(started.error().Wrap("starting the template's start_cmd"));
    }
  }
  if (resolved.ready_cmd.empty()) return {};
  const auto deadline =
      std::chrono::steady_clock::now() +
      std::chrono::milliseconds(static_cast<int64_t>(resolved.ready_timeout_seconds * 1000));
  api::ExecRequest ready;
  ready.cmd = resolved.ready_cmd;
  ready.timeout_seconds = kReadyTryTimeoutSeconds;
  std::string last;
  while (true) {
    auto result = exec_.Exec(id, ready);
    if (!result) return std::unexpected(result.error().Wrap("running the template's ready_cmd"));
    if (result->exit.exit_code == 0 && result->exit.term_signal == 0) return {};
    last = result->stderr_data.empty() ? result->stdout_data : result->stderr_data;
    if (std::chrono::steady_clock::now() + kReadyPoll >= deadline) break;
    std::this_thread::sleep_for(kReadyPoll);
  }
  if (last.size() > 512) last = "..." + last.substr(last.size() - 512);
  return Fail(ErrorCode::kUnavailable,
              fmt::format("the template's ready_cmd did not succeed within {:g} s; its last "
                          "output: {}",
                          resolved.ready_timeout_seconds, last));
}

Result<TemplateRecord> TemplateService::Build(const api::CreateTemplateRequest& request,
                                              const std::function<void(api::Event)>& log) {
  if (auto st = check_network_(request.network); !st) return std::unexpected(st.error());
  api::TemplateSettings settings = api::TemplateSettings::From(request);
  // An imported image's layer is named by no record until the build sandbox's is.
  std::optional<LayerKeeper::Pin> pin;
  if (request.base.starts_with('/')) pin.emplace(layers_);
  auto base = PrepareBase(request.base, log);
  if (!base) return std::unexpected(base.error().Wrap("preparing the base " + request.base));
  const std::vector<std::string>& base_layers = base->layers;
  // The engine the build runs on, and the template's after: the request's, else the base's.
  if (settings.engine.empty() && base->settings) settings.engine = base->settings->engine;
  auto engine = engines_.Get(settings.engine.empty() ? engines_.default_name() : settings.engine);
  if (!engine) return std::unexpected(engine.error());
  const runtime::Capabilities& can = (*engine)->capabilities();
  if (!can.layer_snapshot) {
    return std::unexpected(runtime::Lacks((*engine)->name(), "layer_snapshot", "build a template"));
  }
  if (!request.snapshot_after.empty()) {
    if (!can.memory_fork) {
      return std::unexpected(runtime::Lacks((*engine)->name(), "memory_fork",
                                            "build a template with a memory snapshot "
                                            "(snapshot_after)"));
    }
    // Its image is this engine's: its sandboxes are made there whatever the default becomes.
    settings.engine = std::string((*engine)->name());
  }
  if (base_layers.size() >= can.max_layers) {
    return Fail(ErrorCode::kFailedPrecondition,
                "template '" + request.base + "' already stacks " +
                    std::to_string(base_layers.size()) + " layers, the most the " +
                    std::string((*engine)->name()) + " engine stacks");
  }
  settings.root = base->root;
  if (base->settings) {
    // What the base gives its sandboxes, the new template gives too, unless it says otherwise.
    const api::TemplateSettings& inherited = *base->settings;
    for (const auto& [key, value] : inherited.env) settings.env.try_emplace(key, value);
    if (settings.workdir.empty()) settings.workdir = inherited.workdir;
    runtime::Limits limits;
    inherited.limits_given.Apply(inherited.limits, limits);
    request.limits_given.Apply(request.limits, limits);
    settings.limits = limits;
    settings.limits_given.Add(inherited.limits_given);
    if (settings.start_cmd.empty()) settings.start_cmd = inherited.start_cmd;
    if (settings.ready_cmd.empty()) {
      settings.ready_cmd = inherited.ready_cmd;
      settings.ready_timeout_seconds = inherited.ready_timeout_seconds;
    }
  }
  TemplateRecord record;
  record.name = request.name;
  record.state = TemplateState::kBuilding;
  record.source = "build";
  record.spec = settings.ToJson(request.steps);
  record.tenant = request.tenant;
  auto inserted = store_.InsertTemplate(record);
  if (!inserted) return std::unexpected(inserted.error());
  record = std::move(*inserted);

  std::string build_id;
  auto fail = [&](Error error) -> Result<TemplateRecord> {
    if (!build_id.empty()) {
      if (auto st = maker_.destroy(build_id); !st) {
        spdlog::error("build: {}", st.error().message());
      }
      std::lock_guard lock(builds_mu_);
      build_sandboxes_.erase(build_id);
    }
    record.state = TemplateState::kFailed;
    record.error = error.message();
    if (auto st = store_.UpdateTemplate(record); !st) {
      spdlog::error("template {}: {}", record.name, st.error().message());
    }
    spdlog::warn("template {}: build failed: {}", record.name, error.message());
    return std::unexpected(std::move(error).Wrap("building template " + record.name));
  };

  // The build sandbox: the base's root and settings, the template's env, workdir and limits.
  api::CreateSandboxRequest sandbox_request;
  sandbox_request.template_name =
      request.base.starts_with('/') ? std::string(api::kDefaultTemplate) : request.base;
  sandbox_request.ttl_seconds = kBuildTtlSeconds;
  sandbox_request.env = settings.env;
  settings.limits_given.Apply(settings.limits, sandbox_request.limits);
  sandbox_request.metadata[kBuildMetadataKey] = request.name;
  sandbox_request.engine = std::string((*engine)->name());
  // Its HTTP_PROXY and friends reach the steps through the agent's own env, never the
  // template's settings.
  sandbox_request.network = request.network;
  // The build sandbox belongs to the template's tenant (a shared template's to admin).
  if (!request.tenant.empty()) sandbox_request.tenant = request.tenant;
  {
    std::lock_guard lock(builds_mu_);
    if (builds_stop_) return fail(Error(ErrorCode::kUnavailable, "airlockd is shutting down"));
  }
  const SandboxOrigin origin{base_layers, "", base->root, settings.engine};
  auto sandbox = maker_.create(sandbox_request, origin);
  pin.reset();  // the build sandbox's record names the base's layers now
  if (!sandbox) return fail(sandbox.error().Wrap("creating the build sandbox"));
  build_id = sandbox->id;
  // A stop that came meanwhile did not see this sandbox: the build ends here instead.
  auto stopping = [&] {
    std::lock_guard lock(builds_mu_);
    build_sandboxes_.insert(build_id);
    return builds_stop_;
  };
  if (stopping()) return fail(Error(ErrorCode::kUnavailable, "airlockd is shutting down"));
  spdlog::info("template {}: building in {}", record.name, build_id);
  // The workdir exists before the steps, which run in it.
  if (!settings.workdir.empty()) {
    api::ExecRequest mkdir;
    mkdir.argv = {"mkdir", "-p", settings.workdir};
    mkdir.user = "root";
    auto made = exec_.Exec(build_id, mkdir);
    if (!made || made->exit.exit_code != 0) {
      return fail(made ? Error(ErrorCode::kFailedPrecondition,
                               "making workdir " + settings.workdir + ": " + made->stderr_data)
                       : made.error());
    }
  }

  const json described = json::parse(record.spec)["steps"];
  for (size_t i = 0; i < request.steps.size(); ++i) {
    const api::TemplateStep& step = request.steps[i];
    if (stopping()) return fail(Error(ErrorCode::kUnavailable, "airlockd is shutting down"));
    log({api::StepEvent{i, described.at(i).dump()}});
    const std::string what = "step " + std::to_string(i + 1);
    if (step.is_copy()) {
      api::FileQuery query;
      query.path = step.path;
      query.mode = step.mode;
      query.parents = true;
      if (auto written = files_.WriteFile(build_id, query, step.content); !written) {
        return fail(written.error().Wrap(what + " (copy to " + step.path + ")"));
      }
      continue;
    }
    api::ExecRequest exec;
    exec.cmd = step.run;
    exec.user = step.user;
    exec.cwd = settings.workdir;
    exec.timeout_seconds = step.timeout_seconds;
    if (auto st = RunStreamed(exec_, build_id, std::move(exec), what, log); !st) {
      return fail(st.error());
    }
  }

  if (request.network.mode() != net::NetworkMode::kNone) {
    // The jail wrote resolv.conf naming the build's gateway into the writable layer; the
    // template's sandboxes get their own at create, and the layer keeps what a build without a
    // network has there (root's, 0644).
    api::ExecRequest scrub;
    scrub.cmd = "umask 022 && rm -f /etc/resolv.conf && printf '%s' '" +
                std::string(kNoNetworkResolvConf) + "' > /etc/resolv.conf";
    scrub.user = "root";
    auto scrubbed = exec_.Exec(build_id, scrub);
    if (!scrubbed || scrubbed->exit.exit_code != 0) {
      return fail(
          scrubbed ? Error(ErrorCode::kFailedPrecondition,
                           "resetting /etc/resolv.conf after the steps: " + scrubbed->stderr_data)
                   : scrubbed.error());
    }
  }

  log({api::SnapshotEvent{}});
  const bool memory = !settings.snapshot_after.empty();
  {
    auto layers_lock = layers_.Hold();
    auto layer = sandboxes_.SnapshotLayer(build_id);
    if (!layer) return fail(layer.error());
    record.layers = {layer->digest};
    record.layers.insert(record.layers.end(), base_layers.begin(), base_layers.end());
    if (!memory) record.state = TemplateState::kReady;
    auto updated = store_.UpdateTemplate(record);
    if (!updated) return fail(updated.error());
    record = std::move(*updated);
    spdlog::info("template {}: {} (layer {}: {} files, {} bytes)", record.name,
                 memory ? "files ready" : "ready", layer->digest, layer->files, layer->bytes);
  }
  auto done_with = [&](const std::string& id) {
    if (auto st = maker_.destroy(id); !st) spdlog::error("build: {}", st.error().message());
    std::lock_guard lock(builds_mu_);
    build_sandboxes_.erase(id);
  };
  done_with(build_id);
  build_id.clear();
  if (memory) {
    auto image = SnapshotMemory(record, settings, sandbox_request.engine, build_id, log);
    if (!image) return fail(image.error().Wrap("the memory snapshot"));
    settings.memory_image = image->id;
    settings.memory_image_bytes = image->bytes;
    record.spec = settings.ToJson(request.steps);
    record.state = TemplateState::kReady;
    auto ready = store_.UpdateTemplate(record);
    if (!ready) {
      (void)(*engine)->RemoveMemoryImage(image->id);
      return fail(ready.error());
    }
    record = std::move(*ready);
    spdlog::info("template {}: ready (memory image {}, {} bytes)", record.name, image->id,
                 image->bytes);
    log({api::MemorySnapshotEvent{fmt::format("saved: {} bytes", image->bytes)}});
    done_with(build_id);
  }
  log({api::DoneEvent{ToTemplateView(record)}});
  return record;
}

Result<runtime::MemoryImage> TemplateService::SnapshotMemory(
    const TemplateRecord& record, const api::TemplateSettings& settings,
    const std::string& engine, std::string& sandbox_id,
    const std::function<void(api::Event)>& log) {
  log({api::MemorySnapshotEvent{"starting a sandbox of the template for snapshot_after"}});
  // A sandbox as a create of the template gets it, without a network: no engine here saves
  // one, and the sandboxes restored from the image have none.
  ResolvedCreate resolved;
  api::CreateSandboxRequest& request = resolved.request;
  request.template_name = record.name;
  request.ttl_seconds = kBuildTtlSeconds;
  request.env = settings.env;
  settings.limits_given.Apply(settings.limits, request.limits);
  request.metadata[kBuildMetadataKey] = record.name;
  request.engine = engine;
  if (!record.tenant.empty()) request.tenant = record.tenant;
  resolved.origin = {record.layers, settings.workdir, settings.root, settings.engine};
  resolved.start_cmd = settings.start_cmd;
  resolved.ready_cmd = settings.ready_cmd;
  resolved.ready_timeout_seconds = settings.ready_timeout_seconds;
  {
    std::lock_guard lock(builds_mu_);
    if (builds_stop_) return Fail(ErrorCode::kUnavailable, "airlockd is shutting down");
  }
  auto sandbox = maker_.create(request, resolved.origin);
  if (!sandbox) return std::unexpected(sandbox.error().Wrap("creating its sandbox"));
  sandbox_id = sandbox->id;
  {
    std::lock_guard lock(builds_mu_);
    build_sandboxes_.insert(sandbox_id);
    if (builds_stop_) return Fail(ErrorCode::kUnavailable, "airlockd is shutting down");
  }
  if (auto st = StartCommands(sandbox_id, resolved); !st) return std::unexpected(st.error());
  api::ExecRequest exec;
  exec.cmd = settings.snapshot_after;
  exec.cwd = settings.workdir;
  exec.timeout_seconds = settings.ready_timeout_seconds;
  if (auto st = RunStreamed(exec_, sandbox_id, std::move(exec), "snapshot_after", log); !st) {
    return std::unexpected(st.error());
  }
  log({api::MemorySnapshotEvent{"saving the sandbox's processes and memory"}});
  return sandboxes_.SaveMemoryImage(sandbox_id);
}

// The events of a build running on its own thread, through a queue.
class BuildEvents : public EventStream {
 public:
  struct Queue {
    std::mutex mu;
    std::condition_variable cv;
    std::deque<api::Event> events;
    size_t bytes = 0;  // of output waiting in `events`
    bool done = false;
    bool reader_gone = false;
  };
  explicit BuildEvents(std::shared_ptr<Queue> queue) : queue_(std::move(queue)) {}
  ~BuildEvents() override {
    std::lock_guard lock(queue_->mu);
    queue_->reader_gone = true;  // the build goes on; its events are dropped
    queue_->events.clear();
    queue_->cv.notify_all();
  }
  std::optional<std::vector<api::Event>> Next() override {
    std::unique_lock lock(queue_->mu);
    queue_->cv.wait_for(lock, std::chrono::seconds(1),
                        [&] { return !queue_->events.empty() || queue_->done; });
    if (queue_->events.empty()) {
      if (queue_->done) return std::nullopt;
      return std::vector<api::Event>{};
    }
    std::vector<api::Event> out;
    size_t bytes = 0;
    while (!queue_->events.empty() && bytes < (1u << 20)) {
      const size_t size = OutputBytes(queue_->events.front());
      bytes += size;
      queue_->bytes -= size;
      out.push_back(std::move(queue_->events.front()));
      queue_->events.pop_front();
    }
    queue_->cv.notify_all();
    return out;
  }
  int32_t pid() const override { return 0; }

  static size_t OutputBytes(const api::Event& event) {
    auto* output = std::get_if<api::OutputEvent>(&event.what);
    return output ? output->data.size() : 0;
  }

 private:
  std::shared_ptr<Queue> queue_;
};

std::unique_ptr<EventStream> TemplateService::StartBuild(api::CreateTemplateRequest request) {
  auto queue = std::make_shared<BuildEvents::Queue>();
  auto push = [queue](api::Event event) {
    std::unique_lock lock(queue->mu);
    // A slow reader holds the build back (at most 8 MiB of output waits); a reader that left
    // does not.
    queue->cv.wait(lock, [&] { return queue->reader_gone || queue->bytes < (8u << 20); });
    if (queue->reader_gone) return;
    queue->bytes += BuildEvents::OutputBytes(event);
    queue->events.push_back(std::move(event));
    queue->cv.notify_all();
  };
  std::lock_guard lock(builds_mu_);
  builds_.emplace_back([this, queue, push, request = std::move(request)] {
    auto built = Build(request, push);
    if (!built) push({api::ErrorEvent{built.error()}});
    std::lock_guard done_lock(queue->mu);
    queue->done = true;
    queue->cv.notify_all();
  });
  return std::make_unique<BuildEvents>(queue);
}

void TemplateService::JoinBuilds() {
  std::vector<std::thread> threads;
  std::set<std::string> sandboxes;
  {
    std::lock_guard lock(builds_mu_);
    builds_stop_ = true;
    threads.swap(builds_);
    sandboxes = build_sandboxes_;
  }
  // Destroying a build's sandbox ends the step it runs; the build then fails and returns.
  for (const std::string& id : sandboxes) (void)maker_.destroy(id);
  for (std::thread& t : threads) t.join();
}

Result<TemplateService::Base> TemplateService::PrepareBase(
    const std::string& name, const std::function<void(api::Event)>& log) {
  if (name == api::kDefaultTemplate) return Base{};
  if (name.starts_with('/')) return ImportImage(name, log);
  Result<TemplateRecord> record;
  if (!api::DebianSuite(name).empty()) {
    record = DebianBase(name, log);
  } else if (auto st = Check(name); !st) {
    return std::unexpected(st.error());
  } else {
    record = store_.GetTemplate(name);
  }
  if (!record) return std::unexpected(record.error());
  auto settings = api::TemplateSettings::FromJson(record->spec);
  if (!settings) return std::unexpected(settings.error().Wrap("template " + name));
  Base base;
  base.layers = record->layers;
  base.root = settings->root;
  base.settings = std::move(*settings);
  return base;
}

Result<TemplateRecord> TemplateService::DebianBase(const std::string& name,
                                                   const std::function<void(api::Event)>& log) {
  const std::string suite(api::DebianSuite(name));
  auto stopping = [this] {
    std::lock_guard lock(builds_mu_);
    return builds_stop_;
  };
  while (true) {
    if (stopping()) return Fail(ErrorCode::kUnavailable, "airlockd is shutting down");
    auto existing = store_.GetTemplate(name);
    if (existing) {
      if (existing->state == TemplateState::kReady) return existing;
      if (existing->state == TemplateState::kBuilding) {  // another build is making it
        std::this_thread::sleep_for(std::chrono::milliseconds(500));
        continue;
      }
      // Failed before: made again.
      if (auto st = store_.DeleteTemplate(name); !st && st.error().code() != ErrorCode::kNotFound) {
        return std::unexpected(st.error());
      }
      continue;
    }
    if (existing.error().code() != ErrorCode::kNotFound) return existing;

    TemplateRecord record;
    record.name = name;
    record.state = TemplateState::kBuilding;
    record.source = "mmdebstrap --variant=minbase " + suite + " " + images_.debian_mirror;
    api::TemplateSettings settings;
    settings.root = api::kRootOwn;
    record.spec = settings.ToJson({});
    auto inserted = store_.InsertTemplate(record);
    if (!inserted && inserted.error().code() == ErrorCode::kAlreadyExists) continue;  // a race
    if (!inserted) return inserted;
    record = std::move(*inserted);

    spdlog::info("template {}: making it with mmdebstrap from {}", name, images_.debian_mirror);
    log({api::BaseEvent{name,
                        "making " + name + " with mmdebstrap from " + images_.debian_mirror}});
    LayerKeeper::Pin pin(layers_);
    images::DebianOptions options;
    options.suite = suite;
    options.mirror = images_.debian_mirror;
    auto layer = engines_.layers().ImportTree([&](const std::string& dir) {
      return images::MakeDebianRoot(
          options, dir,
          [&](std::string_view line) {
            log({api::OutputEvent{false, std::string(line) + "\n"}});
          },
          stopping);
    });
    if (!layer) {
      record.state = TemplateState::kFailed;
      record.error = layer.error().message();
      if (auto st = store_.UpdateTemplate(record); !st) {
        spdlog::error("template {}: {}", name, st.error().message());
      }
      return std::unexpected(layer.error().Wrap("making " + name));
    }
    record.layers = {layer->digest};
    record.state = TemplateState::kReady;
    spdlog::info("template {}: ready (layer {}: {} files, {} bytes)", name, layer->digest,
                 layer->files, layer->bytes);
    log({api::BaseEvent{
        name, fmt::format("{} is ready: {} files, {} bytes", name, layer->files, layer->bytes)}});
    return store_.UpdateTemplate(record);
  }
}

Result<TemplateService::Base> TemplateService::ImportImage(
    const std::string& path, const std::function<void(api::Event)>& log) {
  if (images_.image_dir.empty()) {
    return Fail(ErrorCode::kPermissionDenied,
                "this airlockd reads no image archives (image_dir is not set)");
  }
  // Only archives below image_dir: a caller must not make the daemon read any file it can.
  char resolved[PATH_MAX], dir[PATH_MAX];
  if (::realpath(path.c_str(), resolved) == nullptr) {
    return FailErrno("image archive " + path, errno);
  }
  if (::realpath(images_.image_dir.c_str(), dir) == nullptr ||
      !std::string_view(resolved).starts_with(std::string(dir) + "/")) {
    return Fail(ErrorCode::kPermissionDenied,
                "image archives are read from " + images_.image_dir + " only, not from " + path);
  }
  log({api::BaseEvent{path, "importing the image archive " + path}});
  images::ImageConfig config;
  auto layer = engines_.layers().ImportTree([&](const std::string& root) -> Status {
    auto unpacked = images::UnpackImage(resolved, root);
    if (!unpacked) return std::unexpected(unpacked.error());
    config = std::move(*unpacked);
    return {};
  });
  if (!layer) return std::unexpected(layer.error().Wrap("importing " + path));
  spdlog::info("imported image {} ({}) as layer {}: {} files, {} bytes", path, config.digest,
               layer->digest, layer->files, layer->bytes);
  log({api::BaseEvent{path, fmt::format("imported {}: {} files, {} bytes", config.digest,
                                        layer->files, layer->bytes)}});
  Base base;
  base.layers = {layer->digest};
  base.root = api::kRootOwn;
  // What the image's config gives its containers and a sandbox can use: env and workdir (not
  // User: commands run as the sandbox's users). Names our API would refuse are left out.
  api::TemplateSettings settings;
  settings.env = api::EnvFromImage(config.env);
  if (config.workdir.starts_with('/') && config.workdir.size() <= api::kMaxPathBytes &&
      config.workdir.find('\0') == std::string::npos) {
    settings.workdir = config.workdir;
  }
  base.settings = std::move(settings);
  return base;
}

Result<TemplateRecord> TemplateService::Get(const std::string& name) {
  if (name == api::kDefaultTemplate) return BaseTemplate();
  return store_.GetTemplate(name);
}

Result<std::vector<TemplateRecord>> TemplateService::List() {
  auto all = store_.ListTemplates();
  if (all) all->insert(all->begin(), BaseTemplate());
  return all;
}

Status TemplateService::Delete(const std::string& name) {
  if (name == api::kDefaultTemplate) {
    return Fail(ErrorCode::kFailedPrecondition, "the base template cannot be deleted");
  }
  auto record = store_.GetTemplate(name);
  if (!record) return std::unexpected(record.error());
  if (auto st = store_.DeleteTemplate(name); !st) return st;
  pools_.Forget(name);
  spdlog::info("template {}: deleted", name);
  // Its memory snapshot goes with it (the sandboxes restored from it have their own copies).
  if (auto settings = api::TemplateSettings::FromJson(record->spec);
      settings && !settings->memory_image.empty()) {
    auto engine = engines_.Get(settings->engine.empty() ? engines_.default_name()
                                                        : settings->engine);
    Status removed = engine ? (*engine)->RemoveMemoryImage(settings->memory_image)
                            : Status(std::unexpected(engine.error()));
    if (!removed) {
      // The next start removes it (no template names it then).
      spdlog::error("template {}: removing its memory image: {}", name,
                    removed.error().message());
    }
  }
  (void)layers_.Collect();
  return {};
}

Result<SandboxRecord> SnapshotService::Source(const std::string& id) {
  auto source = sandboxes_.Visible(id);
  if (!source) return source;
  if (source->state != store::SandboxState::kRunning &&
      source->state != store::SandboxState::kPaused) {
    return Fail(ErrorCode::kFailedPrecondition, "sandbox " + id + " is " +
                                                    std::string(SandboxStateName(source->state)) +
                                                    ", not running or paused");
  }
  auto engine = sandboxes_.EngineOf(*source);
  if (!engine) return std::unexpected(engine.error());
  if (source->layers.size() >= (*engine)->capabilities().max_layers) {
    return Fail(ErrorCode::kFailedPrecondition,
                "sandbox " + id + " already stacks " + std::to_string(source->layers.size()) +
                    " layers, the most the " + std::string((*engine)->name()) + " engine stacks");
  }
  return source;
}

Result<TemplateRecord> SnapshotService::Snapshot(const std::string& id,
                                                 const api::SnapshotRequest& request) {
  auto source = Source(id);
  if (!source) return std::unexpected(source.error());
  // The snapshot's sandboxes get what the source's template gave it.
  api::TemplateSettings settings;
  if (source->template_name != api::kDefaultTemplate) {
    if (auto t = store_.GetTemplate(source->template_name)) {
      if (auto s = api::TemplateSettings::FromJson(t->spec)) settings = std::move(*s);
    }
  }
  settings.base = source->template_name;
  // Its sandboxes boot: the source template's memory snapshot is not the source's memory.
  settings.snapshot_after.clear();
  settings.memory_image.clear();
  settings.memory_image_bytes = 0;
  settings.root = RootOf(*source);
  settings.engine = source->engine;  // its layer was made there
  TemplateRecord record;
  record.name = request.name;
  record.source = "snapshot of " + id;
  record.spec = settings.ToJson({});
  record.tenant = request.tenant;
  auto inserted = store_.InsertTemplate(record);  // the name is taken before the copy
  if (!inserted) return std::unexpected(inserted.error());
  record = std::move(*inserted);
  auto layers_lock = layers_.Hold();
  auto layer = sandboxes_.SnapshotLayer(id);
  if (!layer) {
    record.state = TemplateState::kFailed;
    record.error = layer.error().message();
    (void)store_.UpdateTemplate(record);
    return std::unexpected(layer.error());
  }
  record.layers = {layer->digest};
  record.layers.insert(record.layers.end(), source->layers.begin(), source->layers.end());
  record.state = TemplateState::kReady;
  spdlog::info("template {}: snapshot of {} (layer {}: {} files, {} bytes)", record.name, id,
               layer->digest, layer->files, layer->bytes);
  return store_.UpdateTemplate(record);
}

Result<SnapshotService::Forked> SnapshotService::Fork(const std::string& id,
                                                      const api::ForkRequest& request) {
  auto source = request.memory ? sandboxes_.Visible(id) : Source(id);
  if (!source) return std::unexpected(source.error());
  api::CreateSandboxRequest like;
  like.template_name = source->template_name;
  like.ttl_seconds = request.ttl_seconds;
  like.limits = LimitsOf(*source);
  like.env = EnvFromList(source->env);
  like.metadata = request.metadata.value_or(source->metadata);
  like.metadata["airlock.forked_from"] = id;
  like.tenant = request.tenant;
  like.network =
      NetworkPolicyOf(*source);  // each fork gets a network of its own under the same policy
  like.engine = source->engine;
  if (request.memory) return ForkWithMemory(*source, std::move(like), request);
  auto workdir = source->resources.find(kWorkdir);

  // Under the keeper's lock until the forks' records name the new layer.
  auto layers_lock = layers_.Hold();
  auto layer = sandboxes_.SnapshotLayer(id);
  if (!layer) return std::unexpected(layer.error());
  SandboxOrigin origin;
  origin.layers = {layer->digest};
  origin.layers.insert(origin.layers.end(), source->layers.begin(), source->layers.end());
  if (workdir != source->resources.end()) origin.workdir = workdir->second;
  origin.root = RootOf(*source);
  Forked forked;
  forked.layer = layer->digest;
  for (int64_t i = 0; i < request.count; ++i) {
    auto made = maker_.create(like, origin);
    if (!made) {
      for (const SandboxRecord& r : forked.sandboxes) (void)maker_.destroy(r.id);
      return std::unexpected(made.error().Wrap("forking " + id));
    }
    forked.sandboxes.push_back(std::move(*made));
  }
  spdlog::info("forked {} into {} sandbox(es) (layer {}: {} files, {} bytes)", id, request.count,
               layer->digest, layer->files, layer->bytes);
  return forked;
}

// How many forks with memory are restored at once.
constexpr int64_t kForkRestoresAtOnce = 4;

Result<SnapshotService::Forked> SnapshotService::ForkWithMemory(
    const SandboxRecord& source, api::CreateSandboxRequest like, const api::ForkRequest& request) {
  const std::string& id = source.id;
  // Its agent must answer for the save: running, not paused.
  const store::SandboxState running[] = {store::SandboxState::kRunning};
  if (auto st = store::RequireState(id, source.state, running); !st) {
    return std::unexpected(st.error());
  }
  auto engine = sandboxes_.EngineOf(source);
  if (!engine) return std::unexpected(engine.error());
  const runtime::Capabilities& can = (*engine)->capabilities();
  const std::string name((*engine)->name());
  if (!can.memory_fork) {
    return std::unexpected(runtime::Lacks(name, "memory_fork", "fork a sandbox with its memory"));
  }
  if (like.network.mode() != net::NetworkMode::kNone && !can.memory_checkpoint_network) {
    return std::unexpected(runtime::Lacks(name, "memory_checkpoint_network",
                                          "fork a sandbox with a network with its memory"));
  }
  // The layers stay the source's (its files come with the image): the keeper keeps them.
  auto layers_lock = layers_.Hold();
  SandboxOrigin origin;
  origin.layers = source.layers;
  origin.root = RootOf(source);
  if (auto workdir = source.resources.find(kWorkdir); workdir != source.resources.end()) {
    origin.workdir = workdir->second;
  }
  // The forks are restored a few at a time (each restore is mostly runsc's own work), the first
  // few while the source itself is restored from the same image.
  std::vector<std::future<Result<SandboxRecord>>> batch;
  auto launch = [&](int64_t first) {
    for (int64_t i = first; i < std::min(request.count, first + kForkRestoresAtOnce); ++i) {
      batch.push_back(std::async(std::launch::async, [&] { return maker_.create(like, origin); }));
    }
  };
  runtime::MemoryImage handed;  // the image, once the engine handed it out
  auto image = sandboxes_.SaveMemoryImage(id, [&](const runtime::MemoryImage& saved) {
    handed = saved;
    origin.memory_image = saved.id;
    launch(0);
  });
  Forked forked;
  Status made_all;
  if (!image) made_all = std::unexpected(image.error().Wrap("forking " + id));
  auto collect = [&] {
    for (auto& one : batch) {
      auto made = one.get();
      if (!made) {
        if (made_all) made_all = std::unexpected(made.error().Wrap("forking " + id));
      } else {
        forked.sandboxes.push_back(std::move(*made));
      }
    }
    batch.clear();
  };
  collect();  // the first few, also when the source's restore failed after they began
  for (int64_t first = kForkRestoresAtOnce; first < request.count && made_all;
       first += kForkRestoresAtOnce) {
    launch(first);
    collect();
  }
  if (!handed.id.empty()) {
    if (auto st = (*engine)->RemoveMemoryImage(handed.id); !st) {
      spdlog::error("forking {}: {}", id, st.error().message());
    }
  }
  if (!made_all) {
    for (const SandboxRecord& r : forked.sandboxes) (void)maker_.destroy(r.id);
    return std::unexpected(made_all.error());
  }
  spdlog::info("forked {} with its memory into {} sandbox(es) (image of {} bytes)", id,
               request.count, handed.bytes);
  return forked;
}

}  // namespace airlock::daemon
