// docs/api/openapi.yaml is the API's contract. This test reads it and drives a real airlockd
// through every documented operation: each must be served, answer a status the spec lists for
// it, and (for JSON answers with a schema) carry every field the schema requires. Routes the
// daemon serves but the spec lacks fail too, since the test's table must name every operation.

#include <fstream>
#include <functional>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <tuple>

#include "support/airlockd.h"

namespace {

using namespace airlock::testing;

struct Operation {
  std::set<int> statuses;
  std::map<int, std::string> schema;  // status -> components/schemas name of its JSON body
};

struct Spec {
  std::map<std::string, Operation> operations;              // "GET /v1/sandboxes/{id}"
  std::map<std::string, std::vector<std::string>> required;  // schema -> required fields
};

int Indent(const std::string& line) {
  return static_cast<int>(line.find_first_not_of(' '));
}

// A line-oriented reader for the subset of YAML the spec uses (block mappings, two-space
// indents): enough to find paths, methods, response codes, schema refs and required lists.
Spec ReadSpec(const std::string& path) {
  Spec spec;
  std::ifstream in(path);
  std::string line, section, route, method, schema;
  int status = 0;
  bool in_required = false, in_schemas = false, json_content = false;
  const std::regex ref(R"re(\$ref: "#/components/schemas/(\w+)")re");
  const std::regex inline_list(R"(required: \[(.*)\])");
  while (std::getline(in, line)) {
    if (line.empty() || line.find_first_not_of(' ') == std::string::npos) continue;
    const int indent = Indent(line);
    const std::string text = line.substr(static_cast<size_t>(indent));
    if (indent == 0) {
      section = text;
      continue;
    }
    if (section == "paths:") {
      if (indent == 2) {
        route = text.substr(0, text.size() - 1);
        method.clear();
      } else if (indent == 4) {
        static const std::set<std::string> kMethods = {"get:", "put:", "post:", "patch:",
                                                       "delete:"};
        method = kMethods.contains(text) ? text.substr(0, text.size() - 1) : "";
        for (char& c : method) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
      } else if (!method.empty() && indent == 8 && text.size() == 6 && text[0] == '"') {
        status = std::stoi(text.substr(1, 3));
        spec.operations[method + " " + route].statuses.insert(status);
      } else if (!method.empty() && indent == 12) {  // content: <media type>:
        json_content = text == "application/json:";
      } else if (!method.empty() && indent == 16 && json_content) {  // schema: $ref
        std::smatch m;
        if (std::regex_search(text, m, ref)) {
          spec.operations[method + " " + route].schema[status] = m[1];
        }
      }
    } else if (section == "components:") {
      if (indent == 2) {
        in_schemas = text == "schemas:";
        schema.clear();
      } else if (in_schemas && indent == 4) {
        schema = text.substr(0, text.size() - 1);
        in_required = false;
      } else if (in_schemas && indent == 6) {
        in_required = text == "required:";
        std::smatch m;
        if (std::regex_match(text, m, inline_list)) {
          std::stringstream items(m[1]);
          for (std::string item; std::getline(items, item, ',');) {
            spec.required[schema].push_back(item.substr(item.find_first_not_of(' ')));
          }
        }
      } else if (in_schemas && indent == 8 && in_required && text.starts_with("- ")) {
        spec.required[schema].push_back(text.substr(2));
      }
    }
  }
  return spec;
}

TEST_F(DaemonTest, EveryDocumentedOperationAnswersAsDocumented) {
  const Spec spec = ReadSpec(AIRLOCK_OPENAPI_PATH);
  ASSERT_GE(spec.operations.size(), 15u) << "the spec reader found too little";
  ASSERT_TRUE(spec.required.contains("Sandbox"));
  ASSERT_TRUE(spec.required.contains("ExecResult"));
  // The reader must see the response schemas, or the field checks below check nothing.
  ASSERT_EQ(spec.operations.at("POST /v1/sandboxes").schema.at(201), "Sandbox");
  ASSERT_EQ(spec.operations.at("POST /v1/sandboxes/{id}/exec").schema.at(200), "ExecResult");
  ASSERT_EQ(spec.operations.at("GET /v1/sandboxes/{id}/files/list").schema.at(200), "FileList");
  ASSERT_EQ(spec.operations.at("GET /v1/sandboxes/{id}/processes").schema.at(200), "ProcessList");
  ASSERT_EQ(spec.operations.at("GET /v1/sandboxes/{id}/processes/{pid}").schema.at(200),
            "Process");
  ASSERT_TRUE(spec.required.contains("Process"));

  // Every field `schema` requires is in `doc`.
  const auto expect_required = [&](const json& doc, const std::string& schema,
                                   const std::string& body) {
    auto required = spec.required.find(schema);
    ASSERT_NE(required, spec.required.end()) << "no required list for " << schema;
    ASSERT_TRUE(doc.is_object()) << body.substr(0, 300);
    for (const std::string& field : required->second) {
      EXPECT_TRUE(doc.contains(field)) << schema << " lacks " << field << ": " << body;
    }
  };
  // The events of an NDJSON answer.
  const auto events = [](const std::string& body) {
    std::vector<json> out;
    std::stringstream lines(body);
    for (std::string line; std::getline(lines, line);) {
      if (!line.empty()) out.push_back(json::parse(line, nullptr, false));
    }
    return out;
  };

  const std::string id = CreateSandbox();
  const std::string doomed = CreateSandbox();
  ASSERT_FALSE(id.empty());
  ASSERT_FALSE(doomed.empty());
  const std::string s = "/v1/sandboxes/" + id;
  std::string tar;  // from the tar download, for the upload

  // Process ids saved from earlier answers, by name; a target's "<name>" is replaced by one.
  std::map<std::string, std::string> pids;
  struct Call {
    std::string op;  // as in the spec
    http::verb verb;
    std::string target;
    std::string body;
    std::string save_pid = {};  // save the answer's "pid" under this name
    // The answer's schema when it is not the spec's (background exec); "-" for none (NDJSON).
    std::string schema = {};
    std::function<void(const Reply&)> check = {};  // more checks on the answer
  };
  const std::string exec_op = "POST /v1/sandboxes/{id}/exec";
  const std::string pid_op = "/v1/sandboxes/{id}/processes/{pid}";
  // In an order that works: each call leaves the sandbox ready for the next.
  const std::vector<Call> calls = {
      {"GET /healthz", http::verb::get, "/healthz", ""},
      {"GET /v1/sandboxes", http::verb::get, "/v1/sandboxes", ""},
      {"POST /v1/sandboxes", http::verb::post, "/v1/sandboxes", R"({"ttl_seconds": 60})"},
      {"GET /v1/sandboxes/{id}", http::verb::get, s, ""},
      {"PATCH /v1/sandboxes/{id}", http::verb::patch, s, R"({"metadata": {"a": "b"}})"},
      {"PATCH /v1/sandboxes/{id}", http::verb::patch, s, R"({"limits": {"pids_max": 300}})", "",
       "", [](const Reply& r) { EXPECT_EQ(r.Json()["limits"]["pids_max"], 300) << r.body; }},
      {exec_op, http::verb::post, s + "/exec", R"({"cmd": "echo hi"})"},
      // Processes: a cat fed through its open stdin, and a sleep ended by a signal. A
      // background exec answers with a Process, not the ExecResult the spec names.
      {exec_op, http::verb::post, s + "/exec",
       R"({"cmd": "cat", "background": true, "stdin_open": true})", "cat", "Process",
       [](const Reply& r) {
         EXPECT_EQ(r.Json()["state"], "running") << r.body;
         EXPECT_EQ(r.Json()["background"], true) << r.body;
         EXPECT_EQ(r.Json()["stdin_open"], true) << r.body;
       }},
      {exec_op, http::verb::post, s + "/exec", R"({"argv": ["sleep", "600"], "background": true})",
       "sleep", "Process",
       [](const Reply& r) { EXPECT_EQ(r.Json()["stdin_open"], false) << r.body; }},
      {"GET /v1/sandboxes/{id}/processes", http::verb::get, s + "/processes", "", "", "",
       [&](const Reply& r) {
         std::set<std::string> listed;
         const json doc = r.Json();
         for (const json& p : doc["processes"]) {
           expect_required(p, "Process", r.body);
           listed.insert(std::to_string(p.value("pid", 0)));
         }
         EXPECT_TRUE(listed.contains(pids["cat"])) << pids["cat"] << " not in " << r.body;
         EXPECT_TRUE(listed.contains(pids["sleep"])) << pids["sleep"] << " not in " << r.body;
       }},
      {"GET " + pid_op, http::verb::get, s + "/processes/<cat>", "", "", "",
       [&](const Reply& r) {
         EXPECT_EQ(std::to_string(r.Json().value("pid", 0)), pids["cat"]) << r.body;
         EXPECT_EQ(r.Json()["command"], "cat") << r.body;
       }},
      {"POST " + pid_op + "/stdin", http::verb::post, s + "/processes/<cat>/stdin",
       R"({"data": "hello\n", "close": true})"},
      {"POST " + pid_op + "/wait", http::verb::post, s + "/processes/<cat>/wait",
       R"({"timeout_seconds": 60})", "", "",
       [](const Reply& r) {
         EXPECT_EQ(r.Json()["state"], "exited") << r.body;
         EXPECT_EQ(r.Json()["exit_code"], 0) << r.body;
         EXPECT_TRUE(r.Json().contains("ended_at")) << r.body;
       }},
      {"GET " + pid_op + "/output", http::verb::get, s + "/processes/<cat>/output?follow=true",
       "", "", "",
       [&](const Reply& r) {
         const std::vector<json> all = events(r.body);
         ASSERT_GE(all.size(), 2u) << r.body;
         EXPECT_EQ(all.front()["type"], "start") << r.body;
         EXPECT_EQ(all.back()["type"], "exit") << r.body;
         EXPECT_EQ(all.back()["exit_code"], 0) << r.body;
         std::string out;
         for (const json& e : all) {
           if (e["type"] == "stdout") out += e["data"].get<std::string>();
         }
         EXPECT_EQ(out, "hello\n") << r.body;
       }},
      {"POST " + pid_op + "/signal", http::verb::post, s + "/processes/<sleep>/signal",
       R"({"signal": "TERM"})"},
      // No body: the default timeout.
      {"POST " + pid_op + "/wait", http::verb::post, s + "/processes/<sleep>/wait", "", "", "",
       [](const Reply& r) {
         EXPECT_EQ(r.Json()["state"], "exited") << r.body;
         EXPECT_EQ(r.Json()["signal"], 15) << r.body;
         EXPECT_TRUE(r.Json()["exit_code"].is_null()) << r.body;
       }},
      {"PUT /v1/sandboxes/{id}/files", http::verb::put, s + "/files?path=/tmp/t/f&parents=true",
       "bytes"},
      {"GET /v1/sandboxes/{id}/files", http::verb::get, s + "/files?path=/tmp/t/f", ""},
      {"GET /v1/sandboxes/{id}/files/list", http::verb::get, s + "/files/list?path=/tmp", ""},
      {"POST /v1/sandboxes/{id}/files/mkdir", http::verb::post, s + "/files/mkdir?path=/tmp/d",
       ""},
      {"GET /v1/sandboxes/{id}/files/tar", http::verb::get, s + "/files/tar?path=/tmp/t", ""},
      {"PUT /v1/sandboxes/{id}/files/tar", http::verb::put, s + "/files/tar?path=/tmp/u", ""},
      {"DELETE /v1/sandboxes/{id}/files", http::verb::delete_, s + "/files?path=/tmp/t/f", ""},
      {"GET /v1/sandboxes/{id}/network/events", http::verb::get,
       s + "/network/events?after=0&limit=10", "", "", "",
       [](const Reply& r) {
         EXPECT_TRUE(r.Json()["events"].is_array()) << r.body;
         EXPECT_EQ(r.Json()["has_more"], false) << r.body;
       }},
      {"GET /v1/sandboxes/{id}/events", http::verb::get, s + "/events?after=0&type=exec,file", "",
       "", "",
       [](const Reply& r) {
         const json page = r.Json();
         EXPECT_TRUE(page["events"].is_array()) << r.body;
         EXPECT_FALSE(page["events"].empty()) << "the calls above are on record: " << r.body;
         for (const json& e : page["events"]) {
           EXPECT_TRUE(e["seq"].is_number_integer() && e["time"].is_string() &&
                       e["type"].is_string() && e["data"].is_object())
               << e.dump();
         }
       }},
      {"GET /v1/sandboxes/{id}/metrics", http::verb::get, s + "/metrics?start=0&limit=10", "",
       "", "",
       [](const Reply& r) { EXPECT_TRUE(r.Json()["samples"].is_array()) << r.body; }},
      {"POST /v1/sandboxes/{id}/pause", http::verb::post, s + "/pause", ""},
      {"POST /v1/sandboxes/{id}/resume", http::verb::post, s + "/resume", ""},
      {"GET /metrics", http::verb::get, "/metrics", ""},
      {"GET /v1/admin/backup", http::verb::get, "/v1/admin/backup", "", "", "-",
       [](const Reply& r) {
         EXPECT_TRUE(r.body.starts_with(std::string("SQLite format 3\0", 16))) << r.body.size();
       }},
      // A pool of 0: the route answers as documented without making sandboxes.
      {"PUT /v1/pools/{template}", http::verb::put, "/v1/pools/base", R"({"size": 0})", "", "",
       [](const Reply& r) { EXPECT_EQ(r.Json()["size"], 0) << r.body; }},
      {"GET /v1/pools", http::verb::get, "/v1/pools", "", "", "",
       [](const Reply& r) { EXPECT_EQ(r.Json()["pools"].size(), 1u) << r.body; }},
      {"GET /v1/engines", http::verb::get, "/v1/engines", "", "", "",
       [](const Reply& r) { EXPECT_EQ(r.Json()["default"], "jail") << r.body; }},
      // Templates: a snapshot of the sandbox, a build on it, a fork, and the snapshot deleted.
      {"POST /v1/sandboxes/{id}/snapshot", http::verb::post, s + "/snapshot",
       R"({"name": "snap"})", "", "",
       [](const Reply& r) { EXPECT_EQ(r.Json()["state"], "ready") << r.body; }},
      {"POST /v1/templates", http::verb::post, "/v1/templates",
       R"({"name": "built", "base": "snap", "steps": [{"run": "touch /opt", "user": "root"}]})", "", "",
       [](const Reply& r) { EXPECT_EQ(r.Json()["layers"].size(), 2u) << r.body; }},
      {"POST /v1/templates", http::verb::post, "/v1/templates",
       R"({"name": "streamed", "stream": true})", "", "-",
       [&](const Reply& r) {
         const std::vector<json> all = events(r.body);
         ASSERT_FALSE(all.empty()) << r.body;
         EXPECT_EQ(all.back()["type"], "done") << r.body;
         expect_required(all.back()["template"], "Template", r.body);
       }},
      {"GET /v1/templates", http::verb::get, "/v1/templates", "", "", "",
       [](const Reply& r) { EXPECT_EQ(r.Json()["templates"].size(), 4u) << r.body; }},
      {"GET /v1/templates/{name}", http::verb::get, "/v1/templates/built", ""},
      {"DELETE /v1/templates/{name}", http::verb::delete_, "/v1/templates/streamed", ""},
      {"POST /v1/sandboxes/{id}/fork", http::verb::post, s + "/fork", R"({"count": 2})", "", "",
       [](const Reply& r) {
         EXPECT_EQ(r.Json()["sandboxes"].size(), 2u) << r.body;
         EXPECT_EQ(r.Json()["memory_carried"], false) << r.body;
       }},
      {"DELETE /v1/sandboxes/{id}", http::verb::delete_, "/v1/sandboxes/" + doomed, ""},
      // API keys: one made, listed and revoked (its id saved like a pid).
      {"POST /v1/keys", http::verb::post, "/v1/keys", R"({"name": "ci", "tenant": "team-a"})",
       "key", "",
       [](const Reply& r) {
         EXPECT_TRUE(r.Json()["key"].get<std::string>().starts_with("al_")) << r.body;
       }},
      {"GET /v1/keys", http::verb::get, "/v1/keys", "", "", "",
       [](const Reply& r) { EXPECT_EQ(r.Json()["keys"].size(), 2u) << r.body; }},
      {"DELETE /v1/keys/{key_id}", http::verb::delete_, "/v1/keys/<key>", ""},
      // Tenant quotas: set, shown (with the sandbox of tenant admin counted), removed.
      {"PUT /v1/tenants/{name}/quota", http::verb::put, "/v1/tenants/team-a/quota",
       R"({"sandboxes": 4, "memory_mb": 4096})", "", "",
       [](const Reply& r) { EXPECT_EQ(r.Json()["quota"]["sandboxes"], 4) << r.body; }},
      {"GET /v1/tenants/{name}", http::verb::get, "/v1/tenants/admin", "", "", "",
       [](const Reply& r) { EXPECT_GE(r.Json()["usage"]["sandboxes"], 1) << r.body; }},
      {"DELETE /v1/tenants/{name}/quota", http::verb::delete_, "/v1/tenants/team-a/quota", ""},
      // Secrets: one made, listed, read, rotated and deleted; its value never comes back.
      {"POST /v1/secrets", http::verb::post, "/v1/secrets",
       R"({"name": "API_TOKEN", "value": "s3cr3t-value"})", "", "",
       [](const Reply& r) {
         EXPECT_EQ(r.Json()["version"], 1) << r.body;
         EXPECT_EQ(r.body.find("s3cr3t"), std::string::npos) << r.body;
       }},
      {"GET /v1/secrets", http::verb::get, "/v1/secrets", "", "", "",
       [](const Reply& r) { EXPECT_EQ(r.Json()["secrets"].size(), 1u) << r.body; }},
      {"GET /v1/secrets/{name}", http::verb::get, "/v1/secrets/API_TOKEN", ""},
      {"PUT /v1/secrets/{name}", http::verb::put, "/v1/secrets/API_TOKEN",
       R"({"value": "r0tated-value"})", "", "",
       [](const Reply& r) {
         EXPECT_EQ(r.Json()["version"], 2) << r.body;
         EXPECT_EQ(r.body.find("r0tated"), std::string::npos) << r.body;
       }},
      {"DELETE /v1/secrets/{name}", http::verb::delete_, "/v1/secrets/API_TOKEN", ""},
  };
  std::set<std::string> covered;
  for (const Call& c : calls) {
    std::string target = c.target;
    for (const auto& [name, pid] : pids) {
      for (size_t at; (at = target.find("<" + name + ">")) != std::string::npos;) {
        target.replace(at, name.size() + 2, pid);
      }
    }
    SCOPED_TRACE(c.op + " (" + target + ")");
    ASSERT_EQ(target.find('<'), std::string::npos) << "no pid saved for " << target;
    covered.insert(c.op);
    auto it = spec.operations.find(c.op);
    ASSERT_NE(it, spec.operations.end()) << "the daemon serves " << c.op << ", the spec lacks it";
    const std::string body = c.op == "PUT /v1/sandboxes/{id}/files/tar" ? tar : c.body;
    Reply r = daemon_->Call(c.verb, target, body);
    EXPECT_LT(r.status, 300) << r.body.substr(0, 300);
    EXPECT_TRUE(it->second.statuses.contains(r.status))
        << "answered " << r.status << ", which the spec does not list";
    if (c.op == "GET /v1/sandboxes/{id}/files/tar") tar = r.body;
    if (!c.save_pid.empty()) {
      const char* field = r.Json().contains("pid") ? "pid" : "id";  // a key's id
      ASSERT_TRUE(r.Json().contains(field)) << r.body.substr(0, 300);
      pids[c.save_pid] = std::to_string(r.Json()[field].get<int64_t>());
    }
    if (r.status < 300 && c.check) c.check(r);
    auto schema = it->second.schema.find(r.status);
    if (c.schema == "-") {
      // An NDJSON answer: its check looks at the events.
    } else if (!c.schema.empty()) {
      expect_required(r.Json(), c.schema, r.body);
    } else if (schema != it->second.schema.end()) {
      expect_required(r.Json(), schema->second, r.body);
    }
  }
  for (const auto& [op, _] : spec.operations) {
    EXPECT_TRUE(covered.contains(op)) << "the spec documents " << op << ", which no call tested";
  }
  // An error answer has the documented shape.
  Reply missing = daemon_->Call(http::verb::get, "/v1/sandboxes/sbx-aaaaaaaaaaaaaaaa");
  EXPECT_TRUE(spec.operations.at("GET /v1/sandboxes/{id}").statuses.contains(missing.status));
  for (const std::string& field : spec.required.at("ErrorBody")) {
    EXPECT_TRUE(missing.Json().contains(field)) << missing.body;
  }
  // The process routes' documented refusals: stdin that is no longer open (409), a pid the
  // agent does not know (404), a pid that is not one (400).
  const std::string cat = s + "/processes/" + pids["cat"];
  const std::vector<std::tuple<std::string, http::verb, std::string, std::string, int>> refusals = {
      {"POST " + pid_op + "/stdin", http::verb::post, cat + "/stdin", R"({"data": "x"})", 409},
      {"GET " + pid_op, http::verb::get, s + "/processes/999999", "", 404},
      {"GET " + pid_op + "/output", http::verb::get, s + "/processes/999999/output", "", 404},
      {"POST " + pid_op + "/wait", http::verb::post, s + "/processes/007/wait", "", 400},
  };
  for (const auto& [op, verb, target, body, status] : refusals) {
    SCOPED_TRACE(op + " (" + target + ")");
    Reply r = daemon_->Call(verb, target, body);
    EXPECT_EQ(r.status, status) << r.body.substr(0, 300);
    EXPECT_TRUE(spec.operations.at(op).statuses.contains(r.status));
    expect_required(r.Json(), "ErrorBody", r.body);
  }
}

}  // namespace
