#include "support/fake_engine.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "common/ids.h"
#include "common/syscall.h"
#include "protocol/client.h"

extern char** environ;

namespace airlock::testing {
namespace {

namespace fs = std::filesystem;

Result<UniqueFd> Connect(const std::string& path) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.size() >= sizeof addr.sun_path) return Fail(ErrorCode::kInternal, "socket path too long");
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd) return FailErrno("socket", errno);
  if (::connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) < 0) {
    return Fail(ErrorCode::kUnavailable, "connecting to " + path + ": " + std::strerror(errno));
  }
  return fd;
}

// Whether `pid` is an agent serving the sandbox directory `dir`.
bool IsAgentOf(pid_t pid, const std::string& dir) {
  // ReadFileToString, not an ifstream: a process that ends while it is read fails the read with
  // ESRCH, on which libstdc++'s filebuf throws.
  auto cmdline = ReadFileToString("/proc/" + std::to_string(pid) + "/cmdline");
  return cmdline && cmdline->find(dir + "/agent.sock") != std::string::npos;
}

pid_t PidOf(const std::string& engine_state) {
  auto doc = nlohmann::json::parse(engine_state, nullptr, /*allow_exceptions=*/false);
  if (!doc.is_object() || !doc.contains("pid") || !doc["pid"].is_number_integer()) return 0;
  return static_cast<pid_t>(doc["pid"].get<int64_t>());
}

// SIGTERM (the agent ends its commands' process trees), then SIGKILL; reaped if ours.
void Stop(pid_t pid) {
  if (pid <= 0 || ::kill(pid, SIGTERM) != 0) return;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(3);
  while (std::chrono::steady_clock::now() < deadline) {
    pid_t r = ::waitpid(pid, nullptr, WNOHANG);
    if (r == pid || (r < 0 && errno == ECHILD && ::kill(pid, 0) != 0)) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ::kill(pid, SIGKILL);
  ::waitpid(pid, nullptr, 0);
}

}  // namespace

FakeEngine::FakeEngine(std::string state_dir, std::string agent_path,
                       const runtime::LayerStore* layers, std::string name)
    : state_dir_(std::move(state_dir) + "/" + name),
      agent_path_(std::move(agent_path)),
      name_(std::move(name)),
      layers_(layers) {
  capabilities_.layer_snapshot = true;
  capabilities_.host_usr_root = true;  // its commands see the host's /usr: all of the host
  capabilities_.max_layers = 8;
  capabilities_.isolation = "none: a process of the test (FakeEngine, tests only)";
  capabilities_.agent_channel = "a unix socket in the sandbox's directory";
  std::error_code ec;
  fs::create_directories(state_dir_, ec);
}

std::string FakeEngine::SandboxDir(const std::string& id) const { return state_dir_ + "/" + id; }

pid_t FakeEngine::AgentPid(const std::string& id) {
  std::lock_guard lock(mu_);
  auto it = live_.find(id);
  return it == live_.end() ? 0 : it->second;
}

Status FakeEngine::Probe() { return runtime::ProbeByCreate(*this, runtime::SandboxSpec{}); }

Result<std::unique_ptr<runtime::Sandbox>> FakeEngine::Create(const runtime::SandboxSpec& spec) {
  if (auto st = ValidateSandboxId(spec.id); !st) return std::unexpected(st.error());
  if (spec.root.layers.size() > capabilities_.max_layers) {
    return Fail(ErrorCode::kInvalidArgument, "too many layers");
  }
  if (!spec.netns.empty()) return std::unexpected(runtime::Lacks(name_, "networking", "join a network"));
  if (!spec.memory_image.empty()) {
    return std::unexpected(runtime::Lacks(name_, "memory_fork", "start from a memory image"));
  }
  const std::string dir = SandboxDir(spec.id);
  if (::mkdir(dir.c_str(), 0755) < 0) {
    if (errno == EEXIST) return Fail(ErrorCode::kAlreadyExists, "sandbox " + spec.id + " exists");
    return FailErrno("creating " + dir, errno);
  }
  auto fail = [&](Error e) -> Result<std::unique_ptr<runtime::Sandbox>> {
    (void)Destroy(spec.id);
    return std::unexpected(std::move(e).Wrap("creating " + spec.id));
  };
  std::error_code ec;
  fs::create_directories(dir + "/root/home/user", ec);
  fs::create_directories(dir + "/root/tmp", ec);
  if (ec) return fail(Error(ErrorCode::kInternal, "making its root: " + ec.message()));
  // The layers, bottom first, copied into its root: a root "over" them, as far as its files go.
  for (auto it = spec.root.layers.rbegin(); it != spec.root.layers.rend(); ++it) {
    if (!layers_->Has(*it)) return fail(Error(ErrorCode::kNotFound, "layer " + *it + " does not exist"));
    fs::copy(layers_->Path(*it), dir + "/root",
             fs::copy_options::recursive | fs::copy_options::overwrite_existing, ec);
    if (ec) return fail(Error(ErrorCode::kInternal, "copying layer " + *it + ": " + ec.message()));
  }
  std::vector<std::string> args = {agent_path_,    "--listen",    dir + "/agent.sock",
                                   "--root",       dir + "/root", "--log-level",
                                   "warn"};
  for (const std::string& kv : spec.env) args.insert(args.end(), {"--env", kv});
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&actions, 1, (dir + "/agent.log").c_str(),
                                   O_WRONLY | O_CREAT | O_APPEND, 0600);
  posix_spawn_file_actions_adddup2(&actions, 1, 2);
  pid_t pid = 0;
  int err = ::posix_spawn(&pid, agent_path_.c_str(), &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (err != 0) return fail(ErrnoError("starting " + agent_path_, err));
  {
    std::lock_guard lock(mu_);
    live_[spec.id] = pid;
  }
  std::ofstream(dir + "/pid") << pid << "\n";
  // The agent binds its socket as it starts.
  Result<UniqueFd> channel = Fail(ErrorCode::kUnavailable, "the agent did not listen");
  for (int i = 0; i < 500 && !channel; ++i) {
    channel = Connect(dir + "/agent.sock");
    if (!channel) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  if (!channel) return fail(channel.error());
  runtime::SandboxInfo info;
  info.id = spec.id;
  info.engine_state = nlohmann::json{{"pid", pid}}.dump();
  return std::make_unique<runtime::CreatedSandbox>(std::move(info), std::move(*channel));
}

Status FakeEngine::Destroy(const std::string& id) {
  if (auto st = ValidateSandboxId(id); !st) return st;
  const std::string dir = SandboxDir(id);
  pid_t pid = 0;
  {
    std::lock_guard lock(mu_);
    if (auto it = live_.find(id); it != live_.end()) {
      pid = it->second;
      live_.erase(it);
    }
  }
  if (pid == 0) {  // what another instance (or a crash) left: found by its pid file
    std::ifstream in(dir + "/pid");
    in >> pid;
    if (pid > 0 && !IsAgentOf(pid, dir)) pid = 0;
  }
  Stop(pid);
  std::error_code ec;
  fs::remove_all(dir, ec);
  if (ec) return Fail(ErrorCode::kInternal, "removing " + dir + ": " + ec.message());
  return {};
}

Result<UniqueFd> FakeEngine::ConnectAgent(const std::string& id) {
  if (AgentPid(id) == 0) return Fail(ErrorCode::kNotFound, "sandbox " + id + " is not held here");
  return Connect(SandboxDir(id) + "/agent.sock");
}

Result<runtime::SandboxInfo> FakeEngine::Adopt(const std::string& id,
                                               const std::string& engine_state,
                                               runtime::SandboxState state) {
  if (state == runtime::SandboxState::kPaused) {
    return std::unexpected(runtime::Lacks(name_, "pause", "hold a paused sandbox"));
  }
  if (state == runtime::SandboxState::kHibernated) {
    return std::unexpected(
        runtime::Lacks(name_, "memory_checkpoint", "hold a hibernated sandbox"));
  }
  const pid_t pid = PidOf(engine_state);
  if (pid <= 0 || !IsAgentOf(pid, SandboxDir(id))) {
    return Fail(ErrorCode::kNotFound, "its agent (pid " + std::to_string(pid) + ") is gone");
  }
  {
    std::lock_guard lock(mu_);
    if (live_.contains(id)) return Fail(ErrorCode::kAlreadyExists, "sandbox " + id + " is held");
    live_[id] = pid;
  }
  runtime::SandboxInfo info;
  info.id = id;
  info.engine_state = engine_state;
  return info;
}

Result<std::vector<std::string>> FakeEngine::ListSandboxes() {
  std::vector<std::string> ids;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(state_dir_, ec)) {
    std::string id = entry.path().filename().string();
    if (ValidateSandboxId(id)) ids.push_back(std::move(id));
  }
  if (ec) return Fail(ErrorCode::kInternal, "listing " + state_dir_ + ": " + ec.message());
  return ids;
}

Status FakeEngine::UpdateLimits(const std::string&, const runtime::Limits&) {
  return std::unexpected(runtime::Lacks(name_, "live_limits", "change a sandbox's limits"));
}

Result<runtime::LayerSnapshot> FakeEngine::SnapshotLayer(const std::string& id) {
  if (AgentPid(id) == 0) return Fail(ErrorCode::kNotFound, "sandbox " + id + " is not held here");
  UniqueFd root(::open((SandboxDir(id) + "/root").c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!root) return FailErrno("opening the root of " + id, errno);
  return layers_->Import(root.get(), 0);
}

Result<runtime::SandboxStats> FakeEngine::Stats(const std::string& id) {
  const pid_t pid = AgentPid(id);
  if (pid == 0) return Fail(ErrorCode::kNotFound, "sandbox " + id + " does not exist");
  // No cgroup: the agent's own CPU time with its reaped children's (every command it ran),
  // its resident memory, its threads, and the bytes of the files under its root.
  runtime::SandboxStats stats;
  auto stat = ReadFileToString("/proc/" + std::to_string(pid) + "/stat");
  if (!stat) return std::unexpected(stat.error());
  std::istringstream fields(stat->substr(stat->rfind(')') + 2));
  std::vector<std::string> f{std::istream_iterator<std::string>(fields), {}};
  // After the comm: state is field 3, utime..cstime fields 14-17, num_threads 20, rss 24.
  if (f.size() < 22) return Fail(ErrorCode::kInternal, "short /proc/" + std::to_string(pid) + "/stat");
  const double tick = static_cast<double>(::sysconf(_SC_CLK_TCK));
  for (int i = 11; i <= 14; ++i) stats.cpu_seconds += std::stod(f[i]) / tick;
  stats.pids = std::stoull(f[17]);
  stats.memory_bytes = std::stoull(f[21]) * static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  std::error_code ec;
  for (const auto& entry :
       std::filesystem::recursive_directory_iterator(SandboxDir(id) + "/root", ec)) {
    if (entry.is_regular_file(ec) && !entry.is_symlink(ec)) stats.disk_bytes += entry.file_size(ec);
  }
  return stats;
}

Status FakeEngine::Alive(const std::string& id) {
  const pid_t pid = AgentPid(id);
  if (pid == 0) return Fail(ErrorCode::kNotFound, "sandbox " + id + " does not exist");
  if (ProcessRuns(pid)) return {};
  return Fail(ErrorCode::kFailedPrecondition,
              "its agent (pid " + std::to_string(pid) + ") exited");
}

Status FakeEngine::Pause(const std::string&) {
  return std::unexpected(runtime::Lacks(name_, "pause", "pause a sandbox"));
}

Status FakeEngine::Resume(const std::string&) {
  return std::unexpected(runtime::Lacks(name_, "pause", "resume a sandbox"));
}

Result<runtime::Hibernation> FakeEngine::Hibernate(const std::string&) {
  return std::unexpected(runtime::Lacks(name_, "memory_checkpoint", "hibernate a sandbox"));
}

Result<std::unique_ptr<runtime::Sandbox>> FakeEngine::Wake(const std::string&) {
  return std::unexpected(runtime::Lacks(name_, "memory_checkpoint", "wake a sandbox"));
}

Result<runtime::MemoryImage> FakeEngine::SaveMemoryImage(const std::string&, const ImageSaved&) {
  return std::unexpected(runtime::Lacks(name_, "memory_fork", "save a sandbox's memory"));
}

Status FakeEngine::RemoveMemoryImage(const std::string&) {
  return std::unexpected(runtime::Lacks(name_, "memory_fork", "remove a memory image"));
}

}  // namespace airlock::testing
