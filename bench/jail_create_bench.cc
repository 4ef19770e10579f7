// Cold create of a jail sandbox (every setup step done, the agent answering a ping), the CPU time
// its PID 1 used for that, and its destroy, beside bubblewrap's cold start (`bwrap --unshare-all
// ... true`) and gVisor's (`runsc run` of a trivial bundle), all measured in the same run. Needs
// root.
//
//   airlock-bench-jail [--iterations N] [--runsc-iterations N] [--json FILE]

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "baselines.h"
#include "common/ids.h"
#include "protocol/client.h"
#include "runtime/jail/jail_engine.h"
#include "stats.h"

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "airlock-bench-jail: %s\n", what.c_str());
  std::exit(1);
}

double Us(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::micro>(b - a).count();
}

// Runs argv to completion, returning its wall time; dies if it fails.
double TimeCommand(const std::vector<std::string>& args) {
  auto us = airlock::bench::TimeCommand(args);
  if (!us) Die(us.error().message());
  return *us;
}

// The CPU time a process has used so far, from /proc/<pid>/schedstat (ns); nullopt if unreadable.
// A sandbox's PID 1 is its setup (ContainProcess) and then the agent: what a create costs in
// CPU, which its wall time on a loaded machine hides under the wait for a CPU.
std::optional<double> CpuUs(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/schedstat");
  double ns = 0;
  if (!(in >> ns)) return std::nullopt;
  return ns / 1000;
}

}  // namespace

int main(int argc, char** argv) {
  int iterations = 200, runsc_iterations = 20;
  std::string json_path;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) Die(a + " needs a value");
      return argv[++i];
    };
    if (a == "--iterations")
      iterations = std::stoi(next());
    else if (a == "--runsc-iterations")
      runsc_iterations = std::stoi(next());
    else if (a == "--json")
      json_path = next();
    else
      Die("unknown argument " + a);
  }
  if (geteuid() != 0) Die("needs root (the jail engine maps uid ranges)");
  std::string work = fs::temp_directory_path() / ("airlock-bench-jail-" + std::to_string(getpid()));
  fs::create_directories(work);

  airlock::runtime::LayerStore layers(work + "/state/layers", work + "/state/staging");
  if (auto st = layers.Prepare(); !st) Die(st.error().message());
  airlock::jail::JailOptions options;
  options.layers = &layers;
  options.state_dir = work + "/state";
  options.launcher_path = AIRLOCK_JAIL_LAUNCHER_PATH;
  options.agent_path = AIRLOCK_AGENT_PATH;
  auto rt = airlock::jail::JailEngine::Open(options);
  if (!rt) Die(rt.error().message());

  std::vector<double> cpu;  // the sandbox's PID 1, at the agent's answer
  auto jail_cycle = [&](std::vector<double>& create, std::vector<double>& destroy) {
    airlock::runtime::SandboxSpec spec;
    spec.id = airlock::NewSandboxId();
    auto t0 = Clock::now();
    auto sbx = (*rt)->Create(spec);
    if (!sbx) Die(sbx.error().message());
    auto client = airlock::protocol::BlockingClient::Connect((*sbx)->TakeAgentChannel());
    if (!client || !client->Ping(1)) Die("the agent did not answer");
    auto t1 = Clock::now();
    if (auto us = CpuUs((*rt)->InitPid(spec.id))) cpu.push_back(*us);
    if (auto st = (*rt)->Destroy(spec.id); !st) Die(st.error().message());
    auto t2 = Clock::now();
    create.push_back(Us(t0, t1));
    destroy.push_back(Us(t1, t2));
  };
  const std::vector<std::string> bwrap = airlock::bench::BwrapArgs({}, {"/usr/bin/true"});
  bool have_bwrap = airlock::bench::Have("bwrap"), have_runsc = airlock::bench::Have("runsc");

  // Warm up the page cache and the allocator, then interleave the two fast ones.
  std::vector<double> create, destroy, bw, rs, ignore1, ignore2;
  for (int i = 0; i < 10; ++i) {
    jail_cycle(ignore1, ignore2);
    if (have_bwrap) TimeCommand(bwrap);
  }
  cpu.clear();
  for (int i = 0; i < iterations; ++i) {
    jail_cycle(create, destroy);
    if (have_bwrap) bw.push_back(TimeCommand(bwrap));
  }
  if (have_runsc) {
    const std::string bundle = work + "/bundle";
    if (auto st = airlock::bench::MakeRunscBundle(bundle, {"/usr/bin/true"}); !st)
      Die(st.error().message());
    for (int i = 0; i < runsc_iterations + 2; ++i) {
      double t = TimeCommand(airlock::bench::RunscArgs(
          work + "/runsc", {"run", "--bundle", bundle, "bench-" + std::to_string(i)}));
      if (i >= 2) rs.push_back(t);
    }
  }
  rt->reset();
  std::error_code ec;
  fs::remove_all(work, ec);

  namespace b = airlock::bench;
  std::vector<b::Summary> all = {b::Summarize("jail cold create (agent answering)", create),
                                 b::Summarize("jail destroy", destroy)};
  if (!cpu.empty()) all.push_back(b::Summarize("jail create CPU (sandbox PID 1)", cpu));
  size_t bw_at = 0, rs_at = 0;
  if (have_bwrap) {
    bw_at = all.size();
    all.push_back(b::Summarize("baseline bwrap --unshare-all true", bw));
  }
  if (have_runsc) {
    rs_at = all.size();
    all.push_back(b::Summarize("baseline runsc run (true)", rs));
  }
  b::PrintHeader();
  for (const auto& s : all) b::Print(s);
  std::string ratios;
  if (have_bwrap) {
    double r = all[0].p50 / all[bw_at].p50;
    std::printf("\nratio jail create / bwrap: p50 %.2fx, p99 %.2fx (target p50 <= 1.50x: %s)\n", r,
                all[0].p99 / all[bw_at].p99, r <= 1.5 ? "met" : "NOT met");
    ratios += ",\"ratio_p50_vs_bwrap\":" + std::to_string(r);
  } else {
    std::printf("\nbwrap is not installed: no baseline (apt-get install bubblewrap)\n");
  }
  if (have_runsc) {
    double r = all[0].p50 / all[rs_at].p50;
    std::printf("ratio jail create / runsc run: p50 %.3fx\n", r);
    ratios += ",\"ratio_p50_vs_runsc\":" + std::to_string(r);
  } else {
    std::printf("runsc is not installed: no baseline (apt-get install runsc)\n");
  }
  if (!json_path.empty()) {
    std::ofstream out(json_path);
    out << "{\"benchmark\":\"jail_create\",\"results\":[";
    for (size_t i = 0; i < all.size(); ++i) out << (i ? "," : "") << b::Json(all[i]);
    out << "]" << ratios << "}\n";
  }
  return 0;
}
