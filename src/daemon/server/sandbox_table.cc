#include "daemon/server/sandbox_table.h"

#include "common/clock.h"

#include <cerrno>
#include <cstdlib>
#include <chrono>
#include <nlohmann/json.hpp>
#include <utility>

#include "common/build_id.h"
#include "common/log.h"
#include "common/syscall.h"

namespace airlock::daemon {
namespace {

using store::SandboxRecord;
using store::SandboxState;

// Idle agent channels kept per sandbox; more are opened while more commands run at once.
constexpr size_t kMaxIdleChannels = 4;
const SandboxState kRunningOnly[] = {SandboxState::kRunning};

}  // namespace

Error SandboxNotFound(const std::string& id) {
  return Error(ErrorCode::kNotFound, "sandbox " + id + " does not exist");
}

runtime::Limits LimitsOf(const store::SandboxRecord& r) {
  runtime::Limits limits;
  limits.cpus = r.limits.cpus;
  limits.memory_mb = static_cast<uint64_t>(r.limits.memory_mb);
  limits.pids_max = static_cast<uint64_t>(r.limits.pids_max);
  limits.disk_mb = static_cast<uint64_t>(r.limits.disk_mb);
  return limits;
}

net::NetworkPolicy NetworkPolicyOf(const SandboxRecord& record) {
  if (record.network.empty()) return {};
  auto parsed = net::NetworkPolicy::FromJson(
      nlohmann::json::parse(record.network, nullptr, /*allow_exceptions=*/false));
  if (!parsed) return {};
  parsed->SetSecrets(net::StoredSecretBindings(record.secrets));
  return std::move(*parsed);
}

void HeldSandbox::Touch() { last_used_ms = SteadyNowMs(); }

void HeldSandbox::SetAutoPause(const std::map<std::string, std::string>& resources) {
  for (const char* key : {kAutoPause, kAutoHibernate}) {
    if (auto after = resources.find(key); after != resources.end()) {
      auto_pause_ms = std::strtoll(after->second.c_str(), nullptr, 10) * 1000;
      auto_pause_memory = key == kAutoHibernate;
    }
  }
}

AgentChannel::AgentChannel(std::shared_ptr<HeldSandbox> held, protocol::BlockingClient client)
    : held_(std::move(held)), client_(std::move(client)) {
  client_->set_receive_timeout(std::chrono::seconds(60));
  ++held_->in_use;
  held_->Touch();
  in_use_ = std::shared_ptr<void>(nullptr, [held = held_](void*) {
    held->Touch();
    --held->in_use;
  });
}

std::vector<std::string> AgentChannel::sandbox_env() const {
  std::lock_guard lock(held_->channels_mu);
  std::vector<std::string> env = held_->env;
  env.insert(env.end(), held_->secret_env.begin(), held_->secret_env.end());
  return env;
}

std::string AgentChannel::sandbox_cwd() const {
  std::lock_guard lock(held_->channels_mu);
  return held_->cwd;
}

void AgentChannel::Keep() {
  std::lock_guard lock(held_->channels_mu);
  if (held_->idle.size() < kMaxIdleChannels) held_->idle.push_back(std::move(*client_));
  client_.reset();
}

std::shared_ptr<HeldSandbox> SandboxTable::Find(const std::string& id) {
  std::lock_guard lock(mu_);
  auto it = held_.find(id);
  return it == held_.end() ? nullptr : it->second;
}

std::shared_ptr<HeldSandbox> SandboxTable::Hold(const std::string& id, runtime::Engine* engine,
                                                std::vector<std::string> env, std::string cwd,
                                                std::optional<protocol::BlockingClient> first) {
  auto held = std::make_shared<HeldSandbox>();
  held->engine = engine;
  held->env = std::move(env);
  held->cwd = std::move(cwd);
  held->Touch();
  if (first) held->idle.push_back(std::move(*first));
  std::lock_guard lock(mu_);
  held_[id] = held;
  return held;
}

void SandboxTable::Release(const std::string& id) {
  std::lock_guard lock(mu_);
  held_.erase(id);
}

std::vector<std::string> SandboxTable::Ids() {
  std::lock_guard lock(mu_);
  std::vector<std::string> ids;
  for (const auto& [id, held] : held_) ids.push_back(id);
  return ids;
}

Result<runtime::Engine*> SandboxTable::EngineOf(const SandboxRecord& record) {
  if (std::shared_ptr<HeldSandbox> held = Find(record.id)) return held->engine;
  return engines_.Get(record.engine);
}

Result<runtime::Engine*> SandboxTable::EngineOf(const std::string& id) {
  if (std::shared_ptr<HeldSandbox> held = Find(id)) return held->engine;
  auto record = store_.Get(id);
  if (!record) return std::unexpected(record.error());
  return engines_.Get(record->engine);
}

Error SandboxTable::NotHeld(const SandboxRecord& record) const {
  // Its engine is unavailable (recovery left it as it was), or it is another daemon's.
  if (auto engine = engines_.Get(record.engine); !engine) {
    return Error(ErrorCode::kFailedPrecondition,
                 "sandbox " + record.id + " runs on the " + record.engine +
                     " engine, which this airlockd cannot use now: " + engine.error().message());
  }
  return Error(ErrorCode::kUnavailable, "sandbox " + record.id + " is not held by this daemon");
}

Result<SandboxRecord> SandboxTable::Visible(const std::string& id) {
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

Result<SandboxRecord> SandboxTable::WakeIfAutoPaused(const std::string& id, bool allow_pooled,
                                                      Result<SandboxRecord> record) {
  if (!record || !wake_ || record->state == SandboxState::kRunning ||
      !record->resources.contains(kAutoPaused)) {
    return record;
  }
  // Paused by the idle sweep: this call resumes it. Another call may have resumed it first
  // (then the record says running); any other failure is this call's answer.
  Status woke = wake_(id);
  record = allow_pooled ? store_.Get(id) : Visible(id);
  if (record && !woke && record->state != SandboxState::kRunning) {
    return std::unexpected(woke.error());
  }
  return record;
}

Result<AgentChannel> SandboxTable::Acquire(const std::string& id, bool allow_pooled) {
  auto record = WakeIfAutoPaused(id, allow_pooled, allow_pooled ? store_.Get(id) : Visible(id));
  if (!record) return std::unexpected(record.error());
  if (auto st = store::RequireState(id, record->state, kRunningOnly); !st) {
    return std::unexpected(st.error());
  }
  std::shared_ptr<HeldSandbox> held = Find(id);
  if (!held) return std::unexpected(NotHeld(*record));
  const bool auto_pauses = held->auto_pause_ms > 0;
  auto channel = ChannelTo(id, std::move(held));
  if (channel && auto_pauses && wake_) {
    // The idle sweep may have paused it between the read above and this loan (which it would
    // have seen, and undone, had the loan come first): look again now that the loan counts.
    record = WakeIfAutoPaused(id, allow_pooled, allow_pooled ? store_.Get(id) : Visible(id));
    if (!record) return std::unexpected(record.error());
  }
  return channel;
}

Result<AgentChannel> SandboxTable::ChannelTo(const std::string& id,
                                             std::shared_ptr<HeldSandbox> held) {
  {
    std::lock_guard lock(held->channels_mu);
    if (!held->idle.empty()) {
      protocol::BlockingClient client = std::move(held->idle.back());
      held->idle.pop_back();
      return AgentChannel(held, std::move(client));
    }
  }
  auto fd = held->engine->ConnectAgent(id);
  if (!fd) return std::unexpected(Explain(id, std::move(fd.error())));
  auto client =
      protocol::BlockingClient::Connect(std::move(*fd), std::string("airlockd ") + kBuildId);
  if (!client) {
    return std::unexpected(Explain(id, client.error().Wrap("connecting to the agent of " + id)));
  }
  return AgentChannel(held, std::move(*client));
}

Status SandboxTable::WriteHeldFile(const std::string& id, std::shared_ptr<HeldSandbox> held,
                                   const std::string& path, std::string_view data) {
  auto channel = ChannelTo(id, std::move(held));
  if (!channel) return std::unexpected(channel.error());
  if (auto st = (*channel)->WriteFile(path, data, 0644, false); !st) return st;
  channel->Keep();
  return {};
}

Status SandboxTable::TrustEgressCa(const std::string& id, std::shared_ptr<HeldSandbox> held,
                                   const std::string& ca_pem) {
  auto channel = ChannelTo(id, std::move(held));
  if (!channel) return std::unexpected(channel.error());
  const std::string bundle_path(net::kSandboxCaBundle);
  auto bundle = (*channel)->ReadFile(bundle_path);
  std::string text;
  if (bundle) {
    text = std::move(*bundle);
  } else if (auto host = ReadFileToString("/etc/ssl/certs/ca-certificates.crt", 16 << 20)) {
    text = std::move(*host);
  }
  if (text.find(ca_pem) == std::string::npos) {
    if (!text.empty() && text.back() != '\n') text += '\n';
    text += ca_pem;
  }
  if (auto st = (*channel)->Mkdir("/etc/ssl/certs", 0755, /*parents=*/true); !st) return st;
  if (auto st = (*channel)->WriteFile(std::string(net::kSandboxCaFile), ca_pem, 0644, false); !st) {
    return st;
  }
  if (auto st = (*channel)->WriteFile(bundle_path, text, 0644, false); !st) return st;
  channel->Keep();
  return {};
}

Result<runtime::LayerSnapshot> SandboxTable::SnapshotLayer(const std::string& id) {
  std::shared_ptr<HeldSandbox> held = Find(id);
  if (!held) return Fail(ErrorCode::kNotFound, "sandbox " + id + " is not held by this daemon");
  if (!held->engine->capabilities().layer_snapshot) {
    return std::unexpected(runtime::Lacks(held->engine->name(), "layer_snapshot",
                                          "copy a sandbox's file system into a layer"));
  }
  std::lock_guard lock(held->lifecycle_mu);
  return held->engine->SnapshotLayer(id);
}

Result<runtime::MemoryImage> SandboxTable::SaveMemoryImage(
    const std::string& id, const runtime::Engine::ImageSaved& saved) {
  std::shared_ptr<HeldSandbox> held = Find(id);
  if (!held) return Fail(ErrorCode::kNotFound, "sandbox " + id + " is not held by this daemon");
  std::lock_guard lock(held->lifecycle_mu);
  held->DropIdle();
  auto image = held->engine->SaveMemoryImage(id, saved);
  if (!image) return image;
  if (auto recorded = store_.SetEngineState(id, image->engine_state); !recorded) {
    // An image handed out is the caller's to remove (sandboxes may be starting from it).
    if (!saved) (void)held->engine->RemoveMemoryImage(image->id);
    return std::unexpected(recorded.error());
  }
  return image;
}

Error SandboxTable::Explain(const std::string& id, Error error) {
  auto now = Visible(id);
  if (!now) return std::move(now.error());
  if (auto st = store::RequireState(id, now->state, kRunningOnly); !st) {
    return std::move(st.error());
  }
  // Still running on record, and the channel to its agent failed (an agent that answers with
  // an error is alive: the engine, which on gVisor runs runsc to tell, is not asked then): the
  // engine says whether the sandbox runs. One that stopped by itself (its memory ran out, its
  // agent was killed) is recorded as failed with the engine's reason, and every call after this
  // one says so; DELETE removes what is left of it.
  const bool channel_failed = error.code() == ErrorCode::kUnavailable ||
                              error.sys_errno() == EPIPE || error.sys_errno() == ECONNRESET;
  if (std::shared_ptr<HeldSandbox> held = channel_failed ? Find(id) : nullptr) {
    Status alive = held->engine->Alive(id);
    if (!alive && alive.error().code() == ErrorCode::kFailedPrecondition) {
      const std::string why = "the sandbox stopped: " + alive.error().message();
      if (auto marked = store_.MarkFailed(id, why, kRunningOnly); !marked) {
        spdlog::warn("{}: {}; recording it failed: {}", id, why, marked.error().message());
      } else {
        recorder_.Record(id, "sandbox.failed", {{"error", why}, {"during", "running"}});
        spdlog::warn("{} failed: {}", id, why);
      }
      return Error(ErrorCode::kFailedPrecondition, "sandbox " + id + " failed: " + why);
    }
  }
  return error;
}

}  // namespace airlock::daemon
