// airlockd's log as JSON (--log-format json) and its line per API request: every line of the
// log is one JSON object; each request gets a line with its method, route, status, duration,
// tenant, sandbox id and request id, and never the key or the body; the request id comes back
// in X-Request-Id (the client's own when it is a sound one).

#include <regex>
#include <sstream>

#include "support/airlockd.h"

namespace {

using namespace airlock::testing;

class RequestLogTest : public DaemonTest {
 protected:
  std::vector<std::string> DaemonArgs() const override { return {"--log-format", "json"}; }

  // The log's lines, each parsed; a line that is not a JSON object fails the test.
  std::vector<json> Lines() {
    std::vector<json> out;
    std::istringstream in(daemon_->Log());
    for (std::string line; std::getline(in, line);) {
      json doc = json::parse(line, nullptr, /*allow_exceptions=*/false);
      EXPECT_TRUE(doc.is_object()) << "not a JSON object: " << line;
      if (doc.is_object()) out.push_back(std::move(doc));
    }
    return out;
  }
  std::vector<json> Requests() {
    std::vector<json> out;
    for (json& line : Lines()) {
      if (line.value("msg", "") == "request") out.push_back(std::move(line));
    }
    return out;
  }
};

TEST_F(RequestLogTest, EveryRequestIsOneJsonLineWithItsIdAndNeverTheKeyOrTheBody) {
  const std::string auth = "Bearer " + daemon_->key();
  Reply created = Http(daemon_->port(), http::verb::post, "/v1/sandboxes",
                       R"({"metadata": {"marker": "BODY-MARKER-7f3a"}})", auth,
                       {{"X-Request-Id", "trace-abc.123_x"}});
  ASSERT_EQ(created.status, 201) << created.body;
  EXPECT_EQ(created.headers["X-Request-Id"], "trace-abc.123_x") << "the client's id comes back";
  const std::string id = created.Json()["id"];

  // No id, or one that could not go in a log line as it is: a new one.
  Reply exec = Http(daemon_->port(), http::verb::post, "/v1/sandboxes/" + id + "/exec",
                    R"({"cmd": "echo EXEC-BODY-91c2"})", auth,
                    {{"X-Request-Id", "has space and \"quotes\""}});
  ASSERT_EQ(exec.status, 200) << exec.body;
  const std::string made = exec.headers["X-Request-Id"];
  EXPECT_TRUE(std::regex_match(made, std::regex("req-[0-9a-f]{16}"))) << made;
  Reply unauthenticated = Http(daemon_->port(), http::verb::get, "/v1/sandboxes", "", std::nullopt);
  EXPECT_EQ(unauthenticated.status, 401);
  EXPECT_FALSE(unauthenticated.headers["X-Request-Id"].empty());
  Reply missing = daemon_->Call(http::verb::get, "/v1/sandboxes/sbx-nosuch/processes/7");
  EXPECT_EQ(missing.status, 404);

  const std::vector<json> requests = Requests();
  auto find = [&](const std::string& request_id) -> const json* {
    for (const json& r : requests) {
      if (r.value("request_id", "") == request_id) return &r;
    }
    return nullptr;
  };
  const json* create_line = find("trace-abc.123_x");
  ASSERT_NE(create_line, nullptr) << daemon_->Log();
  EXPECT_EQ((*create_line)["method"], "POST");
  EXPECT_EQ((*create_line)["route"], "/v1/sandboxes");
  EXPECT_EQ((*create_line)["status"], 201);
  EXPECT_EQ((*create_line)["tenant"], "admin");
  EXPECT_TRUE((*create_line)["duration_ms"].is_number());
  EXPECT_EQ((*create_line)["level"], "info");
  EXPECT_EQ((*create_line)["program"], "airlockd");
  EXPECT_TRUE(std::regex_match((*create_line)["time"].get<std::string>(),
                               std::regex(R"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z)")));
  const json* exec_line = find(made);
  ASSERT_NE(exec_line, nullptr);
  EXPECT_EQ((*exec_line)["route"], "/v1/sandboxes/{id}/exec");
  EXPECT_EQ((*exec_line)["sandbox"], id);
  EXPECT_EQ((*exec_line)["status"], 200);
  const json* refused = find(unauthenticated.headers["X-Request-Id"]);
  ASSERT_NE(refused, nullptr);
  EXPECT_EQ((*refused)["status"], 401);
  EXPECT_EQ((*refused)["tenant"], "") << "no key, no tenant";
  bool saw_missing = false;
  for (const json& r : requests) {
    if (r["route"] == "/v1/sandboxes/{id}/processes/{pid}" && r["status"] == 404) {
      saw_missing = true;
    }
  }
  EXPECT_TRUE(saw_missing) << daemon_->Log();

  // Never a key, anywhere in the log; never a body in a request line.
  const std::string log = daemon_->Log();
  EXPECT_EQ(log.find(daemon_->key()), std::string::npos);
  for (const json& r : requests) {
    EXPECT_EQ(r.dump().find("BODY-MARKER-7f3a"), std::string::npos) << r.dump();
    EXPECT_EQ(r.dump().find("EXEC-BODY-91c2"), std::string::npos) << r.dump();
  }
}

}  // namespace
