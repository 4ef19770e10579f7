#include "daemon/api/utf8.h"

#include <cstddef>
#include <cstdint>

namespace airlock::api {

bool IsValidUtf8(std::string_view bytes) {
  const auto* p = reinterpret_cast<const uint8_t*>(bytes.data());
  const size_t n = bytes.size();
  size_t i = 0;
  while (i < n) {
    const uint8_t b0 = p[i];
    if (b0 < 0x80) {
      ++i;
      continue;
    }
    // The lead byte fixes the length and the allowed range of the second byte; the ranges are
    // what exclude overlongs (E0, F0), surrogates (ED) and code points above U+10FFFF (F4).
    size_t len = 0;
    uint8_t lo = 0x80;
    uint8_t hi = 0xBF;
    if (b0 >= 0xC2 && b0 <= 0xDF) {
      len = 2;
    } else if (b0 == 0xE0) {
      len = 3;
      lo = 0xA0;
    } else if ((b0 >= 0xE1 && b0 <= 0xEC) || b0 == 0xEE || b0 == 0xEF) {
      len = 3;
    } else if (b0 == 0xED) {
      len = 3;
      hi = 0x9F;
    } else if (b0 == 0xF0) {
      len = 4;
      lo = 0x90;
    } else if (b0 >= 0xF1 && b0 <= 0xF3) {
      len = 4;
    } else if (b0 == 0xF4) {
      len = 4;
      hi = 0x8F;
    } else {
      return false;  // a continuation byte, C0/C1 (always overlong) or F5..FF
    }
    if (n - i < len) return false;
    if (p[i + 1] < lo || p[i + 1] > hi) return false;
    for (size_t k = 2; k < len; ++k) {
      if (p[i + k] < 0x80 || p[i + k] > 0xBF) return false;
    }
    i += len;
  }
  return true;
}

}  // namespace airlock::api
