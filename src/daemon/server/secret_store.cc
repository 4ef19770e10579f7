#include "daemon/server/secret_store.h"

#include "common/log.h"
#include "daemon/api/types.h"

namespace airlock::daemon {
namespace {

SecretInfo InfoOf(const store::SecretRecord& r) {
  return {.tenant = r.tenant,
          .name = r.name,
          .version = r.version,
          .created_at_ms = r.created_at_ms,
          .updated_at_ms = r.updated_at_ms};
}

std::string CacheKeyOf(std::string_view tenant, std::string_view name) {
  std::string key(tenant);
  key += '/';
  key += name;
  return key;
}

// The tenant and the name, checked before anything is sealed, stored or looked up.
Status CheckTenantAndName(std::string_view tenant, std::string_view name) {
  if (auto st = store::ValidateTenant(tenant); !st) return st;
  return api::CheckSecretName(name);
}

}  // namespace

Result<std::unique_ptr<SecretStore>> SecretStore::Open(store::Store& store,
                                                       const std::string& state_dir) {
  const std::string path = state_dir + "/" + std::string(kKeyFile);
  auto by_key = store.CountSecretsByKey();
  if (!by_key) return std::unexpected(std::move(by_key.error()).Wrap("opening the secrets"));
  int64_t stored = 0;
  for (const auto& [key_id, n] : *by_key) stored += n;

  bool made = false;
  auto box = SecretBox::Load(path);
  if (!box && box.error().code() == ErrorCode::kNotFound) {
    if (stored > 0) {
      // Fail closed: a new key would not open them, and would hide that they were lost.
      return Fail(ErrorCode::kFailedPrecondition,
                  path + " is missing, and the store holds " + std::to_string(stored) +
                      " secret(s) sealed with it: they cannot be decrypted without it. Restore "
                      "the file from a backup of this state dir; airlockd makes a new key only "
                      "while no secret is stored");
    }
    box = SecretBox::Create(state_dir, path);
    made = true;
  }
  if (!box) return std::unexpected(std::move(box.error()));
  for (const auto& [key_id, n] : *by_key) {
    if (key_id != box->key_id()) {
      return Fail(ErrorCode::kFailedPrecondition,
                  path + " is not the key that sealed " + std::to_string(n) +
                      " stored secret(s) (key id " + key_id + "; the file's is " + box->key_id() +
                      "): restore the secrets.key that belongs with this database");
    }
  }
  auto secrets = std::make_unique<SecretStore>(store, std::move(*box));
  secrets->made_key_ = made;
  return secrets;
}

std::string SecretStore::AdditionalData(std::string_view tenant, std::string_view name) {
  // Neither a tenant nor a name holds NUL, so the three parts cannot be regrouped.
  std::string aad("airlock secret v1");
  aad += '\0';
  aad += tenant;
  aad += '\0';
  aad += name;
  return aad;
}

Result<store::SecretRecord> SecretStore::SealRecord(std::string_view tenant, std::string_view name,
                                                    std::string_view value) const {
  if (auto st = CheckTenantAndName(tenant, name); !st) return std::unexpected(st.error());
  if (auto st = api::CheckSecretValue(value); !st) return std::unexpected(st.error());
  auto sealed = box_.Seal(AdditionalData(tenant, name), value);
  if (!sealed) {
    return std::unexpected(std::move(sealed.error()).Wrap("sealing secret " + std::string(name)));
  }
  return store::SecretRecord{.tenant = std::string(tenant),
                             .name = std::string(name),
                             .ciphertext = std::move(sealed->ciphertext),
                             .nonce = std::move(sealed->nonce),
                             .key_id = box_.key_id()};
}

void SecretStore::CacheWritten(std::string_view tenant, std::string_view name,
                               std::shared_ptr<const Sealed> sealed) {
  std::unique_lock lock(cache_mu_);
  ++generation_;
  if (sealed) {
    cache_[CacheKeyOf(tenant, name)] = std::move(sealed);
  } else {
    cache_.erase(CacheKeyOf(tenant, name));
  }
}

Result<SecretInfo> SecretStore::Create(std::string_view tenant, std::string_view name,
                                       std::string_view value) {
  auto record = SealRecord(tenant, name, value);
  if (!record) return std::unexpected(std::move(record.error()));
  std::lock_guard write(write_mu_);
  auto stored = store_.InsertSecret(*record);
  if (!stored) return std::unexpected(std::move(stored.error()));
  CacheWritten(tenant, name,
               std::make_shared<const Sealed>(Sealed{std::move(record->ciphertext),
                                                     std::move(record->nonce), record->key_id}));
  spdlog::info("secret {} of tenant {}: created", name, tenant);
  return InfoOf(*stored);
}

Result<SecretInfo> SecretStore::Update(std::string_view tenant, std::string_view name,
                                       std::string_view value) {
  auto record = SealRecord(tenant, name, value);
  if (!record) return std::unexpected(std::move(record.error()));
  std::lock_guard write(write_mu_);
  auto stored = store_.UpdateSecret(*record);
  if (!stored) return std::unexpected(std::move(stored.error()));
  CacheWritten(tenant, name,
               std::make_shared<const Sealed>(Sealed{std::move(record->ciphertext),
                                                     std::move(record->nonce), record->key_id}));
  spdlog::info("secret {} of tenant {}: rotated to version {}", name, tenant, stored->version);
  return InfoOf(*stored);
}

Status SecretStore::Delete(std::string_view tenant, std::string_view name) {
  if (auto st = CheckTenantAndName(tenant, name); !st) return st;
  std::lock_guard write(write_mu_);
  if (auto st = store_.DeleteSecret(tenant, name); !st) return st;
  CacheWritten(tenant, name, nullptr);
  spdlog::info("secret {} of tenant {}: deleted", name, tenant);
  return {};
}

Result<std::vector<SecretInfo>> SecretStore::List(std::string_view tenant) {
  auto records = store_.ListSecrets(tenant);
  if (!records) return std::unexpected(std::move(records.error()));
  std::vector<SecretInfo> out;
  out.reserve(records->size());
  for (const store::SecretRecord& r : *records) out.push_back(InfoOf(r));
  return out;
}

Result<SecretInfo> SecretStore::Get(std::string_view tenant, std::string_view name) {
  if (auto st = CheckTenantAndName(tenant, name); !st) return std::unexpected(st.error());
  auto record = store_.GetSecret(tenant, name);
  if (!record) return std::unexpected(std::move(record.error()));
  return InfoOf(*record);
}

Result<std::string> SecretStore::Value(std::string_view tenant, std::string_view name) {
  if (auto st = CheckTenantAndName(tenant, name); !st) return std::unexpected(st.error());
  const std::string key = CacheKeyOf(tenant, name);
  std::shared_ptr<const Sealed> sealed;
  uint64_t generation = 0;
  {
    std::shared_lock lock(cache_mu_);
    if (auto it = cache_.find(key); it != cache_.end()) sealed = it->second;
    generation = generation_;
  }
  if (!sealed) {
    auto record = store_.GetSecret(tenant, name);
    if (!record) return std::unexpected(std::move(record.error()));
    sealed = std::make_shared<const Sealed>(
        Sealed{std::move(record->ciphertext), std::move(record->nonce), std::move(record->key_id)});
    std::unique_lock lock(cache_mu_);
    // A write since the lookup may have committed before or after this read: only a row read
    // with no write in between is known to be current.
    if (generation_ == generation) cache_.emplace(key, sealed);
  }
  const std::string what = "secret " + std::string(name) + " of tenant " + std::string(tenant);
  if (sealed->key_id != box_.key_id()) {
    return Fail(ErrorCode::kInternal, what + " cannot be decrypted: key " + sealed->key_id +
                                          " sealed it, not this daemon's (" + box_.key_id() + ")");
  }
  auto value = box_.Open(AdditionalData(tenant, name), sealed->ciphertext, sealed->nonce);
  if (!value) {
    return std::unexpected(std::move(value.error()).Wrap(what + " cannot be decrypted"));
  }
  return value;
}

Result<int64_t> SecretStore::Count() {
  auto by_key = store_.CountSecretsByKey();
  if (!by_key) return std::unexpected(std::move(by_key.error()));
  int64_t n = 0;
  for (const auto& [key_id, count] : *by_key) n += count;
  return n;
}

}  // namespace airlock::daemon
