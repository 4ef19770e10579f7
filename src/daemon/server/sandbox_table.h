#pragma once
// SandboxTable: the sandboxes this daemon holds, the engine that holds each, and a small pool of
// agent channels per sandbox, so that commands in one sandbox run concurrently, each on its own
// channel. Every service that talks to a sandbox's agent (exec, processes, files, the pool's
// claim) borrows a channel here; the lifecycle (controller.h) adds a sandbox once its engine made
// or adopted it, and removes it when the engine destroyed it.
//
// Locks: the table's own mutex guards the map only (never held across a call out); each held
// sandbox's channels_mu guards its idle channels, env and cwd; its lifecycle_mu is not taken
// here: the lifecycle holds it around the engine calls that change the sandbox's state.
// Thread-safe; calls that read the store or open a channel block.

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/error.h"
#include "daemon/server/recorder.h"
#include "daemon/store/store.h"
#include "net/policy.h"
#include "protocol/client.h"
#include "runtime/registry.h"

namespace airlock::daemon {

// The key in a record's resources that says its agent started without the sandbox env (a
// claimed pooled sandbox), so the controller sends the env with every command.
inline constexpr const char* kEnvPerCommand = "env_per_command";
// The key in a record's resources that holds its template's workdir: commands' default cwd.
inline constexpr const char* kWorkdir = "workdir";
// The metadata key that marks a template's build sandbox (its value: the template's name).
inline constexpr const char* kBuildMetadataKey = "airlock.build";
// The key in a record's resources that names the root under its layers when it is not
// api::kRootHostUsr (a Debian or OCI image's root file system: api::kRootOwn).
inline constexpr const char* kRoot = "root";
// The keys in a record's resources that hold its network's slot and address.
inline constexpr const char* kNetSlot = "net.slot";
inline constexpr const char* kNetAddress = "net.address";
inline constexpr const char* kNetAddress6 = "net.address6";
// The keys in a record's resources that hold its auto-pause idle seconds: kAutoHibernate when
// it hibernates (auto_pause.memory, or auto_hibernate_seconds), kAutoPause when it pauses.
inline constexpr const char* kAutoHibernate = "auto_hibernate_s";
inline constexpr const char* kAutoPause = "auto_pause_s";
// The key in a paused or hibernated sandbox's resources that says the idle sweep did it, so the
// next call that uses its agent resumes it ("1"); any resume removes it.
inline constexpr const char* kAutoPaused = "auto_paused";
// The key in a hibernated sandbox's resources that holds its memory image's size in bytes.
inline constexpr const char* kMemoryImageBytes = "memory_image_bytes";
// The key in an ended sandbox's resources that says why it ended (the API's end_reason), and
// the reasons (a failed sandbox's is "failed", from its state).
inline constexpr const char* kEndReason = "end_reason";
inline constexpr std::string_view kDeleted = "deleted";  // DELETE, or the daemon's shutdown
inline constexpr std::string_view kExpired = "expired";  // its TTL passed
inline constexpr std::string_view kLost = "lost";        // a restart could not take it back

// The sandbox's network policy as its record keeps it, with the secrets bound (mode none when it
// has none).
net::NetworkPolicy NetworkPolicyOf(const store::SandboxRecord& record);
// The limits in a sandbox's record, as an engine takes them (the rest at their defaults).
runtime::Limits LimitsOf(const store::SandboxRecord& record);

// What resolv.conf says in a sandbox without a network (a pooled sandbox claimed with mode
// none, and a build's layer, are given the same as a cold sandbox without one).
inline constexpr std::string_view kNoNetworkResolvConf = "# this sandbox has no network\n";

// The answer for a sandbox the caller may not see: unknown, destroyed, pooled, or another
// tenant's (router.cc); one function so that all of them are the same bytes.
Error SandboxNotFound(const std::string& id);

// A sandbox this daemon holds.
struct HeldSandbox {
  runtime::Engine* engine = nullptr;  // the one that holds it
  std::mutex lifecycle_mu;  // serializes pause / resume / destroy / snapshot on the engine
  std::mutex channels_mu;
  std::vector<protocol::BlockingClient> idle;  // connected channels, guarded by channels_mu
  // The env sent with every command (guarded by channels_mu): a claimed pooled sandbox's,
  // whose agent started without it and cannot be told later. Empty for the others, whose
  // agent has it from its start.
  std::vector<std::string> env;
  // The placeholders of the secrets bound and the CA variables (net::SecretEnv), sent with every
  // command after `env`: bindings change with a PATCH, which an agent's own env cannot follow.
  // Guarded by channels_mu.
  std::vector<std::string> secret_env;
  std::string cwd;  // commands' default cwd (its template's workdir); guarded by channels_mu
  // Background commands started through this daemon whose end is not on record yet, by pid:
  // the number of their exec.start (the flight recorder's exec.end is written when a call
  // first sees the end). Guarded by channels_mu.
  std::map<int32_t, uint64_t> background;
  void RememberBackground(int32_t pid, uint64_t command) {
    std::lock_guard lock(channels_mu);
    background[pid] = command;
  }
  // The command number of background process `pid` if its end is not on record yet; forgets it.
  std::optional<uint64_t> TakeBackground(int32_t pid) {
    std::lock_guard lock(channels_mu);
    auto node = background.extract(pid);
    if (node.empty()) return std::nullopt;
    return node.mapped();
  }
  // For auto-pause: channels on loan now (a command in the foreground holds one), when the last
  // one came back (steady clock, ms), after how long idle the sandbox is paused (0: never), and
  // whether with its memory saved (hibernated) rather than frozen.
  std::atomic<int> in_use{0};
  std::atomic<int64_t> last_used_ms{0};
  std::atomic<int64_t> auto_pause_ms{0};
  std::atomic<bool> auto_pause_memory{false};
  // From the record's resources (kAutoPause, kAutoHibernate).
  void SetAutoPause(const std::map<std::string, std::string>& resources);
  void Touch();  // last_used_ms = now

  // Closes the idle channels (a hibernate: the agent closes every channel anyway).
  void DropIdle() {
    std::lock_guard lock(channels_mu);
    idle.clear();
  }
  void AddIdle(protocol::BlockingClient client) {
    std::lock_guard lock(channels_mu);
    idle.push_back(std::move(client));
  }

  void SetEnv(std::vector<std::string> sandbox_env) {
    std::lock_guard lock(channels_mu);
    env = std::move(sandbox_env);
  }
  void SetSecretEnv(std::vector<std::string> kv) {
    std::lock_guard lock(channels_mu);
    secret_env = std::move(kv);
  }
};

// A channel to a sandbox's agent on loan for one operation; given back with Keep() when the
// operation ended cleanly, else closed when dropped (its stream state is not worth reasoning
// about).
class AgentChannel {
 public:
  AgentChannel(std::shared_ptr<HeldSandbox> held, protocol::BlockingClient client);
  protocol::BlockingClient* operator->() { return &*client_; }
  // What every command in the sandbox carries (HeldSandbox::env, cwd).
  std::vector<std::string> sandbox_env() const;
  std::string sandbox_cwd() const;
  HeldSandbox& held() { return *held_; }
  void Keep();

 private:
  std::shared_ptr<HeldSandbox> held_;
  std::optional<protocol::BlockingClient> client_;
  std::shared_ptr<void> in_use_;  // counts this loan in held_->in_use while it lasts
};

class SandboxTable {
 public:
  // All three outlive the table.
  SandboxTable(store::Store& store, runtime::EngineRegistry& engines, Recorder& recorder)
      : store_(store), engines_(engines), recorder_(recorder) {}

  // Where the services record what happens to a sandbox (docs/design/recorder.md).
  Recorder& recorder() { return recorder_; }

  // nullptr when this daemon does not hold `id`.
  std::shared_ptr<HeldSandbox> Find(const std::string& id);
  // Holds `id` (replacing what held it before), with `first` as its first idle channel.
  std::shared_ptr<HeldSandbox> Hold(const std::string& id, runtime::Engine* engine,
                                    std::vector<std::string> env, std::string cwd,
                                    std::optional<protocol::BlockingClient> first = {});
  // Forgets `id`: commands still running see their channels close as the channels go.
  void Release(const std::string& id);
  std::vector<std::string> Ids();

  // The engine of sandbox `id`: the one holding it, else the one its record names (for what a
  // crash or a failed create left). kFailedPrecondition when that engine is unavailable.
  Result<runtime::Engine*> EngineOf(const std::string& id);
  Result<runtime::Engine*> EngineOf(const store::SandboxRecord& record);
  // Why a sandbox with this record is not held here: its engine's unavailability, else 503.
  Error NotHeld(const store::SandboxRecord& record) const;

  // The record as the API may see it: kNotFound (SandboxNotFound) for unknown, destroyed and
  // pooled sandboxes.
  Result<store::SandboxRecord> Visible(const std::string& id);
  // What resumes a sandbox the idle sweep paused (Controller::Resume). Call before serving.
  using Waker = std::function<Status(const std::string& id)>;
  void SetWaker(Waker wake) { wake_ = std::move(wake); }
  // The sandbox must be held here and running (and visible, unless `allow_pooled`); then a
  // channel to its agent. One the idle sweep paused is resumed first (the waker).
  Result<AgentChannel> Acquire(const std::string& id, bool allow_pooled = false);
  // A channel to the agent of `id`, held here as `held`, without a look at its record.
  Result<AgentChannel> ChannelTo(const std::string& id, std::shared_ptr<HeldSandbox> held);
  // Writes a file (0644) in a sandbox held here whose state the caller knows (a claim's): one
  // round trip to its agent, no record read, no stat after.
  Status WriteHeldFile(const std::string& id, std::shared_ptr<HeldSandbox> held,
                       const std::string& path, std::string_view data);
  // Makes a sandbox with secrets bound trust the daemon's egress CA (`ca_pem`): net::kSandboxCaFile
  // holds it, and net::kSandboxCaBundle becomes the sandbox's bundle (or, if it has none, the
  // host's) with it added. Idempotent. Its commands' secret env comes with SetSecretEnv.
  Status TrustEgressCa(const std::string& id, std::shared_ptr<HeldSandbox> held,
                       const std::string& ca_pem);
  // The engine's snapshot of a held sandbox's writable layer, under its lifecycle lock (no
  // pause, resume or destroy while it is frozen for the copy).
  Result<runtime::LayerSnapshot> SnapshotLayer(const std::string& id);
  // The engine's memory image of a held, running sandbox (runtime::Engine::SaveMemoryImage),
  // under its lifecycle lock, its idle channels dropped first (the agent closes them); the
  // record takes the engine state the save left. `saved`: runtime::Engine::ImageSaved (may be
  // empty; when given, an image that was handed out is never removed here).
  Result<runtime::MemoryImage> SaveMemoryImage(const std::string& id,
                                               const runtime::Engine::ImageSaved& saved = {});
  // After an operation failed: the sandbox's state if it no longer fits (the destroy or pause
  // that interrupted it), else `error`.
  Error Explain(const std::string& id, Error error);

 private:
  // `record` (of `id`, as Acquire read it), or the record after the waker resumed it when the
  // idle sweep had paused it.
  Result<store::SandboxRecord> WakeIfAutoPaused(const std::string& id, bool allow_pooled,
                                                Result<store::SandboxRecord> record);

  store::Store& store_;
  runtime::EngineRegistry& engines_;
  Recorder& recorder_;
  Waker wake_;
  std::mutex mu_;
  std::map<std::string, std::shared_ptr<HeldSandbox>> held_;  // guarded by mu_
};

}  // namespace airlock::daemon
