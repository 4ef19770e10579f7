#pragma once
// SecretBox: the daemon's secrets key and what it does, AES-256-GCM (OpenSSL EVP), and the key
// file it comes from, STATE_DIR/secrets.key (docs/design/secrets-store.md). The key never
// leaves this object: not in a message, not in the database (which holds key_id(), a digest
// that does not reveal it). Its memory is wiped when the box goes.
//
// Thread-safe: Seal and Open use a cipher context of their own per call; the key is read-only
// after construction.

#include <array>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "common/error.h"

namespace airlock::daemon {

// A value sealed by SecretBox::Seal.
struct SealedValue {
  std::string ciphertext;  // the value's bytes encrypted, then the 16-byte GCM tag
  std::string nonce;       // 12 random bytes, never used twice with the key
};

class SecretBox {
 public:
  static constexpr size_t kKeyBytes = 32;    // AES-256
  static constexpr size_t kNonceBytes = 12;  // GCM's 96-bit IV
  static constexpr size_t kTagBytes = 16;
  using Key = std::array<unsigned char, kKeyBytes>;

  // Reads the key file at `path`. kNotFound if there is none; kFailedPrecondition, saying what
  // to do, unless it is a regular file (not a symlink) owned by this process's user, with no
  // permission for group or others, of exactly kKeyBytes bytes.
  [[nodiscard]] static Result<SecretBox> Load(const std::string& path);
  // Makes a new random key (RAND_bytes) and writes it to `path` in directory `dir`: 0600,
  // fsynced, never seen half written; fails if `path` exists.
  [[nodiscard]] static Result<SecretBox> Create(const std::string& dir, const std::string& path);
  // A box over a key held in memory (tests).
  static SecretBox FromKey(const Key& key);

  // The key's name as stored beside what it sealed: 16 hex digits of a SHA-256 over a label
  // and the key. Tells keys apart; reveals nothing of the key.
  const std::string& key_id() const { return key_id_; }

  // Encrypts `plaintext` under a fresh random nonce, authenticating `aad` with it (`aad` is
  // not stored: Open must be given the same). kInternal only if OpenSSL fails.
  [[nodiscard]] Result<SealedValue> Seal(std::string_view aad, std::string_view plaintext) const;
  // The plaintext, if `ciphertext` (with its tag) was sealed by this key with `nonce` and `aad`;
  // kInternal "the tag does not match" otherwise (a changed byte, another key, another aad).
  // The message never holds any of the plaintext.
  [[nodiscard]] Result<std::string> Open(std::string_view aad, std::string_view ciphertext,
                                         std::string_view nonce) const;

 private:
  struct Wipe {
    void operator()(Key* key) const;
  };
  explicit SecretBox(const Key& key);
  std::unique_ptr<Key, Wipe> key_;
  std::string key_id_;
};

}  // namespace airlock::daemon
