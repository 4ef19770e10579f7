#include "daemon/server/controller.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <utility>

#include "common/clock.h"
#include "common/ids.h"
#include "common/build_id.h"
#include "common/log.h"

namespace airlock::daemon {
namespace {

using store::SandboxRecord;
using store::SandboxState;

store::SandboxLimits ToStoreLimits(const runtime::Limits& limits) {
  return {.cpus = limits.cpus,
          .memory_mb = static_cast<int64_t>(limits.memory_mb),
          .pids_max = static_cast<int64_t>(limits.pids_max),
          .disk_mb = static_cast<int64_t>(limits.disk_mb)};
}

const SandboxState kRunningOnly[] = {SandboxState::kRunning};

}  // namespace

std::string Controller::EngineName(const std::string& requested,
                                   const std::string& template_engine) const {
  return !requested.empty()         ? requested
         : !template_engine.empty() ? template_engine
                                    : engines_.default_name();
}

Result<runtime::Engine*> Controller::ChooseEngine(const std::string& requested,
                                                  const SandboxOrigin& origin,
                                                  const net::NetworkPolicy& network) {
  const std::string name = EngineName(requested, origin.engine);
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
  if (!origin.memory_image.empty() && !can.memory_fork) {
    return std::unexpected(runtime::Lacks(name, "memory_fork", "start from a memory image"));
  }
  if (!origin.memory_image.empty() && network.mode() != net::NetworkMode::kNone &&
      !can.memory_checkpoint_network) {
    return std::unexpected(runtime::Lacks(
        name, "memory_checkpoint_network",
        "give a sandbox restored from a memory image (a fork with memory, a template with "
        "snapshot_after) a network"));
  }
  return engine;
}

PoolService::Lifecycle Controller::PoolLifecycle() {
  return {
      .create_pooled =
          [this](const api::CreateSandboxRequest& request) {
            return CreateSandbox(request, /*pooled=*/true);
          },
      .finish_destroy = [this](const std::string& id) { return FinishDestroy(id); },
      .destroy = [this](const std::string& id) { return DestroySandbox(id, /*allow_pooled=*/true); },
      .check_template = [this](const std::string& name) { return templates_.Check(name); },
      .detach_network = [this](const std::string& id) { DetachNetwork(id); },
  };
}

SandboxMaker Controller::Maker() {
  return {
      .create =
          [this](const api::CreateSandboxRequest& request, const SandboxOrigin& origin) {
            return CreateSandbox(request, /*pooled=*/false, &origin);
          },
      .destroy = [this](const std::string& id) { return Destroy(id); },
  };
}

Controller::~Controller() {
  templates_.JoinBuilds();
  pools_.StopFiller();
  expiry_.Stop();
}

Result<RecoveryReport> Controller::Recover() {
  Recovery recovery(store_, engines_, sandboxes_, layers_, networks_,
                    {.finish_destroy = [this](const std::string& id) { return FinishDestroy(id); },
                     .destroy = [this](const std::string& id) { return Destroy(id); },
                     .discard = [this](const std::string& id) { Discard(id); }});
  return recovery.Run();
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

Status Controller::CheckAutoHibernate(const api::CreateSandboxRequest& request,
                                      const std::string& template_engine) {
  if (request.auto_hibernate_seconds == 0) return {};
  const std::string name = EngineName(request.engine, template_engine);
  auto engine = engines_.Get(name);
  if (!engine) return std::unexpected(engine.error());
  const runtime::Capabilities& can = (*engine)->capabilities();
  const char* what = "hibernate a sandbox when it is idle (auto_hibernate_seconds)";
  if (!can.memory_checkpoint) {
    return std::unexpected(runtime::Lacks(name, "memory_checkpoint", what));
  }
  if (request.network.mode() != net::NetworkMode::kNone && !can.memory_checkpoint_network) {
    return std::unexpected(runtime::Lacks(name, "memory_checkpoint_network",
                                          std::string(what) + " with a network"));
  }
  return {};
}

Result<SandboxRecord> Controller::Create(const api::CreateSandboxRequest& request) {
  // Refused before a pooled sandbox is claimed for it (the cold path would refuse it too).
  if (auto st = CheckNetwork(request.network); !st) return std::unexpected(st.error());
  auto resolved = templates_.Resolve(request);
  if (!resolved) return std::unexpected(resolved.error());
  if (auto st = CheckAutoHibernate(request, resolved->origin.engine); !st) {
    return std::unexpected(st.error());
  }
  // What the engine cannot make is refused before a pooled sandbox is claimed for it.
  if (auto chosen = ChooseEngine(request.engine, resolved->origin, request.network); !chosen) {
    return std::unexpected(chosen.error());
  }
  auto made = [&] {
    if (auto claimed = pools_.Claim(resolved->request, resolved->origin.engine)) {
      return std::move(*claimed);
    }
    return CreateSandbox(resolved->request, /*pooled=*/false, &resolved->origin);
  }();
  if (!made) return made;
  if (auto started = templates_.StartCommands(made->id, *resolved); !started) {
    if (auto st = Destroy(made->id); !st) spdlog::error("{}", st.error().message());
    return std::unexpected(started.error());
  }
  if (request.auto_hibernate_seconds > 0) {
    made = store_.SetResource(made->id, kAutoHibernate,
                              std::to_string(request.auto_hibernate_seconds));
    if (!made) return made;
    if (auto held = sandboxes_.Find(made->id)) {
      held->auto_hibernate_ms = request.auto_hibernate_seconds * 1000;
      held->Touch();
    }
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
                                                bool pooled, const SandboxOrigin* given_origin) {
  SandboxOrigin origin;
  if (given_origin) {
    origin = *given_origin;
  } else {
    auto resolved = templates_.Resolve(request);
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
  record.expires_at_ms = pooled ? 0 : UnixNowMs() + request.ttl_seconds * 1000;
  record.pooled = pooled;
  record.layers = origin.layers;
  record.tenant = request.tenant;
  if (auto st = CheckNetwork(request.network); !st) return std::unexpected(st.error());
  const bool networked = request.network.mode() != net::NetworkMode::kNone;
  if (networked) record.network = request.network.ToJson().dump();
  // A pooled sandbox's network namespace must exist before the engine makes it (the jail joins
  // it as it clones), so the pool's sandboxes are made linked but parked; a claim gives them the
  // request's policy or takes the link away (PoolService::Claim).
  // A sandbox restored from a memory image has no link (its image was saved without one).
  const bool linked =
      networked || (pooled && networks_ != nullptr && origin.memory_image.empty());
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
  spec.memory_image = origin.memory_image;
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
    sandboxes_.Release(id);
    if (auto st = engine.Destroy(id); !st) {
      spdlog::error("undoing the create of {}: {}", id, st.error().message());
    }
    return fail(std::move(error));
  };
  auto client = protocol::BlockingClient::Connect((*sandbox)->TakeAgentChannel(),
                                                  std::string("airlockd ") + kBuildId);
  if (!client) return destroy_and_fail(client.error().Wrap("connecting to the agent"));
  const runtime::SandboxInfo& info = (*sandbox)->info();
  // A restored agent has the env of the sandbox its image was saved from: this one's commands
  // carry the sandbox's own (as a claimed pooled sandbox's do).
  const bool env_per_command = !origin.memory_image.empty();
  sandboxes_.Hold(id, &engine, env_per_command ? record.env : std::vector<std::string>{},
                  origin.workdir, std::move(*client));
  // One commit records what the engine made (for recovery) and the running state. A crash
  // before it leaves the record creating, which the next start destroys by id.
  const SandboxState from[] = {SandboxState::kCreating};
  auto running = store_.Transition(id, from, SandboxState::kRunning, [&](SandboxRecord& r) {
    r.engine_state = info.engine_state;
    if (!origin.workdir.empty()) r.resources[kWorkdir] = origin.workdir;
    if (origin.root != api::kRootHostUsr) r.resources[kRoot] = origin.root;
    if (env_per_command) r.resources[kEnvPerCommand] = "yes";
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

Result<SandboxRecord> Controller::Get(const std::string& id) { return sandboxes_.Visible(id); }

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
    record = store_.UpdateTtl(id, UnixNowMs() + *request.ttl_seconds * 1000);
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
  auto engine = sandboxes_.EngineOf(id);
  if (!engine) return std::unexpected(engine.error().Wrap("destroying " + id));
  if (auto st = (*engine)->Destroy(id); !st) {
    if (auto marked = store_.MarkFailed(id, st.error().message()); !marked) {
      spdlog::error("marking {} failed: {}", id, marked.error().message());
    }
    return std::unexpected(st.error().Wrap("destroying " + id));
  }
  sandboxes_.Release(id);  // commands still running see their channels close
  DetachNetwork(id);
  const SandboxState from[] = {SandboxState::kDestroying};
  auto done = store_.Transition(id, from, SandboxState::kDestroyed);
  if (!done) return std::unexpected(done.error().Wrap("recording the destroy of " + id));
  spdlog::info("destroyed {}", id);
  // A fork's snapshot belongs to no template: its last sandbox out takes it along.
  if (!done->layers.empty()) (void)layers_.Collect();
  return {};
}

Status Controller::Destroy(const std::string& id) { return DestroySandbox(id, false); }

Status Controller::DestroySandbox(const std::string& id, bool allow_pooled) {
  std::shared_ptr<HeldSandbox> live = sandboxes_.Find(id);
  std::unique_lock<std::mutex> lock;
  if (live) lock = std::unique_lock(live->lifecycle_mu);
  if (auto record = allow_pooled ? store_.Get(id) : Get(id); !record) {
    return std::unexpected(record.error());
  }
  const SandboxState from[] = {SandboxState::kRunning, SandboxState::kPaused,
                               SandboxState::kHibernated, SandboxState::kFailed};
  if (auto moved = store_.Transition(id, from, SandboxState::kDestroying); !moved) {
    return std::unexpected(moved.error());
  }
  return FinishDestroy(id);
}

Result<Controller::Locked> Controller::LockHeld(const std::string& id,
                                                std::span<const SandboxState> from) {
  Locked held;
  held.live = sandboxes_.Find(id);
  if (held.live) held.lock = std::unique_lock(held.live->lifecycle_mu);
  auto record = Get(id);
  if (!record) return std::unexpected(record.error());
  if (auto st = store::RequireState(id, record->state, from); !st) {
    return std::unexpected(st.error());
  }
  if (!held.live) return std::unexpected(sandboxes_.NotHeld(*record));
  held.state = record->state;
  return held;
}

Result<SandboxRecord> Controller::Pause(const std::string& id) {
  auto held = LockHeld(id, kRunningOnly);
  if (!held) return std::unexpected(held.error());
  runtime::Engine& engine = *held->live->engine;
  if (!engine.capabilities().pause) {
    return std::unexpected(runtime::Lacks(engine.name(), "pause", "pause a sandbox"));
  }
  if (auto st = engine.Pause(id); !st) {
    return std::unexpected(st.error().Wrap("pausing " + id));
  }
  return store_.Transition(id, kRunningOnly, SandboxState::kPaused);
}

Result<SandboxRecord> Controller::Hibernate(const std::string& id) {
  auto held = LockHeld(id, kRunningOnly);
  if (!held) return std::unexpected(held.error());
  HeldSandbox* live = held->live.get();
  runtime::Engine& engine = *live->engine;
  if (!engine.capabilities().memory_checkpoint) {
    return std::unexpected(runtime::Lacks(engine.name(), "memory_checkpoint",
                                          "hibernate a sandbox (pause with memory)"));
  }
  live->DropIdle();  // the agent closes every channel before the save
  auto saved = engine.Hibernate(id);
  if (!saved) {
    Error error = saved.error().Wrap("hibernating " + id);
    if (auto alive = engine.Alive(id); !alive) {
      if (auto marked = store_.MarkFailed(id, error.message(), kRunningOnly); !marked) {
        spdlog::error("marking {} failed: {}", id, marked.error().message());
      }
    }
    return std::unexpected(std::move(error));
  }
  spdlog::info("hibernated {} ({} bytes of memory image)", id, saved->image_bytes);
  return store_.Transition(id, kRunningOnly, SandboxState::kHibernated, [&](SandboxRecord& r) {
    r.engine_state = saved->engine_state;
    r.resources[kMemoryImageBytes] = std::to_string(saved->image_bytes);
  });
}

int Controller::HibernateIdle() {
  const int64_t now = SteadyNowMs();
  int hibernated = 0;
  for (const std::string& id : sandboxes_.Ids()) {
    std::shared_ptr<HeldSandbox> held = sandboxes_.Find(id);
    if (!held) continue;
    const int64_t after = held->auto_hibernate_ms;
    if (after <= 0 || held->in_use > 0 || now - held->last_used_ms < after) continue;
    auto record = store_.Get(id);
    if (!record || record->state != SandboxState::kRunning || record->pooled) continue;
    if (auto done = Hibernate(id); !done) {
      // Busy now (a call in progress), or it cannot be saved: the next sweep tries again a
      // period later, not at once.
      held->Touch();
      spdlog::warn("auto-hibernate: {}", done.error().message());
      continue;
    }
    spdlog::info("auto-hibernate: {} was idle for {} s", id, after / 1000);
    ++hibernated;
  }
  return hibernated;
}

Result<SandboxRecord> Controller::Resume(const std::string& id) {
  const SandboxState from[] = {SandboxState::kPaused, SandboxState::kHibernated};
  auto held = LockHeld(id, from);
  if (!held) return std::unexpected(held.error());
  HeldSandbox* live = held->live.get();
  if (held->state == SandboxState::kPaused) {
    if (auto st = live->engine->Resume(id); !st) {
      return std::unexpected(st.error().Wrap("resuming " + id));
    }
    return store_.Transition(id, from, SandboxState::kRunning);
  }
  // Restored from its memory image; a restore that fails leaves nothing running and the
  // sandbox failed with the reason (a delete removes the rest).
  const SandboxState hibernated[] = {SandboxState::kHibernated};
  auto fail = [&](Error error) -> Result<SandboxRecord> {
    error = std::move(error).Wrap("resuming " + id);
    if (auto marked = store_.MarkFailed(id, error.message(), hibernated); !marked) {
      spdlog::error("marking {} failed: {}", id, marked.error().message());
    }
    return std::unexpected(std::move(error));
  };
  auto woke = live->engine->Wake(id);
  if (!woke) return fail(std::move(woke.error()));
  auto client = protocol::BlockingClient::Connect((*woke)->TakeAgentChannel(),
                                                  std::string("airlockd ") + kBuildId);
  if (!client) return fail(client.error().Wrap("connecting to the agent"));
  live->AddIdle(std::move(*client));
  live->Touch();  // an auto-hibernate counts its idle time from the wake
  spdlog::info("resumed {} from its memory image", id);
  return store_.Transition(id, hibernated, SandboxState::kRunning, [&](SandboxRecord& r) {
    r.engine_state = (*woke)->info().engine_state;
    r.resources.erase(kMemoryImageBytes);
  });
}

void Controller::DestroyAll() {
  pools_.StopFiller();
  expiry_.Stop();
  templates_.JoinBuilds();
  for (const std::string& id : sandboxes_.Ids()) {
    if (auto st = DestroySandbox(id, /*allow_pooled=*/true); !st) {
      spdlog::error("shutdown: {}", st.error().message());
    }
  }
}

}  // namespace airlock::daemon
