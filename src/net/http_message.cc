#include "net/http_message.h"

#include <cstring>

namespace airlock::net::http {
namespace {

// Content-Length and chunk sizes: more digits than this are refused rather than risk overflow
// (15 decimal digits is 999 TB; 15 hex digits, 2^60 bytes).
constexpr size_t kMaxLengthDigits = 15;

char Lower(char c) { return (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c; }

std::string LowerCopy(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = Lower(c);
  return out;
}

bool IsTokenChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
         (c != '\0' && std::strchr("!#$%&'*+-.^_`|~", c) != nullptr);
}

bool IsToken(std::string_view s) {
  if (s.empty()) return false;
  for (char c : s) {
    if (!IsTokenChar(c)) return false;
  }
  return true;
}

bool IsHexDigit(char c) {
  return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

// A field value's byte: anything but control characters (HTAB allowed) and DEL.
bool IsFieldValueChar(char c) {
  const auto u = static_cast<unsigned char>(c);
  return (u >= 0x20 && u != 0x7f) || c == '\t';
}

std::string_view TrimOws(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

std::unexpected<Error> Bad(std::string what) {
  return Fail(ErrorCode::kInvalidArgument, std::move(what));
}

// One field line ("Name: value", no CRLF) into `fields`.
Status ParseFieldLine(std::string_view line,
                      std::vector<std::pair<std::string, std::string>>& fields) {
  if (line[0] == ' ' || line[0] == '\t') return Bad("folded header line");
  const size_t colon = line.find(':');
  if (colon == std::string_view::npos || colon == 0) return Bad("malformed header line");
  const std::string_view name = line.substr(0, colon);
  // A space before the colon is where parsers disagree ("Host : x"): refused (RFC 9112 5.1).
  if (!IsToken(name)) return Bad("malformed header name");
  const std::string_view value = TrimOws(line.substr(colon + 1));
  for (char c : value) {
    if (!IsFieldValueChar(c)) return Bad("control character in a header value");
  }
  fields.emplace_back(std::string(name), std::string(value));
  return {};
}

// Splits a head into its first line and field lines, checking the line ends. `what`: "request"
// or "response", for the messages.
Result<std::vector<std::string_view>> SplitLines(std::string_view text, std::string_view what) {
  for (size_t i = 0; i < text.size(); ++i) {
    // Bare CR or LF and NUL are how requests get smuggled past one parser and not another.
    if (text[i] == '\n' && (i == 0 || text[i - 1] != '\r'))
      return Bad("bare LF in " + std::string(what));
    if (text[i] == '\r' && (i + 1 >= text.size() || text[i + 1] != '\n')) {
      return Bad("bare CR in " + std::string(what));
    }
    if (text[i] == '\0') return Bad("NUL in " + std::string(what));
  }
  if (!text.ends_with("\r\n\r\n")) return Bad("incomplete " + std::string(what) + " head");
  std::vector<std::string_view> lines;
  size_t pos = 0;
  while (pos < text.size()) {
    const size_t end = text.find("\r\n", pos);
    if (end == pos) break;  // the blank line
    lines.push_back(text.substr(pos, end - pos));
    pos = end + 2;
  }
  if (lines.empty()) return Bad("empty " + std::string(what) + " line");
  return lines;
}

Result<uint64_t> ParseDigits(std::string_view s, std::string_view what) {
  if (s.empty() || s.size() > kMaxLengthDigits) return Bad("malformed " + std::string(what));
  uint64_t n = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return Bad("malformed " + std::string(what));
    n = n * 10 + static_cast<uint64_t>(c - '0');
  }
  return n;
}

// The comma-separated elements of every value of `name`, OWS trimmed; an empty element is an
// error (where "a,,b" means two things to two parsers).
Result<std::vector<std::string>> ListElements(const Head& head, std::string_view name) {
  std::vector<std::string> out;
  for (std::string_view value : head.Values(name)) {
    size_t pos = 0;
    while (true) {
      const size_t comma = value.find(',', pos);
      std::string_view element = TrimOws(value.substr(pos, comma - pos));
      if (element.empty()) return Bad("empty element in " + std::string(name));
      out.emplace_back(element);
      if (comma == std::string_view::npos) break;
      pos = comma + 1;
    }
  }
  return out;
}

// chunk-ext = *( BWS ";" BWS ext-name [ BWS "=" BWS ext-val ] ), ext-val a token or a quoted
// string (RFC 9112 7.1.1). Only checked: the proxy drops extensions.
bool ValidChunkExtensions(std::string_view s) {
  size_t i = 0;
  auto skip_bws = [&] {
    while (i < s.size() && (s[i] == ' ' || s[i] == '\t')) ++i;
  };
  auto token = [&] {
    const size_t start = i;
    while (i < s.size() && IsTokenChar(s[i])) ++i;
    return i > start;
  };
  // Whitespace only around ';' and '=': "5 " or "5;a=b " are refused, as some parsers would
  // read them one way and some another.
  while (i < s.size()) {
    skip_bws();
    if (i == s.size() || s[i] != ';') return false;
    ++i;
    skip_bws();
    if (!token()) return false;
    const size_t after_name = i;
    skip_bws();
    if (i == s.size() || s[i] != '=') {
      i = after_name;
      continue;
    }
    ++i;
    skip_bws();
    if (i < s.size() && s[i] == '"') {
      ++i;
      bool closed = false;
      while (i < s.size() && !closed) {
        const auto u = static_cast<unsigned char>(s[i]);
        if (s[i] == '"') {
          closed = true;
        } else if (s[i] == '\\') {
          if (i + 1 >= s.size() || !IsFieldValueChar(s[i + 1])) return false;
          ++i;
        } else if (!(u == '\t' || (u >= 0x20 && u != 0x7f))) {
          return false;
        }
        ++i;
      }
      if (!closed) return false;
    } else if (!token()) {
      return false;
    }
  }
  return true;
}

}  // namespace

bool IEquals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (Lower(a[i]) != Lower(b[i])) return false;
  }
  return true;
}

std::vector<std::string_view> Head::Values(std::string_view name) const {
  std::vector<std::string_view> out;
  for (const auto& [k, v] : fields) {
    if (IEquals(k, name)) out.push_back(v);
  }
  return out;
}

std::vector<std::string> Head::ConnectionOptions() const {
  std::vector<std::string> out;
  for (std::string_view value : Values("connection")) {
    size_t pos = 0;
    while (pos <= value.size()) {
      const size_t comma = value.find(',', pos);
      std::string_view option = TrimOws(value.substr(pos, comma - pos));
      if (!option.empty()) out.push_back(LowerCopy(option));
      if (comma == std::string_view::npos) break;
      pos = comma + 1;
    }
  }
  return out;
}

bool Head::ConnectionHas(std::string_view option) const {
  for (const std::string& o : ConnectionOptions()) {
    if (IEquals(o, option)) return true;
  }
  return false;
}

Result<Head> ParseRequestHead(std::string_view text) {
  auto lines = SplitLines(text, "request");
  if (!lines) return std::unexpected(lines.error());
  Head out;
  const std::string_view line = (*lines)[0];
  const size_t sp1 = line.find(' ');
  const size_t sp2 = sp1 == std::string_view::npos ? sp1 : line.find(' ', sp1 + 1);
  if (sp2 == std::string_view::npos || line.find(' ', sp2 + 1) != std::string_view::npos) {
    return Bad("malformed request line");
  }
  out.method = std::string(line.substr(0, sp1));
  out.target = std::string(line.substr(sp1 + 1, sp2 - sp1 - 1));
  out.version = std::string(line.substr(sp2 + 1));
  if (!IsToken(out.method) || out.target.empty()) return Bad("malformed request line");
  for (char c : out.target) {
    if (static_cast<unsigned char>(c) <= 0x20 || static_cast<unsigned char>(c) >= 0x7f) {
      return Bad("malformed request target");
    }
  }
  if (out.version != "HTTP/1.1" && out.version != "HTTP/1.0") return Bad("not HTTP/1.x");
  for (size_t i = 1; i < lines->size(); ++i) {
    if (auto st = ParseFieldLine((*lines)[i], out.fields); !st) return std::unexpected(st.error());
  }
  return out;
}

Result<Head> ParseResponseHead(std::string_view text) {
  auto lines = SplitLines(text, "response");
  if (!lines) return std::unexpected(lines.error());
  Head out;
  // HTTP/1.x SP 3DIGIT [SP reason]; a missing reason is common enough to accept.
  const std::string_view line = (*lines)[0];
  if (line.size() < 12 || (line.substr(0, 9) != "HTTP/1.1 " && line.substr(0, 9) != "HTTP/1.0 ")) {
    return Bad("malformed status line");
  }
  out.version = std::string(line.substr(0, 8));
  for (size_t i = 9; i < 12; ++i) {
    if (line[i] < '0' || line[i] > '9') return Bad("malformed status code");
  }
  out.status = (line[9] - '0') * 100 + (line[10] - '0') * 10 + (line[11] - '0');
  if (out.status < 100) return Bad("malformed status code");
  if (line.size() > 12) {
    if (line[12] != ' ') return Bad("malformed status line");
    out.reason = std::string(line.substr(13));
    for (char c : out.reason) {
      if (!IsFieldValueChar(c)) return Bad("control character in the reason phrase");
    }
  }
  for (size_t i = 1; i < lines->size(); ++i) {
    if (auto st = ParseFieldLine((*lines)[i], out.fields); !st) return std::unexpected(st.error());
  }
  return out;
}

Result<Framing> RequestFraming(const Head& request) {
  const auto lengths = request.Values("content-length");
  const auto codings = request.Values("transfer-encoding");
  if (!lengths.empty() && !codings.empty()) {
    return Bad("both Content-Length and Transfer-Encoding");
  }
  if (!codings.empty()) {
    if (request.version == "HTTP/1.0") return Bad("Transfer-Encoding in an HTTP/1.0 request");
    if (codings.size() > 1 || !IEquals(codings[0], "chunked")) {
      return Bad("Transfer-Encoding must be exactly \"chunked\"");
    }
    return Framing{Framing::Kind::kChunked, 0};
  }
  if (lengths.size() > 1) return Bad("more than one Content-Length header");
  if (lengths.empty()) return Framing{};
  auto n = ParseDigits(lengths[0], "Content-Length");
  if (!n) return std::unexpected(n.error());
  return Framing{Framing::Kind::kLength, *n};
}

Result<Framing> ResponseFraming(const Head& response, std::string_view method) {
  if (method == "HEAD" || response.status / 100 == 1 || response.status == 204 ||
      response.status == 304) {
    return Framing{};
  }
  const auto lengths = response.Values("content-length");
  if (!response.Values("transfer-encoding").empty()) {
    if (!lengths.empty()) return Bad("both Content-Length and Transfer-Encoding");
    auto codings = ListElements(response, "transfer-encoding");
    if (!codings) return std::unexpected(codings.error());
    for (size_t i = 0; i < codings->size(); ++i) {
      if (!IsToken((*codings)[i])) return Bad("malformed Transfer-Encoding");
      if (IEquals((*codings)[i], "chunked") && i + 1 != codings->size()) {
        return Bad("chunked is not the last transfer coding");
      }
    }
    // HTTP/1.0 has no chunked coding: such a message's framing is faulty (RFC 9112 6.1).
    if (response.version == "HTTP/1.0" || !IEquals(codings->back(), "chunked")) {
      return Framing{Framing::Kind::kUntilClose, 0};
    }
    return Framing{Framing::Kind::kChunked, 0};
  }
  if (lengths.size() > 1) return Bad("more than one Content-Length header");
  if (lengths.empty()) return Framing{Framing::Kind::kUntilClose, 0};
  auto n = ParseDigits(lengths[0], "Content-Length");
  if (!n) return std::unexpected(n.error());
  return Framing{Framing::Kind::kLength, *n};
}

bool IsHopByHop(std::string_view name) {
  for (std::string_view h :
       {"connection", "keep-alive", "proxy-connection", "proxy-authenticate", "proxy-authorization",
        "te", "trailer", "transfer-encoding", "upgrade"}) {
    if (IEquals(name, h)) return true;
  }
  return false;
}

Result<size_t> ChunkedDecoder::Feed(std::string_view in, std::string* data) {
  size_t i = 0;
  while (i < in.size() && state_ != State::kDone) {
    switch (state_) {
      case State::kData: {
        const size_t take = static_cast<size_t>(std::min<uint64_t>(left_, in.size() - i));
        data->append(in.substr(i, take));
        i += take;
        left_ -= take;
        if (left_ == 0) state_ = State::kDataCr;
        break;
      }
      case State::kDataCr:
      case State::kDataLf: {
        const char want = state_ == State::kDataCr ? '\r' : '\n';
        if (in[i++] != want) {
          state_ = State::kFailed;
          return Bad("chunk data not followed by CRLF");
        }
        state_ = state_ == State::kDataCr ? State::kDataLf : State::kSizeLine;
        break;
      }
      case State::kSizeLine:
      case State::kTrailer: {
        const char c = in[i++];
        if (state_ == State::kTrailer && ++trailer_bytes_ > limits_.max_trailer_bytes) {
          state_ = State::kFailed;
          return Bad("chunked trailer section over " + std::to_string(limits_.max_trailer_bytes) +
                     " bytes");
        }
        if (cr_) {
          cr_ = false;
          if (c != '\n') {
            state_ = State::kFailed;
            return Bad("bare CR in chunked framing");
          }
          if (auto st = EndOfLine(); !st) {
            state_ = State::kFailed;
            return std::unexpected(st.error());
          }
        } else if (c == '\r') {
          cr_ = true;
        } else if (c == '\n') {
          state_ = State::kFailed;
          return Bad("bare LF in chunked framing");
        } else if (c == '\0') {
          state_ = State::kFailed;
          return Bad("NUL in chunked framing");
        } else {
          line_.push_back(c);
          if (state_ == State::kSizeLine && line_.size() > limits_.max_size_line) {
            state_ = State::kFailed;
            return Bad("chunk size line over " + std::to_string(limits_.max_size_line) + " bytes");
          }
        }
        break;
      }
      case State::kDone:
        break;
      case State::kFailed:
        return Bad("malformed chunked body");
    }
  }
  if (state_ == State::kFailed) return Bad("malformed chunked body");
  return i;
}

Status ChunkedDecoder::EndOfLine() {
  const std::string line = std::move(line_);
  line_.clear();
  if (state_ == State::kTrailer) {
    if (line.empty()) {
      state_ = State::kDone;
      return {};
    }
    std::vector<std::pair<std::string, std::string>> ignored;
    return ParseFieldLine(line, ignored);  // checked, then dropped
  }
  size_t digits = 0;
  while (digits < line.size() && IsHexDigit(line[digits])) ++digits;
  if (digits == 0) return Bad("malformed chunk size");
  if (digits > kMaxLengthDigits) return Bad("chunk size too large");
  if (!ValidChunkExtensions(std::string_view(line).substr(digits))) {
    return Bad("malformed chunk extension");
  }
  uint64_t size = 0;
  for (size_t i = 0; i < digits; ++i) {
    const char c = Lower(line[i]);
    size = size * 16 + static_cast<uint64_t>(c <= '9' ? c - '0' : c - 'a' + 10);
  }
  left_ = size;
  state_ = size == 0 ? State::kTrailer : State::kData;
  return {};
}

std::string EncodeChunk(std::string_view data) {
  if (data.empty()) return "";
  static constexpr char kHex[] = "0123456789abcdef";
  std::string size;
  for (size_t n = data.size(); n > 0; n /= 16) size.insert(size.begin(), kHex[n % 16]);
  std::string out;
  out.reserve(size.size() + data.size() + 4);
  out.append(size).append("\r\n").append(data).append("\r\n");
  return out;
}

}  // namespace airlock::net::http
