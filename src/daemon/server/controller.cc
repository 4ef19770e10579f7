#include "daemon/server/controller.h"

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <set>
#include <utility>

#include "common/ids.h"
#include "common/build_id.h"
#include "common/log.h"

namespace airlock::daemon {
namespace {

using store::SandboxRecord;
using store::SandboxState;

int64_t NowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

store::SandboxLimits ToStoreLimits(const runtime::Limits& limits) {
  return {.cpus = limits.cpus,
          .memory_mb = static_cast<int64_t>(limits.memory_mb),
          .pids_max = static_cast<int64_t>(limits.pids_max),
          .disk_mb = static_cast<int64_t>(limits.disk_mb)};
}

// `sandbox_env` first, so that the request's env wins as it does over the agent's own.
protocol::Exec ToProtocolExec(const api::ExecRequest& request,
                              std::vector<std::string> sandbox_env, std::string sandbox_cwd) {
  protocol::Exec exec;
  if (request.is_shell()) {
    exec.shell = request.cmd;
  } else {
    exec.argv = request.argv;
  }
  exec.cwd = request.cwd.empty() ? std::move(sandbox_cwd) : request.cwd;
  exec.env = std::move(sandbox_env);
  for (std::string& kv : api::EnvList(request.env)) exec.env.push_back(std::move(kv));
  exec.user = request.user;
  exec.stdin_mode = request.stdin_data.empty() && !request.stdin_open
                        ? protocol::StdinMode::kNull
                        : protocol::StdinMode::kPipe;
  exec.timeout_ms =
      std::max<uint64_t>(1, static_cast<uint64_t>(std::llround(request.timeout_seconds * 1000)));
  // A background command has no timeout unless the request gives one.
  if (request.background && !request.timeout_given) exec.timeout_ms = 0;
  exec.background = request.background;
  if (request.pty) {
    exec.pty = true;
    exec.pty_cols = request.pty->cols;
    exec.pty_rows = request.pty->rows;
  }
  return exec;
}

// How long one wait on the agent may be before a silent channel counts as broken.
constexpr auto kForever = std::chrono::hours(24 * 365);

// Idle agent channels kept per sandbox; more are opened while more commands run at once.
constexpr size_t kMaxIdleChannels = 4;
// The default user's home in the base template: where relative file paths start.
constexpr const char* kDefaultHome = "/home/user";
const SandboxState kRunningOnly[] = {SandboxState::kRunning};

std::string BaseName(const std::string& path) {
  std::string_view p = path;
  while (p.size() > 1 && p.ends_with('/')) p.remove_suffix(1);
  const size_t slash = p.rfind('/');
  return std::string(slash == std::string_view::npos ? p : p.substr(slash + 1));
}

}  // namespace

class Controller::Channel {
 public:
  Channel(std::shared_ptr<Live> live, protocol::BlockingClient client)
      : live_(std::move(live)), client_(std::move(client)) {
    client_->set_receive_timeout(std::chrono::seconds(60));
  }
  protocol::BlockingClient* operator->() { return &*client_; }
  std::vector<std::string> sandbox_env() const {
    std::lock_guard lock(live_->channels_mu);
    return live_->env;
  }
  std::string sandbox_cwd() const {
    std::lock_guard lock(live_->channels_mu);
    return live_->cwd;
  }
  // The operation ended cleanly: the channel goes back to the sandbox's pool. (A channel that
  // saw an error is closed instead: its stream state is not worth reasoning about.)
  void Keep() {
    std::lock_guard lock(live_->channels_mu);
    if (live_->idle.size() < kMaxIdleChannels) live_->idle.push_back(std::move(*client_));
    client_.reset();
  }

 private:
  std::shared_ptr<Live> live_;
  std::optional<protocol::BlockingClient> client_;
};

std::shared_ptr<Controller::Live> Controller::FindLive(const std::string& id) {
  std::lock_guard lock(mu_);
  auto it = live_.find(id);
  return it == live_.end() ? nullptr : it->second;
}

void Controller::Hold(const std::string& id, runtime::Engine* engine, std::vector<std::string> env,
                      std::string cwd) {
  auto live = std::make_shared<Live>();
  live->engine = engine;
  live->env = std::move(env);
  live->cwd = std::move(cwd);
  std::lock_guard lock(mu_);
  live_.try_emplace(id, std::move(live));
}

Result<runtime::Engine*> Controller::EngineOf(const SandboxRecord& record) {
  if (std::shared_ptr<Live> live = FindLive(record.id)) return live->engine;
  return engines_.Get(record.engine);
}

Result<runtime::Engine*> Controller::EngineOf(const std::string& id) {
  if (std::shared_ptr<Live> live = FindLive(id)) return live->engine;
  auto record = store_.Get(id);
  if (!record) return std::unexpected(record.error());
  return engines_.Get(record->engine);
}

Result<runtime::Engine*> Controller::ChooseEngine(const std::string& requested,
                                                  const Origin& origin,
                                                  const net::NetworkPolicy& network) {
  const std::string& name = !requested.empty()       ? requested
                            : !origin.engine.empty() ? origin.engine
                                                     : engines_.default_name();
  auto engine = engines_.Get(name);
  if (!engine) return std::unexpected(engine.error());
  const runtime::Capabilities& can = (*engine)->capabilities();
  if (origin.root == api::kRootHostUsr && !can.host_usr_root) {
    return std::unexpected(
        runtime::Lacks(name, "host_usr_root", "make a sandbox over the host's /usr (template "
                                              "base and those built on it)"));
  }
  if (origin.layers.size() > can.max_layers) {
    return std::unexpected(runtime::Lacks(
        name, "max_layers",
        "stack " + std::to_string(origin.layers.size()) + " layers (it takes " +
            std::to_string(can.max_layers) + ")"));
  }
  if (network.mode() != net::NetworkMode::kNone && !can.networking) {
    return std::unexpected(runtime::Lacks(name, "networking", "give a sandbox a network"));
  }
  return engine;
}

Controller::~Controller() {
  JoinBuilds();
  StopPoolFiller();
  StopReaper();
}

Result<RecoveryReport> Controller::Recover() {
  RecoveryReport report;
  // A build the previous run did not finish will not finish now; its sandbox goes below.
  std::set<std::string> unfinished_builds;
  if (auto templates = store_.ListTemplates()) {
    for (store::TemplateRecord& t : *templates) {
      if (t.state != store::TemplateState::kBuilding) continue;
      t.state = store::TemplateState::kFailed;
      t.error = "airlockd stopped during the build";
      if (auto st = store_.UpdateTemplate(t); !st) spdlog::error("{}", st.error().message());
      unfinished_builds.insert(t.name);
    }
  }
  auto records = store_.List();
  if (!records) return std::unexpected(records.error().Wrap("listing records at start"));
  std::set<std::string> claimed;  // ids whose record was dealt with
  for (const SandboxRecord& rec : *records) {
    if (rec.state == SandboxState::kDestroyed) continue;
    claimed.insert(rec.id);
    RecoverOne(rec, report);
  }
  // What each engine holds that no live record claims goes. An engine that is unavailable now
  // is not asked: what it holds waits for it (a hibernated sandbox is user data).
  for (runtime::Engine* engine : engines_.Available()) {
    auto found = engine->ListSandboxes();
    if (!found) {
      return std::unexpected(
          found.error().Wrap("listing the " + std::string(engine->name()) + " engine's sandboxes"));
    }
    for (const std::string& id : *found) {
      if (claimed.contains(id)) continue;
      spdlog::warn("start: removing {}, which no live record claims", id);
      if (auto st = engine->Destroy(id); !st) {
        spdlog::error("start: removing {}: {}", id, st.error().message());
        continue;
      }
      ++report.orphans_removed;
    }
  }
  for (const SandboxRecord& rec : *records) {
    auto build = rec.metadata.find(kBuildMetadataKey);
    if (build == rec.metadata.end() || !unfinished_builds.contains(build->second)) continue;
    if (!FindLive(rec.id)) continue;
    spdlog::info("start: destroying {}, the sandbox of an unfinished build", rec.id);
    if (auto st = Destroy(rec.id); !st) spdlog::error("start: {}", st.error().message());
  }
  spdlog::info(
      "start: {} adopted, {} not recoverable, {} destroys finished, {} orphans removed, {} left "
      "for an unavailable engine",
      report.adopted, report.failed, report.finished, report.orphans_removed, report.unavailable);
  if (auto collected = CollectLayers(); !collected) {
    spdlog::error("start: collecting layers: {}", collected.error().message());
  }
  if (networks_) {
    if (int removed = networks_->RemoveUnclaimed(); removed > 0) {
      spdlog::info("start: removed {} network namespace(s) no sandbox holds", removed);
    }
  }
  return report;
}

void Controller::RecoverOne(const SandboxRecord& rec, RecoveryReport& report) {
  const std::string& id = rec.id;
  // Destroys what the engine holds for `id` and records why the sandbox is gone.
  // Its engine: one that is unavailable now leaves the sandbox as it is, record and all (the
  // next start that has the engine takes it back), rather than destroying user data.
  auto held_by = engines_.Get(rec.engine);
  if (!held_by) {
    spdlog::warn("start: {} ({}) left as it is: {}", id, store::SandboxStateName(rec.state),
                 held_by.error().message());
    ++report.unavailable;
    return;
  }
  runtime::Engine& engine = **held_by;
  auto give_up = [&](const std::string& why) {
    spdlog::warn("start: {} ({}{}) not recovered: {}", id, store::SandboxStateName(rec.state),
                 rec.pooled ? ", pooled" : "", why);
    if (auto st = engine.Destroy(id); !st) {
      spdlog::error("start: {}", st.error().message());
      if (auto marked = store_.MarkFailed(id, why); !marked) {
        spdlog::error("start: {}", marked.error().message());
      }
    } else if (rec.pooled) {
      Discard(id);  // nobody asked for it: no failed record to show
    } else if (auto marked = store_.MarkFailed(id, why); !marked) {
      spdlog::error("start: {}", marked.error().message());
    }
    ++report.failed;
  };
  switch (rec.state) {
    case SandboxState::kCreating:
      // Never acknowledged: the 201 goes out only once the record says running.
      give_up("airlockd stopped during the create; what it had made was removed");
      return;
    case SandboxState::kDestroying:
      if (auto st = FinishDestroy(id); !st) {
        spdlog::error("start: {}", st.error().message());
      } else {
        ++report.finished;
      }
      return;
    case SandboxState::kFailed:
      // Keeps the record (and its reason) for the caller; removes anything left behind.
      if (auto st = engine.Destroy(id); !st) spdlog::error("start: {}", st.error().message());
      return;
    case SandboxState::kRunning:
    case SandboxState::kPaused:
      break;
    case SandboxState::kDestroyed:
      return;
  }
  const bool paused = rec.state == SandboxState::kPaused;
  auto adopted = engine.Adopt(id, rec.engine_state, paused);
  if (!adopted) {
    give_up("airlockd restarted and " + adopted.error().message());
    return;
  }
  std::vector<std::string> network_env;  // an allowlist network's HTTP_PROXY and friends
  if (auto slot = rec.resources.find(kNetSlot); slot != rec.resources.end()) {
    uint32_t number = 0;
    const std::string& text = slot->second;
    auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), number);
    auto adopted_net =
        !networks_ ? Fail(ErrorCode::kUnimplemented, "this airlockd has no sandbox networking")
        : ec != std::errc() || end != text.data() + text.size()
            ? Fail(ErrorCode::kInternal, "its record names network slot '" + text + "'")
            : networks_->Adopt(id, number, PolicyOf(rec));
    if (!adopted_net) {
      give_up("airlockd restarted and its network could not be taken back: " +
              adopted_net.error().message());
      return;
    }
    network_env = std::move(adopted_net->env);
  }
  auto workdir = rec.resources.find(kWorkdir);
  // A claimed sandbox's commands carry its env, and its network's as a cold create's agent has
  // it (after the request's env); the others' agent has both from its start.
  std::vector<std::string> env;
  if (rec.resources.contains(kEnvPerCommand)) {
    env = rec.env;
    env.insert(env.end(), network_env.begin(), network_env.end());
  }
  Hold(id, &engine, std::move(env), workdir == rec.resources.end() ? "" : workdir->second);
  if (!paused && !rec.pooled && engine.capabilities().live_limits) {
    // A claim commits the request's limits before it writes them to the engine; a crash in
    // between would leave the pool's defaults in force. Writing the recorded ones again closes
    // that gap (and changes nothing for every other sandbox).
    runtime::Limits limits;
    limits.cpus = rec.limits.cpus;
    limits.memory_mb = static_cast<uint64_t>(rec.limits.memory_mb);
    limits.pids_max = static_cast<uint64_t>(rec.limits.pids_max);
    if (auto st = engine.UpdateLimits(id, limits); !st) {
      spdlog::warn("start: {}: re-applying its limits: {}", id, st.error().message());
    }
  }
  if (!paused) {  // a frozen agent cannot answer; its channel is opened after the resume
    auto channel = Acquire(id, /*allow_pooled=*/true);
    if (!channel) {
      {
        std::lock_guard lock(mu_);
        live_.erase(id);
      }
      give_up("airlockd restarted and its agent does not answer: " + channel.error().message());
      return;
    }
    channel->Keep();
  }
  spdlog::info("start: adopted {} ({}{})", id, store::SandboxStateName(rec.state),
               rec.pooled ? ", pooled" : "");
  ++report.adopted;
}

void Controller::StartReaper(std::chrono::milliseconds period) {
  reaper_ = std::thread([this, period] {
    const auto purge_every = std::min<std::chrono::steady_clock::duration>(
        destroyed_keep_, std::chrono::minutes(1));
    std::optional<std::chrono::steady_clock::time_point> purged;
    std::unique_lock lock(reaper_mu_);
    while (!reaper_stop_) {
      lock.unlock();
      // A pass that destroyed some took time (many expiring at once, as after a restart):
      // others may have expired meanwhile, so the next pass comes at once.
      while (ReapExpired() > 0 && !ReaperStopping()) {
      }
      const auto now = std::chrono::steady_clock::now();
      if (destroyed_keep_.count() > 0 && (!purged || now - *purged >= purge_every)) {
        PurgeDestroyed();
        purged = now;
      }
      lock.lock();
      reaper_cv_.wait_for(lock, period, [this] { return reaper_stop_; });
    }
  });
}

bool Controller::ReaperStopping() {
  std::lock_guard lock(reaper_mu_);
  return reaper_stop_;
}

void Controller::StopReaper() {
  {
    std::lock_guard lock(reaper_mu_);
    reaper_stop_ = true;
  }
  reaper_cv_.notify_all();
  if (reaper_.joinable()) reaper_.join();
}

int Controller::ReapExpired() {
  auto ids = store_.Expired(NowMs());
  if (!ids) {
    spdlog::error("ttl: {}", ids.error().message());
    return 0;
  }
  int destroyed = 0;
  for (const std::string& id : *ids) {
    auto record = store_.Get(id);
    // A create in progress is left to finish; its deadline is checked again on the next pass.
    if (!record || record->state == SandboxState::kCreating) continue;
    if (auto st = Destroy(id); !st) {
      // A delete that won the race is not an error.
      if (st.error().code() != ErrorCode::kNotFound &&
          st.error().code() != ErrorCode::kFailedPrecondition) {
        spdlog::error("ttl: {}", st.error().message());
      }
      continue;
    }
    spdlog::info("ttl: {} expired and was destroyed", id);
    ++destroyed;
    ++expired_total_;
  }
  return destroyed;
}

int64_t Controller::PurgeDestroyed() {
  if (destroyed_keep_.count() <= 0) return 0;
  auto purged = store_.PurgeDestroyed(
      NowMs() - std::chrono::duration_cast<std::chrono::milliseconds>(destroyed_keep_).count());
  if (!purged) {
    spdlog::error("purging destroyed records: {}", purged.error().message());
    return 0;
  }
  if (*purged > 0) {
    spdlog::info("purged {} destroyed sandbox record(s) older than {} s", *purged,
                 destroyed_keep_.count());
    purged_total_ += static_cast<uint64_t>(*purged);
  }
  return *purged;
}

Status Controller::CheckNetwork(const net::NetworkPolicy& policy) const {
  if (policy.mode() == net::NetworkMode::kNone) return {};
  if (!networks_) {
    return Fail(ErrorCode::kUnimplemented,
                "this airlockd has no sandbox networking (it could not set it up at start; see "
                "its log), so only network mode \"none\" is served");
  }
  if (policy.mode() == net::NetworkMode::kOpen && networks_->config().uplink.empty()) {
    return Fail(ErrorCode::kFailedPrecondition,
                "network mode open needs an uplink (network_uplink in airlockd.toml)");
  }
  return networks_->CheckLimits(policy);
}

Result<SandboxRecord> Controller::Create(const api::CreateSandboxRequest& request) {
  // Refused before a pooled sandbox is claimed for it (the cold path would refuse it too).
  if (auto st = CheckNetwork(request.network); !st) return std::unexpected(st.error());
  auto resolved = ResolveTemplate(request);
  if (!resolved) return std::unexpected(resolved.error());
  auto made = [&] {
    if (auto claimed = ClaimFromPool(*resolved)) return std::move(*claimed);
    return CreateSandbox(resolved->request, /*pooled=*/false, &resolved->origin);
  }();
  if (!made) return made;
  if (auto started = StartTemplateCommands(made->id, *resolved); !started) {
    if (auto st = Destroy(made->id); !st) spdlog::error("{}", st.error().message());
    return std::unexpected(started.error());
  }
  return made;
}

void Controller::Discard(const std::string& id) {
  const SandboxState from[] = {SandboxState::kCreating, SandboxState::kRunning,
                               SandboxState::kFailed};
  auto moved = store_.Transition(id, from, SandboxState::kDestroying);
  if (moved) moved = store_.Transition(id, {}, SandboxState::kDestroyed);
  if (!moved) spdlog::error("discarding {}: {}", id, moved.error().message());
}

Result<SandboxRecord> Controller::CreateSandbox(const api::CreateSandboxRequest& request,
                                                bool pooled, const Origin* given_origin) {
  Origin origin;
  if (given_origin) {
    origin = *given_origin;
  } else {
    auto resolved = ResolveTemplate(request);
    if (!resolved) return std::unexpected(resolved.error());
    origin = std::move(resolved->origin);
  }
  auto chosen = ChooseEngine(request.engine, origin, request.network);
  if (!chosen) return std::unexpected(chosen.error());
  runtime::Engine& engine = **chosen;
  SandboxRecord record;
  record.id = NewSandboxId();
  record.state = SandboxState::kCreating;
  record.engine = std::string(engine.name());
  record.template_name = request.template_name;
  record.limits = ToStoreLimits(request.limits);
  record.env = api::EnvList(request.env);
  record.metadata = request.metadata;
  // A pooled sandbox has no deadline until a claim gives it the request's.
  record.expires_at_ms = pooled ? 0 : NowMs() + request.ttl_seconds * 1000;
  record.pooled = pooled;
  record.layers = origin.layers;
  record.tenant = request.tenant;
  if (auto st = CheckNetwork(request.network); !st) return std::unexpected(st.error());
  const bool networked = request.network.mode() != net::NetworkMode::kNone;
  if (networked) record.network = request.network.ToJson().dump();
  // A pooled sandbox's network namespace must exist before the engine makes it (the jail joins
  // it as it clones), so the pool's sandboxes are made linked but parked; a claim gives them the
  // request's policy or takes the link away (ClaimFromPool).
  const bool linked = networked || (pooled && networks_ != nullptr);
  const std::string id = record.id;
  // The record exists before any resource does, so a crash during the create leaves a trace.
  if (auto inserted = store_.Insert(record); !inserted) {
    return std::unexpected(inserted.error().Wrap("recording " + id));
  }
  auto fail = [&](Error error) -> Result<SandboxRecord> {
    if (linked) DetachNetwork(id);
    if (pooled) {
      Discard(id);
    } else if (auto marked = store_.MarkFailed(id, error.message()); !marked) {
      spdlog::error("marking {} failed: {}", id, marked.error().message());
    }
    return std::unexpected(std::move(error));  // the engine's messages name the id already
  };

  runtime::SandboxSpec spec;
  spec.id = id;
  spec.root.host_usr = origin.root == api::kRootHostUsr;
  spec.root.layers = origin.layers;
  spec.limits = request.limits;
  spec.env = record.env;
  std::optional<net::Attachment> network;
  if (linked) {
    auto attached = networks_->Attach(id, request.network);  // mode none: parked
    if (!attached) return fail(std::move(attached.error()));
    network = std::move(*attached);
    spec.netns = network->netns_path;
    spec.nameserver = network->gateway;
    spec.env.insert(spec.env.end(), network->env.begin(), network->env.end());
  }
  auto sandbox = engine.Create(spec);
  if (!sandbox) return fail(std::move(sandbox.error()));
  auto destroy_and_fail = [&](Error error) {
    {
      std::lock_guard lock(mu_);
      live_.erase(id);
    }
    if (auto st = engine.Destroy(id); !st) {
      spdlog::error("undoing the create of {}: {}", id, st.error().message());
    }
    return fail(std::move(error));
  };
  auto client = protocol::BlockingClient::Connect((*sandbox)->TakeAgentChannel(),
                                                  std::string("airlockd ") + kBuildId);
  if (!client) return destroy_and_fail(client.error().Wrap("connecting to the agent"));
  const runtime::SandboxInfo& info = (*sandbox)->info();
  auto live = std::make_shared<Live>();
  live->engine = &engine;
  live->idle.push_back(std::move(*client));
  live->cwd = origin.workdir;
  {
    std::lock_guard lock(mu_);
    live_[id] = live;
  }
  // One commit records what the engine made (for recovery) and the running state. A crash
  // before it leaves the record creating, which the next start destroys by id.
  const SandboxState from[] = {SandboxState::kCreating};
  auto running = store_.Transition(id, from, SandboxState::kRunning, [&](SandboxRecord& r) {
    r.engine_state = info.engine_state;
    if (!origin.workdir.empty()) r.resources[kWorkdir] = origin.workdir;
    if (origin.root != api::kRootHostUsr) r.resources[kRoot] = origin.root;
    if (network) {
      r.resources[kNetSlot] = std::to_string(network->slot);
      r.resources[kNetAddress] = network->address;
      if (!network->address6.empty()) r.resources[kNetAddress6] = network->address6;
    }
  });
  if (!running) return destroy_and_fail(std::move(running.error()));
  spdlog::info("created {}{} on the {} engine", id, pooled ? " for the pool" : "", engine.name());
  return running;
}

Error SandboxNotFound(const std::string& id) {
  return Error(ErrorCode::kNotFound, "sandbox " + id + " does not exist");
}

Result<SandboxRecord> Controller::Get(const std::string& id) {
  auto record = store_.Get(id);
  // A pooled sandbox belongs to no one until it is claimed.
  if (record && (record->state == SandboxState::kDestroyed || record->pooled)) {
    return std::unexpected(SandboxNotFound(id));
  }
  if (!record && record.error().code() == ErrorCode::kNotFound) {
    return std::unexpected(SandboxNotFound(id));
  }
  return record;
}

Result<std::vector<SandboxRecord>> Controller::List(const api::ListFilter& filter) {
  store::ListFilter query;
  if (filter.state) {
    auto state = store::ParseSandboxState(*filter.state);
    if (!state) return Fail(ErrorCode::kInvalidArgument, "unknown state " + *filter.state);
    if (*state == SandboxState::kDestroyed) return std::vector<SandboxRecord>{};
    query.states = {*state};
  } else {
    for (SandboxState s : store::kAllSandboxStates) {
      if (s != SandboxState::kDestroyed) query.states.push_back(s);
    }
  }
  for (const auto& [key, value] : filter.metadata) query.metadata.emplace_back(key, value);
  query.pooled = false;
  query.tenant = filter.tenant;
  return store_.List(query);
}

Result<SandboxRecord> Controller::Patch(const std::string& id,
                                        const api::PatchSandboxRequest& request) {
  std::lock_guard lock(patch_mu_);
  auto record = Get(id);
  if (!record) return record;
  api::Metadata metadata = record->metadata;
  if (auto st = request.ApplyMetadata(metadata); !st) return std::unexpected(st.error());
  if (request.network) {  // refused before anything changes
    if (auto st = CheckNetwork(*request.network); !st) return std::unexpected(st.error());
  }
  if (request.ttl_seconds) {
    record = store_.UpdateTtl(id, NowMs() + *request.ttl_seconds * 1000);
    if (!record) return record;
  }
  if (!request.metadata.empty()) record = store_.UpdateMetadata(id, std::move(metadata));
  if (record && request.network) {
    // The sandbox's namespace was made (or not) at create: a sandbox without one stays without.
    if (!networks_ || !record->resources.contains(kNetSlot)) {
      return Fail(ErrorCode::kFailedPrecondition,
                  "sandbox " + id + " was created with network mode \"none\"; its network cannot "
                  "be changed (create it with a network mode to change its policy later)");
    }
    if (auto st = networks_->Update(id, *request.network); !st) return std::unexpected(st.error());
    record = store_.UpdateNetwork(id, request.network->ToJson().dump());
  }
  return record;
}

net::NetworkPolicy Controller::PolicyOf(const SandboxRecord& r) {
  if (r.network.empty()) return {};
  auto parsed = net::NetworkPolicy::FromJson(
      nlohmann::json::parse(r.network, nullptr, /*allow_exceptions=*/false));
  return parsed ? std::move(*parsed) : net::NetworkPolicy();
}

void Controller::DetachNetwork(const std::string& id) {
  if (!networks_) return;
  if (auto st = networks_->Detach(id); !st) spdlog::error("{}", st.error().message());
}

Result<store::NetworkEventPage> Controller::NetworkEvents(const std::string& id,
                                                          const api::NetworkEventsQuery& query) {
  // Readable after the destroy too (an audit usually comes then), until the record is purged.
  auto record = store_.Get(id);
  if ((record && record->pooled) || (!record && record.error().code() == ErrorCode::kNotFound)) {
    return std::unexpected(SandboxNotFound(id));
  }
  if (!record) return std::unexpected(record.error());
  if (network_events_) {
    // What is queued is older than this call: the reader sees it. A failed write is counted
    // as dropped and said in the log; the page is still served.
    if (auto st = network_events_->Flush(); !st) {
      spdlog::error("storing network verdicts: {}", st.error().message());
    }
  }
  return store_.NetworkEvents(id, query.after, query.limit);
}

Status Controller::FinishDestroy(const std::string& id) {
  // An engine that is unavailable leaves the record destroying, for a start that has it.
  auto engine = EngineOf(id);
  if (!engine) return std::unexpected(engine.error().Wrap("destroying " + id));
  if (auto st = (*engine)->Destroy(id); !st) {
    if (auto marked = store_.MarkFailed(id, st.error().message()); !marked) {
      spdlog::error("marking {} failed: {}", id, marked.error().message());
    }
    return std::unexpected(st.error().Wrap("destroying " + id));
  }
  {
    std::lock_guard lock(mu_);
    live_.erase(id);  // commands still running see their channels close
  }
  DetachNetwork(id);
  const SandboxState from[] = {SandboxState::kDestroying};
  auto done = store_.Transition(id, from, SandboxState::kDestroyed);
  if (!done) return std::unexpected(done.error().Wrap("recording the destroy of " + id));
  spdlog::info("destroyed {}", id);
  // A fork's snapshot belongs to no template: its last sandbox out takes it along.
  if (!done->layers.empty()) (void)CollectLayers();
  return {};
}

Status Controller::Destroy(const std::string& id) { return DestroySandbox(id, false); }

Status Controller::DestroySandbox(const std::string& id, bool allow_pooled) {
  std::shared_ptr<Live> live = FindLive(id);
  std::unique_lock<std::mutex> lock;
  if (live) lock = std::unique_lock(live->lifecycle_mu);
  if (auto record = allow_pooled ? store_.Get(id) : Get(id); !record) {
    return std::unexpected(record.error());
  }
  const SandboxState from[] = {SandboxState::kRunning, SandboxState::kPaused,
                               SandboxState::kFailed};
  if (auto moved = store_.Transition(id, from, SandboxState::kDestroying); !moved) {
    return std::unexpected(moved.error());
  }
  return FinishDestroy(id);
}

Result<SandboxRecord> Controller::Pause(const std::string& id) {
  std::shared_ptr<Live> live = FindLive(id);
  std::unique_lock<std::mutex> lock;
  if (live) lock = std::unique_lock(live->lifecycle_mu);
  auto record = Get(id);
  if (!record) return record;
  if (auto st = store::RequireState(id, record->state, kRunningOnly); !st) {
    return std::unexpected(st.error());
  }
  if (!live) return std::unexpected(NotHeld(*record));
  if (!live->engine->capabilities().pause) {
    return std::unexpected(runtime::Lacks(live->engine->name(), "pause", "pause a sandbox"));
  }
  if (auto st = live->engine->Pause(id); !st) {
    return std::unexpected(st.error().Wrap("pausing " + id));
  }
  return store_.Transition(id, kRunningOnly, SandboxState::kPaused);
}

Result<SandboxRecord> Controller::Resume(const std::string& id) {
  std::shared_ptr<Live> live = FindLive(id);
  std::unique_lock<std::mutex> lock;
  if (live) lock = std::unique_lock(live->lifecycle_mu);
  auto record = Get(id);
  if (!record) return record;
  const SandboxState from[] = {SandboxState::kPaused};
  if (auto st = store::RequireState(id, record->state, from); !st) {
    return std::unexpected(st.error());
  }
  if (!live) return std::unexpected(NotHeld(*record));
  if (auto st = live->engine->Resume(id); !st) {
    return std::unexpected(st.error().Wrap("resuming " + id));
  }
  return store_.Transition(id, from, SandboxState::kRunning);
}

Error Controller::NotHeld(const SandboxRecord& record) const {
  // Its engine is unavailable (recovery left it as it was), or it is another daemon's.
  if (auto engine = engines_.Get(record.engine); !engine) {
    return Error(ErrorCode::kFailedPrecondition,
                 "sandbox " + record.id + " runs on the " + record.engine +
                     " engine, which this airlockd cannot use now: " + engine.error().message());
  }
  return Error(ErrorCode::kUnavailable, "sandbox " + record.id + " is not held by this daemon");
}

Result<Controller::Channel> Controller::Acquire(const std::string& id, bool allow_pooled) {
  auto record = allow_pooled ? store_.Get(id) : Get(id);
  if (!record) return std::unexpected(record.error());
  if (auto st = store::RequireState(id, record->state, kRunningOnly); !st) {
    return std::unexpected(st.error());
  }
  std::shared_ptr<Live> live = FindLive(id);
  if (!live) return std::unexpected(NotHeld(*record));
  return ChannelTo(id, std::move(live));
}

Result<Controller::Channel> Controller::ChannelTo(const std::string& id,
                                                  std::shared_ptr<Live> live) {
  {
    std::lock_guard lock(live->channels_mu);
    if (!live->idle.empty()) {
      protocol::BlockingClient client = std::move(live->idle.back());
      live->idle.pop_back();
      return Channel(live, std::move(client));
    }
  }
  auto fd = live->engine->ConnectAgent(id);
  if (!fd) return std::unexpected(Explain(id, std::move(fd.error())));
  auto client =
      protocol::BlockingClient::Connect(std::move(*fd), std::string("airlockd ") + kBuildId);
  if (!client) {
    return std::unexpected(Explain(id, client.error().Wrap("connecting to the agent of " + id)));
  }
  return Channel(live, std::move(*client));
}

Status Controller::WriteHeldFile(const std::string& id, std::shared_ptr<Live> live,
                                 const std::string& path, std::string_view data) {
  auto channel = ChannelTo(id, std::move(live));
  if (!channel) return std::unexpected(channel.error());
  if (auto st = (*channel)->WriteFile(path, data, 0644, false); !st) return st;
  channel->Keep();
  return {};
}

Error Controller::Explain(const std::string& id, Error error) {
  auto now = Get(id);
  if (!now) return std::move(now.error());
  if (auto st = store::RequireState(id, now->state, kRunningOnly); !st) {
    return std::move(st.error());
  }
  return error;
}

api::ExecResultView ToResultView(protocol::ExecResult result) {
  api::ExecResultView view;
  view.exit_code = result.exit.exit_code;
  view.signal = result.exit.term_signal;
  view.stdout_bytes = std::move(result.stdout_data);
  view.stderr_bytes = std::move(result.stderr_data);
  view.duration_ms = result.exit.duration_us / 1000;
  view.timed_out = result.exit.timed_out;
  view.oom_killed = result.exit.oom_killed;
  view.truncated = result.exit.truncated;
  return view;
}

Error Controller::ExecError(const std::string& id, Error error) {
  error = Explain(id, std::move(error).Wrap("exec in " + id));
  // The agent's "not found" / "permission denied" are about the command, its cwd or its
  // user, not the sandbox: the caller must change the request (400), not look for the id.
  if (error.code() == ErrorCode::kNotFound || error.code() == ErrorCode::kPermissionDenied) {
    return Error(ErrorCode::kInvalidArgument, error.message());
  }
  return error;
}

Result<protocol::ExecResult> Controller::Exec(const std::string& id,
                                              const api::ExecRequest& request) {
  auto channel = Acquire(id);
  if (!channel) return std::unexpected(channel.error());
  protocol::Exec exec = ToProtocolExec(request, channel->sandbox_env(), channel->sandbox_cwd());
  // The agent ends the command at its timeout (plus the kill grace); until then it may be
  // silent for as long as it likes.
  (*channel)->set_receive_timeout(std::chrono::milliseconds(exec.timeout_ms) +
                                  std::chrono::seconds(30));
  auto result = (*channel)->Exec(exec, request.stdin_data);
  if (!result) return std::unexpected(ExecError(id, std::move(result.error())));
  channel->Keep();
  return result;
}

// The events of an exec stream or an attach stream, one NDJSON line each.
class Controller::StreamingExec : public ExecStream {
 public:
  StreamingExec(Controller& controller, std::string id, Channel channel, uint32_t stream,
                std::chrono::milliseconds silence_limit, int32_t pid, std::string first_event,
                bool done)
      : controller_(controller),
        id_(std::move(id)),
        channel_(std::move(channel)),
        stream_(stream),
        silence_limit_(silence_limit),
        pid_(pid),
        first_(std::move(first_event)),
        done_(done) {}

  int32_t pid() const override { return pid_; }

  std::optional<std::string> Next() override {
    if (!first_.empty()) return std::exchange(first_, std::string());
    if (done_) return std::nullopt;
    // Waits a second at a time, so that the server can check on its client between waits (an
    // empty piece sends nothing).
    auto msg = channel_->NextFor(stream_, std::chrono::seconds(1));
    if (!msg && msg.error().code() == ErrorCode::kDeadlineExceeded) {
      silent_ += std::chrono::seconds(1);
      if (silent_ < silence_limit_) return std::string();
    }
    silent_ = {};
    std::string piece;
    // Then whatever else has already arrived, up to a bound: one piece (one HTTP chunk, one
    // trip between the worker pool and the IO thread) for many events when output is heavy.
    constexpr size_t kMaxPiece = 1 << 20;
    while (true) {
      Render(std::move(msg), piece);
      if (done_ || piece.size() >= kMaxPiece) break;
      msg = channel_->NextFor(stream_, std::chrono::milliseconds(0));
      if (!msg && msg.error().code() == ErrorCode::kDeadlineExceeded) break;
    }
    if (piece.empty() && done_) return std::nullopt;  // an attachment's end without an event
    return piece;
  }

 private:
  // Appends the event for `msg` (or for the failure to read one) to `out`.
  void Render(Result<protocol::Message> msg, std::string& out) {
    const auto now = std::chrono::system_clock::now();  // when the event reached the daemon
    if (!msg) {
      done_ = true;
      out += api::RenderErrorEvent(controller_.ExecError(id_, std::move(msg.error())), now);
    } else if (auto* output = std::get_if<protocol::Output>(&*msg)) {
      out += api::RenderOutputEvent(output->fd == protocol::OutputFd::kStdout, output->data, now);
    } else if (auto* dropped = std::get_if<protocol::Dropped>(&*msg)) {
      out += api::RenderDroppedEvent(dropped->bytes, now);
    } else if (auto* exited = std::get_if<protocol::Exited>(&*msg)) {
      done_ = true;
      channel_.Keep();
      out += api::RenderExitEvent(ToResultView({.exit = *exited}), now);
    } else if (std::holds_alternative<protocol::Done>(*msg)) {  // an attachment's replay ended
      done_ = true;
      channel_.Keep();
    } else if (auto* error = std::get_if<protocol::ErrorMsg>(&*msg)) {
      done_ = true;
      Error e(error->code, error->message, error->sys_errno);
      out += api::RenderErrorEvent(controller_.ExecError(id_, std::move(e)), now);
    }
  }

  Controller& controller_;
  std::string id_;
  Channel channel_;
  uint32_t stream_;
  // The agent ends the command at its timeout; a channel silent for longer than that (plus a
  // margin) is broken.
  std::chrono::milliseconds silence_limit_;
  std::chrono::milliseconds silent_{0};
  int32_t pid_;
  std::string first_;  // sent before anything read from the channel
  bool done_;
};

Result<std::unique_ptr<ExecStream>> Controller::StartExec(const std::string& id,
                                                          const api::ExecRequest& request) {
  auto channel = Acquire(id);
  if (!channel) return std::unexpected(channel.error());
  protocol::Exec exec = ToProtocolExec(request, channel->sandbox_env(), channel->sandbox_cwd());
  // A stream holds nothing in the daemon (each piece waits for the client to take the last),
  // so the output is not capped; a plain exec keeps the agent's default cap (16 MiB).
  exec.output_cap = uint64_t{1} << 50;
  const auto silence_limit = exec.timeout_ms
                                 ? std::chrono::milliseconds(exec.timeout_ms) + std::chrono::seconds(30)
                                 : std::chrono::milliseconds(kForever);
  auto stream = (*channel)->StartExec(exec);
  if (!stream) return std::unexpected(ExecError(id, std::move(stream.error())));
  if (exec.stdin_mode == protocol::StdinMode::kPipe) {
    const std::string_view in = request.stdin_data;
    for (size_t off = 0; off < in.size(); off += protocol::kMaxChunk) {
      auto st = (*channel)->Send(*stream, protocol::StdinData{std::string(in.substr(off, protocol::kMaxChunk))});
      if (!st) return std::unexpected(ExecError(id, std::move(st.error())));
    }
    if (!request.stdin_open) {
      if (auto st = (*channel)->Send(*stream, protocol::StdinClose{}); !st) {
        return std::unexpected(ExecError(id, std::move(st.error())));
      }
    }
  }
  // The first answer: the pid, or why the command could not start (an error event, so that the
  // stream still answers 200 like any command that ran and failed).
  auto first = (*channel)->NextFor(*stream);
  const auto now = std::chrono::system_clock::now();
  if (!first) return std::unexpected(ExecError(id, std::move(first.error())));
  if (auto* started = std::get_if<protocol::Started>(&*first)) {
    return std::make_unique<StreamingExec>(*this, id, std::move(*channel), *stream, silence_limit,
                                           started->pid,
                                           api::RenderStartEvent(started->pid, now), false);
  }
  if (auto* error = std::get_if<protocol::ErrorMsg>(&*first)) {
    Error e = ExecError(id, Error(error->code, error->message, error->sys_errno));
    channel->Keep();
    return std::make_unique<StreamingExec>(*this, id, std::move(*channel), *stream, silence_limit, 0,
                                           api::RenderErrorEvent(e, now), true);
  }
  return Fail(ErrorCode::kProtocol, "the agent answered exec with " +
                                        std::string(protocol::MsgTypeName(protocol::TypeOf(*first))));
}

api::ProcessView ToProcessView(const protocol::ProcessInfo& info) {
  const auto from_ms = [](int64_t ms) {
    return std::chrono::system_clock::time_point(std::chrono::milliseconds(ms));
  };
  api::ProcessView view;
  view.pid = info.pid;
  view.command = info.command;
  view.running = info.running;
  view.background = info.background;
  view.pty = info.pty;
  view.stdin_open = info.stdin_open;
  view.started_at = from_ms(info.started_unix_ms);
  if (!info.running) {
    view.ended_at = from_ms(info.ended_unix_ms);
    view.exit = ToResultView({.exit = info.exit});
  }
  return view;
}

Error Controller::ProcessError(const std::string& id, int32_t pid, Error error) {
  return Explain(id, std::move(error).Wrap("process " + std::to_string(pid) + " in " + id));
}

Result<protocol::ProcessInfo> Controller::FindProcess(const std::string& id, Channel& channel,
                                                      int32_t pid) {
  auto all = channel->ListProcesses();
  if (!all) return std::unexpected(Explain(id, std::move(all.error())));
  // The running one with this pid, else the latest that had it.
  const protocol::ProcessInfo* found = nullptr;
  for (const auto& p : *all) {
    if (p.pid == pid && (!found || p.running || !found->running)) found = &p;
  }
  if (!found) {
    return Fail(ErrorCode::kNotFound, "no process " + std::to_string(pid) + " in " + id +
                                          " (never started by the API, or forgotten)");
  }
  return *found;
}

Result<protocol::ProcessInfo> Controller::StartBackground(const std::string& id,
                                                          const api::ExecRequest& request) {
  auto channel = Acquire(id);
  if (!channel) return std::unexpected(channel.error());
  protocol::Exec exec = ToProtocolExec(request, channel->sandbox_env(), channel->sandbox_cwd());
  auto stream = (*channel)->StartExec(exec);
  if (!stream) return std::unexpected(ExecError(id, std::move(stream.error())));
  auto first = (*channel)->NextFor(*stream);
  if (!first) return std::unexpected(ExecError(id, std::move(first.error())));
  if (auto* error = std::get_if<protocol::ErrorMsg>(&*first)) {
    return std::unexpected(ExecError(id, Error(error->code, error->message, error->sys_errno)));
  }
  auto* started = std::get_if<protocol::Started>(&*first);
  if (!started) return Fail(ErrorCode::kProtocol, "the agent did not answer exec with started");
  const int32_t pid = started->pid;
  if (!request.stdin_data.empty() || (exec.stdin_mode == protocol::StdinMode::kPipe &&
                                      !request.stdin_open)) {
    auto attached = (*channel)->Attach({.pid = pid});
    if (!attached) return std::unexpected(ProcessError(id, pid, std::move(attached.error())));
    const uint32_t s = attached->first;
    for (size_t off = 0; off < request.stdin_data.size(); off += protocol::kMaxChunk) {
      auto st = (*channel)->Send(
          s, protocol::StdinData{request.stdin_data.substr(off, protocol::kMaxChunk)});
      if (!st) return std::unexpected(ProcessError(id, pid, std::move(st.error())));
    }
    if (!request.stdin_open) {
      if (auto st = (*channel)->Send(s, protocol::StdinClose{}); !st) {
        return std::unexpected(ProcessError(id, pid, std::move(st.error())));
      }
    }
    if (auto end = (*channel)->Detach(s); !end) {
      return std::unexpected(ProcessError(id, pid, std::move(end.error())));
    }
  }
  auto info = FindProcess(id, *channel, pid);
  if (info) channel->Keep();
  return info;
}

Result<std::vector<protocol::ProcessInfo>> Controller::ListProcesses(const std::string& id) {
  auto channel = Acquire(id);
  if (!channel) return std::unexpected(channel.error());
  auto all = (*channel)->ListProcesses();
  if (!all) return std::unexpected(Explain(id, std::move(all.error())));
  channel->Keep();
  return all;
}

Result<protocol::ProcessInfo> Controller::GetProcess(const std::string& id, int32_t pid) {
  auto channel = Acquire(id);
  if (!channel) return std::unexpected(channel.error());
  auto info = FindProcess(id, *channel, pid);
  if (info || info.error().code() == ErrorCode::kNotFound) channel->Keep();
  return info;
}

Result<protocol::ProcessInfo> Controller::ControlOnce(
    const std::string& id, int32_t pid,
    const std::function<Result<std::optional<protocol::Exited>>(
        Channel&, uint32_t, const protocol::Attached&)>& action) {
  auto channel = Acquire(id);
  if (!channel) return std::unexpected(channel.error());
  // The entry as it was, for when the process is gone from the table afterwards (a foreground
  // command leaves it as it ends).
  auto before = FindProcess(id, *channel, pid);
  if (!before) {
    if (before.error().code() == ErrorCode::kNotFound) channel->Keep();
    return before;
  }
  auto attached = (*channel)->Attach({.pid = pid});
  if (!attached) return std::unexpected(ProcessError(id, pid, std::move(attached.error())));
  auto ended = action(*channel, attached->first, attached->second);
  if (!ended) {
    // The attachment may still be open: the channel is not reused.
    return std::unexpected(ProcessError(id, pid, std::move(ended.error())));
  }
  std::optional<protocol::Exited> exited = *ended;
  if (!exited) {
    auto end = (*channel)->Detach(attached->first);
    if (!end) return std::unexpected(ProcessError(id, pid, std::move(end.error())));
    if (auto* e = std::get_if<protocol::Exited>(&*end)) exited = *e;
  }
  auto after = FindProcess(id, *channel, pid);
  if (after || after.error().code() == ErrorCode::kNotFound) channel->Keep();
  if (after || after.error().code() != ErrorCode::kNotFound) return after;
  if (exited) {
    before->running = false;
    before->stdin_open = false;
    before->exit = *exited;
    before->ended_unix_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                                std::chrono::system_clock::now().time_since_epoch())
                                .count();
  }
  return before;
}

Result<protocol::ProcessInfo> Controller::SignalProcess(const std::string& id, int32_t pid,
                                                        int signo) {
  return ControlOnce(id, pid,
                     [&](Channel& channel, uint32_t stream,
                         const protocol::Attached&) -> Result<std::optional<protocol::Exited>> {
                       if (auto st = channel->Send(stream, protocol::Signal{signo}); !st) {
                         return std::unexpected(st.error());
                       }
                       return std::nullopt;
                     });
}

Result<protocol::ProcessInfo> Controller::WriteProcessStdin(const std::string& id, int32_t pid,
                                                            std::string_view data, bool close) {
  return ControlOnce(
      id, pid,
      [&](Channel& channel, uint32_t stream,
          const protocol::Attached& info) -> Result<std::optional<protocol::Exited>> {
        if (!info.stdin_open) {
          return Fail(ErrorCode::kFailedPrecondition,
                      info.running ? "its stdin is not open (start it with \"stdin_open\": true, "
                                     "or it was closed)"
                                   : "it has exited");
        }
        for (size_t off = 0; off < data.size(); off += protocol::kMaxChunk) {
          auto st = channel->Send(
              stream, protocol::StdinData{std::string(data.substr(off, protocol::kMaxChunk))});
          if (!st) return std::unexpected(st.error());
        }
        if (close) {
          if (auto st = channel->Send(stream, protocol::StdinClose{}); !st) {
            return std::unexpected(st.error());
          }
        }
        return std::nullopt;
      });
}

Result<protocol::ProcessInfo> Controller::WaitProcess(const std::string& id, int32_t pid,
                                                      std::chrono::milliseconds timeout) {
  return ControlOnce(id, pid,
                     [&](Channel& channel, uint32_t stream, const protocol::Attached& info)
                         -> Result<std::optional<protocol::Exited>> {
                       // An attachment to an exited process ends at once with its kExited.
                       auto msg = channel->NextFor(
                           stream, info.running ? timeout : std::chrono::milliseconds(60000));
                       if (!msg && msg.error().code() == ErrorCode::kDeadlineExceeded) {
                         return std::nullopt;  // still running
                       }
                       if (!msg) return std::unexpected(msg.error());
                       if (auto* error = std::get_if<protocol::ErrorMsg>(&*msg)) {
                         return std::unexpected(protocol::FromErrorMsg(*error));
                       }
                       auto* exited = std::get_if<protocol::Exited>(&*msg);
                       if (!exited) {
                         return Fail(ErrorCode::kProtocol,
                                     "unexpected " +
                                         std::string(protocol::MsgTypeName(protocol::TypeOf(*msg))) +
                                         " on an attachment without output");
                       }
                       return *exited;
                     });
}

Result<std::unique_ptr<ExecStream>> Controller::AttachOutput(const std::string& id, int32_t pid,
                                                             bool replay, bool follow) {
  auto channel = Acquire(id);
  if (!channel) return std::unexpected(channel.error());
  auto attached = (*channel)->Attach(
      {.pid = pid,
       .output = replay ? protocol::AttachOutput::kReplay : protocol::AttachOutput::kLive,
       .follow = follow});
  if (!attached) return std::unexpected(ProcessError(id, pid, std::move(attached.error())));
  return std::make_unique<StreamingExec>(
      *this, id, std::move(*channel), attached->first, std::chrono::milliseconds(kForever), pid,
      api::RenderStartEvent(pid, std::chrono::system_clock::now()), false);
}

class Controller::AttachedControl final : public ProcessControl {
 public:
  AttachedControl(Channel channel, uint32_t stream, protocol::Attached info)
      : channel_(std::move(channel)), stream_(stream), info_(info) {}
  const protocol::Attached& info() const override { return info_; }
  Status WriteStdin(std::string_view data) override {
    if (!info_.stdin_open) {
      return Fail(ErrorCode::kFailedPrecondition,
                  "the stdin of process " + std::to_string(info_.pid) + " is not open");
    }
    for (size_t off = 0; off < data.size(); off += protocol::kMaxChunk) {
      auto st = channel_->Send(stream_, protocol::StdinData{std::string(data.substr(off, protocol::kMaxChunk))});
      if (!st) return st;
    }
    return {};
  }
  Status CloseStdin() override {
    if (!info_.stdin_open) return {};
    info_.stdin_open = false;
    return channel_->Send(stream_, protocol::StdinClose{});
  }
  Status Signal(int signo) override {
    if (signo < 1 || signo > 64) {
      return Fail(ErrorCode::kInvalidArgument, "signal " + std::to_string(signo) + " is not 1..64");
    }
    return channel_->Send(stream_, protocol::Signal{signo});
  }
  Status Resize(uint16_t cols, uint16_t rows) override {
    if (!info_.pty) {
      return Fail(ErrorCode::kFailedPrecondition,
                  "process " + std::to_string(info_.pid) + " has no terminal");
    }
    if (cols == 0 || rows == 0) {
      return Fail(ErrorCode::kInvalidArgument, "terminal size must be non-zero");
    }
    return channel_->Send(stream_, protocol::Resize{rows, cols});
  }

 private:
  Channel channel_;  // dropped with the object: closing it detaches
  uint32_t stream_;
  protocol::Attached info_;
};

Result<std::unique_ptr<ProcessControl>> Controller::Control(const std::string& id, int32_t pid) {
  auto channel = Acquire(id);
  if (!channel) return std::unexpected(channel.error());
  auto attached = (*channel)->Attach({.pid = pid});
  if (!attached) return std::unexpected(ProcessError(id, pid, std::move(attached.error())));
  return std::make_unique<AttachedControl>(std::move(*channel), attached->first, attached->second);
}

std::string Controller::Resolve(const std::string& path) const {
  return path.starts_with('/') ? path : std::string(kDefaultHome) + "/" + path;
}

Result<std::string> Controller::ReadFile(const std::string& id, const api::FileQuery& query) {
  auto channel = Acquire(id);
  if (!channel) return std::unexpected(channel.error());
  const std::string path = Resolve(query.path);
  auto info = (*channel)->Stat(path);
  if (!info) return std::unexpected(Explain(id, std::move(info.error())));
  if (info->type == protocol::FileType::kDirectory) {
    return Fail(ErrorCode::kInvalidArgument,
                path + " is a directory (list it, or read it with .../files/tar)");
  }
  if (info->size > api::kMaxFileBytes) {
    return Fail(ErrorCode::kTooLarge, path + " is " + std::to_string(info->size) +
                                          " bytes, over the cap of " +
                                          std::to_string(api::kMaxFileBytes));
  }
  // One byte past the cap tells a file that grew since the stat.
  auto data = (*channel)->ReadFile(path, 0, api::kMaxFileBytes + 1);
  if (!data) return std::unexpected(Explain(id, std::move(data.error())));
  if (data->size() > api::kMaxFileBytes) {
    return Fail(ErrorCode::kTooLarge,
                path + " grew over the cap of " + std::to_string(api::kMaxFileBytes) + " bytes");
  }
  channel->Keep();
  return data;
}

Result<protocol::FileInfo> Controller::WriteFile(const std::string& id,
                                                 const api::FileQuery& query,
                                                 std::string_view data) {
  auto channel = Acquire(id);
  if (!channel) return std::unexpected(channel.error());
  const std::string path = Resolve(query.path);
  (*channel)->set_receive_timeout(std::chrono::minutes(5));
  if (auto st = (*channel)->WriteFile(path, data, query.mode.value_or(0644), query.parents); !st) {
    return std::unexpected(Explain(id, std::move(st.error())));
  }
  return Describe(id, *channel, path);
}

Result<protocol::FileInfo> Controller::Describe(const std::string& id, Channel& channel,
                                                const std::string& path) {
  auto info = channel->Stat(path);
  if (!info) return std::unexpected(Explain(id, std::move(info.error())));
  info->name = BaseName(path);  // as a listing names it
  channel.Keep();
  return info;
}

Status Controller::DeleteFile(const std::string& id, const api::FileQuery& query) {
  auto channel = Acquire(id);
  if (!channel) return std::unexpected(channel.error());
  (*channel)->set_receive_timeout(std::chrono::minutes(5));
  if (auto removed = (*channel)->Remove(Resolve(query.path), query.recursive); !removed) {
    return std::unexpected(Explain(id, std::move(removed.error())));
  }
  channel->Keep();
  return {};
}

Result<std::vector<protocol::FileInfo>> Controller::ListFiles(const std::string& id,
                                                              const api::FileQuery& query) {
  auto channel = Acquire(id);
  if (!channel) return std::unexpected(channel.error());
  auto entries = (*channel)->List(Resolve(query.path));
  if (!entries) return std::unexpected(Explain(id, std::move(entries.error())));
  channel->Keep();
  return entries;
}

Result<protocol::FileInfo> Controller::MakeDirectory(const std::string& id,
                                                     const api::FileQuery& query) {
  auto channel = Acquire(id);
  if (!channel) return std::unexpected(channel.error());
  const std::string path = Resolve(query.path);
  if (auto st = (*channel)->Mkdir(path, query.mode.value_or(0755), query.parents); !st) {
    return std::unexpected(Explain(id, std::move(st.error())));
  }
  return Describe(id, *channel, path);
}

Result<protocol::ExecResult> Controller::RunTar(const std::string& id, Channel& channel,
                                                const protocol::Exec& exec,
                                                std::string_view stdin_data) {
  channel->set_receive_timeout(std::chrono::milliseconds(exec.timeout_ms) +
                               std::chrono::minutes(1));
  auto result = channel->Exec(exec, stdin_data);
  if (!result) {
    Error error = Explain(id, std::move(result.error()));
    if (error.code() == ErrorCode::kNotFound) {
      return Fail(ErrorCode::kUnimplemented, "this sandbox's template has no tar: " + error.message());
    }
    return std::unexpected(std::move(error));
  }
  return result;
}

Result<std::string> Controller::ReadTar(const std::string& id, const api::FileQuery& query) {
  auto channel = Acquire(id);
  if (!channel) return std::unexpected(channel.error());
  const std::string path = Resolve(query.path);
  auto info = (*channel)->Stat(path);
  if (!info) return std::unexpected(Explain(id, std::move(info.error())));
  if (info->type != protocol::FileType::kDirectory) {
    return Fail(ErrorCode::kInvalidArgument, path + " is not a directory");
  }
  protocol::Exec exec;
  exec.argv = {"tar", "--create", "--format=posix", "--file=-", "--directory=" + path, "."};
  exec.timeout_ms = 10 * 60 * 1000;
  exec.output_cap = api::kMaxTarBytes + 1;
  auto result = RunTar(id, *channel, exec, {});
  if (!result) return std::unexpected(result.error());
  if (result->exit.truncated || result->stdout_data.size() > api::kMaxTarBytes) {
    return Fail(ErrorCode::kTooLarge, "the tar stream of " + path + " is over " +
                                          std::to_string(api::kMaxTarBytes) + " bytes");
  }
  if (result->exit.exit_code != 0) {
    return Fail(ErrorCode::kInvalidArgument,
                "tar in the sandbox failed on " + path + ": " + result->stderr_data.substr(0, 1024));
  }
  channel->Keep();
  return std::move(result->stdout_data);
}

Status Controller::WriteTar(const std::string& id, const api::FileQuery& query,
                            std::string_view tar) {
  auto channel = Acquire(id);
  if (!channel) return std::unexpected(channel.error());
  const std::string path = Resolve(query.path);
  if (auto st = (*channel)->Mkdir(path, 0755, /*parents=*/true); !st) {
    return std::unexpected(Explain(id, std::move(st.error())));
  }
  // Extracted by the sandbox's default user, inside the sandbox: whatever the archive holds
  // (absolute names, "..", links, devices) can do no more than that user could.
  protocol::Exec exec;
  exec.argv = {"tar", "--extract", "--file=-", "--directory=" + path, "--no-same-owner",
               "--no-overwrite-dir"};
  exec.stdin_mode = protocol::StdinMode::kPipe;
  exec.timeout_ms = 10 * 60 * 1000;
  exec.output_cap = 64 * 1024;
  auto result = RunTar(id, *channel, exec, tar);
  if (!result) return std::unexpected(result.error());
  if (result->exit.exit_code != 0) {
    return Fail(ErrorCode::kInvalidArgument,
                "tar in the sandbox could not unpack into " + path + ": " +
                    result->stderr_data.substr(0, 1024));
  }
  channel->Keep();
  return {};
}

void Controller::DestroyAll() {
  StopPoolFiller();
  StopReaper();
  JoinBuilds();
  std::vector<std::string> ids;
  {
    std::lock_guard lock(mu_);
    for (const auto& [id, live] : live_) ids.push_back(id);
  }
  for (const std::string& id : ids) {
    if (auto st = DestroySandbox(id, /*allow_pooled=*/true); !st) {
      spdlog::error("shutdown: {}", st.error().message());
    }
  }
}

}  // namespace airlock::daemon
