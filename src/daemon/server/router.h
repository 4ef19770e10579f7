#pragma once
// Router: one HTTP request in, one response out, for every route airlockd serves. It knows
// nothing of sockets (http_server.cc does); it authenticates, validates with api/types.h, hands
// the typed request to the Controller and renders the answer with api/render.h.

#include <string>
#include <string_view>

#include "daemon/server/controller.h"
#include "daemon/store/store.h"

namespace airlock::daemon {

struct HttpRequest {
  std::string method;         // "GET", "POST", ...
  std::string target;         // "/v1/sandboxes?state=running"
  std::string authorization;  // the Authorization header, "" if absent
  std::string body;
};

struct HttpReply {
  unsigned status = 200;
  std::string body;   // JSON, or empty (204)
  std::string allow;  // the Allow header of a 405
};

class Router {
 public:
  // `auth_required` false is --no-auth (loopback only; main checks that).
  Router(Controller& controller, store::Store& store, bool auth_required)
      : controller_(controller), store_(store), auth_required_(auth_required) {}

  // Blocks (store, engine, agent): call on the worker pool. Thread-safe.
  HttpReply Handle(const HttpRequest& request);

 private:
  bool Authenticated(std::string_view authorization);

  Controller& controller_;
  store::Store& store_;
  bool auth_required_;
};

}  // namespace airlock::daemon
