#pragma once
// HTTP/1.1 message framing for the egress proxy (RFC 9112), read strictly: whatever two parsers
// could read two ways is refused, never guessed at, so the proxy and a server behind it cannot
// disagree on where one request ends and the next begins (request smuggling).
//
//   - heads: the request or status line and the header fields; bare CR or LF, NUL and other
//     control characters, obs-fold (a field line starting with a space) and malformed names are
//     errors;
//   - how a body is delimited (RequestFraming, ResponseFraming);
//   - chunked bodies, decoded as they arrive (ChunkedDecoder). The proxy forwards the data it
//     decoded in chunks of its own (EncodeChunk), so the framing a server sees is exactly the one
//     the proxy understood: no extensions, no trailers, sizes as the proxy counted them.
//
// Pure functions and a small state machine: no I/O, any thread.

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/error.h"

namespace airlock::net::http {

struct Head {
  // A request: method, target and version ("HTTP/1.1"); a response: version, status and reason.
  std::string method;
  std::string target;
  std::string version;
  int status = 0;
  std::string reason;
  std::vector<std::pair<std::string, std::string>> fields;  // in order, names as sent

  // The values of a field, by case-insensitive name.
  std::vector<std::string_view> Values(std::string_view name) const;
  // True when a Connection field lists `option` ("close"), case-insensitively.
  bool ConnectionHas(std::string_view option) const;
  // The field names a Connection field lists, lowercased: hop-by-hop for this message.
  std::vector<std::string> ConnectionOptions() const;
};

// `text` is a head up to and including its blank line (CRLF CRLF). Errors are kInvalidArgument
// with a sentence a 400 can show.
[[nodiscard]] Result<Head> ParseRequestHead(std::string_view text);
[[nodiscard]] Result<Head> ParseResponseHead(std::string_view text);

struct Framing {
  enum class Kind {
    kNone,        // no body
    kLength,      // `length` bytes
    kChunked,     // chunked transfer coding
    kUntilClose,  // responses only: the body ends when the server closes
  };
  Kind kind = Kind::kNone;
  uint64_t length = 0;
};

// A request's body: one Content-Length of digits, or one Transfer-Encoding that is exactly
// "chunked" (any case; not in HTTP/1.0), never both; neither is no body.
[[nodiscard]] Result<Framing> RequestFraming(const Head& request);
// A response's body (RFC 9112 6.3) for a request of `method`: none for HEAD and for status 1xx,
// 204 and 304; chunked when the last transfer coding is chunked (and it appears once); until
// close for another Transfer-Encoding, or with neither field; else its Content-Length. Both
// fields, or a Content-Length that is repeated or not all digits, are errors.
[[nodiscard]] Result<Framing> ResponseFraming(const Head& response, std::string_view method);

// Fields that concern one connection, not the message (RFC 9110 7.6.1), lowercase or not. The
// proxy drops them, and those a Connection field lists, and writes the ones it needs itself.
bool IsHopByHop(std::string_view name);
bool IEquals(std::string_view a, std::string_view b);

class ChunkedDecoder {
 public:
  struct Limits {
    size_t max_size_line = 4096;           // a chunk's size line with its extensions, CRLF excluded
    size_t max_trailer_bytes = 16 * 1024;  // the trailer section, CRLFs included
  };
  ChunkedDecoder() = default;
  explicit ChunkedDecoder(Limits limits) : limits_(limits) {}

  // Decodes from `in`, appending the chunks' data to `*data`, and returns how many bytes of `in`
  // it took: all of them, or fewer once the body has ended (done()); the rest belongs to what
  // follows the body. Chunk extensions and trailer fields are checked, then dropped. An error
  // is final: every later call fails too.
  [[nodiscard]] Result<size_t> Feed(std::string_view in, std::string* data);
  bool done() const { return state_ == State::kDone; }

 private:
  enum class State { kSizeLine, kData, kDataCr, kDataLf, kTrailer, kDone, kFailed };
  Status EndOfLine();

  Limits limits_;
  State state_ = State::kSizeLine;
  std::string line_;   // the size or trailer line being read, without its CRLF
  bool cr_ = false;    // a CR ended line_; an LF must follow
  uint64_t left_ = 0;  // data bytes still to come in this chunk
  size_t trailer_bytes_ = 0;
};

// One chunk carrying `data` ("" for empty data: a chunk of size 0 would end the body).
std::string EncodeChunk(std::string_view data);
// The last chunk and an empty trailer section.
inline constexpr std::string_view kLastChunk = "0\r\n\r\n";

}  // namespace airlock::net::http
