#pragma once
// SHA-256 as lowercase hex, for the digests that name layers, image blobs and API keys.
// Header-only: whoever includes it links OpenSSL::Crypto (libssl-dev).

#include <openssl/evp.h>

#include <memory>
#include <string>
#include <string_view>

#include "common/error.h"

namespace airlock {

class Sha256 {
 public:
  Sha256() : ctx_(EVP_MD_CTX_new()) {
    AIRLOCK_CHECK(ctx_ && EVP_DigestInit_ex(ctx_.get(), EVP_sha256(), nullptr) == 1);
  }
  void Update(const void* data, size_t size) { EVP_DigestUpdate(ctx_.get(), data, size); }
  void Update(std::string_view data) { Update(data.data(), data.size()); }
  // The digest of `data` alone.
  static std::string Of(std::string_view data) {
    Sha256 h;
    h.Update(data);
    return h.Hex();
  }
  // The digest of everything given so far; the hash is finished after this.
  std::string Hex() {
    unsigned char out[EVP_MAX_MD_SIZE];
    unsigned int n = 0;
    EVP_DigestFinal_ex(ctx_.get(), out, &n);
    static constexpr char kHex[] = "0123456789abcdef";
    std::string hex;
    for (unsigned int i = 0; i < n; ++i) {
      hex += kHex[out[i] >> 4];
      hex += kHex[out[i] & 15];
    }
    return hex;
  }

 private:
  struct Free {
    void operator()(EVP_MD_CTX* ctx) const { EVP_MD_CTX_free(ctx); }
  };
  std::unique_ptr<EVP_MD_CTX, Free> ctx_;
};

}  // namespace airlock
