#include "daemon/server/secret_box.h"

#include <fcntl.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/rand.h>
#include <sys/stat.h>
#include <unistd.h>

#include <climits>

#include "common/sha256.h"
#include "common/syscall.h"
#include "common/unique_fd.h"

namespace airlock::daemon {
namespace {

// Names the key in the database; a label keeps the digest apart from any other use of the key.
constexpr std::string_view kKeyIdLabel = "airlock secrets.key id v1";

struct CipherContextFree {
  void operator()(EVP_CIPHER_CTX* ctx) const { EVP_CIPHER_CTX_free(ctx); }
};
using CipherContext = std::unique_ptr<EVP_CIPHER_CTX, CipherContextFree>;

Error OpenSslError(std::string_view what) {
  return Error(ErrorCode::kInternal, "AES-256-GCM: " + std::string(what) + " failed");
}

const unsigned char* Bytes(std::string_view s) {
  return reinterpret_cast<const unsigned char*>(s.data());
}

std::string ModeText(mode_t mode) {
  char buf[8];
  std::snprintf(buf, sizeof buf, "%04o", static_cast<unsigned>(mode & 07777));
  return buf;
}

}  // namespace

void SecretBox::Wipe::operator()(Key* key) const {
  OPENSSL_cleanse(key->data(), key->size());
  delete key;
}

SecretBox::SecretBox(const Key& key) : key_(new Key(key)) {
  Sha256 digest;
  digest.Update(kKeyIdLabel);
  digest.Update(key.data(), key.size());
  key_id_ = digest.Hex().substr(0, 16);
}

SecretBox SecretBox::FromKey(const Key& key) { return SecretBox(key); }

Result<SecretBox> SecretBox::Load(const std::string& path) {
  // O_NOFOLLOW: a symlink is refused (ELOOP) rather than followed to a file someone else chose.
  auto fd = OpenFile(path, O_RDONLY | O_NOFOLLOW);
  if (!fd) {
    const int err = fd.error().sys_errno();
    if (err == ENOENT) return Fail(ErrorCode::kNotFound, path + " does not exist");
    if (err == ELOOP) {
      return Fail(ErrorCode::kFailedPrecondition,
                  path + " is a symbolic link; the secrets key must be a regular file");
    }
    return std::unexpected(std::move(fd.error()).Wrap("reading the secrets key"));
  }
  struct stat st {};
  if (::fstat(fd->get(), &st) != 0) return FailErrno("stat " + path, errno);
  if (!S_ISREG(st.st_mode)) {
    return Fail(ErrorCode::kFailedPrecondition,
                path + " is not a regular file; the secrets key must be one");
  }
  if (st.st_uid != ::geteuid()) {
    const std::string owners = "uid " + std::to_string(st.st_uid) + ", not by airlockd's (" +
                               std::to_string(::geteuid()) + ")";
    return Fail(ErrorCode::kFailedPrecondition,
                path + " is owned by " + owners +
                    ": the key to every secret must be airlockd's alone; chown it");
  }
  if ((st.st_mode & 077) != 0) {
    return Fail(ErrorCode::kFailedPrecondition,
                path + " has mode " + ModeText(st.st_mode) +
                    ": group or others may read or change the key to every secret. Run chmod "
                    "600 on it (and consider the key seen: rotate the secrets)");
  }
  if (st.st_size != static_cast<off_t>(kKeyBytes)) {
    return Fail(ErrorCode::kFailedPrecondition,
                path + " holds " + std::to_string(st.st_size) + " bytes, not " +
                    std::to_string(kKeyBytes) +
                    ": it is not a secrets key. Restore the file airlockd made (a new key "
                    "cannot open the secrets the old one sealed)");
  }
  Key key{};
  auto got = ReadFull(fd->get(), std::as_writable_bytes(std::span(key)));
  if (!got) return std::unexpected(std::move(got.error()).Wrap("reading " + path));
  if (*got != kKeyBytes) {
    OPENSSL_cleanse(key.data(), key.size());
    return Fail(ErrorCode::kFailedPrecondition, path + " changed while it was read");
  }
  SecretBox box(key);
  OPENSSL_cleanse(key.data(), key.size());
  return box;
}

Result<SecretBox> SecretBox::Create(const std::string& dir, const std::string& path) {
  Key key{};
  if (RAND_bytes(key.data(), static_cast<int>(key.size())) != 1) {
    return Fail(ErrorCode::kInternal, "RAND_bytes could not make a secrets key");
  }
  std::string_view bytes(reinterpret_cast<const char*>(key.data()), key.size());
  auto written = WriteNewPrivateFile(dir, path, bytes);
  if (!written) {
    OPENSSL_cleanse(key.data(), key.size());
    return std::unexpected(std::move(written.error()).Wrap("writing the secrets key"));
  }
  SecretBox box(key);
  OPENSSL_cleanse(key.data(), key.size());
  return box;
}

Result<SealedValue> SecretBox::Seal(std::string_view aad, std::string_view plaintext) const {
  if (plaintext.size() > INT_MAX - kTagBytes || aad.size() > INT_MAX) {
    return Fail(ErrorCode::kTooLarge, "a value to seal is over 2 GiB");
  }
  SealedValue out;
  out.nonce.resize(kNonceBytes);
  auto* nonce = reinterpret_cast<unsigned char*>(out.nonce.data());
  if (RAND_bytes(nonce, static_cast<int>(kNonceBytes)) != 1) {
    return std::unexpected(OpenSslError("RAND_bytes for a nonce"));
  }
  CipherContext ctx(EVP_CIPHER_CTX_new());
  int len = 0;
  out.ciphertext.resize(plaintext.size() + kTagBytes);
  auto* sealed = reinterpret_cast<unsigned char*>(out.ciphertext.data());
  if (!ctx || EVP_EncryptInit_ex(ctx.get(), EVP_aes_256_gcm(), nullptr, nullptr, nullptr) != 1 ||
      EVP_CIPHER_CTX_ctrl(ctx.get(), EVP_CTRL_GCM_SET_IVLEN, kNonceBytes, nullptr) != 1 ||
      EVP_EncryptInit_ex(ctx.get(), nullptr, nullptr, key_->data(), nonce) != 1 ||
      EVP_EncryptUpdate(ctx.get(), nullptr, &len, Bytes(aad), static_cast<int>(aad.size())) != 1 ||
      EVP_EncryptUpdate(ctx.get(), sealed, &len, Bytes(plaintext),
                        static_cast<int>(plaintext.size())) != 1) {
    return std::unexpected(OpenSslError("encrypting"));
  }
  int tail = 0;
  unsigned char* tag = sealed + plaintext.size();
  if (EVP_EncryptFinal_ex(ctx.get(), sealed + len, &tail) != 1 ||
      static_cast<size_t>(len + tail) != plaintext.size() ||
      EVP_CIPHER_CTX_ctrl(ctx.get(), EVP_CTRL_GCM_GET_TAG, kTagBytes, tag) != 1) {
    return std::unexpected(OpenSslError("finishing the encryption"));
  }
  return out;
}

Result<std::string> SecretBox::Open(std::string_view aad, std::string_view ciphertext,
                                    std::string_view nonce) const {
  if (nonce.size() != kNonceBytes || ciphertext.size() < kTagBytes || ciphertext.size() > INT_MAX ||
      aad.size() > INT_MAX) {
    return Fail(ErrorCode::kInternal, "not a sealed value (a " + std::to_string(nonce.size()) +
                                          "-byte nonce, " + std::to_string(ciphertext.size()) +
                                          " bytes of ciphertext and tag)");
  }
  const size_t size = ciphertext.size() - kTagBytes;
  std::string plaintext(size, '\0');
  auto* out = reinterpret_cast<unsigned char*>(plaintext.data());
  // OpenSSL's setter takes a non-const pointer but only reads the tag.
  std::string tag(ciphertext.substr(size));
  CipherContext ctx(EVP_CIPHER_CTX_new());
  int len = 0;
  if (!ctx || EVP_DecryptInit_ex(ctx.get(), EVP_aes_256_gcm(), nullptr, nullptr, nullptr) != 1 ||
      EVP_CIPHER_CTX_ctrl(ctx.get(), EVP_CTRL_GCM_SET_IVLEN, kNonceBytes, nullptr) != 1 ||
      EVP_DecryptInit_ex(ctx.get(), nullptr, nullptr, key_->data(), Bytes(nonce)) != 1 ||
      EVP_DecryptUpdate(ctx.get(), nullptr, &len, Bytes(aad), static_cast<int>(aad.size())) != 1 ||
      EVP_DecryptUpdate(ctx.get(), out, &len, Bytes(ciphertext), static_cast<int>(size)) != 1 ||
      EVP_CIPHER_CTX_ctrl(ctx.get(), EVP_CTRL_GCM_SET_TAG, kTagBytes, tag.data()) != 1) {
    OPENSSL_cleanse(plaintext.data(), plaintext.size());
    return std::unexpected(OpenSslError("decrypting"));
  }
  int tail = 0;
  if (EVP_DecryptFinal_ex(ctx.get(), out + len, &tail) != 1) {
    // What was decrypted is not to be trusted, nor shown: it goes.
    OPENSSL_cleanse(plaintext.data(), plaintext.size());
    return Fail(ErrorCode::kInternal,
                "the tag does not match: the ciphertext, its nonce or where it is stored was "
                "changed, or another key sealed it");
  }
  return plaintext;
}

}  // namespace airlock::daemon
