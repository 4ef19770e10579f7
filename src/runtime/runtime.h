#pragma once
// The engine interface: every isolation engine (jail, gVisor, microVM) sits behind it, and the
// daemon never includes an engine's internals. An engine that cannot do an operation returns
// ErrorCode::kUnimplemented with its name in the message (the API answers 501).

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/error.h"
#include "common/unique_fd.h"

namespace airlock::runtime {

struct Limits {
  double cpus = 1.0;         // CPU quota in cores (fractions allowed)
  uint64_t memory_mb = 512;  // memory cap; no swap
  uint64_t pids_max = 256;   // processes and threads
  uint64_t disk_mb = 1024;   // the sandbox's writable layer
  uint64_t tmp_mb = 256;     // /tmp
  uint64_t nofile = 4096;    // RLIMIT_NOFILE
};

// The engines' roots. "base": the host's /usr/bin, /usr/lib, ... read-only, under a fresh /etc
// and /usr/local; layers stack on it. "rootfs": nothing of the host's; the bottom layer is a whole
// root file system (made by ImportLayer from a Debian or OCI image), and the sandbox's accounts are
// merged into its /etc.
inline constexpr const char* kBaseRoot = "base";
inline constexpr const char* kRootfsRoot = "rootfs";

// What a sandbox is made of. Validated once at the API edge; engines may assume it is valid.
struct SandboxSpec {
  std::string id;  // ValidateSandboxId holds
  std::string template_name = kBaseRoot;  // kBaseRoot or kRootfsRoot (which needs layers)
  // Read-only layers stacked on the template, topmost first (digests; see LayerSnapshot).
  std::vector<std::string> layers;
  Limits limits;
  std::vector<std::string> env;  // KEY=VALUE for every command
  std::string user = "user";     // who commands run as by default
  // A network namespace the host made for it (a path; "": loopback only), and the DNS server
  // its resolv.conf names.
  std::string netns;
  std::string nameserver;
};

enum class SandboxState { kRunning, kPaused, kStopped };

// A live sandbox as an engine reports it.
struct SandboxInfo {
  std::string id;
  std::string engine;
  SandboxState state = SandboxState::kRunning;
  pid_t init_pid = 0;                            // the agent, PID 1 inside (host pid)
  std::map<std::string, std::string> resources;  // what it holds: "cgroup:/sys/...", "uids:..."
};

// A sandbox's writable layer frozen into a read-only, content-addressed layer.
struct LayerSnapshot {
  std::string digest;  // 64 hex digits (SHA-256 of the layer's manifest)
  uint64_t files = 0;
  uint64_t bytes = 0;
  bool existed = false;  // an identical layer was already stored
};

class Sandbox {
 public:
  virtual ~Sandbox() = default;
  virtual const SandboxInfo& info() const = 0;
  // A channel to the sandbox's agent, connected during the create; taken once (the caller owns
  // it after). More channels come from Runtime::ConnectAgent.
  virtual UniqueFd TakeAgentChannel() = 0;
};

class Runtime {
 public:
  virtual ~Runtime() = default;
  virtual std::string_view name() const = 0;
  // Whether `template_name` can be created from now (checked before a create is recorded).
  virtual bool HasTemplate(const std::string& template_name) const = 0;

  // Creates and starts a sandbox; on return its agent is running and the channel is connected.
  // On failure nothing it made is left behind.
  [[nodiscard]] virtual Result<std::unique_ptr<Sandbox>> Create(const SandboxSpec& spec) = 0;
  // Kills everything in the sandbox and releases everything it held. Idempotent: destroying a
  // sandbox that is already gone (or half made, after a crash) succeeds.
  [[nodiscard]] virtual Status Destroy(const std::string& id) = 0;
  // A new channel to a live sandbox's agent; the agent serves any number at once (the daemon
  // uses one per command in flight). kNotFound when the sandbox is not held by this engine.
  [[nodiscard]] virtual Result<UniqueFd> ConnectAgent(const std::string& id) = 0;
  // Takes over a sandbox that a previous run of the daemon created and left alive: checks that
  // `init_pid` (host pid) is alive and is that sandbox's agent, re-acquires what the sandbox
  // holds, and makes it frozen or not as `paused` says. On failure nothing is changed (the
  // caller destroys the sandbox by id).
  [[nodiscard]] virtual Result<SandboxInfo> Adopt(const std::string& id, pid_t init_pid,
                                                  bool paused) = 0;
  // The ids of every sandbox, live or half made, that this engine instance owns (under its
  // state dir; never another instance's); for recovery, which destroys the ones no record
  // claims.
  [[nodiscard]] virtual Result<std::vector<std::string>> ListSandboxes() = 0;
  // Changes the limits a live sandbox's processes are held to: cpus, memory_mb and pids_max
  // only (disk_mb, tmp_mb and nofile are fixed at create). A warm-pool claim uses it to give a
  // pooled sandbox the request's limits. kNotFound when the sandbox is not held here.
  [[nodiscard]] virtual Status UpdateLimits(const std::string& id, const Limits& limits) = 0;
  // Layers. SnapshotLayer copies what a live sandbox wrote (its writable layer, not /tmp)
  // into a layer, the sandbox frozen meanwhile; a create stacks layers by digest.
  virtual bool HasLayer(const std::string& digest) const = 0;
  [[nodiscard]] virtual Result<LayerSnapshot> SnapshotLayer(const std::string& id) = 0;
  // A layer from a tree that `fill` writes into an empty host directory it is given (owners as
  // they are to appear inside a sandbox: 0..65535); the directory is removed afterwards.
  [[nodiscard]] virtual Result<LayerSnapshot> ImportLayer(
      const std::function<Status(const std::string& dir)>& fill) = 0;
  // Removes a layer; the caller makes sure no sandbox or template uses it. Idempotent.
  [[nodiscard]] virtual Status RemoveLayer(const std::string& digest) = 0;
  [[nodiscard]] virtual Result<std::vector<std::string>> ListLayers() = 0;
  [[nodiscard]] virtual Status Pause(const std::string& id) = 0;
  [[nodiscard]] virtual Status Resume(const std::string& id) = 0;
  // Saves (and stops) a sandbox with its memory to `dir`; Restore starts it again from there.
  [[nodiscard]] virtual Status Checkpoint(const std::string& id, const std::string& dir) = 0;
  [[nodiscard]] virtual Result<std::unique_ptr<Sandbox>> Restore(const SandboxSpec& spec,
                                                                 const std::string& dir) = 0;
};

}  // namespace airlock::runtime
