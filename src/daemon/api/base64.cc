#include "daemon/api/base64.h"

#include <array>
#include <cstddef>
#include <cstdint>

namespace airlock::api {
namespace {

constexpr char kAlphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

constexpr std::array<int8_t, 256> MakeDecodeTable() {
  std::array<int8_t, 256> table{};
  for (auto& v : table) v = -1;
  for (int i = 0; i < 64; ++i) table[static_cast<uint8_t>(kAlphabet[i])] = static_cast<int8_t>(i);
  return table;
}
constexpr std::array<int8_t, 256> kDecode = MakeDecodeTable();

}  // namespace

std::string Base64Encode(std::string_view bytes) {
  std::string out;
  out.reserve((bytes.size() + 2) / 3 * 4);
  const auto* p = reinterpret_cast<const uint8_t*>(bytes.data());
  size_t i = 0;
  for (; i + 3 <= bytes.size(); i += 3) {
    const uint32_t v = (uint32_t{p[i]} << 16) | (uint32_t{p[i + 1]} << 8) | p[i + 2];
    out += kAlphabet[(v >> 18) & 63];
    out += kAlphabet[(v >> 12) & 63];
    out += kAlphabet[(v >> 6) & 63];
    out += kAlphabet[v & 63];
  }
  const size_t rest = bytes.size() - i;
  if (rest == 1) {
    const uint32_t v = uint32_t{p[i]} << 16;
    out += kAlphabet[(v >> 18) & 63];
    out += kAlphabet[(v >> 12) & 63];
    out += "==";
  } else if (rest == 2) {
    const uint32_t v = (uint32_t{p[i]} << 16) | (uint32_t{p[i + 1]} << 8);
    out += kAlphabet[(v >> 18) & 63];
    out += kAlphabet[(v >> 12) & 63];
    out += kAlphabet[(v >> 6) & 63];
    out += '=';
  }
  return out;
}

Result<std::string> Base64Decode(std::string_view text) {
  if (text.size() % 4 != 0) {
    return Fail(ErrorCode::kInvalidArgument,
                "base64 length must be a multiple of 4, got " + std::to_string(text.size()));
  }
  std::string out;
  out.reserve(text.size() / 4 * 3);
  for (size_t i = 0; i < text.size(); i += 4) {
    const bool last = i + 4 == text.size();
    int pad = 0;
    if (last) pad = (text[i + 3] == '=') + (text[i + 3] == '=' && text[i + 2] == '=');
    uint32_t v = 0;
    for (size_t k = 0; k < 4; ++k) {
      const auto c = static_cast<uint8_t>(text[i + k]);
      if (k >= 4 - static_cast<size_t>(pad)) {
        v <<= 6;  // the padding, checked above
        continue;
      }
      const int8_t d = kDecode[c];
      if (d < 0) {
        static constexpr char kHex[] = "0123456789abcdef";
        const std::string what =
            c == '=' ? std::string("misplaced '='")
                     : std::string("invalid character 0x") + kHex[c >> 4] + kHex[c & 15];
        return Fail(ErrorCode::kInvalidArgument,
                    "invalid base64: " + what + " at offset " + std::to_string(i + k));
      }
      v = (v << 6) | static_cast<uint32_t>(d);
    }
    // Non-canonical encodings set bits that the padding discards: refuse them.
    if ((pad == 1 && (v & 0xFF) != 0) || (pad == 2 && (v & 0xFFFF) != 0)) {
      return Fail(ErrorCode::kInvalidArgument,
                  "invalid base64: non-zero padding bits at offset " + std::to_string(i));
    }
    out += static_cast<char>((v >> 16) & 0xFF);
    if (pad < 2) out += static_cast<char>((v >> 8) & 0xFF);
    if (pad < 1) out += static_cast<char>(v & 0xFF);
  }
  return out;
}

}  // namespace airlock::api
