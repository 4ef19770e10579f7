#include "daemon/api/query.h"

#include "daemon/api/json.h"

namespace airlock::api {
namespace {

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

Result<std::string> Decode(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (c == '+') {
      out += ' ';
    } else if (c == '%') {
      const bool complete = i + 2 < text.size();
      const int hi = complete ? HexValue(text[i + 1]) : -1;
      const int lo = complete ? HexValue(text[i + 2]) : -1;
      if (hi < 0 || lo < 0) {
        return Fail(ErrorCode::kInvalidArgument, "query string has a bad percent escape in " +
                                                     Quote(text) +
                                                     "; '%' must be followed by two hex digits");
      }
      out += static_cast<char>(hi * 16 + lo);
      i += 2;
    } else {
      out += c;
    }
  }
  return out;
}

}  // namespace

Result<QueryParams> ParseQueryString(std::string_view raw) {
  QueryParams params;
  while (!raw.empty()) {
    const size_t amp = raw.find('&');
    std::string_view segment = raw.substr(0, amp);
    raw = amp == std::string_view::npos ? std::string_view() : raw.substr(amp + 1);
    if (segment.empty()) continue;
    const size_t eq = segment.find('=');
    auto name = Decode(segment.substr(0, eq));
    if (!name) return std::unexpected(std::move(name.error()));
    if (name->empty()) {
      return Fail(ErrorCode::kInvalidArgument,
                  "query string has a parameter with no name: " + Quote(segment));
    }
    std::string value;
    if (eq != std::string_view::npos) {
      auto decoded = Decode(segment.substr(eq + 1));
      if (!decoded) return std::unexpected(std::move(decoded.error()));
      value = std::move(*decoded);
    }
    params.emplace_back(std::move(*name), std::move(value));
  }
  return params;
}

}  // namespace airlock::api
