// SecretStore::Value, the call the egress proxy is to make for every request it puts a secret
// into: from the cache of sealed rows (a lookup and an AES-256-GCM open), beside what it would
// cost without the cache (the store's row read, then the open) and the open alone, measured in
// the same run with the samples interleaved; then the cached call from 4 threads at once, one
// of the values rotated every millisecond meanwhile. The target: cached p99 well under 100 us.
//
//   airlock-bench-secrets [--iterations N] [--json FILE]

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "common/log.h"
#include "daemon/server/secret_store.h"
#include "daemon/store/store.h"
#include "stats.h"

namespace {

namespace fs = std::filesystem;
using airlock::bench::Summarize;
using airlock::bench::Summary;
using Clock = std::chrono::steady_clock;

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "airlock-bench-secrets: %s\n", what.c_str());
  std::exit(1);
}

double Us(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::micro>(b - a).count();
}

template <typename Fn>
double Time(Fn&& fn) {
  const auto t0 = Clock::now();
  fn();
  return Us(t0, Clock::now());
}

}  // namespace

int main(int argc, char** argv) {
  spdlog::set_level(spdlog::level::warn);  // not a line per rotation
  int iterations = 20000;
  std::string json_path;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--iterations" && i + 1 < argc) {
      iterations = std::atoi(argv[++i]);
    } else if (arg == "--json" && i + 1 < argc) {
      json_path = argv[++i];
    } else {
      Die("usage: airlock-bench-secrets [--iterations N] [--json FILE]");
    }
  }
  std::string tmpl = (fs::temp_directory_path() / "airlock-bench-secrets-XXXXXX").string();
  if (::mkdtemp(tmpl.data()) == nullptr) Die("mkdtemp");
  const std::string dir = tmpl;
  std::vector<Summary> results;
  {
    auto store = airlock::store::Store::Open(dir + "/airlock.db");
    if (!store) Die(store.error().message());
    auto secrets = airlock::daemon::SecretStore::Open(**store, dir);
    if (!secrets) Die(secrets.error().message());
    airlock::daemon::SecretStore& s = **secrets;
    const std::string token = "ghp_" + std::string(36, 'x');  // a GitHub token's length
    const std::string page(4096, 'v');
    if (!s.Create("team-a", "TOKEN", token) || !s.Create("team-a", "PAGE", page) ||
        !s.Create("team-a", "ROTATED", token)) {
      Die("creating the secrets");
    }
    auto box = airlock::daemon::SecretBox::Load(dir + "/secrets.key");
    if (!box) Die(box.error().message());
    const std::string aad = std::string("airlock secret v1") + '\0' + "team-a" + '\0' + "TOKEN";
    auto sealed = box->Seal(aad, token);
    if (!sealed) Die(sealed.error().message());

    std::vector<double> cached, cached_page, uncached, open_only;
    for (int i = 0; i < iterations; ++i) {
      cached.push_back(Time([&] {
        if (s.Value("team-a", "TOKEN")->size() != token.size()) Die("wrong value");
      }));
      cached_page.push_back(Time([&] { (void)s.Value("team-a", "PAGE"); }));
      // Without the cache: the row from SQLite (behind the store's one mutex), then the open.
      uncached.push_back(Time([&] {
        auto row = (*store)->GetSecret("team-a", "TOKEN");
        (void)box->Open(aad, sealed->ciphertext, sealed->nonce);
      }));
      open_only.push_back(Time([&] { (void)box->Open(aad, sealed->ciphertext, sealed->nonce); }));
    }
    results.push_back(Summarize("Value, cached, 40 B", cached));
    results.push_back(Summarize("Value, cached, 4 KiB", cached_page));
    results.push_back(Summarize("baseline: row read + open, 40 B", uncached));
    results.push_back(Summarize("baseline: AES-GCM open alone, 40 B", open_only));

    // 4 readers at once while a writer rotates another secret every millisecond (each rotation
    // is a SQLite commit, then a cache update under the exclusive lock).
    std::atomic<bool> stop{false};
    std::thread writer([&] {
      for (int n = 0; !stop; ++n) {
        (void)s.Update("team-a", "ROTATED", token + std::to_string(n));
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
    });
    std::vector<std::vector<double>> per_thread(4);
    std::vector<std::thread> readers;
    for (auto& samples : per_thread) {
      readers.emplace_back([&s, &samples, iterations] {
        for (int i = 0; i < iterations; ++i) {
          samples.push_back(Time([&] { (void)s.Value("team-a", "TOKEN"); }));
          if (i % 2 == 0) samples.push_back(Time([&] { (void)s.Value("team-a", "ROTATED"); }));
        }
      });
    }
    for (auto& t : readers) t.join();
    stop = true;
    writer.join();
    std::vector<double> all;
    for (const auto& samples : per_thread) all.insert(all.end(), samples.begin(), samples.end());
    results.push_back(Summarize("Value, 4 threads, rotating", all));
  }
  fs::remove_all(dir);

  airlock::bench::PrintHeader();
  for (const Summary& r : results) airlock::bench::Print(r);
  std::printf("\ncached / uncached p50: %.2f; cached p99: %.1f us (target: well under 100 us)\n",
              results[0].p50 / results[2].p50, results[0].p99);
  if (!json_path.empty()) {
    std::ofstream out(json_path);
    out << "[";
    for (size_t i = 0; i < results.size(); ++i) {
      out << (i ? "," : "") << airlock::bench::Json(results[i]);
    }
    out << "]\n";
  }
  return 0;
}
