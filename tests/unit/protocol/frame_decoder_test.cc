#include "protocol/frame_decoder.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "protocol/messages.h"
#include "protocol/wire.h"

namespace airlock::protocol {
namespace {

std::string Header(uint32_t payload_len, uint8_t version, uint8_t type, uint16_t flags,
                   uint32_t stream) {
  std::string out;
  auto put = [&](uint64_t v, size_t n) {
    for (size_t i = 0; i < n; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
  };
  put(payload_len, 4);
  put(version, 1);
  put(type, 1);
  put(flags, 2);
  put(stream, 4);
  return out;
}

// The next frame, which must be there.
Frame MustNext(FrameDecoder& d) {
  auto next = d.Next();
  if (!next) {
    ADD_FAILURE() << next.error().message();
    return Frame{MsgType::kHello, 0, ""};
  }
  if (!*next) {
    ADD_FAILURE() << "no whole frame buffered";
    return Frame{MsgType::kHello, 0, ""};
  }
  return std::move(**next);
}

void ExpectNeedsMore(FrameDecoder& d) {
  auto next = d.Next();
  ASSERT_TRUE(next.has_value()) << next.error().message();
  EXPECT_FALSE(next->has_value()) << "a frame came out of an incomplete buffer";
}

std::string ExpectError(FrameDecoder& d) {
  auto next = d.Next();
  if (next) {
    ADD_FAILURE() << "accepted";
    return "";
  }
  EXPECT_EQ(next.error().code(), ErrorCode::kProtocol);
  return next.error().message();
}

std::vector<std::pair<uint32_t, Message>> SomeMessages() {
  return {
      {0, Hello{1, "daemon", 0}},
      {1, Exec{.argv = {"/bin/cat"}, .stdin_mode = StdinMode::kPipe}},
      {1, StdinData{std::string(1000, 'i')}},
      {1, StdinClose{}},
      {0, Ping{7}},
      {2, FileWrite{"/f", 0600, false, false}},
      {2, Data{std::string("\0\x01\x02", 3)}},
      {2, DataEnd{}},
      {0xffffffffu, Done{3}},
  };
}

TEST(FrameDecoderTest, EmptyDecoderNeedsMore) {
  FrameDecoder d;
  ExpectNeedsMore(d);
  d.Feed("");
  ExpectNeedsMore(d);
  EXPECT_EQ(d.buffered(), 0u);
}

TEST(FrameDecoderTest, FramesSplitByteByByte) {
  auto msgs = SomeMessages();
  std::string bytes;
  for (const auto& [stream, msg] : msgs) AppendFrame(bytes, stream, msg);

  FrameDecoder d;
  std::vector<Frame> frames;
  for (char c : bytes) {
    d.Feed(std::string_view(&c, 1));
    auto next = d.Next();
    ASSERT_TRUE(next.has_value()) << next.error().message();
    if (*next) frames.push_back(std::move(**next));
    ExpectNeedsMore(d);  // one byte completes at most one frame
  }
  EXPECT_EQ(d.buffered(), 0u);
  ASSERT_EQ(frames.size(), msgs.size());
  for (size_t i = 0; i < msgs.size(); ++i) {
    EXPECT_EQ(frames[i].stream, msgs[i].first);
    EXPECT_EQ(frames[i].type, TypeOf(msgs[i].second));
    auto decoded = DecodeMessage(frames[i].type, frames[i].payload);
    ASSERT_TRUE(decoded.has_value()) << decoded.error().message();
    EXPECT_TRUE(*decoded == msgs[i].second) << "frame " << i;
  }
}

TEST(FrameDecoderTest, ManyFramesInOneFeed) {
  std::string bytes;
  for (uint32_t i = 1; i <= 500; ++i) AppendFrame(bytes, i, Ping{i * 1000ull});
  FrameDecoder d;
  d.Feed(bytes);
  EXPECT_EQ(d.buffered(), bytes.size());
  for (uint32_t i = 1; i <= 500; ++i) {
    Frame f = MustNext(d);
    EXPECT_EQ(f.type, MsgType::kPing);
    EXPECT_EQ(f.stream, i);
    auto decoded = DecodeMessage(f.type, f.payload);
    ASSERT_TRUE(decoded.has_value());
    EXPECT_EQ(std::get<Ping>(*decoded).nonce, i * 1000ull);
    EXPECT_EQ(d.buffered(), bytes.size() - i * (kHeaderSize + 8));
  }
  ExpectNeedsMore(d);
}

TEST(FrameDecoderTest, UnevenSplitsAndInterleavedNext) {
  // Feeds in chunks of 1..37 bytes while frames come out, so the internal buffer is compacted
  // while a partial frame sits in it.
  auto msgs = SomeMessages();
  std::string bytes;
  for (int round = 0; round < 20; ++round) {
    for (const auto& [stream, msg] : msgs) AppendFrame(bytes, stream, msg);
  }
  FrameDecoder d;
  size_t got = 0;
  size_t step = 1;
  for (size_t off = 0; off < bytes.size(); off += step, step = step % 37 + 1) {
    d.Feed(std::string_view(bytes).substr(off, step));
    while (true) {
      auto next = d.Next();
      ASSERT_TRUE(next.has_value()) << next.error().message();
      if (!*next) break;
      const auto& [stream, msg] = msgs[got % msgs.size()];
      EXPECT_EQ((*next)->stream, stream);
      EXPECT_EQ((*next)->payload, EncodeFrame(stream, msg).substr(kHeaderSize));
      ++got;
    }
  }
  EXPECT_EQ(got, msgs.size() * 20);
  EXPECT_EQ(d.buffered(), 0u);
}

TEST(FrameDecoderTest, BufferedAccounting) {
  std::string a = EncodeFrame(1, StdinData{"hello"});
  std::string b = EncodeFrame(1, StdinClose{});
  FrameDecoder d;
  d.Feed(a.substr(0, 5));
  EXPECT_EQ(d.buffered(), 5u);
  ExpectNeedsMore(d);
  d.Feed(a.substr(5, kHeaderSize - 5));
  EXPECT_EQ(d.buffered(), kHeaderSize);
  ExpectNeedsMore(d);  // header complete, payload not
  EXPECT_EQ(d.buffered(), kHeaderSize) << "a partial frame must stay buffered";
  d.Feed(a.substr(kHeaderSize) + b.substr(0, 3));
  EXPECT_EQ(d.buffered(), a.size() + 3);
  Frame f = MustNext(d);
  EXPECT_EQ(f.type, MsgType::kStdinData);
  EXPECT_EQ(d.buffered(), 3u);
  ExpectNeedsMore(d);
  d.Feed(b.substr(3));
  EXPECT_EQ(d.buffered(), kHeaderSize);
  f = MustNext(d);
  EXPECT_EQ(f.type, MsgType::kStdinClose);
  EXPECT_EQ(d.buffered(), 0u);
}

TEST(FrameDecoderTest, ZeroLengthPayload) {
  FrameDecoder d;
  d.Feed(EncodeFrame(3, StdinClose{}) + EncodeFrame(4, DataEnd{}));
  Frame close = MustNext(d);
  EXPECT_EQ(close.type, MsgType::kStdinClose);
  EXPECT_EQ(close.stream, 3u);
  EXPECT_TRUE(close.payload.empty());
  auto decoded = DecodeMessage(close.type, close.payload);
  ASSERT_TRUE(decoded.has_value());
  EXPECT_TRUE(std::holds_alternative<StdinClose>(*decoded));
  Frame end = MustNext(d);
  EXPECT_EQ(end.type, MsgType::kDataEnd);
  EXPECT_EQ(end.stream, 4u);
  EXPECT_TRUE(end.payload.empty());
  ExpectNeedsMore(d);
}

TEST(FrameDecoderTest, PayloadOfExactlyMaxPayloadIsAccepted) {
  std::string payload(kMaxPayload, 'p');
  FrameDecoder d;
  d.Feed(Header(kMaxPayload, kProtocolVersion, static_cast<uint8_t>(MsgType::kData), 0, 5));
  ExpectNeedsMore(d);
  d.Feed(std::string_view(payload).substr(0, kMaxPayload - 1));
  ExpectNeedsMore(d);
  d.Feed(std::string_view(payload).substr(kMaxPayload - 1));
  Frame f = MustNext(d);
  EXPECT_EQ(f.type, MsgType::kData);
  EXPECT_EQ(f.stream, 5u);
  EXPECT_EQ(f.payload.size(), kMaxPayload);
  EXPECT_EQ(d.buffered(), 0u);
}

TEST(FrameDecoderTest, OversizedPayloadRejectedFromTheHeaderAlone) {
  FrameDecoder d;
  std::string h =
      Header(kMaxPayload + 1, kProtocolVersion, static_cast<uint8_t>(MsgType::kData), 0, 1);
  d.Feed(h.substr(0, kHeaderSize - 1));
  ExpectNeedsMore(d);  // 11 bytes: not yet a header
  d.Feed(h.substr(kHeaderSize - 1));
  std::string first = ExpectError(d);  // no payload byte has arrived
  EXPECT_NE(first.find(std::to_string(kMaxPayload + 1)), std::string::npos) << first;
  EXPECT_NE(first.find("exceeds"), std::string::npos) << first;

  // Sticky: more bytes, even a valid frame, do not bring the decoder back.
  d.Feed(std::string(100, 'x'));
  EXPECT_EQ(ExpectError(d), first);
  d.Feed(EncodeFrame(0, Ping{1}));
  EXPECT_EQ(ExpectError(d), first);
}

TEST(FrameDecoderTest, HugeLengthRejected) {
  FrameDecoder d;
  d.Feed(Header(0xffffffffu, kProtocolVersion, static_cast<uint8_t>(MsgType::kData), 0, 1));
  EXPECT_NE(ExpectError(d).find("exceeds the limit"), std::string::npos);
}

struct BadHeader {
  const char* name;
  std::string header;
  const char* reason;
};

TEST(FrameDecoderTest, BadHeadersAreRejectedAndSticky) {
  const uint8_t ping = static_cast<uint8_t>(MsgType::kPing);
  const BadHeader kCases[] = {
      {"version 3", Header(8, 3, ping, 0, 0), "protocol version 3, expected 2"},
      {"version 1", Header(8, 1, ping, 0, 0), "protocol version 1, expected 2"},
      {"version 255", Header(8, 255, ping, 0, 0), "protocol version 255"},
      {"type 0", Header(0, kProtocolVersion, 0, 0, 0), "unknown type 0"},
      {"type 9", Header(0, kProtocolVersion, 9, 0, 0), "unknown type 9"},
      {"type 42", Header(0, kProtocolVersion, 42, 0, 0), "unknown type 42"},
      {"type 255", Header(0, kProtocolVersion, 255, 0, 0), "unknown type 255"},
      {"flags 1", Header(8, kProtocolVersion, ping, 1, 0), "reserved flags"},
      {"flags 0x8000", Header(8, kProtocolVersion, ping, 0x8000, 0), "reserved flags"},
      {"flags 0x0100", Header(8, kProtocolVersion, ping, 0x0100, 0), "reserved flags"},
  };
  for (const auto& c : kCases) {
    SCOPED_TRACE(c.name);
    FrameDecoder d;
    d.Feed(EncodeFrame(0, Ping{1}));  // a good frame first: it still comes out
    Frame good = MustNext(d);
    EXPECT_EQ(good.type, MsgType::kPing);
    d.Feed(c.header);  // rejected before any payload byte
    std::string first = ExpectError(d);
    EXPECT_NE(first.find(c.reason), std::string::npos) << first;
    d.Feed(std::string(8, '\0') + EncodeFrame(0, Ping{2}));
    EXPECT_EQ(ExpectError(d), first);
  }
}

TEST(FrameDecoderTest, EveryKnownTypePassesTheHeaderCheck) {
  for (int t = 0; t < 256; ++t) {
    FrameDecoder d;
    d.Feed(Header(0, kProtocolVersion, static_cast<uint8_t>(t), 0, 0));
    auto next = d.Next();
    EXPECT_EQ(next.has_value(), IsKnownMsgType(static_cast<uint8_t>(t))) << "type " << t;
  }
}

}  // namespace
}  // namespace airlock::protocol
