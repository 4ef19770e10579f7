#pragma once
// Helpers for the tenancy tests (tests/integration/tenancy_test.cc, the security suite's Tenancy
// class): the /v1/sandboxes/{id} routes docs/api/openapi.yaml documents, a plausible call for
// each, and a raw WebSocket handshake.

#include <algorithm>
#include <cctype>
#include <fstream>
#include <map>
#include <random>
#include <regex>
#include <string>
#include <vector>

#include "support/airlockd.h"

namespace airlock::testing {

struct Route {
  std::string method;  // "GET", ... as HTTP spells it
  std::string path;    // "/v1/sandboxes/{id}/files"
  bool websocket = false;
};

// Every operation on a /v1/sandboxes/{id} path in the spec, and the WebSocket routes its
// description names ("`GET /v1/sandboxes/{id}/.../ws`").
inline std::vector<Route> SandboxRoutes(const std::string& spec_path) {
  std::ifstream in(spec_path);
  std::vector<Route> routes;
  std::string line, path, section;
  const std::regex ws_route(R"(`GET (/v1/sandboxes/\{id\}/[^`\s]*/ws)`)");
  while (std::getline(in, line)) {
    for (std::sregex_iterator it(line.begin(), line.end(), ws_route), end; it != end; ++it) {
      routes.push_back({"GET", (*it)[1], true});
    }
    if (line.empty()) continue;
    if (line[0] != ' ') {
      section = line;
      continue;
    }
    if (section != "paths:") continue;
    if (line.starts_with("  /")) {
      path = line.substr(2, line.size() - 3);
    } else if (path.starts_with("/v1/sandboxes/{id}")) {
      for (const char* m : {"get", "put", "post", "patch", "delete"}) {
        if (line == std::string("    ") + m + ":") {
          std::string method = m;
          for (char& c : method) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
          routes.push_back({method, path, false});
        }
      }
    }
  }
  return routes;
}

inline http::verb Verb(const std::string& method) {
  if (method == "GET") return http::verb::get;
  if (method == "PUT") return http::verb::put;
  if (method == "POST") return http::verb::post;
  if (method == "PATCH") return http::verb::patch;
  return http::verb::delete_;
}

inline std::string Replace(std::string text, const std::string& from, const std::string& to) {
  for (size_t at = 0; (at = text.find(from, at)) != std::string::npos; at += to.size()) {
    text.replace(at, from.size(), to);
  }
  return text;
}

// A sandbox id in the daemon's format that no sandbox has.
inline std::string UnusedId() {
  static constexpr char kAlphabet[] = "abcdefghijklmnopqrstuvwxyz234567";
  std::random_device rd;
  std::string id = "sbx-";
  for (int i = 0; i < 16; ++i) id += kAlphabet[rd() % 32];
  return id;
}

// What a route's call carries: a plausible body and query, so that the owner's own call gets
// past validation (the positive control). Routes not named here get none.
struct CallShape {
  std::string query;
  std::string body;
  std::string owner_body = {};  // the owner's, when it must differ (it must not end the process)
};
inline std::map<std::string, CallShape> Shapes() {
  return {
      {"PATCH /v1/sandboxes/{id}", {"", R"({"metadata": {"touched": "yes"}})"}},
      {"POST /v1/sandboxes/{id}/exec", {"", R"({"cmd": "echo hi > /tmp/secret"})"}},
      {"POST /v1/sandboxes/{id}/processes/{pid}/signal",
       {"", R"({"signal": "KILL"})", R"({"signal": "CONT"})"}},
      {"POST /v1/sandboxes/{id}/processes/{pid}/stdin", {"", R"({"data": "x", "close": true})"}},
      {"POST /v1/sandboxes/{id}/processes/{pid}/wait", {"", R"({"timeout_seconds": 1})"}},
      {"GET /v1/sandboxes/{id}/files", {"?path=/tmp/secret", ""}},
      {"PUT /v1/sandboxes/{id}/files", {"?path=/tmp/secret", "overwritten"}},
      {"DELETE /v1/sandboxes/{id}/files", {"?path=/tmp/secret", ""}},
      {"GET /v1/sandboxes/{id}/files/list", {"?path=/tmp", ""}},
      {"POST /v1/sandboxes/{id}/files/mkdir", {"?path=/tmp/made", ""}},
      {"GET /v1/sandboxes/{id}/files/tar", {"?path=/tmp", ""}},
      {"PUT /v1/sandboxes/{id}/files/tar", {"?path=/tmp/untar", ""}},
      {"POST /v1/sandboxes/{id}/snapshot", {"", R"({"name": "stolen"})"}},
      {"POST /v1/sandboxes/{id}/fork", {"", R"({"count": 1})"}},
      {"GET /v1/sandboxes/{id}/processes/{pid}/ws", {"?replay=false", ""}},
  };
}

}  // namespace airlock::testing
