// Tenancy end to end (docs/design/tenancy.md): two tenants and an admin on a real airlockd. For
// every /v1/sandboxes/{id} route docs/api/openapi.yaml documents (read here, so that a new route
// is covered without editing this file) and both WebSocket routes, tenant B's call on tenant A's
// sandbox gets the very answer of a sandbox that does not exist, A's own call does not, and A's
// sandbox is untouched afterwards.

#include "support/tenancy.h"

#include <algorithm>
#include <fstream>
#include <random>
#include <regex>
#include <set>
#include <sstream>

#include "support/airlockd.h"

namespace {

using namespace airlock::testing;

class TenancyTest : public DaemonTest {
 protected:
  void SetUp() override {
    DaemonTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    key_a_ = MakeKey("alice", "team-a");
    key_b_ = MakeKey("bob", "team-b");
    ASSERT_FALSE(key_a_.empty());
    ASSERT_FALSE(key_b_.empty());
  }

  // A new key of `tenant`; "" (with a failure) if the create failed.
  std::string MakeKey(const std::string& name, const std::string& tenant, bool admin = false) {
    Reply r = daemon_->Call(http::verb::post, "/v1/keys",
                            json{{"name", name}, {"tenant", tenant}, {"admin", admin}}.dump());
    EXPECT_EQ(r.status, 201) << r.body;
    if (r.status != 201) return "";
    EXPECT_EQ(r.Json()["tenant"], tenant) << r.body;
    EXPECT_FALSE(r.Json().contains("hash")) << r.body;
    return r.Json()["key"].get<std::string>();
  }

  Reply As(const std::string& key, http::verb verb, const std::string& target,
           const std::string& body = "") {
    return Http(daemon_->port(), verb, target, body, "Bearer " + key);
  }

  // A sandbox of the key's tenant; "" (with a failure) if the create failed.
  std::string CreateAs(const std::string& key, const std::string& body = "{}") {
    Reply r = As(key, http::verb::post, "/v1/sandboxes", body);
    EXPECT_EQ(r.status, 201) << r.body;
    if (r.status != 201) return "";
    return r.Json()["id"].get<std::string>();
  }

  std::set<std::string> ListedBy(const std::string& key, const std::string& query = "") {
    Reply r = As(key, http::verb::get, "/v1/sandboxes" + query);
    EXPECT_EQ(r.status, 200) << r.body;
    std::set<std::string> ids;
    const json doc = r.Json();
    for (const json& s : doc["sandboxes"]) ids.insert(s["id"].get<std::string>());
    return ids;
  }

  std::string key_a_, key_b_;
};

TEST_F(TenancyTest, EveryRouteOnAnotherTenantsSandboxAnswersAsIfItDidNotExist) {
  const std::vector<Route> routes = SandboxRoutes(AIRLOCK_OPENAPI_PATH);
  ASSERT_GE(routes.size(), 20u) << "the spec reader found too few routes";
  std::set<std::string> names;
  for (const Route& r : routes) names.insert(r.method + " " + r.path);
  // The reader must see what it claims to cover, WebSocket routes and path parameters included.
  for (const char* must :
       {"DELETE /v1/sandboxes/{id}", "POST /v1/sandboxes/{id}/exec",
        "GET /v1/sandboxes/{id}/exec/ws", "GET /v1/sandboxes/{id}/processes/{pid}/ws",
        "POST /v1/sandboxes/{id}/processes/{pid}/signal", "PUT /v1/sandboxes/{id}/files/tar",
        "POST /v1/sandboxes/{id}/fork"}) {
    ASSERT_TRUE(names.contains(must)) << must << " not read from the spec";
  }

  // A's sandbox: a file A wrote and a process A started.
  const std::string victim = CreateAs(key_a_);
  ASSERT_FALSE(victim.empty());
  const std::string v = "/v1/sandboxes/" + victim;
  ASSERT_EQ(As(key_a_, http::verb::put, v + "/files?path=/tmp/secret", "A's data").status, 200);
  Reply started = As(key_a_, http::verb::post, v + "/exec",
                     R"({"argv": ["sleep", "600"], "background": true, "stdin_open": true})");
  ASSERT_EQ(started.status, 200) << started.body;
  std::string pid = std::to_string(started.Json()["pid"].get<int64_t>());
  const std::string missing = UnusedId();
  ASSERT_EQ(missing.size(), victim.size());
  const std::map<std::string, CallShape> shapes = Shapes();

  auto target_for = [&](const Route& r, const std::string& id) {
    std::string t = Replace(Replace(r.path, "{id}", id), "{pid}", pid);
    auto shape = shapes.find(r.method + " " + r.path);
    return shape == shapes.end() ? t : t + shape->second.query;
  };
  auto call = [&](const std::string& key, const Route& r, const std::string& id) {
    const std::string target = target_for(r, id);
    if (r.websocket) return WsHandshake(daemon_->port(), key, target);
    auto shape = shapes.find(r.method + " " + r.path);
    if (shape == shapes.end()) return As(key, Verb(r.method), target);
    const bool owner_body = key == key_a_ && !shape->second.owner_body.empty();
    return As(key, Verb(r.method), target,
              owner_body ? shape->second.owner_body : shape->second.body);
  };

  // B's attempts: each is the 404 of a sandbox that does not exist, byte for byte.
  for (const Route& r : routes) {
    SCOPED_TRACE(r.method + " " + r.path);
    Reply theirs = call(key_b_, r, victim);
    Reply nobodys = call(key_b_, r, missing);
    EXPECT_EQ(theirs.status, 404) << theirs.body;
    EXPECT_EQ(nobodys.status, 404) << nobodys.body;
    EXPECT_EQ(Replace(theirs.body, victim, missing), nobodys.body);
    EXPECT_EQ(theirs.StableHeaders(), nobodys.StableHeaders());
    EXPECT_EQ(theirs.body.find("team-a"), std::string::npos) << theirs.body;
  }

  // A's sandbox is untouched: running, its file, its process, its metadata; no snapshot, no fork.
  Reply after = As(key_a_, http::verb::get, v);
  ASSERT_EQ(after.status, 200) << after.body;
  EXPECT_EQ(after.Json()["state"], "running") << after.body;
  EXPECT_EQ(after.Json()["tenant"], "team-a") << after.body;
  EXPECT_FALSE(after.Json()["metadata"].contains("touched")) << after.body;
  Reply file = As(key_a_, http::verb::get, v + "/files?path=/tmp/secret");
  EXPECT_EQ(file.status, 200);
  EXPECT_EQ(file.body, "A's data");
  Reply process = As(key_a_, http::verb::get, v + "/processes/" + pid);
  EXPECT_EQ(process.Json()["state"], "running") << process.body;
  EXPECT_EQ(process.Json()["stdin_open"], true) << process.body;
  EXPECT_EQ(daemon_->Call(http::verb::get, "/v1/templates/stolen").status, 404);
  const json all = daemon_->Call(http::verb::get, "/v1/sandboxes").Json();
  for (const json& s : all["sandboxes"]) {
    EXPECT_NE(s["metadata"].value("airlock.forked_from", ""), victim) << "B forked A's sandbox";
  }

  // Positive control: A's own calls get past the owner check (none is a 404), on a second
  // sandbox of A's, in the spec's order (DELETE of the sandbox itself last).
  const std::string own = CreateAs(key_a_);
  ASSERT_FALSE(own.empty());
  ASSERT_EQ(
      As(key_a_, http::verb::put, "/v1/sandboxes/" + own + "/files?path=/tmp/secret", "x").status,
      200);
  Reply own_started = As(key_a_, http::verb::post, "/v1/sandboxes/" + own + "/exec",
                         R"({"argv": ["sleep", "600"], "background": true, "stdin_open": true})");
  ASSERT_EQ(own_started.status, 200);
  pid = std::to_string(own_started.Json()["pid"].get<int64_t>());
  std::vector<Route> ordered = routes;
  std::stable_partition(ordered.begin(), ordered.end(), [](const Route& r) {
    return !(r.method == "DELETE" && r.path == "/v1/sandboxes/{id}");
  });
  for (const Route& r : ordered) {
    SCOPED_TRACE("owner: " + r.method + " " + r.path);
    if (r.path == "/v1/sandboxes/{id}/resume") {
      // Resume needs a paused sandbox: pause it first (the pause route has its own turn).
      (void)As(key_a_, http::verb::post, "/v1/sandboxes/" + own + "/pause");
    }
    Reply mine = call(key_a_, r, own);
    EXPECT_NE(mine.status, 404) << mine.body;
    EXPECT_LT(mine.status, 500) << mine.body;
    if (r.websocket) {
      EXPECT_EQ(mine.status, 101) << mine.body;
    }
    if (r.path == "/v1/sandboxes/{id}/pause" && mine.status == 200) {
      (void)As(key_a_, http::verb::post, "/v1/sandboxes/" + own + "/resume");
    }
  }
  EXPECT_EQ(As(key_a_, http::verb::get, "/v1/sandboxes/" + own).Json()["state"], "destroyed")
      << "deleted last";
  // What A made is A's: the fork, and the snapshot, which B cannot see.
  Reply forks = As(key_a_, http::verb::get, "/v1/sandboxes?metadata.airlock.forked_from=" + own);
  ASSERT_EQ(forks.status, 200) << forks.body;
  ASSERT_EQ(forks.Json()["sandboxes"].size(), 1u) << forks.body;
  EXPECT_EQ(forks.Json()["sandboxes"][0]["tenant"], "team-a") << forks.body;
  Reply snap = As(key_a_, http::verb::get, "/v1/templates/stolen");
  EXPECT_EQ(snap.status, 200) << snap.body;
  EXPECT_EQ(snap.Json()["tenant"], "team-a") << snap.body;
}

TEST_F(TenancyTest, ListsShowEachTenantItsOwnAndAdminEverything) {
  const std::string a = CreateAs(key_a_);
  const std::string b = CreateAs(key_b_);
  const std::string admins = CreateSandbox();
  ASSERT_FALSE(a.empty());
  ASSERT_FALSE(b.empty());
  EXPECT_EQ(ListedBy(key_a_), std::set<std::string>{a});
  EXPECT_EQ(ListedBy(key_b_), std::set<std::string>{b});
  EXPECT_EQ(ListedBy(daemon_->key()), (std::set<std::string>{a, b, admins}));
  EXPECT_EQ(ListedBy(daemon_->key(), "?tenant=team-a"), std::set<std::string>{a});
  EXPECT_EQ(ListedBy(daemon_->key(), "?tenant=admin"), std::set<std::string>{admins});
  EXPECT_EQ(ListedBy(key_a_, "?tenant=team-a"), std::set<std::string>{a});
  Reply other = As(key_a_, http::verb::get, "/v1/sandboxes?tenant=team-b");
  EXPECT_EQ(other.status, 403) << other.body;
  EXPECT_EQ(other.Json()["error"]["code"], "permission_denied") << other.body;
  EXPECT_EQ(other.body.find(b), std::string::npos);
  EXPECT_EQ(As(key_a_, http::verb::get, "/v1/sandboxes?tenant=a%20b").status, 400);
  // Admin keys act on any tenant's sandbox.
  Reply got = daemon_->Call(http::verb::get, "/v1/sandboxes/" + a);
  EXPECT_EQ(got.status, 200) << got.body;
  EXPECT_EQ(got.Json()["tenant"], "team-a");
  Reply ran = daemon_->Call(http::verb::post, "/v1/sandboxes/" + b + "/exec", R"({"cmd": "true"})");
  EXPECT_EQ(ran.status, 200) << ran.body;
  // A second admin key of another tenant sees everything too, and its sandboxes are its tenant's.
  const std::string ops = MakeKey("ops", "ops", /*admin=*/true);
  EXPECT_EQ(ListedBy(ops), (std::set<std::string>{a, b, admins}));
  const std::string by_ops = CreateAs(ops);
  EXPECT_EQ(As(ops, http::verb::get, "/v1/sandboxes/" + by_ops).Json()["tenant"], "ops");
  EXPECT_EQ(As(key_a_, http::verb::get, "/v1/sandboxes/" + by_ops).status, 404);
}

TEST_F(TenancyTest, ADeletedSandboxsVerdictsAreItsTenantsAlone) {
  const std::string a = CreateAs(key_a_);
  ASSERT_FALSE(a.empty());
  const std::string events = "/v1/sandboxes/" + a + "/network/events";
  ASSERT_EQ(As(key_a_, http::verb::delete_, "/v1/sandboxes/" + a).status, 204);
  // The owner still reads them (an audit after the work), and its record with why it ended,
  // though the sandbox itself is gone...
  Reply own = As(key_a_, http::verb::get, events);
  EXPECT_EQ(own.status, 200) << own.body;
  EXPECT_EQ(As(key_a_, http::verb::get, "/v1/sandboxes/" + a).Json()["end_reason"], "deleted");
  EXPECT_EQ(As(key_a_, http::verb::get, "/v1/sandboxes/" + a + "/events").status, 200);
  Reply exec = As(key_a_, http::verb::post, "/v1/sandboxes/" + a + "/exec", R"({"cmd": "true"})");
  EXPECT_EQ(exec.status, 404) << exec.body;
  // ...and another tenant gets the 404 of an id that never existed.
  const std::string unused = UnusedId();
  Reply theirs = As(key_b_, http::verb::get, events);
  Reply none = As(key_b_, http::verb::get, "/v1/sandboxes/" + unused + "/network/events");
  EXPECT_EQ(theirs.status, 404);
  EXPECT_EQ(Replace(theirs.body, a, unused), none.body);
  // The same for its record and its flight recorder.
  for (const std::string suffix : {"", "/events"}) {
    Reply record = As(key_b_, http::verb::get, "/v1/sandboxes/" + a + suffix);
    Reply never = As(key_b_, http::verb::get, "/v1/sandboxes/" + unused + suffix);
    EXPECT_EQ(record.status, 404) << suffix;
    EXPECT_EQ(Replace(record.body, a, unused), never.body) << suffix;
  }
}

TEST_F(TenancyTest, AdminOnlyRoutesRefuseOtherKeysWith403) {
  const std::vector<std::tuple<http::verb, std::string, std::string, int>> calls = {
      {http::verb::get, "/v1/keys", "", 200},
      {http::verb::post, "/v1/keys", R"({"name": "x", "tenant": "team-c"})", 201},
      {http::verb::get, "/v1/pools", "", 200},
      {http::verb::put, "/v1/pools/base", R"({"size": 0})", 200},
      {http::verb::get, "/metrics", "", 200},
  };
  for (const auto& [verb, target, body, admin_status] : calls) {
    SCOPED_TRACE(target);
    Reply refused = As(key_a_, verb, target, body);
    EXPECT_EQ(refused.status, 403) << refused.body;
    EXPECT_EQ(refused.Json()["error"]["code"], "permission_denied") << refused.body;
    EXPECT_NE(refused.Json()["error"]["message"].get<std::string>().find("admin"),
              std::string::npos)
        << refused.body;
    Reply allowed = daemon_->Call(verb, target, body);  // positive control
    EXPECT_EQ(allowed.status, admin_status) << allowed.body;
  }
  Reply revoke = As(key_a_, http::verb::delete_, "/v1/keys/1");
  EXPECT_EQ(revoke.status, 403) << revoke.body;
  // The list never shows a key or its hash, and the refused create made nothing.
  Reply keys = daemon_->Call(http::verb::get, "/v1/keys");
  ASSERT_EQ(keys.status, 200);
  EXPECT_EQ(keys.body.find(key_a_.substr(3)), std::string::npos);
  EXPECT_EQ(keys.body.find("\"key\""), std::string::npos) << keys.body;
  std::set<std::string> tenants;
  const json key_list = keys.Json();
  for (const json& k : key_list["keys"]) tenants.insert(k["tenant"].get<std::string>());
  EXPECT_EQ(tenants, (std::set<std::string>{"admin", "team-a", "team-b", "team-c"}));
  EXPECT_EQ(keys.Json()["keys"].size(), 4u) << keys.body;
  EXPECT_FALSE(keys.Json()["keys"][0]["revoked"]) << "admin key 1 is still valid";
}

TEST_F(TenancyTest, RevokedKeyGets401AtOnceAndTheLastAdminKeyStays) {
  Reply made = daemon_->Call(http::verb::post, "/v1/keys", R"({"name": "c", "tenant": "team-c"})");
  ASSERT_EQ(made.status, 201) << made.body;
  const std::string key = made.Json()["key"];
  const int64_t id = made.Json()["id"];
  EXPECT_EQ(As(key, http::verb::get, "/v1/sandboxes").status, 200);  // positive control
  Reply revoked = daemon_->Call(http::verb::delete_, "/v1/keys/" + std::to_string(id));
  EXPECT_EQ(revoked.status, 204) << revoked.body;
  Reply after = As(key, http::verb::get, "/v1/sandboxes");
  EXPECT_EQ(after.status, 401) << after.body;
  EXPECT_EQ(after.body, As("al_" + std::string(64, '0'), http::verb::get, "/v1/sandboxes").body);
  EXPECT_EQ(WsHandshake(daemon_->port(), key, "/v1/sandboxes/" + UnusedId() + "/exec/ws").status,
            401);
  Reply listed = daemon_->Call(http::verb::get, "/v1/keys");
  const json key_list = listed.Json();
  for (const json& k : key_list["keys"]) {
    if (k["id"] == id) {
      EXPECT_TRUE(k["revoked"].get<bool>()) << listed.body;
    }
  }
  // The admin key is the last one not revoked: it stays.
  Reply last = daemon_->Call(http::verb::delete_, "/v1/keys/1");
  EXPECT_EQ(last.status, 409) << last.body;
  EXPECT_EQ(daemon_->Call(http::verb::get, "/v1/keys").status, 200);
  EXPECT_EQ(daemon_->Call(http::verb::delete_, "/v1/keys/999").status, 404);
  EXPECT_EQ(daemon_->Call(http::verb::delete_, "/v1/keys/x1").status, 400);
  Reply bad = daemon_->Call(http::verb::post, "/v1/keys", R"({"name": "d", "tenant": "a/b"})");
  EXPECT_EQ(bad.status, 400) << bad.body;
  EXPECT_EQ(daemon_->Call(http::verb::post, "/v1/keys", R"({"name": "d"})").status, 400);
}

TEST_F(TenancyTest, TenantTemplatesAreInvisibleToOthersAndSharedOnesAreAdminsToChange) {
  // A shared template (an admin's snapshot) and one of A's own.
  const std::string admins = CreateSandbox();
  ASSERT_EQ(daemon_
                ->Call(http::verb::post, "/v1/sandboxes/" + admins + "/snapshot",
                       R"({"name": "shared1"})")
                .status,
            201);
  const std::string a = CreateAs(key_a_);
  Reply snap =
      As(key_a_, http::verb::post, "/v1/sandboxes/" + a + "/snapshot", R"({"name": "private"})");
  ASSERT_EQ(snap.status, 201) << snap.body;
  EXPECT_EQ(snap.Json()["tenant"], "team-a");

  auto names = [&](const std::string& key) {
    std::set<std::string> out;
    const json doc = As(key, http::verb::get, "/v1/templates").Json();
    for (const json& t : doc["templates"]) out.insert(t["name"].get<std::string>());
    return out;
  };
  EXPECT_EQ(names(key_a_), (std::set<std::string>{"base", "shared1", "private"}));
  EXPECT_EQ(names(key_b_), (std::set<std::string>{"base", "shared1"}));
  EXPECT_EQ(names(daemon_->key()), (std::set<std::string>{"base", "shared1", "private"}));

  // B: A's template is the 404 of one that does not exist (same-length names), to get, use,
  // build on and delete.
  Reply theirs = As(key_b_, http::verb::get, "/v1/templates/private");
  Reply nobodys = As(key_b_, http::verb::get, "/v1/templates/missing");
  EXPECT_EQ(theirs.status, 404);
  EXPECT_EQ(Replace(theirs.body, "private", "missing"), nobodys.body);
  Reply use = As(key_b_, http::verb::post, "/v1/sandboxes", R"({"template": "private"})");
  Reply use_missing = As(key_b_, http::verb::post, "/v1/sandboxes", R"({"template": "missing"})");
  EXPECT_EQ(use.status, 404) << use.body;
  EXPECT_EQ(Replace(use.body, "private", "missing"), use_missing.body);
  Reply build =
      As(key_b_, http::verb::post, "/v1/templates", R"({"name": "b-built", "base": "private"})");
  EXPECT_EQ(build.status, 404) << build.body;
  Reply del = As(key_b_, http::verb::delete_, "/v1/templates/private");
  EXPECT_EQ(del.status, 404) << del.body;
  EXPECT_EQ(As(key_a_, http::verb::get, "/v1/templates/private").status, 200) << "not deleted";

  // Positive controls: A uses its template; B uses the shared one.
  const std::string from_private = CreateAs(key_a_, R"({"template": "private"})");
  EXPECT_FALSE(from_private.empty());
  const std::string from_shared = CreateAs(key_b_, R"({"template": "shared1"})");
  EXPECT_FALSE(from_shared.empty());

  // Shared templates: only admins delete them (B gets 403 and it stays).
  Reply refused = As(key_b_, http::verb::delete_, "/v1/templates/shared1");
  EXPECT_EQ(refused.status, 403) << refused.body;
  EXPECT_EQ(As(key_b_, http::verb::delete_, "/v1/templates/base").status, 403);
  EXPECT_EQ(As(key_b_, http::verb::get, "/v1/templates/shared1").status, 200);
  // A deletes its own once no sandbox uses it; the admin deletes the shared one.
  ASSERT_EQ(As(key_a_, http::verb::delete_, "/v1/sandboxes/" + from_private).status, 204);
  EXPECT_EQ(As(key_a_, http::verb::delete_, "/v1/templates/private").status, 204);
  ASSERT_EQ(As(key_b_, http::verb::delete_, "/v1/sandboxes/" + from_shared).status, 204);
  EXPECT_EQ(daemon_->Call(http::verb::delete_, "/v1/templates/shared1").status, 204);
}

}  // namespace
