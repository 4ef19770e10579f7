// airlockd under load and under faults: many clients at once, and SIGKILL of the daemon in the
// middle of creates and deletes followed by a restart. Needs root (the jail engine).

#include <atomic>
#include <mutex>
#include <random>
#include <set>
#include <thread>

#include <sstream>

#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include "client/http_client.h"
#include "daemon/store/store.h"
#include "support/airlockd.h"

namespace {

using namespace airlock::testing;
namespace asio = boost::asio;
namespace beast = boost::beast;
using tcp = asio::ip::tcp;
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
    const std::string state = r.status == 200 ? r.Json().value("state", "") : "";
    if (delete_unanswered.contains(id) && !deleted.contains(id)) {
      EXPECT_TRUE(state == "destroyed" || state == "running") << id << ": " << r.body;
    } else if (deleted.contains(id)) {
      EXPECT_EQ(state, "destroyed") << id << " was deleted (204) but is back: " << r.body;
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
    // The kill window opens once this round has had a delete acknowledged: under a sanitizer
    // on a loaded machine a create can take a second, and a round that killed the daemon before
    // any answer would check nothing.
    const size_t deleted_before = deleted.size();
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (std::chrono::steady_clock::now() < deadline) {
      {
        std::lock_guard lock(mu);
        if (deleted.size() > deleted_before) break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(rng() % 1200));
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

namespace {

// A streamed exec read to its end on a raw connection; the stdout it carried, decoded.
struct Streamed {
  std::string stdout_data;
  json exit;
  std::string problem;  // empty when the stream was whole
};

Streamed StreamToEnd(uint16_t port, const std::string& key, const std::string& target,
                     const std::string& body) {
  Streamed out;
  asio::io_context io;
  tcp::socket socket(io);
  beast::error_code ec;
  socket.connect(tcp::endpoint(asio::ip::make_address("127.0.0.1"), port), ec);
  if (ec) return {.problem = "connect: " + ec.message()};
  const std::string request = "POST " + target + " HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " +
                              key + "\r\nContent-Length: " + std::to_string(body.size()) +
                              "\r\nConnection: close\r\n\r\n" + body;
  asio::write(socket, asio::buffer(request), ec);
  // Beast parses the chunked body; each chunk is one event line.
  beast::flat_buffer buffer;
  http::response_parser<http::string_body> parser;
  parser.body_limit(1ull << 30);
  http::read(socket, buffer, parser, ec);
  if (ec) return {.problem = "read: " + ec.message()};
  if (parser.get().result_int() != 200) return {.problem = parser.get().body()};
  std::istringstream lines(parser.get().body());
  std::string line;
  while (std::getline(lines, line)) {
    json e = json::parse(line, nullptr, false);
    if (e.is_discarded()) return {.problem = "not JSON: " + line.substr(0, 100)};
    if (e["type"] == "stdout") {
      if (e["data_encoding"] != "utf-8") return {.problem = "unexpected base64"};
      out.stdout_data += e["data"].get<std::string>();
    } else if (e["type"] == "exit" || e["type"] == "error") {
      out.exit = e;
    }
  }
  if (!out.exit.is_object() || out.exit["type"] != "exit") out.problem = "no exit event";
  return out;
}

std::string Lines(int from, int to, const std::string& prefix = "") {
  std::string s;
  for (int i = from; i <= to; ++i) s += prefix + std::to_string(i) + "\n";
  return s;
}

TEST_F(DaemonTest, AMillionLineStreamArrivesWholeAndInOrder) {
  const std::string id = CreateSandbox();
  ASSERT_FALSE(id.empty());
  Streamed s = StreamToEnd(daemon_->port(), daemon_->key(), "/v1/sandboxes/" + id + "/exec",
                           R"({"stream": true, "argv": ["seq", "1", "1000000"]})");
  ASSERT_TRUE(s.problem.empty()) << s.problem;
  EXPECT_EQ(s.exit["exit_code"], 0) << s.exit;
  EXPECT_EQ(s.exit["truncated"], false) << s.exit;
  const std::string expected = Lines(1, 1000000);
  EXPECT_EQ(s.stdout_data.size(), expected.size());
  EXPECT_TRUE(s.stdout_data == expected) << "the stream's bytes differ from seq's";

  // A stream is not capped like a plain exec's buffered output (16 MiB): 24 MiB come whole.
  Streamed big = StreamToEnd(daemon_->port(), daemon_->key(), "/v1/sandboxes/" + id + "/exec",
                             R"({"stream": true, "cmd": "head -c 25165824 /dev/zero | tr '\\0' a"})");
  ASSERT_TRUE(big.problem.empty()) << big.problem;
  EXPECT_EQ(big.exit["truncated"], false) << big.exit;
  EXPECT_EQ(big.stdout_data.size(), 25165824u);
  EXPECT_EQ(big.stdout_data.find_first_not_of('a'), std::string::npos);
}

TEST_F(DaemonTest, AHundredConcurrentStreams) {
  constexpr int kSandboxes = 4, kStreams = 100;
  std::vector<std::string> ids;
  for (int i = 0; i < kSandboxes; ++i) ids.push_back(CreateSandbox());
  for (const auto& id : ids) ASSERT_FALSE(id.empty());
  std::vector<Streamed> results(kStreams);
  std::vector<std::thread> threads;
  for (int i = 0; i < kStreams; ++i) {
    threads.emplace_back([&, i] {
      const std::string body = R"({"stream": true, "cmd": "for i in $(seq 1 300); do echo s)" +
                               std::to_string(i) + R"(-$i; done; exit )" + std::to_string(i % 7) +
                               "\"}";
      results[i] = StreamToEnd(daemon_->port(), daemon_->key(),
                               "/v1/sandboxes/" + ids[i % kSandboxes] + "/exec", body);
    });
  }
  for (auto& t : threads) t.join();
  for (int i = 0; i < kStreams; ++i) {
    SCOPED_TRACE("stream " + std::to_string(i));
    ASSERT_TRUE(results[i].problem.empty()) << results[i].problem;
    EXPECT_EQ(results[i].exit["exit_code"], i % 7);
    EXPECT_TRUE(results[i].stdout_data == Lines(1, 300, "s" + std::to_string(i) + "-"));
  }
}

}  // namespace
