// libFuzzer target for the egress proxy's HTTP/1.1 framing (src/net/http_message.h): the bytes a
// sandbox (requests) or a server it reaches (responses) controls.
//
// Input: byte 0 picks what is parsed, byte 1 where a chunked body is split, the rest is the text:
//
//   0 ParseRequestHead + RequestFraming     1 ParseResponseHead + ResponseFraming (GET and HEAD)
//   2 ChunkedDecoder
//
// What is checked, for every input:
//  - a head parser returns a head or a kInvalidArgument Error with a message; a parsed head's
//    fields carry no CR, LF or NUL, and framing a parsed head does the same;
//  - the chunked decoder reaches the same outcome (the same error or not, the same data, the
//    same bytes taken) fed the text whole, in two pieces split anywhere, and a byte at a time:
//    where TCP happens to split a body can never change where the proxy thinks it ends;
//  - a body it decoded, re-encoded with EncodeChunk and kLastChunk, decodes to the same data and
//    is taken whole.

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <initializer_list>
#include <string>
#include <string_view>
#include <vector>

#include "common/error.h"
#include "net/http_message.h"

namespace airlock::net::http {
namespace {

void Check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "http_message_fuzz: %s\n", what);
    std::abort();
  }
}

void CheckError(const Error& e) {
  Check(e.code() == ErrorCode::kInvalidArgument, "an error that is not kInvalidArgument");
  Check(!e.message().empty(), "an error without a message");
}

void CheckHead(const Result<Head>& head) {
  if (!head) {
    CheckError(head.error());
    return;
  }
  for (const auto& [name, value] : head->fields) {
    Check(!name.empty(), "an empty field name");
    Check((name + value).find_first_of(std::string_view("\r\n\0", 3)) == std::string::npos,
          "CR, LF or NUL in a parsed field");
  }
}

struct Outcome {
  bool failed = false;
  bool done = false;
  size_t taken = 0;  // meaningless once failed: an error is final, nothing more is taken
  std::string data;  // once failed: what was decoded before the error
  bool operator==(const Outcome& o) const {
    return failed == o.failed && data == o.data && (failed || (done == o.done && taken == o.taken));
  }
};

// Feeds `text` in pieces that end at each of `cuts` (ascending) and at the end, as the proxy
// feeds what each read brings; stops at the first error or once the body is done.
template <typename Cuts>
Outcome Decode(std::string_view text, const Cuts& cuts) {
  ChunkedDecoder decoder;
  Outcome out;
  size_t from = 0;
  auto feed = [&](size_t to) {
    if (out.failed || out.done || to <= from) return;
    std::string_view piece = text.substr(from, to - from);
    auto used = decoder.Feed(piece, &out.data);
    if (!used) {
      CheckError(used.error());
      out.failed = true;
      return;
    }
    Check(*used <= piece.size(), "took more than it was given");
    out.taken += *used;
    out.done = decoder.done();
    Check(out.done || *used == piece.size(), "left bytes before the body's end");
    from = to;
  };
  for (size_t cut : cuts) feed(cut);
  feed(text.size());
  return out;
}

}  // namespace
}  // namespace airlock::net::http

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace airlock::net::http;
  if (size < 2) return 0;
  const std::string_view text(reinterpret_cast<const char*>(data) + 2, size - 2);
  switch (data[0] % 3) {
    case 0: {
      auto head = ParseRequestHead(text);
      CheckHead(head);
      if (head) {
        auto framing = RequestFraming(*head);
        if (!framing) CheckError(framing.error());
      }
      break;
    }
    case 1: {
      auto head = ParseResponseHead(text);
      CheckHead(head);
      if (head) {
        for (const char* method : {"GET", "HEAD"}) {
          auto framing = ResponseFraming(*head, method);
          if (!framing) CheckError(framing.error());
        }
      }
      break;
    }
    case 2: {
      const Outcome whole = Decode(text, std::initializer_list<size_t>{});
      const size_t split = text.size() * data[1] / 256;
      Check(Decode(text, std::initializer_list<size_t>{split}) == whole,
            "two pieces decode differently from one");
      std::vector<size_t> every;
      for (size_t i = 1; i < text.size(); ++i) every.push_back(i);
      Check(Decode(text, every) == whole, "a byte at a time decodes differently from one piece");
      if (whole.done) {
        const std::string again = EncodeChunk(whole.data) + std::string(kLastChunk);
        const Outcome round = Decode(again, std::initializer_list<size_t>{});
        Check(round.done && round.data == whole.data && round.taken == again.size(),
              "a re-encoded body does not decode to its data");
      }
      break;
    }
  }
  return 0;
}
