// HTTP/1.1 framing as the egress proxy reads it (src/net/http_message.h): every ambiguous form
// refused, each table with the accepted forms beside it.

#include "net/http_message.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace airlock::net::http {
namespace {

Result<Framing> Request(const std::string& fields, const std::string& version = "HTTP/1.1") {
  auto head = ParseRequestHead("POST /x " + version + "\r\nHost: a.test\r\n" + fields + "\r\n");
  if (!head) return std::unexpected(head.error());
  return RequestFraming(*head);
}

TEST(HttpRequestFramingTest, LengthOrExactlyChunkedNeverBoth) {
  struct Case {
    std::string fields;
    Framing::Kind kind;
    uint64_t length;
  };
  for (const Case& c : std::vector<Case>{
           {"", Framing::Kind::kNone, 0},
           {"Content-Length: 0\r\n", Framing::Kind::kLength, 0},
           {"Content-Length: 42\r\n", Framing::Kind::kLength, 42},
           {"Content-Length:  007 \r\n", Framing::Kind::kLength, 7},
           {"Transfer-Encoding: chunked\r\n", Framing::Kind::kChunked, 0},
           {"Transfer-Encoding: Chunked\r\n", Framing::Kind::kChunked, 0},
       }) {
    auto f = Request(c.fields);
    ASSERT_TRUE(f) << c.fields << ": " << f.error().message();
    EXPECT_EQ(f->kind, c.kind) << c.fields;
    EXPECT_EQ(f->length, c.length) << c.fields;
  }
  for (const std::string& bad : std::vector<std::string>{
           "Content-Length: 5\r\nTransfer-Encoding: chunked\r\n",
           "Transfer-Encoding: chunked\r\nContent-Length: 5\r\n",
           "Content-Length: 5\r\nContent-Length: 5\r\n",
           "Content-Length: 5, 5\r\n",
           "Content-Length: +5\r\n",
           "Content-Length: 0x5\r\n",
           "Content-Length: 5 5\r\n",
           "Content-Length: \r\n",
           "Content-Length: 1234567890123456\r\n",  // 16 digits
           "Transfer-Encoding: gzip, chunked\r\n",
           "Transfer-Encoding: chunked, chunked\r\n",
           "Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n",
           "Transfer-Encoding: xchunked\r\n",
           "Transfer-Encoding: chunked;q=1\r\n",
           "Transfer-Encoding: identity\r\n",
           "Transfer-Encoding:\r\n",
       }) {
    EXPECT_FALSE(Request(bad)) << bad;
  }
  EXPECT_FALSE(Request("Transfer-Encoding: chunked\r\n", "HTTP/1.0"));
  EXPECT_TRUE(Request("Content-Length: 3\r\n", "HTTP/1.0"));
}

TEST(HttpHeadTest, StrictLinesAndFields) {
  EXPECT_TRUE(ParseRequestHead("GET / HTTP/1.1\r\nHost: a\r\nX:\r\n\r\n"));
  for (const std::string& bad : std::vector<std::string>{
           "GET / HTTP/1.1\nHost: a\r\n\r\n",                     // bare LF
           "GET / HTTP/1.1\r\nHost: a\rX: b\r\n\r\n",             // bare CR
           "GET / HTTP/1.1\r\nHost: a\r\n x\r\n\r\n",             // obs-fold
           "GET / HTTP/1.1\r\nHost : a\r\n\r\n",                  // space before the colon
           "GET / HTTP/1.1\r\nHo\"st: a\r\n\r\n",                 // not a token
           std::string("GET / HTTP/1.1\r\nX: a\0b\r\n\r\n", 26),  // NUL
           "GET / HTTP/1.1\r\nX: a\x01\r\n\r\n",                  // a control character
           "GET  / HTTP/1.1\r\n\r\n",                             // two spaces
           "GET / HTTP/2\r\n\r\n",
           "GET / HTTP/1.1\r\nHost: a\r\n",  // no blank line
       }) {
    EXPECT_FALSE(ParseRequestHead(bad)) << bad;
  }
  auto head = ParseRequestHead(
      "GET / HTTP/1.1\r\nConnection: Keep-Alive, X-Secret\r\nconnection: close\r\n\r\n");
  ASSERT_TRUE(head);
  EXPECT_TRUE(head->ConnectionHas("close"));
  EXPECT_TRUE(head->ConnectionHas("x-secret"));
  EXPECT_EQ(head->ConnectionOptions(),
            (std::vector<std::string>{"keep-alive", "x-secret", "close"}));
}

TEST(HttpResponseFramingTest, Rfc9112Section6_3) {
  auto framing = [](const std::string& text, const std::string& method = "GET") {
    auto head = ParseResponseHead(text);
    if (!head) return Result<Framing>(std::unexpected(head.error()));
    return ResponseFraming(*head, method);
  };
  struct Case {
    std::string text, method;
    Framing::Kind kind;
    uint64_t length;
  };
  for (const Case& c : std::vector<Case>{
           {"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n", "GET", Framing::Kind::kLength, 5},
           {"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n", "HEAD", Framing::Kind::kNone, 0},
           {"HTTP/1.1 204 No Content\r\nContent-Length: 5\r\n\r\n", "GET", Framing::Kind::kNone, 0},
           {"HTTP/1.1 304 Not Modified\r\n\r\n", "GET", Framing::Kind::kNone, 0},
           {"HTTP/1.1 100 Continue\r\n\r\n", "POST", Framing::Kind::kNone, 0},
           {"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n", "GET", Framing::Kind::kChunked,
            0},
           {"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n", "GET",
            Framing::Kind::kChunked, 0},
           {"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n", "GET", Framing::Kind::kUntilClose,
            0},
           {"HTTP/1.0 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n", "GET",
            Framing::Kind::kUntilClose, 0},
           {"HTTP/1.1 200 OK\r\n\r\n", "GET", Framing::Kind::kUntilClose, 0},
           {"HTTP/1.1 200\r\nContent-Length: 0\r\n\r\n", "GET", Framing::Kind::kLength, 0},
       }) {
    auto f = framing(c.text, c.method);
    ASSERT_TRUE(f) << c.text << ": " << f.error().message();
    EXPECT_EQ(f->kind, c.kind) << c.text;
    EXPECT_EQ(f->length, c.length) << c.text;
  }
  for (const std::string& bad : std::vector<std::string>{
           "HTTP/1.1 200 OK\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n",
           "HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n",
           "HTTP/1.1 200 OK\r\nContent-Length: 5,5\r\n\r\n",
           "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked, gzip\r\n\r\n",
           "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked,,\r\n\r\n",
           "HTTP/1.1 2000 OK\r\n\r\n",
           "HTTP/1.1 20 OK\r\n\r\n",
           "HTTP/1.1 200 OK\nContent-Length: 5\n\n",
           "HTTP/2 200 OK\r\n\r\n",
       }) {
    EXPECT_FALSE(framing(bad)) << bad;
  }
}

// Decodes `wire` fed in pieces of `step` bytes; the data, and what was left after the body.
Result<std::pair<std::string, std::string>> Decode(const std::string& wire, size_t step,
                                                   ChunkedDecoder::Limits limits = {}) {
  ChunkedDecoder decoder(limits);
  std::string data, rest;
  for (size_t i = 0; i < wire.size(); i += step) {
    std::string_view piece = std::string_view(wire).substr(i, step);
    if (decoder.done()) {
      rest.append(piece);
      continue;
    }
    auto used = decoder.Feed(piece, &data);
    if (!used) return std::unexpected(used.error());
    rest.append(piece.substr(*used));
  }
  if (!decoder.done()) return Fail(ErrorCode::kInvalidArgument, "not done");
  return std::make_pair(data, rest);
}

TEST(ChunkedDecoderTest, ValidBodiesAtEverySplit) {
  const std::string wire =
      "5\r\nhello\r\n"
      "6;name=value;flag ; q=\"a \\\"quoted\\\" ;string\"\r\n world\r\n"
      "A\r\n0123456789\r\n"
      "0\r\n"
      "Trailer-One: x\r\n"
      "Trailer-Two:\r\n"
      "\r\n"
      "GET /next HTTP/1.1\r\n";
  for (size_t step = 1; step <= wire.size(); ++step) {
    auto decoded = Decode(wire, step);
    ASSERT_TRUE(decoded) << step << ": " << decoded.error().message();
    EXPECT_EQ(decoded->first, "hello world0123456789") << step;
    EXPECT_EQ(decoded->second, "GET /next HTTP/1.1\r\n") << step;
  }
  auto empty = Decode("0\r\n\r\n", 1);
  ASSERT_TRUE(empty);
  EXPECT_EQ(empty->first, "");
  auto big = Decode("00000000000000F\r\n" + std::string(15, 'x') + "\r\n0\r\n\r\n", 7);
  ASSERT_TRUE(big) << big.error().message();
  EXPECT_EQ(big->first.size(), 15u);
}

TEST(ChunkedDecoderTest, AmbiguousFramingRefused) {
  for (const std::string& bad : std::vector<std::string>{
           "5\nhello\r\n0\r\n\r\n",  // bare LF after the size
           "5\r\nhello\n0\r\n\r\n",  // data not followed by CRLF
           "5\r\nhelloXY0\r\n\r\n",
           "5\r\nhello\r\n0\r\n\n",       // bare LF ending the trailers
           "5\rx\r\nhello\r\n0\r\n\r\n",  // bare CR
           "0x5\r\nhello\r\n0\r\n\r\n",
           "-5\r\nhello\r\n0\r\n\r\n",
           "+5\r\nhello\r\n0\r\n\r\n",
           " 5\r\nhello\r\n0\r\n\r\n",
           "5 \r\nhello\r\n0\r\n\r\n",  // whitespace that is not before a ';'
           "5;\r\nhello\r\n0\r\n\r\n",  // an empty extension name
           "5;a=\r\nhello\r\n0\r\n\r\n",
           "5;a=\"open\r\nhello\r\n0\r\n\r\n",
           "5;a=b \r\nhello\r\n0\r\n\r\n",
           "5,6\r\nhello\r\n0\r\n\r\n",
           "\r\nhello\r\n0\r\n\r\n",  // no size
           "g\r\nhello\r\n0\r\n\r\n",
           "1000000000000000\r\n",     // 16 hex digits
           "0\r\n folded: x\r\n\r\n",  // obs-fold in the trailers
           "0\r\nno colon\r\n\r\n",
           "0\r\nBad Name: x\r\n\r\n",
           std::string("5\r\nhello\r\n0\r\nX: a\0\r\n\r\n", 20),
       }) {
    auto decoded = Decode(bad, 1);
    EXPECT_FALSE(decoded) << bad;
    EXPECT_FALSE(Decode(bad, bad.size())) << bad;
  }
}

TEST(ChunkedDecoderTest, LimitsOnTheSizeLineAndTheTrailers) {
  ChunkedDecoder::Limits limits;
  limits.max_size_line = 64;
  limits.max_trailer_bytes = 64;
  const std::string ext(58, 'e');  // "5;" + 58 = 60 bytes: within 64
  EXPECT_TRUE(Decode("5;" + ext + "\r\nhello\r\n0\r\n\r\n", 3, limits));
  EXPECT_FALSE(Decode("5;" + ext + "eeeee\r\nhello\r\n0\r\n\r\n", 3, limits));
  EXPECT_TRUE(Decode("0\r\nX: " + std::string(50, 'v') + "\r\n\r\n", 3, limits));
  EXPECT_FALSE(Decode("0\r\nX: " + std::string(60, 'v') + "\r\n\r\n", 3, limits));
  // A failed decoder stays failed.
  ChunkedDecoder decoder;
  std::string data;
  EXPECT_FALSE(decoder.Feed("zz\r\n", &data));
  EXPECT_FALSE(decoder.Feed("5\r\nhello\r\n", &data));
}

TEST(ChunkedDecoderTest, EncodeChunkRoundTrips) {
  EXPECT_EQ(EncodeChunk(""), "");
  EXPECT_EQ(EncodeChunk("hello"), "5\r\nhello\r\n");
  const std::string big(0x1234, 'z');
  const std::string wire = EncodeChunk(big) + std::string(kLastChunk);
  EXPECT_TRUE(wire.starts_with("1234\r\n"));
  auto decoded = Decode(wire, 100);
  ASSERT_TRUE(decoded);
  EXPECT_EQ(decoded->first, big);
}

}  // namespace
}  // namespace airlock::net::http
