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
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/error.h"
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
// The key in a record's resources that holds its auto_hibernate_seconds.
inline constexpr const char* kAutoHibernate = "auto_hibernate_s";
// The key in a hibernated sandbox's resources that holds its memory image's size in bytes.
inline constexpr const char* kMemoryImageBytes = "memory_image_bytes";

// The sandbox's network policy as its record keeps it (mode none when it has none).
net::NetworkPolicy NetworkPolicyOf(const store::SandboxRecord& record);

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
  std::string cwd;  // commands' default cwd (its template's workdir); guarded by channels_mu
  // For auto-hibernate: channels on loan now, when the last one came back (steady clock, ms),
  // and after how long idle the sandbox hibernates (0: never).
  std::atomic<int> in_use{0};
  std::atomic<int64_t> last_used_ms{0};
  std::atomic<int64_t> auto_hibernate_ms{0};
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
  void Keep();

 private:
  std::shared_ptr<HeldSandbox> held_;
  std::optional<protocol::BlockingClient> client_;
  std::shared_ptr<void> in_use_;  // counts this loan in held_->in_use while it lasts
};

class SandboxTable {
 public:
  // Both outlive the table.
  SandboxTable(store::Store& store, runtime::EngineRegistry& engines)
      : store_(store), engines_(engines) {}

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
  // The sandbox must be held here and running (and visible, unless `allow_pooled`); then a
  // channel to its agent.
  Result<AgentChannel> Acquire(const std::string& id, bool allow_pooled = false);
  // A channel to the agent of `id`, held here as `held`, without a look at its record.
  Result<AgentChannel> ChannelTo(const std::string& id, std::shared_ptr<HeldSandbox> held);
  // Writes a file (0644) in a sandbox held here whose state the caller knows (a claim's): one
  // round trip to its agent, no record read, no stat after.
  Status WriteHeldFile(const std::string& id, std::shared_ptr<HeldSandbox> held,
                       const std::string& path, std::string_view data);
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
  store::Store& store_;
  runtime::EngineRegistry& engines_;
  std::mutex mu_;
  std::map<std::string, std::shared_ptr<HeldSandbox>> held_;  // guarded by mu_
};

}  // namespace airlock::daemon
