#pragma once
// SecretStore: each tenant's secrets (docs/design/secrets-store.md). A secret is a named value
// (a token, a password) that the egress proxy will put into the requests a sandbox makes to
// the hosts it is bound to; the value never enters a sandbox and never leaves the daemon
// through the API. The router creates, rotates, lists and deletes them (metadata only);
// Value() is for the proxy.
//
// Owns: the key (SecretBox, from STATE_DIR/secrets.key), and a cache of sealed rows by tenant
// and name that Value() fills and every write here keeps in step. The cache holds ciphertext,
// never a value in clear; the store (SQLite) holds the same.
// Locks: write_mu_ around each write (the store's write, then the cache's update, so that the
// cache follows the order of the commits); cache_mu_ shared for Value()'s lookup, exclusive to
// change the cache, never held across a call out.
// Threads: any; every method is thread-safe. Create, Update, Delete, List, Get and Count read
// or write SQLite: call them on the worker pool. Value() reads SQLite only when the secret is
// not cached (its first use, and after a write), then decrypts: a few microseconds.
// Errors never hold a value, whatever the call.

#include <cstdint>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/error.h"
#include "daemon/server/secret_box.h"
#include "daemon/store/store.h"

namespace airlock::daemon {

// What the API shows of a secret: never its value.
struct SecretInfo {
  std::string tenant;
  std::string name;
  int64_t version = 0;        // 1 at create, one more at every update
  int64_t created_at_ms = 0;  // unix ms
  int64_t updated_at_ms = 0;  // unix ms: the last create or update
  bool operator==(const SecretInfo&) const = default;
};

class SecretStore {
 public:
  // The key file, in the state dir.
  static constexpr std::string_view kKeyFile = "secrets.key";

  // Loads the key from `state_dir`/secrets.key, or makes it (0600) if the file is absent and
  // the store holds no secret. Fails with kFailedPrecondition, saying what to do, when the file
  // is absent but secrets exist (they cannot be decrypted without it: no new key is made), when
  // SecretBox::Load refuses the file (owner, mode, size), or when it is not the key the stored
  // secrets were sealed with. Call once at start, before serving. `store` outlives the result.
  [[nodiscard]] static Result<std::unique_ptr<SecretStore>> Open(store::Store& store,
                                                                 const std::string& state_dir);
  // Over a box given in memory, with no key file (tests).
  SecretStore(store::Store& store, SecretBox box) : store_(store), box_(std::move(box)) {}

  SecretStore(const SecretStore&) = delete;
  SecretStore& operator=(const SecretStore&) = delete;

  // Whether Open made a new key file (for the start's log line).
  bool made_key() const { return made_key_; }
  const std::string& key_id() const { return box_.key_id(); }

  // Seals `value` and stores it as `tenant`'s secret `name`, version 1. kInvalidArgument for a
  // bad tenant, name (api::CheckSecretName) or value (api::CheckSecretValue); kAlreadyExists if
  // the tenant has a secret of that name.
  [[nodiscard]] Result<SecretInfo> Create(std::string_view tenant, std::string_view name,
                                          std::string_view value);
  // Rotates: `value` replaces the secret's, its version goes up by one; what Value() returns
  // is the new value from the moment this returns. kNotFound if the tenant has no such secret.
  [[nodiscard]] Result<SecretInfo> Update(std::string_view tenant, std::string_view name,
                                          std::string_view value);
  // kNotFound if the tenant has no such secret.
  [[nodiscard]] Status Delete(std::string_view tenant, std::string_view name);
  // The tenant's secrets by name.
  [[nodiscard]] Result<std::vector<SecretInfo>> List(std::string_view tenant);
  // kNotFound if the tenant has no such secret.
  [[nodiscard]] Result<SecretInfo> Get(std::string_view tenant, std::string_view name);
  // The value in clear, for the egress proxy: never to be shown through the API or logged.
  // kNotFound if the tenant has no such secret; kInternal "cannot be decrypted" if its stored
  // row does not open with this key for this tenant and name (changed, or moved from another
  // row).
  [[nodiscard]] Result<std::string> Value(std::string_view tenant, std::string_view name);
  // How many secrets are stored, every tenant's (for /metrics).
  [[nodiscard]] Result<int64_t> Count();

 private:
  struct Sealed {
    std::string ciphertext, nonce, key_id;
  };

  // What the tag authenticates besides the ciphertext: a row copied to another tenant or name
  // does not open.
  static std::string AdditionalData(std::string_view tenant, std::string_view name);
  // Seals `value` for `tenant`'s `name` into a record for the store.
  [[nodiscard]] Result<store::SecretRecord> SealRecord(std::string_view tenant,
                                                       std::string_view name,
                                                       std::string_view value) const;
  // Replaces (or with nullptr removes) the cached row; bumps generation_. Caller holds
  // write_mu_.
  void CacheWritten(std::string_view tenant, std::string_view name,
                    std::shared_ptr<const Sealed> sealed);

  store::Store& store_;
  SecretBox box_;
  bool made_key_ = false;
  std::mutex write_mu_;
  std::shared_mutex cache_mu_;
  // By "tenant/name" (neither holds a '/'); guarded by cache_mu_.
  std::unordered_map<std::string, std::shared_ptr<const Sealed>> cache_;
  // Changes at every write (guarded by cache_mu_): a row read from the store while it changed
  // may be older than the write, and is not cached.
  uint64_t generation_ = 0;
};

}  // namespace airlock::daemon
