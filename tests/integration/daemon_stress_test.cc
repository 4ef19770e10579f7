// airlockd under load and under faults: many clients at once, and SIGKILL of the daemon in the
// middle of creates and deletes followed by a restart. Needs root (the jail engine).

#include <atomic>
#include <mutex>
#include <random>
#include <set>
#include <thread>

#include "client/http_client.h"
#include "daemon/store/store.h"
#include "support/airlockd.h"

namespace {

using namespace airlock::testing;
using airlock::client::HttpClient;

HttpClient ClientFor(const Daemon& d) {
  auto client = HttpClient::Open("http://127.0.0.1:" + std::to_string(d.port()));
  EXPECT_TRUE(client.has_value());
  client->set_api_key(d.key());
  client->set_timeout(std::chrono::seconds(120));
  return std::move(*client);
}

TEST_F(DaemonTest, FiftyClientsCreateExecAndDeleteInParallel) {
  constexpr int kClients = 50;
  std::atomic<int> ok{0};
  std::mutex mu;
  std::vector<std::string> problems;
  auto problem = [&](int i, const std::string& what) {
    std::lock_guard lock(mu);
    problems.push_back("client " + std::to_string(i) + ": " + what);
  };
  std::vector<std::thread> threads;
  for (int i = 0; i < kClients; ++i) {
    threads.emplace_back([&, i] {
      HttpClient http = ClientFor(*daemon_);
      auto created = http.Request("POST", "/v1/sandboxes", R"({"metadata": {"client": ")" +
                                                                std::to_string(i) + "\"}}");
      if (!created || created->status != 201) {
        return problem(i, "create: " + (created ? created->body : created.error().message()));
      }
      const std::string id = json::parse(created->body)["id"];
      const std::string base = "/v1/sandboxes/" + id;
      const std::string token = "client-" + std::to_string(i);
      // Two commands at once in the same sandbox, and a file round trip beside them.
      HttpClient second = ClientFor(*daemon_);
      std::optional<airlock::Result<airlock::client::HttpResponse>> slow;
      std::thread beside([&] {
        slow = second.Request("POST", base + "/exec", R"({"cmd": "sleep 0.3; echo slow"})");
      });
      auto exec = http.Request("POST", base + "/exec", R"({"argv": ["echo", ")" + token + "\"]}");
      auto put = http.Request("PUT", base + "/files?path=t.txt", token, "application/octet-stream");
      auto got = http.Request("GET", base + "/files?path=t.txt");
      beside.join();
      if (!exec || exec->status != 200 || json::parse(exec->body)["stdout"] != token + "\n") {
        problem(i, "exec: " + (exec ? exec->body : exec.error().message()));
      } else if (!put || put->status != 200 || !got || got->status != 200 || got->body != token) {
        problem(i, "files: " + (got ? got->body : got.error().message()));
      } else if (!*slow || (**slow).status != 200 ||
                 json::parse((**slow).body)["stdout"] != "slow\n") {
        problem(i, "concurrent exec: " + (*slow ? (**slow).body : (*slow).error().message()));
      } else {
        ++ok;
      }
      auto deleted = http.Request("DELETE", base);
      if (!deleted || deleted->status != 204) {
        problem(i, "delete: " + (deleted ? deleted->body : deleted.error().message()));
      }
    });
  }
  for (auto& t : threads) t.join();
  for (const auto& p : problems) ADD_FAILURE() << p;
  EXPECT_EQ(ok.load(), kClients);
  EXPECT_TRUE(Listed().empty());
  EXPECT_TRUE(fs::is_empty(daemon_->state_dir() + "/jail"));
}

// The state of the world after a restart: every acknowledged create that was not deleted is
// there and running, every acknowledged delete is gone, and no directory or cgroup is left
// for a sandbox that is not running.
// A delete sent but not answered (the daemon died first) may or may not have happened.
void CheckAfterRestart(Daemon& d, const std::set<std::string>& created,
                       const std::set<std::string>& deleted,
                       const std::set<std::string>& delete_unanswered) {
  for (const std::string& id : created) {
    Reply r = d.Call(http::verb::get, "/v1/sandboxes/" + id);
    if (delete_unanswered.contains(id) && !deleted.contains(id)) {
      EXPECT_TRUE(r.status == 404 || (r.status == 200 && r.Json()["state"] == "running"))
          << id << ": " << r.body;
    } else if (deleted.contains(id)) {
      EXPECT_EQ(r.status, 404) << id << " was deleted (204) but is back: " << r.body;
    } else {
      EXPECT_EQ(r.status, 200) << id << " was acknowledged (201) but is lost: " << r.body;
      EXPECT_EQ(r.Json().value("state", ""), "running") << id << ": " << r.body;
    }
  }
  auto store = airlock::store::Store::Open(d.state_dir() + "/airlock.db");
  ASSERT_TRUE(store) << store.error().message();
  auto records = (*store)->List();
  ASSERT_TRUE(records) << records.error().message();
  std::set<std::string> live;
  for (const auto& rec : *records) {
    if (rec.state == airlock::store::SandboxState::kRunning) {
      live.insert(rec.id);
      continue;
    }
    EXPECT_NE(rec.state, airlock::store::SandboxState::kCreating) << rec.id;
    EXPECT_NE(rec.state, airlock::store::SandboxState::kDestroying) << rec.id;
    EXPECT_FALSE(fs::exists(d.state_dir() + "/jail/" + rec.id)) << "orphan dir of " << rec.id;
    EXPECT_EQ(CgroupsNamed(rec.id), std::vector<std::string>{}) << "orphan cgroup of " << rec.id;
  }
  for (const auto& entry : fs::directory_iterator(d.state_dir() + "/jail")) {
    EXPECT_TRUE(live.contains(entry.path().filename().string()))
        << "a jail dir no running record claims: " << entry.path();
  }
}

TEST_F(DaemonTest, SigkillDuringCreatesAndDeletesLosesNoAcknowledgedRecord) {
  std::mt19937 rng(std::random_device{}());
  std::set<std::string> created, deleted;  // acknowledged, across every round
  std::set<std::string> delete_unanswered;
  for (int round = 0; round < 3; ++round) {
    std::atomic<bool> stop{false};
    std::mutex mu;
    std::vector<std::thread> workers;
    for (int w = 0; w < 6; ++w) {
      workers.emplace_back([&, w] {
        HttpClient http = ClientFor(*daemon_);
        std::mt19937 local(static_cast<unsigned>(w * 7919 + round));
        while (!stop) {
          auto r = http.Request("POST", "/v1/sandboxes", "{}");
          if (!r) break;  // the daemon is gone
          if (r->status != 201) continue;
          const std::string id = json::parse(r->body)["id"];
          {
            std::lock_guard lock(mu);
            created.insert(id);
          }
          if (local() % 2 == 0) continue;  // keep about half
          auto d = http.Request("DELETE", "/v1/sandboxes/" + id);
          if (!d) {
            std::lock_guard lock(mu);
            delete_unanswered.insert(id);
            break;
          }
          if (d->status == 204) {
            std::lock_guard lock(mu);
            deleted.insert(id);
          }
        }
      });
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(400 + rng() % 1200));
    const int status = daemon_->Stop(SIGKILL);
    stop = true;
    for (auto& t : workers) t.join();
    ASSERT_TRUE(WIFSIGNALED(status));
    const std::string state_dir = daemon_->state_dir();
    daemon_.reset();
    daemon_.emplace(state_dir);
    ASSERT_TRUE(daemon_->Start());
    SCOPED_TRACE("round " + std::to_string(round) + ": " + std::to_string(created.size()) +
                 " created, " + std::to_string(deleted.size()) + " deleted so far");
    CheckAfterRestart(*daemon_, created, deleted, delete_unanswered);
    if (HasFailure()) return;
  }
  EXPECT_GT(created.size(), deleted.size()) << "the workers made no progress";
  EXPECT_FALSE(deleted.empty());
}

}  // namespace
