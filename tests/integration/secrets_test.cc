// Secrets end to end (docs/secrets.md, docs/design/secrets-store.md) on a real airlockd: the
// routes answer metadata only; a value never comes back in any answer, the daemon's log or
// /metrics; another tenant's secret is the 404 of one that does not exist while its owner's
// calls succeed; a rotated value is what the store opens afterwards; and the daemon will not
// start without the key that sealed its secrets.

#include <sys/stat.h>

#include <random>
#include <set>
#include <sstream>

#include "daemon/server/secret_store.h"
#include "daemon/store/store.h"
#include "support/airlockd.h"
#include "support/tenancy.h"

namespace {

using namespace airlock::testing;

// A value nobody else would write, so that finding it anywhere means it leaked.
std::string DistinctValue(std::string_view label) {
  std::random_device rd;
  std::ostringstream out;
  out << "ghp_" << label << "_" << std::hex << rd() << rd() << rd();
  return out.str();
}

class SecretsTest : public DaemonTest {
 protected:
  // A new key of `tenant`; "" (with a failure) if the create failed.
  std::string MakeKey(const std::string& name, const std::string& tenant) {
    Reply r = daemon_->Call(http::verb::post, "/v1/keys",
                            json{{"name", name}, {"tenant", tenant}}.dump());
    EXPECT_EQ(r.status, 201) << r.body;
    return r.status == 201 ? r.Json()["key"].get<std::string>() : "";
  }

  Reply As(const std::string& key, http::verb verb, const std::string& target,
           const std::string& body = "") {
    Reply r = Http(daemon_->port(), verb, target, body, "Bearer " + key);
    answers_ += r.body + "\n";
    for (const auto& [name, value] : r.headers) answers_ += name + ": " + value + "\n";
    return r;
  }
  Reply Call(http::verb verb, const std::string& target, const std::string& body = "") {
    return As(daemon_->key(), verb, target, body);
  }

  // Restarts the daemon on the same state dir; the start's result.
  ::testing::AssertionResult Restart() {
    if (daemon_->running()) daemon_->Stop(SIGTERM);
    daemon_.emplace(dir_ + "/state", DaemonArgs());
    return daemon_->Start();
  }

  std::string key_path() const { return dir_ + "/state/secrets.key"; }

  std::string answers_;  // every body and header this test received
};

TEST_F(SecretsTest, TheRoutesAnswerMetadataOnly) {
  const std::string value = DistinctValue("crud");
  Reply made = Call(http::verb::post, "/v1/secrets",
                    json{{"name", "GITHUB_TOKEN"}, {"value", value}}.dump());
  ASSERT_EQ(made.status, 201) << made.body;
  const json doc = made.Json();
  EXPECT_EQ(doc["name"], "GITHUB_TOKEN");
  EXPECT_EQ(doc["version"], 1);
  EXPECT_EQ(doc["created_at"], doc["updated_at"]);
  EXPECT_EQ(doc.size(), 4u) << "name, version, created_at, updated_at and nothing else: "
                            << made.body;
  const std::string created = doc["created_at"];
  EXPECT_EQ(created.size(), std::string("2024-05-01T12:34:56.789Z").size()) << created;
  EXPECT_EQ(created.back(), 'Z');

  Reply again = Call(http::verb::post, "/v1/secrets",
                     json{{"name", "GITHUB_TOKEN"}, {"value", "other"}}.dump());
  EXPECT_EQ(again.status, 409) << again.body;
  EXPECT_EQ(again.Json()["error"]["code"], "already_exists");

  Reply listed = Call(http::verb::get, "/v1/secrets");
  ASSERT_EQ(listed.status, 200) << listed.body;
  ASSERT_EQ(listed.Json()["secrets"].size(), 1u) << listed.body;
  EXPECT_EQ(listed.Json()["secrets"][0], doc);
  Reply one = Call(http::verb::get, "/v1/secrets/GITHUB_TOKEN");
  ASSERT_EQ(one.status, 200) << one.body;
  EXPECT_EQ(one.Json(), doc);

  std::this_thread::sleep_for(std::chrono::milliseconds(5));
  const std::string rotated = DistinctValue("rotated");
  Reply updated =
      Call(http::verb::put, "/v1/secrets/GITHUB_TOKEN", json{{"value", rotated}}.dump());
  ASSERT_EQ(updated.status, 200) << updated.body;
  EXPECT_EQ(updated.Json()["version"], 2);
  EXPECT_EQ(updated.Json()["created_at"], created);
  EXPECT_GT(updated.Json()["updated_at"].get<std::string>(), created);
  EXPECT_EQ(Call(http::verb::get, "/v1/secrets/GITHUB_TOKEN").Json()["version"], 2);

  // Unknown names, wrong methods, bodies where none belongs.
  EXPECT_EQ(Call(http::verb::get, "/v1/secrets/NOPE").status, 404);
  EXPECT_EQ(Call(http::verb::put, "/v1/secrets/NOPE", R"({"value": "v"})").status, 404);
  EXPECT_EQ(Call(http::verb::delete_, "/v1/secrets/NOPE").status, 404);
  Reply patch = Call(http::verb::patch, "/v1/secrets/GITHUB_TOKEN", "{}");
  EXPECT_EQ(patch.status, 405);
  EXPECT_EQ(patch.headers["Allow"], "GET, PUT, DELETE");
  EXPECT_EQ(Call(http::verb::delete_, "/v1/secrets").status, 405);
  EXPECT_EQ(Call(http::verb::get, "/v1/secrets/A/B").status, 404);
  EXPECT_EQ(Call(http::verb::get, "/v1/secrets/GITHUB_TOKEN", "{}").status, 400);
  EXPECT_EQ(Call(http::verb::get, "/v1/secrets?state=x").status, 400);
  EXPECT_EQ(Call(http::verb::get, "/v1/secrets/9X").status, 400);

  Reply gone = Call(http::verb::delete_, "/v1/secrets/GITHUB_TOKEN");
  EXPECT_EQ(gone.status, 204) << gone.body;
  EXPECT_TRUE(gone.body.empty());
  EXPECT_EQ(Call(http::verb::get, "/v1/secrets/GITHUB_TOKEN").status, 404);
  EXPECT_EQ(Call(http::verb::get, "/v1/secrets").Json()["secrets"].size(), 0u);
  EXPECT_EQ(Call(http::verb::delete_, "/v1/secrets/GITHUB_TOKEN").status, 404);
  EXPECT_EQ(answers_.find(value), std::string::npos);
  EXPECT_EQ(answers_.find(rotated), std::string::npos);
}

// Every way a value can be sent, good and bad: it comes back in no answer, no log line and no
// metric. The daemon logs at debug level here, its most talkative.
TEST_F(SecretsTest, AValueNeverComesBackInAnAnswerTheLogOrTheMetrics) {
  const std::string value = DistinctValue("leak");
  const std::string body = json{{"name", "LEAK_CHECK"}, {"value", value}}.dump();
  ASSERT_EQ(Call(http::verb::post, "/v1/secrets", body).status, 201);
  EXPECT_EQ(Call(http::verb::post, "/v1/secrets", body).status, 409);
  const std::string next = DistinctValue("next");
  ASSERT_EQ(Call(http::verb::put, "/v1/secrets/LEAK_CHECK", json{{"value", next}}.dump()).status,
            200);
  // Refused bodies that carry the value: each 400 says what is wrong without it. The same body
  // less its name goes to the update (but where the value was sent as the name).
  const std::vector<std::pair<std::string, std::string>> refused = {
      {R"({"name": "BAD", "value": ")" + value + "\n" + R"("})", "control character U+000A"},
      {R"({"name": "BAD", "value": ")" + value + R"(\r\n"})", "must not contain CR, LF or NUL"},
      {R"({"name": "BAD", "value": ")" + value + R"(\u0000"})", "must not contain CR, LF or NUL"},
      {R"({"name": "BAD", "value": ")" + value + "\xff" + R"("})", "ill-formed UTF-8"},
      {R"({"name": "BAD", "value": )" + value + "}", "not valid JSON"},
      {R"({"name": "BAD", "value": [")" + value + R"("]})", "value must be a string, got array"},
      // (Swapped: a value that is no name. One that is, like "ghp_x", would be taken as a name.)
      {R"({"name": "-)" + value + R"(", "value": "BAD"})", "a secret name must match"},
      {R"({"name": "BAD", "value": ")" + value + R"(", "value": "x"})", "duplicate key"},
      {json{{"name", "BAD"}, {"value", value + std::string(65536, 'x')}}.dump(),
       "value must be 1-65536 bytes"},
  };
  for (const auto& [bad, why] : refused) {
    SCOPED_TRACE(why);
    Reply r = Call(http::verb::post, "/v1/secrets", bad);
    EXPECT_EQ(r.status, 400) << r.body;
    EXPECT_NE(r.body.find(why), std::string::npos) << r.body;
    if (bad.find(R"("name": "BAD")") == std::string::npos &&
        bad.find(R"("name":"BAD")") == std::string::npos) {
      continue;
    }
    Reply u =
        Call(http::verb::put, "/v1/secrets/LEAK_CHECK", "{" + bad.substr(bad.find("\"value\"")));
    EXPECT_EQ(u.status, 400) << u.body;
  }
  EXPECT_EQ(Call(http::verb::get, "/v1/secrets/BAD").status, 404) << "nothing refused was stored";
  EXPECT_EQ(Call(http::verb::get, "/v1/secrets/LEAK_CHECK").Json()["version"], 2);
  Reply metrics = Call(http::verb::get, "/metrics");
  ASSERT_EQ(metrics.status, 200);
  EXPECT_NE(metrics.body.find("\nairlock_secrets 1\n"), std::string::npos) << metrics.body;

  EXPECT_EQ(answers_.find(value), std::string::npos);
  EXPECT_EQ(answers_.find(next), std::string::npos);
  EXPECT_EQ(answers_.find(value.substr(4)), std::string::npos);
  // The log, while the daemon runs and after its stop; the control is that it names the
  // secret, so the search reads the right file.
  for (bool stopped : {false, true}) {
    if (stopped) daemon_->Stop(SIGTERM);
    const std::string log = daemon_->Log();
    ASSERT_NE(log.find("secret LEAK_CHECK of tenant admin: created"), std::string::npos) << log;
    ASSERT_NE(log.find("rotated to version 2"), std::string::npos);
    EXPECT_EQ(log.find(value), std::string::npos);
    EXPECT_EQ(log.find(next), std::string::npos);
    EXPECT_EQ(log.find(value.substr(4)), std::string::npos);
  }
  // Nor anything in the state dir but what the key opens.
  for (const auto& entry : fs::recursive_directory_iterator(dir_)) {
    if (!entry.is_regular_file() || entry.file_size() > (64u << 20)) continue;
    std::ifstream in(entry.path(), std::ios::binary);
    const std::string bytes(std::istreambuf_iterator<char>(in), {});
    EXPECT_EQ(bytes.find(value), std::string::npos) << entry.path();
    EXPECT_EQ(bytes.find(next), std::string::npos) << entry.path();
  }
}

TEST_F(SecretsTest, AnotherTenantsSecretIsNotFoundWhileItsOwnerCanUseIt) {
  const std::string key_a = MakeKey("alice", "team-a");
  const std::string key_b = MakeKey("bob", "team-b");
  ASSERT_FALSE(key_a.empty());
  ASSERT_FALSE(key_b.empty());
  const std::string value = DistinctValue("team-a");
  Reply made =
      As(key_a, http::verb::post, "/v1/secrets", json{{"name", "TOKEN"}, {"value", value}}.dump());
  ASSERT_EQ(made.status, 201) << made.body;

  // B on A's secret, and B on a name nobody has: the same answer, but for the name.
  struct Attempt {
    http::verb verb;
    std::string body;
  };
  for (const Attempt& a : std::vector<Attempt>{{http::verb::get, ""},
                                               {http::verb::put, R"({"value": "b's"})"},
                                               {http::verb::delete_, ""}}) {
    SCOPED_TRACE(std::string(http::to_string(a.verb)));
    Reply theirs = As(key_b, a.verb, "/v1/secrets/TOKEN", a.body);
    Reply nobodys = As(key_b, a.verb, "/v1/secrets/NOBODYS", a.body);
    EXPECT_EQ(theirs.status, 404) << theirs.body;
    EXPECT_EQ(nobodys.status, 404) << nobodys.body;
    EXPECT_EQ(theirs.body, Replace(nobodys.body, "NOBODYS", "TOKEN"));
    // The positive control: the owner's same call is not refused.
    if (a.verb != http::verb::delete_) {
      Reply own = As(key_a, a.verb, "/v1/secrets/TOKEN", a.body);
      EXPECT_EQ(own.status, 200) << own.body;
    }
  }
  EXPECT_EQ(As(key_b, http::verb::get, "/v1/secrets").Json()["secrets"].size(), 0u);
  Reply asked = As(key_b, http::verb::get, "/v1/secrets?tenant=team-a");
  EXPECT_EQ(asked.status, 403) << asked.body;
  EXPECT_EQ(As(key_b, http::verb::get, "/v1/secrets/TOKEN?tenant=team-a").status, 403);
  EXPECT_EQ(As(key_b, http::verb::get, "/v1/secrets?tenant=team-b").status, 200)
      << "its own tenant by name is fine";

  // A's secret is as A left it (one update: A's own PUT above).
  Reply after = As(key_a, http::verb::get, "/v1/secrets/TOKEN");
  ASSERT_EQ(after.status, 200) << after.body;
  EXPECT_EQ(after.Json()["version"], 2);
  ASSERT_EQ(As(key_a, http::verb::get, "/v1/secrets").Json()["secrets"].size(), 1u);

  // B's own secret of the same name is another one.
  Reply b_made = As(key_b, http::verb::post, "/v1/secrets",
                    json{{"name", "TOKEN"}, {"value", "b's own"}}.dump());
  EXPECT_EQ(b_made.status, 201) << b_made.body;
  EXPECT_EQ(As(key_b, http::verb::get, "/v1/secrets/TOKEN").Json()["version"], 1);
  EXPECT_EQ(As(key_a, http::verb::get, "/v1/secrets/TOKEN").Json()["version"], 2);

  // An admin acts on tenant admin's secrets unless it names another tenant.
  EXPECT_EQ(Call(http::verb::get, "/v1/secrets/TOKEN").status, 404);
  EXPECT_EQ(Call(http::verb::get, "/v1/secrets").Json()["secrets"].size(), 0u);
  Reply admin_a = Call(http::verb::get, "/v1/secrets/TOKEN?tenant=team-a");
  EXPECT_EQ(admin_a.status, 200) << admin_a.body;
  EXPECT_EQ(admin_a.Json()["version"], 2);
  EXPECT_EQ(Call(http::verb::get, "/v1/secrets?tenant=team-a").Json()["secrets"].size(), 1u);
  EXPECT_EQ(Call(http::verb::get, "/v1/secrets?tenant=not%20one").status, 400);

  // A deletes its own; B's stays.
  EXPECT_EQ(As(key_a, http::verb::delete_, "/v1/secrets/TOKEN").status, 204);
  EXPECT_EQ(As(key_a, http::verb::get, "/v1/secrets/TOKEN").status, 404);
  EXPECT_EQ(As(key_b, http::verb::get, "/v1/secrets/TOKEN").status, 200);
  EXPECT_EQ(answers_.find(value), std::string::npos);
}

// What the daemon stored is what the store opens with the daemon's key file: the rotated
// value, at the version the API showed.
TEST_F(SecretsTest, ARotatedValueIsWhatTheStoreOpensAfterwards) {
  const std::string first = DistinctValue("first"), second = DistinctValue("second");
  ASSERT_EQ(
      Call(http::verb::post, "/v1/secrets", json{{"name", "API_KEY"}, {"value", first}}.dump())
          .status,
      201);
  Reply rotated = Call(http::verb::put, "/v1/secrets/API_KEY", json{{"value", second}}.dump());
  ASSERT_EQ(rotated.status, 200) << rotated.body;
  EXPECT_EQ(rotated.Json()["version"], 2);
  daemon_->Stop(SIGTERM);

  auto store = airlock::store::Store::Open(dir_ + "/state/airlock.db");
  ASSERT_TRUE(store.has_value()) << store.error().message();
  auto secrets = airlock::daemon::SecretStore::Open(**store, dir_ + "/state");
  ASSERT_TRUE(secrets.has_value()) << secrets.error().message();
  EXPECT_FALSE((*secrets)->made_key());
  auto value = (*secrets)->Value("admin", "API_KEY");
  ASSERT_TRUE(value.has_value()) << value.error().message();
  EXPECT_EQ(*value, second);
  EXPECT_EQ((*secrets)->Get("admin", "API_KEY")->version, 2);
}

TEST_F(SecretsTest, TheDaemonDoesNotStartWithoutTheKeyThatSealedItsSecrets) {
  struct stat st {};
  ASSERT_EQ(::stat(key_path().c_str(), &st), 0) << "the first start made the key";
  EXPECT_EQ(st.st_mode & 07777, 0600u);
  EXPECT_EQ(st.st_size, 32);
  ASSERT_EQ(Call(http::verb::post, "/v1/secrets", R"({"name": "KEPT", "value": "v"})").status, 201);
  daemon_->Stop(SIGTERM);
  const std::string saved = dir_ + "/secrets.key.saved";
  fs::rename(key_path(), saved);

  EXPECT_FALSE(Restart());
  EXPECT_NE(daemon_->Log().find("secrets.key is missing, and the store holds 1 secret(s) sealed "
                                "with it: they cannot be decrypted without it"),
            std::string::npos)
      << daemon_->Log();
  EXPECT_FALSE(fs::exists(key_path())) << "no new key was made";

  // Readable by others: refused too, saying how to fix it.
  fs::copy_file(saved, key_path());
  ASSERT_EQ(::chmod(key_path().c_str(), 0644), 0);
  EXPECT_FALSE(Restart());
  EXPECT_NE(daemon_->Log().find("has mode 0644: group or others may read or change the key"),
            std::string::npos)
      << daemon_->Log();

  // The control: the right file, 0600, and the daemon starts with its secret.
  ASSERT_EQ(::chmod(key_path().c_str(), 0600), 0);
  ASSERT_TRUE(Restart());
  Reply kept = Call(http::verb::get, "/v1/secrets/KEPT");
  EXPECT_EQ(kept.status, 200) << kept.body;
  EXPECT_EQ(kept.Json()["version"], 1);
}

}  // namespace
