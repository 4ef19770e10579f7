// airlock-jail-run: creates one jail sandbox, runs a command in it through the agent, prints
// its output, and destroys the sandbox. A small driver for the engine until airlockd exists.
//
//   airlock-jail-run [--state-dir DIR] [--memory-mb N] [--cpus X] [--pids N] [--disk-mb N]
//                    [--user NAME] [--keep] -- COMMAND...

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "common/ids.h"
#include "protocol/client.h"
#include "runtime/jail/jail_engine.h"

namespace {

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "airlock-jail-run: %s\n", what.c_str());
  std::exit(125);
}

}  // namespace

int main(int argc, char** argv) {
  namespace fs = std::filesystem;
  fs::path bin = fs::canonical("/proc/self/exe").parent_path();
  airlock::jail::JailOptions options;
  options.state_dir = "/var/lib/airlock";
  options.launcher_path = (bin / "airlock-jail").string();
  options.agent_path = (bin.parent_path().parent_path() / "agent" / "airlock-agent").string();
  airlock::runtime::SandboxSpec spec;
  spec.id = airlock::NewSandboxId();
  std::string user;
  int i = 1;
  auto value = [&](const char* flag) -> std::string {
    if (i + 1 >= argc) Die(std::string(flag) + " needs a value");
    return argv[++i];
  };
  for (; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--") {
      ++i;
      break;
    }
    if (a == "--state-dir")
      options.state_dir = value("--state-dir");
    else if (a == "--agent")
      options.agent_path = value("--agent");
    else if (a == "--memory-mb")
      spec.limits.memory_mb = std::stoull(value("--memory-mb"));
    else if (a == "--cpus")
      spec.limits.cpus = std::stod(value("--cpus"));
    else if (a == "--pids")
      spec.limits.pids_max = std::stoull(value("--pids"));
    else if (a == "--disk-mb")
      spec.limits.disk_mb = std::stoull(value("--disk-mb"));
    else if (a == "--user")
      user = value("--user");
    else
      Die("unknown option " + a);
  }
  if (i >= argc) Die("usage: airlock-jail-run [options] -- COMMAND...");
  airlock::protocol::Exec exec;
  for (; i < argc; ++i) exec.argv.emplace_back(argv[i]);
  exec.user = user;

  airlock::runtime::LayerStore layers(options.state_dir + "/layers", options.state_dir + "/staging");
  if (auto st = layers.Prepare(); !st) Die(st.error().message());
  options.layers = &layers;
  auto rt = airlock::jail::JailEngine::Open(options);
  if (!rt) Die(rt.error().message());
  auto t0 = std::chrono::steady_clock::now();
  auto sbx = (*rt)->Create(spec);
  if (!sbx) Die(sbx.error().message());
  auto client = airlock::protocol::BlockingClient::Connect((*sbx)->TakeAgentChannel(), "jail-run");
  auto t1 = std::chrono::steady_clock::now();
  int code = 125;
  if (!client) {
    std::fprintf(stderr, "airlock-jail-run: %s\n", client.error().message().c_str());
  } else {
    std::fprintf(stderr, "[%s created in %.1f ms, agent pid %d on the host]\n", spec.id.c_str(),
                 std::chrono::duration<double, std::milli>(t1 - t0).count(),
                 (*rt)->InitPid(spec.id));
    auto r = client->Exec(exec);
    if (!r) {
      std::fprintf(stderr, "airlock-jail-run: %s\n", r.error().message().c_str());
    } else {
      std::fwrite(r->stdout_data.data(), 1, r->stdout_data.size(), stdout);
      std::fwrite(r->stderr_data.data(), 1, r->stderr_data.size(), stderr);
      code = r->exit.term_signal ? 128 + r->exit.term_signal : r->exit.exit_code;
    }
  }
  if (auto st = (*rt)->Destroy(spec.id); !st) Die(st.error().message());
  return code;
}
