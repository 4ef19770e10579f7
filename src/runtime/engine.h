#pragma once
// The engine interface: every isolation engine (the jail; gVisor and microVMs next) sits behind
// it, and the daemon never includes an engine's internals (docs/design/engines.md). Engines are
// built and probed by the registry (runtime/registry.h); each says what it can do in its
// Capabilities, and the daemon checks them before it asks, so an engine is never asked for
// something it lacks. An engine that is asked anyway answers Lacks(...) too.
//
// What an engine gets is engine-neutral (SandboxSpec: a root made of layers from the shared
// layer store, limits, a network namespace, the guest contract of runtime/guest.h). What it
// keeps about a live sandbox beyond its id is its own: an opaque state string it returns at
// create and adopt, which the daemon stores with the sandbox's record and gives back at adopt.

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
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

// A sandbox's root file system, bottom to top: the host's /usr (read-only; only engines with
// Capabilities::host_usr_root) or nothing of the host's, then read-only layers from the shared
// layer store (runtime/layer_store.h), then the sandbox's writable layer. Without the host's
// /usr the bottom layer is a whole root file system (a Debian suite's, an OCI image's).
struct RootSpec {
  bool host_usr = true;
  std::vector<std::string> layers;  // digests, topmost first
  bool operator==(const RootSpec&) const = default;
};

// What a sandbox is made of. Validated once at the API edge; engines may assume it is valid.
struct SandboxSpec {
  std::string id;  // ValidateSandboxId holds
  RootSpec root;
  Limits limits;
  std::vector<std::string> env;  // KEY=VALUE for every command
  std::string user = "user";     // who commands run as by default (runtime/guest.h)
  // A network namespace the host made for it (a path; "": loopback only), and the DNS server
  // its resolv.conf names.
  std::string netns;
  std::string nameserver;
  // A MemoryImage (Engine::SaveMemoryImage) to start from instead of booting: its processes,
  // memory and files, on `root` (which must be the saved sandbox's). "": a fresh sandbox.
  std::string memory_image;
};

// What an engine can do on this host, as its probe found it. The daemon refuses a request that
// needs what the engine lacks (409, naming the engine and the capability) before it changes
// anything; the conformance suite (tests/engine/) checks that what is claimed works.
struct Capabilities {
  bool limits = false;          // cpus, memory_mb, pids_max and disk_mb hold from the create on
  bool pause = false;           // Pause/Resume: frozen in place, memory kept
  bool live_limits = false;     // UpdateLimits (cpus, memory, pids) on a running sandbox
  bool layer_snapshot = false;  // SnapshotLayer: snapshots, forks of the file system, builds
  bool memory_checkpoint = false;  // a sandbox saved with its memory and restored later
  bool memory_checkpoint_network = false;  // ... also one that joined a network namespace
  bool memory_fork = false;        // a running sandbox copied with its memory
  bool host_usr_root = false;      // RootSpec::host_usr
  bool networking = false;         // joins SandboxSpec::netns
  uint32_t max_layers = 0;         // RootSpec::layers at most
  std::string isolation;           // what stands between the sandbox and the host, in words
  // How it runs sandbox code where the engine has a choice (gVisor: the runsc platform,
  // "ptrace" or "kvm"); "" where it has none.
  std::string platform;
  std::string agent_channel;       // how the daemon reaches the agent (runtime/guest.h)
  // Engine::WatchProcesses reports every program started in its sandboxes (not only the API's
  // commands) and their ends.
  bool process_events = false;
};

enum class SandboxState { kRunning, kPaused, kHibernated };

// A live sandbox as its engine reports it.
struct SandboxInfo {
  std::string id;
  SandboxState state = SandboxState::kRunning;
  // The engine's own record of the sandbox (a JSON object by convention, never read by the
  // daemon): stored with the sandbox's record, given back to Adopt after a restart.
  std::string engine_state;
};

// What a sandbox uses now, as its engine can read it cheaply (no fork, a few small reads):
// Engine::Stats, sampled by the daemon every few seconds (docs/design/metrics.md).
struct SandboxStats {
  double cpu_seconds = 0;          // CPU time used since it started, user + system
  uint64_t memory_bytes = 0;       // memory charged to it now (page cache included)
  uint64_t memory_peak_bytes = 0;  // the most it was charged; 0 where the engine cannot tell
  uint64_t pids = 0;               // processes and threads now
  uint64_t disk_bytes = 0;         // bytes used in its writable layer (against disk_mb)
};

// A sandbox saved to disk with its memory (Engine::Hibernate).
struct Hibernation {
  uint64_t image_bytes = 0;  // the memory image, on disk under the engine's state dir
  // Replaces the sandbox's engine_state (what Adopt gets back while it is hibernated).
  std::string engine_state;
};

// A running sandbox's processes, memory and files saved for new sandboxes to start from
// (Engine::SaveMemoryImage, SandboxSpec::memory_image).
struct MemoryImage {
  std::string id;            // "mem-...": names it to Create and RemoveMemoryImage
  uint64_t bytes = 0;        // on disk
  std::string engine_state;  // the saved sandbox's, which the save changed: it replaces it
};

// A sandbox's writable layer frozen into a read-only, content-addressed layer.
struct LayerSnapshot {
  std::string digest;  // 64 hex digits (SHA-256 of the layer's manifest)
  uint64_t files = 0;
  uint64_t bytes = 0;
  bool existed = false;  // an identical layer was already stored
};

// A process started (exec) or ended in a sandbox, as the sandbox sees it: what the flight
// recorder logs (Engine::WatchProcesses). Best effort by nature (docs/design/jail.md, "Process
// events"): a process may be gone before it is looked at, and events are dropped, and counted,
// rather than let a storm of processes grow memory or slow the sandbox.
struct ProcessEvent {
  enum class Kind { kExec, kExit };
  // What one exec event carries of argv at most: this many arguments and bytes in all.
  static constexpr size_t kMaxArgs = 32;
  static constexpr size_t kMaxArgvBytes = 4096;

  Kind kind = Kind::kExec;
  int64_t at_ms = 0;  // unix ms, when the engine saw it
  int64_t pid = 0;    // in the sandbox's pid namespace
  int64_t ppid = 0;   // likewise; 0 if unknown or outside the sandbox
  int64_t uid = -1;   // the effective uid as the sandbox sees it; -1 unknown
  std::vector<std::string> argv;  // kExec: capped (kMaxArgs, kMaxArgvBytes)
  bool argv_truncated = false;    // kExec: the cap cut it
  bool argv_lost = false;         // kExec: the process was gone before its argv could be read
  int exit_code = -1;             // kExit: its exit status if it exited (-1 if a signal ended it)
  int signal = 0;                 // kExit: the signal that killed it (0 if it exited)

  // Appends `arg` to argv within the caps (the argument that crosses kMaxArgvBytes keeps what
  // fits) and marks argv_truncated when one is hit; false once argv is full.
  bool AddArg(std::string_view arg);
  // Sets exit_code or signal from a wait(2) status.
  void SetWaitStatus(int status);
};
// Called from a thread of the engine's, one event at a time, for the sandbox `sandbox_id`.
using ProcessEventSink =
    std::function<void(const std::string& sandbox_id, const ProcessEvent& event)>;
// What a process watch let go, since WatchProcesses: engines count rather than block.
struct ProcessEventCounters {
  uint64_t reported = 0;  // events given to the sink
  uint64_t dropped = 0;   // events of its sandboxes it saw but could not report (a bound was hit)
  uint64_t lost = 0;      // events the engine's source lost before it saw them (which sandbox's
                          // it cannot tell)
};

class Sandbox {
 public:
  virtual ~Sandbox() = default;
  virtual const SandboxInfo& info() const = 0;
  // A channel to the sandbox's agent, connected during the create; taken once (the caller owns
  // it after). More channels come from Engine::ConnectAgent.
  virtual UniqueFd TakeAgentChannel() = 0;
};

class Engine {
 public:
  virtual ~Engine() = default;
  // "jail", "gvisor", ...: the name records, requests and the config use.
  virtual std::string_view name() const = 0;
  // What it can do here; fixed once the registry has built it.
  virtual const Capabilities& capabilities() const = 0;
  // A real pre-flight: makes a small sandbox, speaks to its agent, destroys it. The registry
  // runs it once at start; an engine that fails it is listed unavailable with this error.
  [[nodiscard]] virtual Status Probe() = 0;

  // Creates and starts a sandbox; on return its agent is running and the channel is connected.
  // On failure nothing it made is left behind.
  [[nodiscard]] virtual Result<std::unique_ptr<Sandbox>> Create(const SandboxSpec& spec) = 0;
  // Kills everything in the sandbox and releases everything it held. Idempotent: destroying a
  // sandbox that is already gone (or half made, after a crash) succeeds; found by id alone.
  [[nodiscard]] virtual Status Destroy(const std::string& id) = 0;
  // A new channel to a live sandbox's agent; the agent serves any number at once (the daemon
  // uses one per command in flight). kNotFound when the sandbox is not held by this engine.
  [[nodiscard]] virtual Result<UniqueFd> ConnectAgent(const std::string& id) = 0;
  // Whether a sandbox held here still runs (paused counts): OK, or kFailedPrecondition saying
  // why it stopped when it can tell (its memory ran out, its agent exited). The daemon asks when
  // the agent does not answer, and records a sandbox that stopped as failed with that reason.
  // kNotFound when the sandbox is not held here.
  [[nodiscard]] virtual Status Alive(const std::string& id) = 0;
  // Takes over a sandbox that a previous run of the daemon created and left alive, from the
  // engine_state its create (or last adopt, hibernate or wake) returned: checks that it is alive
  // and is that sandbox, re-acquires what it holds, and makes it paused or not as `state` says
  // (kHibernated: its memory image is there and nothing of it runs). On failure nothing is
  // changed (the caller destroys the sandbox by id).
  [[nodiscard]] virtual Result<SandboxInfo> Adopt(const std::string& id,
                                                  const std::string& engine_state,
                                                  SandboxState state) = 0;
  // The ids of every sandbox, live or half made, that this engine instance owns (under its
  // state dir; never another instance's); for recovery, which destroys the ones no record
  // claims.
  [[nodiscard]] virtual Result<std::vector<std::string>> ListSandboxes() = 0;
  // What a live sandbox held here uses now (paused ones too: frozen, their memory still held).
  // kNotFound when it is not held here; kFailedPrecondition when nothing of it runs (hibernated).
  [[nodiscard]] virtual Result<SandboxStats> Stats(const std::string& id) = 0;
  // Capabilities::live_limits. Changes cpus, memory_mb and pids_max only (disk_mb, tmp_mb and
  // nofile are fixed at create). kNotFound when the sandbox is not held here.
  [[nodiscard]] virtual Status UpdateLimits(const std::string& id, const Limits& limits) = 0;
  // Capabilities::layer_snapshot. Copies what a live sandbox wrote (its writable layer, not
  // /tmp) into a layer of the shared layer store, the sandbox frozen meanwhile.
  [[nodiscard]] virtual Result<LayerSnapshot> SnapshotLayer(const std::string& id) = 0;
  // Capabilities::pause.
  [[nodiscard]] virtual Status Pause(const std::string& id) = 0;
  [[nodiscard]] virtual Status Resume(const std::string& id) = 0;
  // Capabilities::memory_checkpoint. Saves a running sandbox's processes and memory to disk and
  // stops it: nothing of it runs and the memory it held is freed; its files stay. Every agent
  // channel to it closes. kFailedPrecondition, the sandbox still running, when it cannot be
  // saved now (a command in the foreground, a file transfer) or at all (the message says why).
  [[nodiscard]] virtual Result<Hibernation> Hibernate(const std::string& id) = 0;
  // Restores a hibernated sandbox, every process where it was, its agent channel connected; the
  // info's engine_state replaces the record's. On failure nothing of it runs and its image
  // stays (the caller records it failed; Destroy removes everything).
  [[nodiscard]] virtual Result<std::unique_ptr<Sandbox>> Wake(const std::string& id) = 0;
  // What SaveMemoryImage calls once the image is whole, before the sandbox it was saved from is
  // brought back: creates from the image may start meanwhile (the id and bytes are set).
  using ImageSaved = std::function<void(const MemoryImage&)>;
  // Capabilities::memory_fork. Saves a running sandbox's processes, memory and files into an
  // image that Create can start new sandboxes from (SandboxSpec::memory_image); the sandbox runs
  // on, its agent channels closed. Refused as Hibernate is. `saved` (may be empty): above. A
  // failure after `saved` was called leaves the image to the caller (RemoveMemoryImage).
  [[nodiscard]] virtual Result<MemoryImage> SaveMemoryImage(const std::string& id,
                                                            const ImageSaved& saved) = 0;
  // Idempotent; the sandboxes made from it are not touched.
  [[nodiscard]] virtual Status RemoveMemoryImage(const std::string& image) = 0;
  // Every memory image this engine instance holds, whole or half written (they outlive a
  // restart); for recovery, which removes the ones no template names. Empty without
  // Capabilities::memory_fork.
  [[nodiscard]] virtual Result<std::vector<std::string>> ListMemoryImages() = 0;
  // Capabilities::process_events. Called once (the daemon: before it serves); from then on the
  // engine gives `sink` the exec and exit events of every sandbox it holds (created, adopted or
  // woken), from a thread of its own, until it is destroyed (which waits for that thread: the
  // sink must outlive the engine). Never blocks a sandbox: what it cannot report in time it
  // drops and counts. This default: Lacks.
  [[nodiscard]] virtual Status WatchProcesses(ProcessEventSink sink);
  // What the watch dropped and lost so far (zeros without one).
  virtual ProcessEventCounters ProcessEventCounts() const { return {}; }
};

// A sandbox as an engine's Create returns it: its info and the agent channel connected during
// the create.
class CreatedSandbox final : public Sandbox {
 public:
  CreatedSandbox(SandboxInfo info, UniqueFd channel)
      : info_(std::move(info)), channel_(std::move(channel)) {}
  const SandboxInfo& info() const override { return info_; }
  UniqueFd TakeAgentChannel() override { return std::move(channel_); }

 private:
  SandboxInfo info_;
  UniqueFd channel_;
};

// A probe made of a whole create of `spec` (its id chosen here), a hello to the new sandbox's
// agent and a destroy: what each engine's Probe does, with limits of its choosing.
[[nodiscard]] Status ProbeByCreate(Engine& engine, SandboxSpec spec);

// The answer to a request `engine` cannot serve for lack of `capability` (a Capabilities field
// name; `what`: the request, "pause a sandbox"): kFailedPrecondition (409), naming both. The
// daemon's answer before it asks, and an engine's when asked anyway.
Error Lacks(std::string_view engine, std::string_view capability, std::string_view what);

}  // namespace airlock::runtime
