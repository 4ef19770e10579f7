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

// The data of a sandbox.created event: what it was made of and with, from its record.
nlohmann::json CreatedData(const SandboxRecord& r, bool from_pool) {
  nlohmann::json data = {
      {"engine", r.engine},
      {"template", r.template_name},
      {"tenant", r.tenant},
      {"from_pool", from_pool},
      {"limits",
       {{"cpus", r.limits.cpus},
        {"memory_mb", r.limits.memory_mb},
        {"pids_max", r.limits.pids_max},
        {"disk_mb", r.limits.disk_mb}}},
      {"network", NetworkPolicyOf(r).ToJson().value("mode", "none")},
      {"metadata", r.metadata},
  };
  if (r.expires_at_ms > 0) data["expires_at_ms"] = r.expires_at_ms;
  nlohmann::json secrets = nlohmann::json::array();
  for (const net::SecretBinding& b : net::StoredSecretBindings(r.secrets)) {
    secrets.push_back(b.secret);
  }
  if (!secrets.empty()) data["secrets"] = std::move(secrets);
  return data;
}

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
      .destroy =
          [this](const std::string& id) {
            return DestroySandbox(id, /*allow_pooled=*/true, kDeleted);
          },
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
  sampler_.Stop();
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

Status Controller::CheckSecrets(const net::NetworkPolicy& policy, const std::string& tenant) const {
  const std::vector<net::SecretBinding>& secrets = policy.secrets();
  if (secrets.empty()) return {};
  if (!networks_ || networks_->config().egress_ca_pem.empty() || !secret_values_) {
    return Fail(ErrorCode::kUnimplemented,
                "this airlockd cannot bind secrets (it has no sandbox networking or no egress CA)");
  }
  if (policy.mode() != net::NetworkMode::kAllowlist) {
    return Fail(ErrorCode::kInvalidArgument,
                "secrets need network mode \"allowlist\": in mode \"" +
                    std::string(net::ModeName(policy.mode())) +
                    "\" a sandbox could reach a bound host where the egress proxy does not see it");
  }
  for (size_t i = 0; i < secrets.size(); ++i) {
    const std::string at = "secrets[" + std::to_string(i) + "]";
    if (auto value = secret_values_(tenant, secrets[i].secret); !value) {
      return Fail(ErrorCode::kInvalidArgument, at + ".name: " + value.error().message());
    }
    for (size_t h = 0; h < secrets[i].hosts.size(); ++h) {
      const std::string& host = secrets[i].hosts[h];
      if (net::Verdict v = policy.CheckName(host, 443); !v.allowed) {
        return Fail(ErrorCode::kInvalidArgument,
                    at + ".hosts[" + std::to_string(h) + "]: " + host +
                        " is not allowed on port 443 by this sandbox's network (" + v.reason +
                        "), so the secret could never reach it");
      }
    }
  }
  return {};
}

Status Controller::CheckAutoPause(const api::CreateSandboxRequest& request,
                                  const std::string& template_engine) {
  if (request.auto_pause_seconds == 0) return {};
  const std::string name = EngineName(request.engine, template_engine);
  auto engine = engines_.Get(name);
  if (!engine) return std::unexpected(engine.error());
  const runtime::Capabilities& can = (*engine)->capabilities();
  if (!request.auto_pause_memory) {
    if (!can.pause) {
      return std::unexpected(
          runtime::Lacks(name, "pause", "pause a sandbox when it is idle (auto_pause)"));
    }
    return {};
  }
  const char* what = "hibernate a sandbox when it is idle (auto_pause with memory)";
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
  if (auto st = CheckSecrets(request.network, request.tenant); !st) {
    return std::unexpected(st.error());
  }
  auto resolved = templates_.Resolve(request);
  if (!resolved) return std::unexpected(resolved.error());
  if (auto st = CheckAutoPause(request, resolved->origin.engine); !st) {
    return std::unexpected(st.error());
  }
  // What the engine cannot make is refused before a pooled sandbox is claimed for it.
  if (auto chosen = ChooseEngine(request.engine, resolved->origin, request.network); !chosen) {
    return std::unexpected(chosen.error());
  }
  auto made = [&] {
    if (auto claimed = pools_.Claim(resolved->request, resolved->origin.engine)) {
      if (*claimed) recorder_.Record((*claimed)->id, "sandbox.created", CreatedData(**claimed, true));
      return std::move(*claimed);
    }
    return CreateSandbox(resolved->request, /*pooled=*/false, &resolved->origin);
  }();
  if (!made) return made;
  if (auto started = templates_.StartCommands(made->id, *resolved); !started) {
    if (auto st = Destroy(made->id); !st) spdlog::error("{}", st.error().message());
    return std::unexpected(started.error());
  }
  if (request.auto_pause_seconds > 0) {
    made = store_.SetResource(made->id, request.auto_pause_memory ? kAutoHibernate : kAutoPause,
                              std::to_string(request.auto_pause_seconds));
    if (!made) return made;
    if (auto held = sandboxes_.Find(made->id)) {
      held->SetAutoPause(made->resources);
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
  if (auto st = CheckSecrets(request.network, request.tenant); !st) {
    return std::unexpected(st.error());
  }
  const bool networked = request.network.mode() != net::NetworkMode::kNone;
  if (networked) record.network = request.network.ToJson().dump();
  const std::vector<net::SecretBinding>& secrets = request.network.secrets();
  if (!secrets.empty()) record.secrets = net::SecretBindingsToJson(secrets).dump();
  // A pooled sandbox's network namespace must exist before the engine makes it (the jail joins
  // it as it clones), so the pool's sandboxes are made linked but parked; a claim gives them the
  // request's policy or takes the link away (PoolService::Claim).
  // A sandbox restored from a memory image has no link (its image was saved without one).
  const bool linked =
      networked || (pooled && networks_ != nullptr && origin.memory_image.empty());
  const std::string id = record.id;
  // The record exists before any resource does, so a crash during the create leaves a trace.
  // Its insert is what makes it count for its tenant: admitted by the tenant's quota (a pooled
  // one counts for nobody until claimed).
  auto insert = [&]() -> Result<bool> {
    if (auto inserted = store_.Insert(record); !inserted) {
      return std::unexpected(inserted.error().Wrap("recording " + id));
    }
    return true;
  };
  if (pooled) {
    if (auto inserted = insert(); !inserted) return std::unexpected(std::move(inserted.error()));
  } else if (auto admitted = quotas_.Admit(record.tenant, record.limits, insert); !admitted) {
    return std::unexpected(std::move(admitted.error()));
  }
  auto fail = [&](Error error) -> Result<SandboxRecord> {
    if (linked) DetachNetwork(id);
    if (pooled) {
      Discard(id);
    } else {
      recorder_.Record(id, "sandbox.failed", {{"error", error.message()}, {"during", "create"}});
      if (auto marked = store_.MarkFailed(id, error.message()); !marked) {
        spdlog::error("marking {} failed: {}", id, marked.error().message());
      }
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
  std::shared_ptr<HeldSandbox> held =
      sandboxes_.Hold(id, &engine, env_per_command ? record.env : std::vector<std::string>{},
                      origin.workdir, std::move(*client));
  if (!secrets.empty()) {
    held->SetSecretEnv(net::SecretEnv(secrets));
    if (auto st = sandboxes_.TrustEgressCa(id, held, networks_->config().egress_ca_pem); !st) {
      return destroy_and_fail(st.error().Wrap("installing the egress CA"));
    }
  }
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
  // A pooled sandbox's life on record starts when a create claims it.
  if (!pooled) recorder_.Record(id, "sandbox.created", CreatedData(*running, false));
  return running;
}

Result<SandboxRecord> Controller::Get(const std::string& id) { return sandboxes_.Visible(id); }

Result<SandboxRecord> Controller::Describe(const std::string& id) {
  auto record = store_.Get(id);
  if ((record && record->pooled) || (!record && record.error().code() == ErrorCode::kNotFound)) {
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
  // The policy from now on, with the secrets bound (the request's, or those it had; a secret
  // bound before keeps its placeholder), refused before anything changes.
  std::optional<net::NetworkPolicy> policy;
  const std::vector<net::SecretBinding> had = net::StoredSecretBindings(record->secrets);
  if (request.network || request.secrets) {
    policy = request.network ? *request.network : NetworkPolicyOf(*record);
    std::vector<net::SecretBinding> bound = request.secrets ? *request.secrets : had;
    for (net::SecretBinding& b : bound) {
      for (const net::SecretBinding& old : had) {
        if (old.secret == b.secret) b.placeholder = old.placeholder;
      }
    }
    policy->SetSecrets(std::move(bound));
    if (auto st = CheckNetwork(*policy); !st) return std::unexpected(st.error());
    if (auto st = CheckSecrets(*policy, record->tenant); !st) return std::unexpected(st.error());
  }
  // The limits first: the one change the engine may refuse (its capability, the memory in use)
  // or the quota (429); nothing else has changed then.
  if (request.limits) {
    record = ChangeLimits(*record, *request.limits);
    if (!record) return record;
  }
  if (request.ttl_seconds) {
    record = store_.UpdateTtl(id, UnixNowMs() + *request.ttl_seconds * 1000);
    if (!record) return record;
  }
  if (!request.metadata.empty()) record = store_.UpdateMetadata(id, std::move(metadata));
  nlohmann::json changed = nlohmann::json::object();
  if (request.ttl_seconds) changed["ttl_seconds"] = *request.ttl_seconds;
  if (request.limits && record) {
    changed["limits"] = {{"cpus", record->limits.cpus},
                         {"memory_mb", record->limits.memory_mb},
                         {"pids_max", record->limits.pids_max}};
  }
  if (!request.metadata.empty()) {
    nlohmann::json keys = nlohmann::json::array();
    for (const auto& [key, value] : request.metadata) keys.push_back(key);
    changed["metadata"] = std::move(keys);
  }
  if (record && policy) {
    // The sandbox's namespace was made (or not) at create: a sandbox without one stays without.
    if (!networks_ || !record->resources.contains(kNetSlot)) {
      return Fail(ErrorCode::kFailedPrecondition,
                  "sandbox " + id + " was created with network mode \"none\"; its network cannot "
                  "be changed (create it with a network mode to change its policy later)");
    }
    const std::vector<net::SecretBinding>& bound = policy->secrets();
    std::shared_ptr<HeldSandbox> held = sandboxes_.Find(id);
    if (!bound.empty() && had.empty()) {
      if (!held) return Fail(ErrorCode::kFailedPrecondition, "sandbox " + id + " is not held here");
      if (auto st = sandboxes_.TrustEgressCa(id, held, networks_->config().egress_ca_pem); !st) {
        return std::unexpected(st.error().Wrap("installing the egress CA"));
      }
    }
    if (auto st = networks_->Update(id, *policy); !st) return std::unexpected(st.error());
    if (held) held->SetSecretEnv(net::SecretEnv(bound));
    record = store_.UpdateNetwork(id, policy->ToJson().dump(),
                                  bound.empty() ? "" : net::SecretBindingsToJson(bound).dump());
    changed["network"] = policy->ToJson().value("mode", "none");
    nlohmann::json names = nlohmann::json::array();
    for (const net::SecretBinding& b : bound) names.push_back(b.secret);
    changed["secrets"] = std::move(names);
  }
  if (record) recorder_.Record(id, "sandbox.updated", std::move(changed));
  return record;
}

Result<SandboxRecord> Controller::ChangeLimits(const SandboxRecord& record,
                                               const api::LimitsPatch& patch) {
  const std::string& id = record.id;
  const SandboxState live_states[] = {SandboxState::kRunning, SandboxState::kPaused};
  auto held = LockHeld(id, live_states);
  if (!held) return std::unexpected(held.error());
  runtime::Engine& engine = *held->live->engine;
  if (!engine.capabilities().live_limits) {
    return std::unexpected(
        runtime::Lacks(engine.name(), "live_limits", "change the limits of a live sandbox"));
  }
  // The record as it is under the lifecycle lock (another change may have come first).
  auto current = store_.Get(id);
  if (!current) return current;
  runtime::Limits limits = patch.Over(LimitsOf(*current));
  const store::SandboxLimits to = ToStoreLimits(limits);
  Result<SandboxRecord> changed = std::unexpected(Error(ErrorCode::kInternal, "not changed"));
  auto applied = quotas_.Change(current->tenant, current->limits, to, [&]() -> Status {
    if (auto st = engine.UpdateLimits(id, limits); !st) {
      return std::unexpected(st.error().Wrap("changing the limits of " + id));
    }
    changed = store_.UpdateLimits(id, to);
    if (!changed) return std::unexpected(changed.error());
    return {};
  });
  if (!applied) return std::unexpected(std::move(applied.error()));
  spdlog::info("limits of {}: {} cpus, {} MiB, {} pids", id, to.cpus, to.memory_mb, to.pids_max);
  return changed;
}

void Controller::DetachNetwork(const std::string& id) {
  if (!networks_) return;
  if (auto st = networks_->Detach(id); !st) spdlog::error("{}", st.error().message());
}

Result<store::EventPage> Controller::Events(const std::string& id, const api::EventsQuery& query) {
  // Readable after the destroy too (an audit usually comes then), until the record is purged.
  if (auto record = Describe(id); !record) return std::unexpected(record.error());
  // What is queued is older than this call: the reader sees it. A failed write is counted as
  // dropped and said in the log; the page is still served.
  if (auto st = recorder_.Flush(); !st) spdlog::error("storing events: {}", st.error().message());
  return store_.Events(id, query.after, query.types, query.limit);
}

Result<store::NetworkEventPage> Controller::NetworkEvents(const std::string& id,
                                                          const api::NetworkEventsQuery& query) {
  if (auto record = Describe(id); !record) return std::unexpected(record.error());
  if (auto st = recorder_.Flush(); !st) spdlog::error("storing events: {}", st.error().message());
  return store_.NetworkEvents(id, query.after, query.limit);
}

Result<store::MetricPage> Controller::Metrics(const std::string& id,
                                              const api::MetricsQuery& query) {
  if (auto record = Describe(id); !record) return std::unexpected(record.error());
  return store_.Metrics(id, query.start_ms, query.end_ms, query.limit);
}

Status Controller::FinishDestroy(const std::string& id) {
  // An engine that is unavailable leaves the record destroying, for a start that has it.
  auto engine = sandboxes_.EngineOf(id);
  if (!engine) return std::unexpected(engine.error().Wrap("destroying " + id));
  if (auto st = (*engine)->Destroy(id); !st) {
    recorder_.Record(id, "sandbox.failed",
                     {{"error", st.error().message()}, {"during", "destroy"}});
    if (auto marked = store_.MarkFailed(id, st.error().message()); !marked) {
      spdlog::error("marking {} failed: {}", id, marked.error().message());
    }
    return std::unexpected(st.error().Wrap("destroying " + id));
  }
  sandboxes_.Release(id);  // commands still running see their channels close
  DetachNetwork(id);
  // The event is queued before the state is committed: a reader that sees the sandbox
  // destroyed (a follower of its log ends then) flushes the recorder and finds it.
  const SandboxState from[] = {SandboxState::kDestroying};
  auto done = store_.Transition(id, from, SandboxState::kDestroyed, [&](SandboxRecord& r) {
    nlohmann::json data = nlohmann::json::object();
    if (auto reason = r.resources.find(kEndReason); reason != r.resources.end()) {
      data["reason"] = reason->second;
    }
    recorder_.Record(id, "sandbox.destroyed", std::move(data));
  });
  if (!done) return std::unexpected(done.error().Wrap("recording the destroy of " + id));
  spdlog::info("destroyed {}", id);
  // A fork's snapshot belongs to no template: its last sandbox out takes it along.
  if (!done->layers.empty()) (void)layers_.Collect();
  return {};
}

Status Controller::Destroy(const std::string& id, std::string_view reason) {
  return DestroySandbox(id, false, reason);
}

Status Controller::DestroySandbox(const std::string& id, bool allow_pooled,
                                  std::string_view reason) {
  std::shared_ptr<HeldSandbox> live = sandboxes_.Find(id);
  std::unique_lock<std::mutex> lock;
  if (live) lock = std::unique_lock(live->lifecycle_mu);
  if (auto record = allow_pooled ? store_.Get(id) : Get(id); !record) {
    return std::unexpected(record.error());
  }
  const SandboxState from[] = {SandboxState::kRunning, SandboxState::kPaused,
                               SandboxState::kHibernated, SandboxState::kFailed};
  auto moved = store_.Transition(id, from, SandboxState::kDestroying, [&](SandboxRecord& r) {
    r.resources[kEndReason] = std::string(reason);
  });
  if (!moved) return std::unexpected(moved.error());
  recorder_.Record(id, "sandbox." + std::string(reason));
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

Result<SandboxRecord> Controller::Pause(const std::string& id) { return DoPause(id, false); }

Result<SandboxRecord> Controller::Hibernate(const std::string& id) {
  return DoHibernate(id, false);
}

Result<SandboxRecord> Controller::DoPause(const std::string& id, bool idle) {
  auto held = LockHeld(id, kRunningOnly);
  if (!held) return std::unexpected(held.error());
  runtime::Engine& engine = *held->live->engine;
  if (!engine.capabilities().pause) {
    return std::unexpected(runtime::Lacks(engine.name(), "pause", "pause a sandbox"));
  }
  if (auto st = engine.Pause(id); !st) {
    return std::unexpected(st.error().Wrap("pausing " + id));
  }
  auto paused = store_.Transition(id, kRunningOnly, SandboxState::kPaused, [&](SandboxRecord& r) {
    if (idle) r.resources[kAutoPaused] = "1";
  });
  if (paused) recorder_.Record(id, "sandbox.paused", idle ? nlohmann::json{{"auto", true}} : nlohmann::json::object());
  return paused;
}

Result<SandboxRecord> Controller::DoHibernate(const std::string& id, bool idle) {
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
      recorder_.Record(id, "sandbox.failed", {{"error", error.message()}, {"during", "hibernate"}});
      if (auto marked = store_.MarkFailed(id, error.message(), kRunningOnly); !marked) {
        spdlog::error("marking {} failed: {}", id, marked.error().message());
      }
    }
    return std::unexpected(std::move(error));
  }
  spdlog::info("hibernated {} ({} bytes of memory image)", id, saved->image_bytes);
  auto hibernated =
      store_.Transition(id, kRunningOnly, SandboxState::kHibernated, [&](SandboxRecord& r) {
        r.engine_state = saved->engine_state;
        r.resources[kMemoryImageBytes] = std::to_string(saved->image_bytes);
        if (idle) r.resources[kAutoPaused] = "1";
      });
  if (hibernated) {
    nlohmann::json data = {{"image_bytes", saved->image_bytes}};
    if (idle) data["auto"] = true;
    recorder_.Record(id, "sandbox.hibernated", std::move(data));
  }
  return hibernated;
}

int Controller::PauseIdle() {
  const int64_t now = SteadyNowMs();
  int paused = 0;
  for (const std::string& id : sandboxes_.Ids()) {
    std::shared_ptr<HeldSandbox> held = sandboxes_.Find(id);
    if (!held) continue;
    // Idle: no channel on loan (a command in the foreground, a transfer, a WebSocket session
    // holds one) and none returned for `after`. Background processes do not keep it awake.
    const int64_t after = held->auto_pause_ms;
    if (after <= 0 || held->in_use > 0 || now - held->last_used_ms < after) continue;
    auto record = store_.Get(id);
    if (!record || record->state != SandboxState::kRunning || record->pooled) continue;
    const bool memory = held->auto_pause_memory;
    auto done = memory ? DoHibernate(id, /*idle=*/true) : DoPause(id, /*idle=*/true);
    if (!done) {
      // Busy now (a call in progress), or it cannot be saved: the next sweep tries again a
      // period later, not at once.
      held->Touch();
      spdlog::warn("auto-pause: {}", done.error().message());
      continue;
    }
    if (!memory && held->in_use > 0) {
      // A call took a channel between the check above and the pause: it must not find the
      // sandbox frozen (Acquire looks again after its loan too, so one of the two sees it).
      if (auto resumed = Resume(id); !resumed) {
        spdlog::warn("auto-pause: resuming {}: {}", id, resumed.error().message());
      }
      continue;
    }
    // The pause was recorded by DoPause / DoHibernate ("auto": true).
    spdlog::info("auto-pause: {} was idle for {} s and is {}", id, after / 1000,
                 memory ? "hibernated" : "paused");
    ++paused;
  }
  return paused;
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
    live->Touch();  // an auto-pause counts its idle time from the resume
    auto resumed = store_.Transition(id, from, SandboxState::kRunning,
                                     [](SandboxRecord& r) { r.resources.erase(kAutoPaused); });
    if (resumed) recorder_.Record(id, "sandbox.resumed", {{"from", "paused"}});
    return resumed;
  }
  // Restored from its memory image; a restore that fails leaves nothing running and the
  // sandbox failed with the reason (a delete removes the rest).
  const SandboxState hibernated[] = {SandboxState::kHibernated};
  auto fail = [&](Error error) -> Result<SandboxRecord> {
    error = std::move(error).Wrap("resuming " + id);
    recorder_.Record(id, "sandbox.failed", {{"error", error.message()}, {"during", "resume"}});
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
  auto resumed = store_.Transition(id, hibernated, SandboxState::kRunning, [&](SandboxRecord& r) {
    r.engine_state = (*woke)->info().engine_state;
    r.resources.erase(kMemoryImageBytes);
    r.resources.erase(kAutoPaused);
  });
  if (resumed) recorder_.Record(id, "sandbox.resumed", {{"from", "hibernated"}});
  return resumed;
}

void Controller::DestroyAll() {
  sampler_.Stop();
  pools_.StopFiller();
  expiry_.Stop();
  templates_.JoinBuilds();
  for (const std::string& id : sandboxes_.Ids()) {
    if (auto st = DestroySandbox(id, /*allow_pooled=*/true, kDeleted); !st) {
      spdlog::error("shutdown: {}", st.error().message());
    }
  }
}

}  // namespace airlock::daemon
