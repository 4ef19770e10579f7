#pragma once
// The sandbox lifecycle through airlockd's REST API (create, exec `true`, delete), run at a
// concurrency by worker threads, and the warm pool's routes: shared by airlock-bench-api and
// airlock-bench-run. Timings are of the calls that succeeded; every failure is kept.

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <iterator>
#include <latch>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "client/http_client.h"
#include "common/error.h"
#include "daemon_process.h"

namespace airlock::bench {

using Clock = std::chrono::steady_clock;

inline double Us(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::micro>(b - a).count();
}

inline std::string Truncated(std::string s, size_t max = 300) {
  if (s.size() > max) s = s.substr(0, max) + "...";
  return s;
}

// "HTTP 404: {...}", for failure messages.
inline std::string Describe(const client::HttpResponse& r) {
  return "HTTP " + std::to_string(r.status) + ": " + Truncated(r.body);
}

struct Failure {
  std::string op;  // create, exec, delete, setup, ...
  std::string message;
};

// One lifecycle: the timings of the steps that succeeded, and what went wrong.
struct Lifecycle {
  std::string id;          // the sandbox's, once known
  bool undeleted = false;  // the engine's Destroy failed: to be tried again
  std::optional<double> create_us, exec_us, delete_us, total_us;
  std::vector<Failure> failures;
  void Fail(std::string op, std::string message) {
    failures.push_back({std::move(op), std::move(message)});
  }
};

// Runs one lifecycle on the calling thread; each worker thread gets its own.
using LifecycleFn = std::function<Lifecycle()>;
// Makes a worker's LifecycleFn (e.g. with its own HTTP client), on that worker's thread.
using WorkerFactory = std::function<Result<LifecycleFn>()>;

// POST /v1/sandboxes `body`; the new sandbox's id, or why not (anything but a 201 with an id).
inline Result<std::string> CreateSandbox(client::HttpClient& http, const std::string& body = "{}") {
  auto created = http.Request("POST", "/v1/sandboxes", body);
  if (!created) return std::unexpected(created.error());
  nlohmann::json doc = nlohmann::json::parse(created->body, nullptr, /*allow_exceptions=*/false);
  if (created->status != 201 || !doc.is_object() || !doc.contains("id") || !doc["id"].is_string()) {
    return Fail(ErrorCode::kInternal, "expected 201 with an id, got " + Describe(*created));
  }
  return doc["id"].get<std::string>();
}

// POST /v1/sandboxes/{id}/exec of `true`; an error unless it exited 0.
inline Status ExecTrue(client::HttpClient& http, const std::string& id) {
  auto exec = http.Request("POST", "/v1/sandboxes/" + id + "/exec", R"({"argv":["true"]})");
  if (!exec) return std::unexpected(exec.error());
  if (exec->status != 200) return Fail(ErrorCode::kInternal, Describe(*exec));
  nlohmann::json result = nlohmann::json::parse(exec->body, nullptr, false);
  if (!result.is_object() || result.value("exit_code", nlohmann::json()) != nlohmann::json(0)) {
    return Fail(ErrorCode::kInternal, "true did not exit 0: " + Describe(*exec));
  }
  return {};
}

// DELETE /v1/sandboxes/{id}; an error unless 204.
inline Status DeleteSandbox(client::HttpClient& http, const std::string& id) {
  auto deleted = http.Request("DELETE", "/v1/sandboxes/" + id);
  if (!deleted) return std::unexpected(deleted.error());
  if (deleted->status != 204) return Fail(ErrorCode::kInternal, Describe(*deleted));
  return {};
}

// POST /v1/sandboxes -> POST .../exec `true` -> DELETE, on one keep-alive connection.
inline Lifecycle ApiLifecycle(client::HttpClient& http) {
  Lifecycle life;
  const auto t0 = Clock::now();
  auto created = CreateSandbox(http);
  const auto t1 = Clock::now();
  if (!created) {
    life.Fail("create", created.error().message());
    return life;
  }
  life.id = *created;
  life.create_us = Us(t0, t1);

  const auto t2 = Clock::now();
  auto exec = ExecTrue(http, life.id);
  const auto t3 = Clock::now();
  if (!exec) {
    life.Fail("exec", exec.error().message());
  } else {
    life.exec_us = Us(t2, t3);
  }

  // Deleted even when the exec failed, so no sandbox waits for the daemon's shutdown.
  const auto t4 = Clock::now();
  auto deleted = DeleteSandbox(http, life.id);
  const auto t5 = Clock::now();
  if (!deleted) {
    life.Fail("delete", deleted.error().message());
  } else {
    life.delete_us = Us(t4, t5);
  }
  if (life.failures.empty()) life.total_us = Us(t0, t5);
  return life;
}

// A worker factory for ApiLifecycle: one keep-alive HttpClient per worker thread.
inline WorkerFactory ApiWorker(const std::string& url) {
  return [url]() -> Result<LifecycleFn> {
    auto http = client::HttpClient::Open(url);
    if (!http) return std::unexpected(http.error());
    http->set_timeout(std::chrono::minutes(2));
    auto shared = std::make_shared<client::HttpClient>(std::move(*http));
    return LifecycleFn([shared] { return ApiLifecycle(*shared); });
  };
}

struct LevelResult {
  std::string phase;  // "api", "engine", "warm", ...
  int concurrency = 0;
  int attempted = 0;
  double wall_s = 0;
  std::vector<double> create, exec, destroy, total;  // microseconds, successes only
  std::vector<Failure> failures;
  std::vector<std::string> ids;        // every sandbox made, for the leftover check
  std::vector<std::string> undeleted;  // engine sandboxes whose Destroy failed
  size_t succeeded() const { return total.size(); }
  double throughput() const { return wall_s > 0 ? static_cast<double>(succeeded()) / wall_s : 0; }
};

inline void Absorb(LevelResult& level, Lifecycle&& life) {
  ++level.attempted;
  if (life.create_us) level.create.push_back(*life.create_us);
  if (life.exec_us) level.exec.push_back(*life.exec_us);
  if (life.delete_us) level.destroy.push_back(*life.delete_us);
  if (life.total_us) level.total.push_back(*life.total_us);
  if (life.undeleted) level.undeleted.push_back(life.id);
  if (!life.id.empty()) level.ids.push_back(std::move(life.id));
  for (auto& f : life.failures) level.failures.push_back(std::move(f));
}

// `iterations` lifecycles shared by `concurrency` threads, each with the LifecycleFn its
// factory made. The wall clock runs from the moment every worker is ready to the last one done.
// Stops early (what was started finishes) once g_interrupted is set.
inline LevelResult RunLevel(const std::string& phase, int concurrency, int iterations,
                            const WorkerFactory& factory) {
  LevelResult level;
  level.phase = phase;
  level.concurrency = concurrency;
  std::vector<LevelResult> per_worker(static_cast<size_t>(concurrency));
  std::atomic<int> claimed{0};
  std::latch ready(concurrency + 1);
  std::vector<std::thread> workers;
  for (int w = 0; w < concurrency; ++w) {
    workers.emplace_back([&, w] {
      LevelResult& mine = per_worker[static_cast<size_t>(w)];
      auto lifecycle = factory();
      ready.arrive_and_wait();
      if (!lifecycle) {
        mine.failures.push_back({"setup", lifecycle.error().message()});
        return;
      }
      while (!g_interrupted.load() && claimed.fetch_add(1) < iterations) {
        Absorb(mine, (*lifecycle)());
      }
    });
  }
  ready.arrive_and_wait();
  const auto t0 = Clock::now();
  for (auto& t : workers) t.join();
  level.wall_s = std::chrono::duration<double>(Clock::now() - t0).count();
  for (auto& mine : per_worker) {
    level.attempted += mine.attempted;
    auto append = [](auto& to, auto& from) {
      to.insert(to.end(), std::make_move_iterator(from.begin()),
                std::make_move_iterator(from.end()));
    };
    append(level.create, mine.create);
    append(level.exec, mine.exec);
    append(level.destroy, mine.destroy);
    append(level.total, mine.total);
    append(level.failures, mine.failures);
    append(level.ids, mine.ids);
    append(level.undeleted, mine.undeleted);
  }
  return level;
}

// Prints a level's failures (counted by op, the first five in full) to stderr under `tag`.
inline void PrintFailures(const char* tag, const LevelResult& level) {
  if (level.failures.empty()) return;
  std::map<std::string, int> by_op;
  for (const auto& f : level.failures) ++by_op[f.op];
  std::string counts;
  for (const auto& [op, n] : by_op) counts += " " + op + "=" + std::to_string(n);
  std::fprintf(stderr, "%s: %s at concurrency %d: %zu failures:%s\n", tag, level.phase.c_str(),
               level.concurrency, level.failures.size(), counts.c_str());
  for (size_t i = 0; i < level.failures.size() && i < 5; ++i) {
    std::fprintf(stderr, "  %s: %s\n", level.failures[i].op.c_str(),
                 level.failures[i].message.c_str());
  }
}

// The base pool's entry of GET /v1/pools (null if none).
inline Result<nlohmann::json> BasePool(client::HttpClient& http) {
  auto r = http.Request("GET", "/v1/pools");
  if (!r) return std::unexpected(r.error());
  nlohmann::json doc = nlohmann::json::parse(r->body, nullptr, false);
  if (r->status != 200 || !doc.is_object()) {
    return Fail(ErrorCode::kInternal, "GET /v1/pools: HTTP " + std::to_string(r->status));
  }
  for (const nlohmann::json& p : doc["pools"]) {
    if (p.value("template", "") == "base") return p;
  }
  return nlohmann::json();
}

// Sets the base pool's size and waits (up to a minute) until that many are ready.
inline Status FillPool(client::HttpClient& http, int size) {
  auto r = http.Request("PUT", "/v1/pools/base", nlohmann::json{{"size", size}}.dump());
  if (!r) return std::unexpected(r.error());
  if (r->status != 200) {
    return Fail(ErrorCode::kInternal,
                "PUT /v1/pools/base: HTTP " + std::to_string(r->status) + " " + r->body);
  }
  const auto deadline = Clock::now() + std::chrono::minutes(1);
  while (Clock::now() < deadline && !g_interrupted.load()) {
    auto pool = BasePool(http);
    if (!pool) return std::unexpected(pool.error());
    if (pool->is_object() && pool->value("ready", -1) == size) return {};
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return Fail(ErrorCode::kDeadlineExceeded,
              "the pool did not reach " + std::to_string(size) + " ready");
}

}  // namespace airlock::bench
