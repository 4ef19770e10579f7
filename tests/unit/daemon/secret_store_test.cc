// The secrets store (docs/design/secrets-store.md) over a real SQLite store in a temp state dir:
// round trips, what the database file holds, tampered and moved rows, the key file at start,
// and that no error carries a value. No daemon, no sandbox.

#include "daemon/server/secret_store.h"

#include <gtest/gtest.h>
#include <sqlite3.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace airlock::daemon {
namespace {

namespace fs = std::filesystem;

// A value nobody else would write, so that finding it anywhere means it leaked.
std::string DistinctValue(std::string_view label) {
  std::random_device rd;
  std::ostringstream out;
  out << "ghp_" << label << "_" << std::hex << rd() << rd() << rd();
  return out.str();
}

std::string ReadBytes(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// Runs one statement on a connection of its own (as an operator's sqlite3 would).
void RawExec(const std::string& db_path, const std::string& sql) {
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open_v2(db_path.c_str(), &db, SQLITE_OPEN_READWRITE, nullptr), SQLITE_OK);
  char* error = nullptr;
  const int rc = sqlite3_exec(db, sql.c_str(), nullptr, nullptr, &error);
  EXPECT_EQ(rc, SQLITE_OK) << sql << ": " << (error ? error : "");
  sqlite3_free(error);
  sqlite3_close(db);
}

class SecretStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::temp_directory_path() / "airlock-secrets-XXXXXX").string();
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
    ASSERT_TRUE(Reopen());
  }
  void TearDown() override {
    secrets_.reset();
    store_.reset();
    fs::remove_all(dir_);
  }

  // Opens the store and the secrets again, as a daemon's start does.
  ::testing::AssertionResult Reopen() {
    secrets_.reset();
    store_.reset();
    auto opened = store::Store::Open(db_path());
    if (!opened) return ::testing::AssertionFailure() << opened.error().message();
    store_ = std::move(*opened);
    auto secrets = SecretStore::Open(*store_, dir_);
    if (!secrets) {
      open_error_ = secrets.error().message();
      return ::testing::AssertionFailure() << open_error_;
    }
    secrets_ = std::move(*secrets);
    return ::testing::AssertionSuccess();
  }

  std::string db_path() const { return dir_ + "/airlock.db"; }
  std::string key_path() const { return dir_ + "/secrets.key"; }

  // Every byte of the database's files (the main file, its WAL and shared memory).
  std::string DatabaseBytes() const {
    std::string all;
    for (const char* suffix : {"", "-wal", "-shm"}) all += ReadBytes(db_path() + suffix);
    return all;
  }

  std::string dir_;
  std::string open_error_;
  std::unique_ptr<store::Store> store_;
  std::unique_ptr<SecretStore> secrets_;
};

TEST_F(SecretStoreTest, FirstStartMakesAPrivateThirtyTwoByteKey) {
  EXPECT_TRUE(secrets_->made_key());
  struct stat st {};
  ASSERT_EQ(::lstat(key_path().c_str(), &st), 0);
  EXPECT_TRUE(S_ISREG(st.st_mode));
  EXPECT_EQ(st.st_mode & 07777, 0600u);
  EXPECT_EQ(st.st_size, 32);
  EXPECT_EQ(st.st_uid, ::geteuid());
  EXPECT_FALSE(fs::exists(key_path() + ".tmp"));
  const std::string key = ReadBytes(key_path());
  EXPECT_NE(key, std::string(32, '\0'));
  // A later start loads it, and makes nothing.
  const std::string id = secrets_->key_id();
  ASSERT_TRUE(Reopen());
  EXPECT_FALSE(secrets_->made_key());
  EXPECT_EQ(secrets_->key_id(), id);
  EXPECT_EQ(ReadBytes(key_path()), key);
  EXPECT_EQ(id.size(), 16u);
  EXPECT_EQ(key.find(id), std::string::npos);
}

TEST_F(SecretStoreTest, ValuesRoundTripAndRotate) {
  const std::string first = DistinctValue("first");
  auto made = secrets_->Create("team-a", "GITHUB_TOKEN", first);
  ASSERT_TRUE(made.has_value()) << made.error().message();
  EXPECT_EQ(made->tenant, "team-a");
  EXPECT_EQ(made->name, "GITHUB_TOKEN");
  EXPECT_EQ(made->version, 1);
  EXPECT_GT(made->created_at_ms, 0);
  EXPECT_EQ(made->updated_at_ms, made->created_at_ms);
  EXPECT_EQ(*secrets_->Value("team-a", "GITHUB_TOKEN"), first);
  EXPECT_EQ(*secrets_->Get("team-a", "GITHUB_TOKEN"), *made);

  const std::string second = DistinctValue("second");
  auto rotated = secrets_->Update("team-a", "GITHUB_TOKEN", second);
  ASSERT_TRUE(rotated.has_value()) << rotated.error().message();
  EXPECT_EQ(rotated->version, 2);
  EXPECT_EQ(rotated->created_at_ms, made->created_at_ms);
  EXPECT_GE(rotated->updated_at_ms, made->updated_at_ms);
  EXPECT_EQ(*secrets_->Value("team-a", "GITHUB_TOKEN"), second) << "the cache followed the write";

  // A start later: the same value from the database, through the key file.
  ASSERT_TRUE(Reopen());
  EXPECT_EQ(*secrets_->Value("team-a", "GITHUB_TOKEN"), second);
  auto listed = secrets_->List("team-a");
  ASSERT_TRUE(listed.has_value());
  ASSERT_EQ(listed->size(), 1u);
  EXPECT_EQ((*listed)[0].version, 2);
  EXPECT_EQ(*secrets_->Count(), 1);

  // Any byte but CR, LF and NUL, up to 64 KiB.
  std::string binary;
  for (int c = 1; c < 256; ++c) {
    if (c != '\r' && c != '\n') binary += static_cast<char>(c);
  }
  ASSERT_TRUE(secrets_->Create("team-a", "BYTES", binary).has_value());
  ASSERT_TRUE(secrets_->Create("team-a", "BIG", std::string(65536, 'v')).has_value());
  ASSERT_TRUE(Reopen());
  EXPECT_EQ(*secrets_->Value("team-a", "BYTES"), binary);
  EXPECT_EQ(*secrets_->Value("team-a", "BIG"), std::string(65536, 'v'));

  ASSERT_TRUE(secrets_->Delete("team-a", "GITHUB_TOKEN").has_value());
  auto gone = secrets_->Value("team-a", "GITHUB_TOKEN");
  ASSERT_FALSE(gone.has_value());
  EXPECT_EQ(gone.error().code(), ErrorCode::kNotFound);
  EXPECT_EQ(secrets_->Get("team-a", "GITHUB_TOKEN").error().code(), ErrorCode::kNotFound);
  EXPECT_EQ(secrets_->Delete("team-a", "GITHUB_TOKEN").error().code(), ErrorCode::kNotFound);
  EXPECT_EQ(secrets_->Update("team-a", "GITHUB_TOKEN", "x").error().code(), ErrorCode::kNotFound);
}

TEST_F(SecretStoreTest, TenantsHaveTheirOwnNames) {
  const std::string a = DistinctValue("a"), b = DistinctValue("b");
  ASSERT_TRUE(secrets_->Create("team-a", "TOKEN", a).has_value());
  ASSERT_TRUE(secrets_->Create("team-b", "TOKEN", b).has_value());
  EXPECT_EQ(*secrets_->Value("team-a", "TOKEN"), a);
  EXPECT_EQ(*secrets_->Value("team-b", "TOKEN"), b);
  auto absent = secrets_->Value("team-c", "TOKEN");
  ASSERT_FALSE(absent.has_value());
  EXPECT_EQ(absent.error().code(), ErrorCode::kNotFound);
  EXPECT_EQ(secrets_->Create("team-a", "TOKEN", b).error().code(), ErrorCode::kAlreadyExists);
  EXPECT_EQ(*secrets_->Value("team-a", "TOKEN"), a) << "a refused create changed nothing";
}

TEST_F(SecretStoreTest, TheDatabaseHoldsNoValue) {
  const std::string value = DistinctValue("in-the-db");
  ASSERT_TRUE(secrets_->Create("team-a", "DB_PASSWORD", value).has_value());
  const std::string rotated = DistinctValue("rotated");
  ASSERT_TRUE(secrets_->Update("team-a", "DB_PASSWORD", rotated).has_value());
  ASSERT_TRUE(secrets_->Create("team-b", "SAME_VALUE", value).has_value());
  // Both as written (WAL) and after a checkpoint has moved the pages into the main file.
  for (bool checkpointed : {false, true}) {
    SCOPED_TRACE(checkpointed ? "after a checkpoint" : "before a checkpoint");
    if (checkpointed) {
      secrets_.reset();
      store_.reset();  // the last connection's close checkpoints the WAL into the file
    }
    const std::string bytes = DatabaseBytes();
    // The control: what is stored in clear is found, so the search would find a value too.
    ASSERT_NE(bytes.find("DB_PASSWORD"), std::string::npos);
    ASSERT_NE(bytes.find("SAME_VALUE"), std::string::npos);
    EXPECT_EQ(bytes.find(value), std::string::npos);
    EXPECT_EQ(bytes.find(rotated), std::string::npos);
    EXPECT_EQ(bytes.find(value.substr(4, 12)), std::string::npos) << "not even a part of it";
  }
  // Nor does anything else in the state dir but the key.
  for (const auto& entry : fs::directory_iterator(dir_)) {
    const std::string bytes = ReadBytes(entry.path());
    EXPECT_EQ(bytes.find(value), std::string::npos) << entry.path();
  }
  ASSERT_TRUE(Reopen());
  EXPECT_EQ(*secrets_->Value("team-b", "SAME_VALUE"), value);
}

TEST_F(SecretStoreTest, EveryWriteHasAFreshNonce) {
  ASSERT_TRUE(secrets_->Create("t", "ONE", "same value").has_value());
  ASSERT_TRUE(secrets_->Create("t", "TWO", "same value").has_value());
  auto one = store_->GetSecret("t", "ONE");
  auto two = store_->GetSecret("t", "TWO");
  ASSERT_TRUE(one.has_value() && two.has_value());
  EXPECT_EQ(one->nonce.size(), 12u);
  EXPECT_NE(one->nonce, two->nonce);
  EXPECT_NE(one->ciphertext, two->ciphertext);
  EXPECT_EQ(one->ciphertext.size(), std::string("same value").size() + 16) << "value and tag";
  ASSERT_TRUE(secrets_->Update("t", "ONE", "same value").has_value());
  auto again = store_->GetSecret("t", "ONE");
  EXPECT_NE(again->nonce, one->nonce) << "an update with the same value seals it anew";
  EXPECT_EQ(again->key_id, secrets_->key_id());
}

TEST_F(SecretStoreTest, ATamperedRowDoesNotDecrypt) {
  const std::string value = DistinctValue("tampered");
  ASSERT_TRUE(secrets_->Create("team-a", "TOKEN", value).has_value());
  ASSERT_TRUE(secrets_->Create("team-a", "CONTROL", value).has_value());
  secrets_.reset();
  store_.reset();
  // A byte of the ciphertext changed, then of the nonce, then of the tag (each to 00, or to 01
  // where it was 00).
  const std::string flip = "CASE WHEN %s = x'00' THEN x'01' ELSE x'00' END";
  auto flipped = [&](const std::string& byte) {
    std::string sql = flip;
    return sql.replace(sql.find("%s"), 2, byte);
  };
  // (|| makes text, which a STRICT table's BLOB column refuses: hence the casts.)
  for (const std::string& sql :
       {"UPDATE secrets SET ciphertext = CAST(" + flipped("substr(ciphertext, 1, 1)") +
            " || substr(ciphertext, 2) AS BLOB) WHERE name = 'TOKEN'",
        "UPDATE secrets SET nonce = CAST(substr(nonce, 1, 11) || " +
            flipped("substr(nonce, 12, 1)") + " AS BLOB) WHERE name = 'TOKEN'",
        "UPDATE secrets SET ciphertext = CAST(substr(ciphertext, 1, length(ciphertext) - 1) || " +
            flipped("substr(ciphertext, length(ciphertext), 1)") +
            " AS BLOB) WHERE name = 'TOKEN'"}) {
    SCOPED_TRACE(sql);
    RawExec(db_path(), sql);
    ASSERT_TRUE(Reopen());
    auto opened = secrets_->Value("team-a", "TOKEN");
    ASSERT_FALSE(opened.has_value());
    EXPECT_EQ(opened.error().code(), ErrorCode::kInternal);
    EXPECT_NE(opened.error().message().find("secret TOKEN of tenant team-a cannot be decrypted"),
              std::string::npos)
        << opened.error().message();
    EXPECT_EQ(opened.error().message().find(value), std::string::npos);
    EXPECT_EQ(*secrets_->Value("team-a", "CONTROL"), value) << "the untouched row opens";
  }
}

TEST_F(SecretStoreTest, ARowMovedToAnotherNameOrTenantDoesNotDecrypt) {
  const std::string value = DistinctValue("moved");
  ASSERT_TRUE(secrets_->Create("team-a", "TOKEN", value).has_value());
  ASSERT_TRUE(secrets_->Create("team-b", "TOKEN", "b's own").has_value());
  secrets_.reset();
  store_.reset();
  const std::string copy =
      "INSERT INTO secrets SELECT %s, ciphertext, nonce, key_id, version, created_at_ms, "
      "updated_at_ms FROM secrets WHERE tenant = 'team-a' AND name = 'TOKEN'";
  auto with = [&](const std::string& columns) {
    std::string sql = copy;
    return sql.replace(sql.find("%s"), 2, columns);
  };
  RawExec(db_path(), with("tenant, 'STOLEN'"));  // another name, same tenant
  RawExec(db_path(), with("'team-c', name"));    // same name, another tenant
  RawExec(db_path(), "DELETE FROM secrets WHERE tenant = 'team-b'");
  RawExec(db_path(), with("'team-b', name"));  // over another tenant's own secret
  ASSERT_TRUE(Reopen());
  for (const auto& [tenant, name] : std::vector<std::pair<std::string, std::string>>{
           {"team-a", "STOLEN"}, {"team-c", "TOKEN"}, {"team-b", "TOKEN"}}) {
    SCOPED_TRACE(tenant + "/" + name);
    auto opened = secrets_->Value(tenant, name);
    ASSERT_FALSE(opened.has_value());
    EXPECT_EQ(opened.error().code(), ErrorCode::kInternal);
    EXPECT_NE(opened.error().message().find("cannot be decrypted: the tag does not match"),
              std::string::npos)
        << opened.error().message();
    EXPECT_EQ(opened.error().message().find(value), std::string::npos);
  }
  EXPECT_EQ(*secrets_->Value("team-a", "TOKEN"), value) << "the original still opens";
}

TEST_F(SecretStoreTest, BadValuesAreRefusedWithoutShowingThem) {
  const std::string token = DistinctValue("bad");
  const std::vector<std::pair<std::string, std::string>> cases = {
      {token + "\n", "must not contain CR, LF or NUL"},
      {token + "\r\nX-Injected: 1", "must not contain CR, LF or NUL"},
      {token + std::string("\0tail", 5), "must not contain CR, LF or NUL"},
      {"", "must be 1-65536 bytes, got 0"},
      {token + std::string(65536, 'x'), "must be 1-65536 bytes"},
  };
  for (const auto& [value, why] : cases) {
    SCOPED_TRACE(why);
    auto made = secrets_->Create("team-a", "TOKEN", value);
    ASSERT_FALSE(made.has_value());
    EXPECT_EQ(made.error().code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(made.error().message().find(why), std::string::npos) << made.error().message();
    EXPECT_EQ(made.error().message().find(token), std::string::npos) << made.error().message();
  }
  // The control: the same value without what was wrong with it is taken, and updates check too.
  ASSERT_TRUE(secrets_->Create("team-a", "TOKEN", token).has_value());
  auto updated = secrets_->Update("team-a", "TOKEN", token + "\n");
  ASSERT_FALSE(updated.has_value());
  EXPECT_EQ(updated.error().code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(updated.error().message().find(token), std::string::npos);
  EXPECT_EQ(secrets_->Get("team-a", "TOKEN")->version, 1);
  // Names: the rule, and the name is not quoted (a caller may have swapped name and value).
  auto swapped = secrets_->Create("team-a", token + "-x", "GITHUB_TOKEN");
  ASSERT_FALSE(swapped.has_value());
  EXPECT_EQ(swapped.error().code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(swapped.error().message().find(token), std::string::npos);
  EXPECT_EQ(secrets_->Create("not a tenant", "A", "v").error().code(), ErrorCode::kInvalidArgument);
}

TEST_F(SecretStoreTest, AMissingKeyIsNotReplacedWhileSecretsExist) {
  ASSERT_TRUE(secrets_->Create("team-a", "TOKEN", "v").has_value());
  const std::string key = ReadBytes(key_path());
  fs::remove(key_path());
  EXPECT_FALSE(Reopen());
  EXPECT_NE(open_error_.find("secrets.key is missing, and the store holds 1 secret(s) sealed "
                             "with it: they cannot be decrypted without it"),
            std::string::npos)
      << open_error_;
  EXPECT_FALSE(fs::exists(key_path())) << "no new key was made";
  // Restored, it opens them again.
  std::ofstream(key_path(), std::ios::binary) << key;
  fs::permissions(key_path(), fs::perms::owner_read | fs::perms::owner_write);
  ASSERT_TRUE(Reopen());
  EXPECT_EQ(*secrets_->Value("team-a", "TOKEN"), "v");
  // With no secret left, a lost key is simply made again.
  ASSERT_TRUE(secrets_->Delete("team-a", "TOKEN").has_value());
  fs::remove(key_path());
  ASSERT_TRUE(Reopen());
  EXPECT_TRUE(secrets_->made_key());
}

TEST_F(SecretStoreTest, AKeyFileOthersCouldReadOrThatIsNotAKeyIsRefused) {
  ASSERT_TRUE(secrets_->Create("team-a", "TOKEN", "v").has_value());
  const std::string key = ReadBytes(key_path());
  secrets_.reset();
  auto write_key = [&](const std::string& bytes, mode_t mode = 0600) {
    fs::remove(key_path());
    std::ofstream(key_path(), std::ios::binary) << bytes;
    ASSERT_EQ(::chmod(key_path().c_str(), mode), 0);
  };
  struct Case {
    const char* what;
    std::function<void()> make;
    const char* error;
  };
  const std::vector<Case> cases = {
      {"group-readable", [&] { write_key(key, 0640); },
       "has mode 0640: group or others may read or change the key"},
      {"world-readable", [&] { write_key(key, 0604); }, "has mode 0604"},
      {"group-writable", [&] { write_key(key, 0620); }, "has mode 0620"},
      {"short", [&] { write_key(key.substr(0, 31)); }, "holds 31 bytes, not 32"},
      {"long", [&] { write_key(key + "\n"); }, "holds 33 bytes, not 32"},
      {"empty", [&] { write_key(""); }, "holds 0 bytes, not 32"},
      {"another user's",
       [&] {
         write_key(key);
         ASSERT_EQ(::chown(key_path().c_str(), 65534, 65534), 0);
       },
       "is owned by uid 65534"},
      {"a symlink",
       [&] {
         write_key(key);
         fs::rename(key_path(), dir_ + "/elsewhere.key");
         fs::create_symlink(dir_ + "/elsewhere.key", key_path());
       },
       "is a symbolic link"},
      {"a directory",
       [&] {
         fs::remove(key_path());
         fs::create_directory(key_path());
       },
       "is not a regular file"},
      {"another key", [&] { write_key(std::string(32, 'k')); },
       "is not the key that sealed 1 stored secret(s)"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    if (std::string(c.what) == "another user's" && ::geteuid() != 0) continue;  // chown needs root
    c.make();
    EXPECT_FALSE(Reopen());
    EXPECT_NE(open_error_.find(c.error), std::string::npos) << open_error_;
    EXPECT_EQ(open_error_.find(key), std::string::npos);
    // The control: the right file, 0600, opens and decrypts.
    fs::remove_all(key_path());
    fs::remove(dir_ + "/elsewhere.key");
    write_key(key);
    ASSERT_TRUE(Reopen());
    EXPECT_EQ(*secrets_->Value("team-a", "TOKEN"), "v");
    secrets_.reset();
  }
}

TEST_F(SecretStoreTest, ValueFollowsRotationUnderConcurrentReads) {
  ASSERT_TRUE(secrets_->Create("t", "TOKEN", "v0").has_value());
  std::atomic<bool> stop{false};
  std::atomic<int> bad{0}, reads{0};
  std::vector<std::thread> readers;
  for (int i = 0; i < 4; ++i) {
    readers.emplace_back([&] {
      while (!stop) {
        auto v = secrets_->Value("t", "TOKEN");
        if (!v || v->size() < 2 || (*v)[0] != 'v') ++bad;
        ++reads;
      }
    });
  }
  for (int i = 1; i <= 50; ++i) {
    const std::string next = "v" + std::to_string(i);
    ASSERT_TRUE(secrets_->Update("t", "TOKEN", next).has_value());
    EXPECT_EQ(*secrets_->Value("t", "TOKEN"), next) << "an update is seen once it returned";
  }
  stop = true;
  for (auto& t : readers) t.join();
  EXPECT_EQ(bad, 0);
  EXPECT_GT(reads, 0);
  EXPECT_EQ(secrets_->Get("t", "TOKEN")->version, 51);
}

}  // namespace
}  // namespace airlock::daemon
