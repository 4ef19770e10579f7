#include "protocol/messages.h"

#include <gtest/gtest.h>

#include <cerrno>
#include <cstdlib>
#include <new>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "protocol/frame_decoder.h"
#include "protocol/wire.h"

// The decoder must reject an absurd list count before it allocates for it. To see that, this
// test binary replaces the global operator new and records the largest request made while a
// test is watching (see LargestAllocationDuring below). Outside that window it only forwards
// to malloc.
namespace {
thread_local bool g_watching_allocations = false;
thread_local size_t g_largest_allocation = 0;
}  // namespace

// g++ -O2 sees these forward to malloc/free and, inlining them into gtest's code, mistakes the
// pairing for a mismatch.
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"

void* operator new(std::size_t size) {
  if (g_watching_allocations && size > g_largest_allocation) g_largest_allocation = size;
  if (void* p = std::malloc(size == 0 ? 1 : size)) return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t size) { return ::operator new(size); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }

namespace airlock::protocol {
namespace {

template <typename F>
size_t LargestAllocationDuring(F&& f) {
  g_largest_allocation = 0;
  g_watching_allocations = true;
  f();
  g_watching_allocations = false;
  return g_largest_allocation;
}

// Builds payloads byte by byte from the layout in docs/design/protocol.md, independently of
// the encoder in messages.cc.
class Bytes {
 public:
  Bytes& U8(uint8_t v) { return Int(v, 1); }
  Bytes& U16(uint16_t v) { return Int(v, 2); }
  Bytes& U32(uint32_t v) { return Int(v, 4); }
  Bytes& I32(int32_t v) { return Int(static_cast<uint32_t>(v), 4); }
  Bytes& U64(uint64_t v) { return Int(v, 8); }
  Bytes& I64(int64_t v) { return Int(static_cast<uint64_t>(v), 8); }
  Bytes& Bool(bool b) { return U8(b ? 1 : 0); }
  Bytes& Str(std::string_view s) {
    U32(static_cast<uint32_t>(s.size()));
    return Raw(s);
  }
  Bytes& Raw(std::string_view s) {
    out_.append(s);
    return *this;
  }
  Bytes& Info(std::string_view name, uint8_t type, uint32_t mode, uint64_t size, int64_t mtime_ns,
              uint32_t uid, uint32_t gid, std::string_view link_target) {
    return Str(name).U8(type).U32(mode).U64(size).I64(mtime_ns).U32(uid).U32(gid).Str(link_target);
  }
  std::string str() const { return out_; }

 private:
  Bytes& Int(uint64_t v, size_t n) {
    for (size_t i = 0; i < n; ++i) out_.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
    return *this;
  }
  std::string out_;
};

// The payload the library encoder produces for `msg`. The encoder writes whatever it is given,
// so tests also use it to build payloads that the decoder must reject.
std::string Payload(const Message& msg) { return EncodeFrame(1, msg).substr(kHeaderSize); }

std::string Name(const Message& msg) { return std::string(MsgTypeName(TypeOf(msg))); }

// Decodes the frames in `bytes`, which must hold exactly whole frames.
std::vector<std::pair<uint32_t, Message>> DecodeAll(const std::string& bytes) {
  std::vector<std::pair<uint32_t, Message>> out;
  FrameDecoder decoder;
  decoder.Feed(bytes);
  while (true) {
    auto next = decoder.Next();
    if (!next) {
      ADD_FAILURE() << "frame decoder: " << next.error().message();
      break;
    }
    if (!*next) break;
    auto msg = DecodeMessage((*next)->type, (*next)->payload);
    if (!msg) {
      ADD_FAILURE() << "decoding: " << msg.error().message();
      break;
    }
    out.emplace_back((*next)->stream, std::move(*msg));
  }
  EXPECT_EQ(decoder.buffered(), 0u) << "bytes left after the last whole frame";
  return out;
}

FileInfo SymlinkInfo() {
  return FileInfo{.name = "/tmp/link",
                  .type = FileType::kSymlink,
                  .mode = 0777,
                  .size = 9,
                  .mtime_ns = -5,  // before the epoch
                  .uid = 1000,
                  .gid = 4294967294u,
                  .link_target = "../target"};
}

// One or more messages of every type with non-default field values, each with its payload
// written out by hand from the specification.
struct Sample {
  Message msg;
  std::string payload;
};

std::vector<Sample> Samples() {
  std::vector<Sample> s;
  s.push_back({Hello{.version = 1, .build_id = "airlock-agent 0.1.0 (git abc123)", .features = 0},
               Bytes().U16(1).Str("airlock-agent 0.1.0 (git abc123)").U64(0).str()});
  s.push_back({Ping{0x0123456789abcdefull}, Bytes().U64(0x0123456789abcdefull).str()});
  s.push_back({Pong{0xfedcba9876543210ull}, Bytes().U64(0xfedcba9876543210ull).str()});
  s.push_back({Exec{.argv = {"/bin/echo", "hello world", ""},
                    .cwd = "/tmp",
                    .env = {"A=1", "EMPTY=", "PATH=/usr/bin:/bin"},
                    .user = "nobody",
                    .stdin_mode = StdinMode::kPipe,
                    .timeout_ms = 30000,
                    .output_cap = 1 << 20,
                    .kill_grace_ms = 2500,
                    .pty = true,
                    .pty_rows = 24,
                    .pty_cols = 80},
               Bytes()
                   .U32(3)
                   .Str("/bin/echo")
                   .Str("hello world")
                   .Str("")
                   .Str("")
                   .Str("/tmp")
                   .U32(3)
                   .Str("A=1")
                   .Str("EMPTY=")
                   .Str("PATH=/usr/bin:/bin")
                   .Str("nobody")
                   .U8(1)
                   .U64(30000)
                   .U64(1 << 20)
                   .U32(2500)
                   .Bool(true)
                   .U16(24)
                   .U16(80)
                   .Bool(false)
                   .U32(0)
                   .str()});
  s.push_back({Exec{.shell = "echo $HOME | wc -c",
                    .user = "1000",
                    .stdin_mode = StdinMode::kNull,
                    .timeout_ms = ~0ull,
                    .kill_grace_ms = 1},
               Bytes()
                   .U32(0)
                   .Str("echo $HOME | wc -c")
                   .Str("")
                   .U32(0)
                   .Str("1000")
                   .U8(0)
                   .U64(~0ull)
                   .U64(0)
                   .U32(1)
                   .Bool(false)
                   .U16(0)
                   .U16(0)
                   .Bool(false)
                   .U32(0)
                   .str()});
  s.push_back({Exec{.argv = {"server"}, .background = true, .ring_bytes = 1 << 20},
               Bytes()
                   .U32(1)
                   .Str("server")
                   .Str("")
                   .Str("")
                   .U32(0)
                   .Str("")
                   .U8(0)
                   .U64(0)
                   .U64(0)
                   .U32(0)
                   .Bool(false)
                   .U16(0)
                   .U16(0)
                   .Bool(true)
                   .U32(1 << 20)
                   .str()});
  s.push_back({Attach{.pid = 77, .output = AttachOutput::kReplay, .follow = false},
               Bytes().I32(77).U8(1).Bool(false).str()});
  s.push_back({Attach{.pid = 1, .output = AttachOutput::kNone, .follow = true},
               Bytes().I32(1).U8(0).Bool(true).str()});
  s.push_back({Detach{}, ""});
  s.push_back({Attached{.pid = 9, .background = true, .pty = false, .stdin_open = true,
                        .running = true},
               Bytes().I32(9).Bool(true).Bool(false).Bool(true).Bool(true).str()});
  s.push_back({Dropped{12345}, Bytes().U64(12345).str()});
  s.push_back({ProcList{}, ""});
  s.push_back({Quiesce{"/.airlock/run/wake"}, Bytes().Str("/.airlock/run/wake").str()});
  s.push_back({Processes{{ProcessInfo{.pid = 5,
                                      .command = "sleep 100",
                                      .background = true,
                                      .pty = true,
                                      .stdin_open = false,
                                      .running = false,
                                      .started_unix_ms = 1700000000000,
                                      .ended_unix_ms = 1700000000500,
                                      .exit = Exited{.exit_code = -1, .term_signal = 15}}}},
               Bytes()
                   .U32(1)
                   .I32(5)
                   .Str("sleep 100")
                   .Bool(true)
                   .Bool(true)
                   .Bool(false)
                   .Bool(false)
                   .U64(1700000000000)
                   .U64(1700000000500)
                   .I32(-1)
                   .I32(15)
                   .U64(0)
                   .Raw(std::string(3, '\0'))
                   .U64(0)
                   .U64(0)
                   .str()});
  s.push_back({Processes{}, Bytes().U32(0).str()});
  // The smallest entries (an empty command, a running process): the count check must admit them.
  s.push_back({Processes{{ProcessInfo{.pid = 1, .running = true}, ProcessInfo{.pid = 2}}},
               Bytes()
                   .U32(2)
                   .I32(1)
                   .Str("")
                   .Bool(false)
                   .Bool(false)
                   .Bool(false)
                   .Bool(true)
                   .U64(0)
                   .U64(0)
                   .I32(0)
                   .I32(0)
                   .U64(0)
                   .Raw(std::string(3, '\0'))
                   .U64(0)
                   .U64(0)
                   .I32(2)
                   .Str("")
                   .Raw(std::string(4, '\0'))
                   .U64(0)
                   .U64(0)
                   .I32(0)
                   .I32(0)
                   .U64(0)
                   .Raw(std::string(3, '\0'))
                   .U64(0)
                   .U64(0)
                   .str()});
  const std::string binary("line\n\0\xff\x80", 8);
  s.push_back({StdinData{binary}, Bytes().Str(binary).str()});
  s.push_back({StdinClose{}, ""});
  s.push_back({Signal{15}, Bytes().I32(15).str()});
  s.push_back({Signal{1}, Bytes().I32(1).str()});
  s.push_back({Signal{64}, Bytes().I32(64).str()});
  s.push_back({Resize{50, 132}, Bytes().U16(50).U16(132).str()});
  s.push_back({Started{4242}, Bytes().I32(4242).str()});
  s.push_back({Output{OutputFd::kStderr, "oops\n"}, Bytes().U8(2).Str("oops\n").str()});
  s.push_back({Output{OutputFd::kStdout, binary}, Bytes().U8(1).Str(binary).str()});
  s.push_back({Exited{.exit_code = 3,
                      .term_signal = 0,
                      .duration_us = 123456,
                      .timed_out = false,
                      .truncated = true,
                      .oom_killed = false,
                      .stdout_bytes = 1ull << 40,
                      .stderr_bytes = 7},
               Bytes()
                   .I32(3)
                   .I32(0)
                   .U64(123456)
                   .Bool(false)
                   .Bool(true)
                   .Bool(false)
                   .U64(1ull << 40)
                   .U64(7)
                   .str()});
  s.push_back(
      {Exited{.exit_code = -1,
              .term_signal = 9,
              .duration_us = 5,
              .timed_out = true,
              .truncated = false,
              .oom_killed = true,
              .stdout_bytes = 0,
              .stderr_bytes = 0},
       Bytes().I32(-1).I32(9).U64(5).Bool(true).Bool(false).Bool(true).U64(0).U64(0).str()});
  s.push_back({Exited{.exit_code = 255},
               Bytes().I32(255).I32(0).U64(0).Raw(std::string(3, '\0')).U64(0).U64(0).str()});
  s.push_back({FileWrite{"/work/out.txt", 0640, true, true},
               Bytes().Str("/work/out.txt").U32(0640).Bool(true).Bool(true).str()});
  s.push_back({FileWrite{"rel", 07777, false, false},
               Bytes().Str("rel").U32(07777).Bool(false).Bool(false).str()});
  s.push_back({Data{binary}, Bytes().Str(binary).str()});
  s.push_back({DataEnd{}, ""});
  s.push_back({FileRead{"/etc/hosts", 10, 200}, Bytes().Str("/etc/hosts").U64(10).U64(200).str()});
  s.push_back({Stat{"/tmp/link"}, Bytes().Str("/tmp/link").str()});
  s.push_back({StatResult{SymlinkInfo()},
               Bytes().Info("/tmp/link", 3, 0777, 9, -5, 1000, 4294967294u, "../target").str()});
  s.push_back({List{"/home"}, Bytes().Str("/home").str()});
  s.push_back(
      {Entries{{FileInfo{"a", FileType::kFile, 0644, 12, 1700000000000000000, 0, 0, ""},
                FileInfo{"dir", FileType::kDirectory, 07777, 4096, 1, 1, 2, ""},
                FileInfo{"fifo", FileType::kOther, 0600, 0, 0, 65534, 65534, ""}, SymlinkInfo()}},
       Bytes()
           .U32(4)
           .Info("a", 1, 0644, 12, 1700000000000000000, 0, 0, "")
           .Info("dir", 2, 07777, 4096, 1, 1, 2, "")
           .Info("fifo", 4, 0600, 0, 0, 65534, 65534, "")
           .Info("/tmp/link", 3, 0777, 9, -5, 1000, 4294967294u, "../target")
           .str()});
  s.push_back({Entries{}, Bytes().U32(0).str()});
  s.push_back({Remove{"/tmp/x", true}, Bytes().Str("/tmp/x").Bool(true).str()});
  s.push_back({Mkdir{"/a/b/c", 0700, true}, Bytes().Str("/a/b/c").U32(0700).Bool(true).str()});
  s.push_back({Done{1ull << 33}, Bytes().U64(1ull << 33).str()});
  s.push_back({ErrorMsg{ErrorCode::kNotFound, ENOENT, "opening /nope: ENOENT"},
               Bytes().U16(2).I32(ENOENT).Str("opening /nope: ENOENT").str()});
  s.push_back({ErrorMsg{ErrorCode::kInternal, 0, ""}, Bytes().U16(13).I32(0).Str("").str()});
  return s;
}

TEST(MessagesTest, SamplesCoverEveryMessageType) {
  std::set<size_t> covered;
  for (const auto& s : Samples()) covered.insert(s.msg.index());
  EXPECT_EQ(covered.size(), std::variant_size_v<Message>);
}

TEST(MessagesTest, TypeNumbersAndNames) {
  struct Row {
    MsgType type;
    uint8_t value;
    std::string_view name;
  };
  // The numbers travel on the wire: a renumbering must fail here.
  constexpr Row kRows[] = {
      {MsgType::kHello, 1, "hello"},
      {MsgType::kPing, 2, "ping"},
      {MsgType::kPong, 3, "pong"},
      {MsgType::kExec, 10, "exec"},
      {MsgType::kFileWrite, 11, "file_write"},
      {MsgType::kFileRead, 12, "file_read"},
      {MsgType::kStat, 13, "stat"},
      {MsgType::kList, 14, "list"},
      {MsgType::kRemove, 15, "remove"},
      {MsgType::kMkdir, 16, "mkdir"},
      {MsgType::kAttach, 17, "attach"},
      {MsgType::kProcList, 18, "proc_list"},
      {MsgType::kQuiesce, 19, "quiesce"},
      {MsgType::kDetach, 24, "detach"},
      {MsgType::kAttached, 33, "attached"},
      {MsgType::kDropped, 34, "dropped"},
      {MsgType::kProcesses, 53, "processes"},
      {MsgType::kStdinData, 20, "stdin_data"},
      {MsgType::kStdinClose, 21, "stdin_close"},
      {MsgType::kSignal, 22, "signal"},
      {MsgType::kResize, 23, "resize"},
      {MsgType::kStarted, 30, "started"},
      {MsgType::kOutput, 31, "output"},
      {MsgType::kExited, 32, "exited"},
      {MsgType::kData, 40, "data"},
      {MsgType::kDataEnd, 41, "data_end"},
      {MsgType::kStatResult, 50, "stat_result"},
      {MsgType::kEntries, 51, "entries"},
      {MsgType::kDone, 52, "done"},
      {MsgType::kError, 60, "error"},
  };
  static_assert(std::size(kRows) == std::variant_size_v<Message>);
  std::set<uint8_t> known;
  for (const auto& row : kRows) {
    EXPECT_EQ(static_cast<uint8_t>(row.type), row.value) << row.name;
    EXPECT_EQ(MsgTypeName(row.type), row.name);
    known.insert(row.value);
  }
  for (int v = 0; v < 256; ++v) {
    EXPECT_EQ(IsKnownMsgType(static_cast<uint8_t>(v)), known.contains(static_cast<uint8_t>(v)))
        << "type " << v;
  }
  EXPECT_EQ(MsgTypeName(static_cast<MsgType>(9)), "unknown");
}

TEST(MessagesTest, HeaderLayout) {
  std::string frame = EncodeFrame(0x01020304, Ping{0x1122334455667788ull});
  const std::string expected = Bytes()
                                   .U32(8)           // payload length
                                   .U8(kProtocolVersion)  // version
                                   .U8(2)            // type: ping
                                   .U16(0)           // flags
                                   .U32(0x01020304)  // stream
                                   .U64(0x1122334455667788ull)
                                   .str();
  EXPECT_EQ(frame, expected);
}

TEST(MessagesTest, EncodingMatchesTheSpecifiedLayout) {
  for (const auto& s : Samples()) {
    SCOPED_TRACE(Name(s.msg));
    std::string frame = EncodeFrame(77, s.msg);
    ASSERT_GE(frame.size(), kHeaderSize);
    EXPECT_EQ(frame.substr(kHeaderSize), s.payload);
    FrameHeader h{.payload_len = static_cast<uint32_t>(s.payload.size()),
                  .type = TypeOf(s.msg),
                  .stream = 77};
    std::string header;
    AppendHeader(header, h);
    EXPECT_EQ(frame.substr(0, kHeaderSize), header);
  }
}

TEST(MessagesTest, RoundTripEveryType) {
  uint32_t stream = 0;
  for (const auto& s : Samples()) {
    SCOPED_TRACE(Name(s.msg));
    stream += 3;
    auto decoded = DecodeAll(EncodeFrame(stream, s.msg));
    ASSERT_EQ(decoded.size(), 1u);
    EXPECT_EQ(decoded[0].first, stream);
    EXPECT_EQ(TypeOf(decoded[0].second), TypeOf(s.msg));
    EXPECT_TRUE(decoded[0].second == s.msg);
  }
}

TEST(MessagesTest, RoundTripAllSamplesInOneBuffer) {
  std::string bytes;
  auto samples = Samples();
  for (size_t i = 0; i < samples.size(); ++i) {
    AppendFrame(bytes, static_cast<uint32_t>(i), samples[i].msg);
  }
  auto decoded = DecodeAll(bytes);
  ASSERT_EQ(decoded.size(), samples.size());
  for (size_t i = 0; i < samples.size(); ++i) {
    EXPECT_EQ(decoded[i].first, i);
    EXPECT_TRUE(decoded[i].second == samples[i].msg) << "frame " << i;
  }
}

TEST(MessagesTest, RoundTripMaxChunks) {
  std::string chunk(kMaxChunk, '\0');
  for (size_t i = 0; i < chunk.size(); ++i) chunk[i] = static_cast<char>(i * 7 + 3);
  const Message msgs[] = {StdinData{chunk}, Output{OutputFd::kStdout, chunk},
                          Output{OutputFd::kStderr, chunk}, Data{chunk}};
  for (const auto& msg : msgs) {
    SCOPED_TRACE(Name(msg));
    auto decoded = DecodeAll(EncodeFrame(9, msg));
    ASSERT_EQ(decoded.size(), 1u);
    EXPECT_TRUE(decoded[0].second == msg);
  }
}

TEST(MessagesTest, RoundTripLargestPayloads) {
  // A frame may carry up to kMaxPayload bytes: data of kMaxPayload minus its length prefix.
  const Message msgs[] = {Data{std::string(kMaxPayload - 4, 'd')},
                          StdinData{std::string(kMaxPayload - 4, 's')},
                          Output{OutputFd::kStderr, std::string(kMaxPayload - 5, 'o')}};
  for (const auto& msg : msgs) {
    SCOPED_TRACE(Name(msg));
    std::string frame = EncodeFrame(1, msg);
    EXPECT_EQ(frame.size(), kHeaderSize + kMaxPayload);
    auto decoded = DecodeAll(frame);
    ASSERT_EQ(decoded.size(), 1u);
    EXPECT_TRUE(decoded[0].second == msg);
  }
}

TEST(MessagesTest, RoundTripManySmallEntries) {
  // Entries with one-character names and no link target are the smallest FileInfos (38
  // bytes): a full listing of them must still decode.
  Entries many;
  for (int i = 0; i < 1000; ++i) {
    many.entries.push_back(FileInfo{.name = std::string(1, static_cast<char>('a' + i % 26)),
                                    .type = FileType::kFile,
                                    .mode = 0644,
                                    .size = static_cast<uint64_t>(i)});
  }
  Entries empty_names;
  empty_names.entries.resize(3);
  for (const Message& msg : {Message(many), Message(empty_names)}) {
    auto decoded = DecodeAll(EncodeFrame(4, msg));
    ASSERT_EQ(decoded.size(), 1u);
    EXPECT_TRUE(decoded[0].second == msg);
  }
}

TEST(MessagesTest, AppendOutputAndDataFramesMatchTheMessageEncoding) {
  std::string chunk(kMaxChunk, 'x');
  chunk[0] = '\0';
  std::string bytes = "prefix";  // both append; neither touches what is already there
  AppendOutputFrame(bytes, 5, OutputFd::kStderr, chunk);
  AppendOutputFrame(bytes, 5, OutputFd::kStdout, "");
  AppendDataFrame(bytes, 6, chunk);
  AppendDataFrame(bytes, 6, "tail");
  ASSERT_EQ(bytes.substr(0, 6), "prefix");
  bytes.erase(0, 6);

  std::string expected = EncodeFrame(5, Output{OutputFd::kStderr, chunk}) +
                         EncodeFrame(5, Output{OutputFd::kStdout, ""}) +
                         EncodeFrame(6, Data{chunk}) + EncodeFrame(6, Data{"tail"});
  EXPECT_TRUE(bytes == expected) << "the hot-path frames differ from EncodeFrame's";

  auto decoded = DecodeAll(bytes);
  ASSERT_EQ(decoded.size(), 4u);
  EXPECT_EQ(decoded[0].first, 5u);
  EXPECT_TRUE(decoded[0].second == Message(Output{OutputFd::kStderr, chunk}));
  EXPECT_TRUE(decoded[1].second == Message(Output{OutputFd::kStdout, ""}));
  EXPECT_EQ(decoded[2].first, 6u);
  EXPECT_TRUE(decoded[2].second == Message(Data{chunk}));
  EXPECT_TRUE(decoded[3].second == Message(Data{"tail"}));
}

TEST(MessagesDeathTest, FramingMoreThanMaxPayloadIsABug) {
  std::string out;
  std::string too_big(kMaxPayload - 3, 'x');
  EXPECT_DEATH(AppendDataFrame(out, 1, too_big), "check failed");
  EXPECT_DEATH(AppendOutputFrame(out, 1, OutputFd::kStdout, too_big), "check failed");
  EXPECT_DEATH(AppendFrame(out, 1, Data{too_big}), "check failed");
}

// --- rejection ---

void ExpectRejected(MsgType type, std::string_view payload, std::string_view reason) {
  auto r = DecodeMessage(type, payload);
  ASSERT_FALSE(r.has_value()) << "accepted";
  EXPECT_EQ(r.error().code(), ErrorCode::kProtocol);
  const std::string prefix = "malformed " + std::string(MsgTypeName(type)) + " frame: ";
  EXPECT_EQ(r.error().message().substr(0, prefix.size()), prefix) << r.error().message();
  EXPECT_NE(r.error().message().find(reason), std::string::npos)
      << "message \"" << r.error().message() << "\" does not say \"" << reason << "\"";
}

TEST(MessagesTest, EveryShorterPrefixIsRejected) {
  for (const auto& s : Samples()) {
    SCOPED_TRACE(Name(s.msg));
    const std::string full = Payload(s.msg);
    ASSERT_TRUE(DecodeMessage(TypeOf(s.msg), full).has_value());
    for (size_t len = 0; len < full.size(); ++len) {
      SCOPED_TRACE("prefix of " + std::to_string(len) + " of " + std::to_string(full.size()));
      ExpectRejected(TypeOf(s.msg), std::string_view(full).substr(0, len), "");
    }
  }
}

TEST(MessagesTest, TrailingBytesAreRejected) {
  for (const auto& s : Samples()) {
    SCOPED_TRACE(Name(s.msg));
    const std::string full = Payload(s.msg);
    ExpectRejected(TypeOf(s.msg), full + '\0', "trailing bytes");
    ExpectRejected(TypeOf(s.msg), full + "xyz", "trailing bytes");
  }
}

TEST(MessagesTest, UnknownTypeIsRejected) {
  for (int t : {0, 4, 9, 25, 42, 61, 255}) {
    auto r = DecodeMessage(static_cast<MsgType>(t), "");
    ASSERT_FALSE(r.has_value()) << t;
    EXPECT_EQ(r.error().code(), ErrorCode::kProtocol);
    EXPECT_EQ(r.error().message(), "unknown message type " + std::to_string(t));
  }
}

// The payload of `base` with the one byte in which it differs from `other` set to `value`.
// Used to put an out-of-range value in a bool or enum field without hand-encoding the rest.
std::string Patched(const Message& base, const Message& other, uint8_t value) {
  std::string a = Payload(base);
  std::string b = Payload(other);
  std::optional<size_t> at;
  int differences = 0;
  for (size_t i = 0; i < a.size() && a.size() == b.size(); ++i) {
    if (a[i] != b[i]) {
      at = i;
      ++differences;
    }
  }
  if (a.size() != b.size() || differences != 1) {
    ADD_FAILURE() << "the two " << Name(base) << " encodings must differ in exactly one byte";
    return a;
  }
  a[*at] = static_cast<char>(value);
  return a;
}

struct BadPayload {
  std::string name;
  MsgType type;
  std::string payload;
  std::string reason;  // a phrase the error message must contain
};

std::vector<BadPayload> BadPayloads() {
  std::vector<BadPayload> v;
  auto add = [&](std::string name, const Message& msg, std::string reason) {
    v.push_back({std::move(name), TypeOf(msg), Payload(msg), std::move(reason)});
  };
  auto add_raw = [&](std::string name, MsgType type, std::string payload, std::string reason) {
    v.push_back({std::move(name), type, std::move(payload), std::move(reason)});
  };
  const std::string nul("a\0b", 3);
  const Exec exec{.argv = {"/bin/true", "x"}, .cwd = "/", .env = {"A=1"}};
  auto exec_with = [&](auto change) {
    Exec e = exec;
    change(e);
    return e;
  };

  // hello
  add("hello with feature bits", Hello{1, "b", 1}, "unknown feature bits");
  add("hello with high feature bit", Hello{1, "b", 1ull << 63}, "unknown feature bits");
  add("hello build id over 256 bytes", Hello{1, std::string(257, 'b'), 0}, "build id");

  // bools that are neither 0 nor 1
  const char* kBool = "bool field is not 0 or 1";
  add_raw("exec pty byte 2", MsgType::kExec,
          Patched(exec, exec_with([](Exec& e) { e.pty = true; }), 2), kBool);
  add_raw("exited timed_out byte 2", MsgType::kExited,
          Patched(Exited{0, 0}, Exited{.exit_code = 0, .timed_out = true}, 2), kBool);
  add_raw("exited truncated byte 2", MsgType::kExited,
          Patched(Exited{0, 0}, Exited{.exit_code = 0, .truncated = true}, 2), kBool);
  add_raw("exited oom_killed byte 255", MsgType::kExited,
          Patched(Exited{0, 0}, Exited{.exit_code = 0, .oom_killed = true}, 255), kBool);
  add_raw("file_write create_parents byte 2", MsgType::kFileWrite,
          Patched(FileWrite{"/f", 0644, false, false}, FileWrite{"/f", 0644, true, false}, 2),
          kBool);
  add_raw("file_write append byte 2", MsgType::kFileWrite,
          Patched(FileWrite{"/f", 0644, false, false}, FileWrite{"/f", 0644, false, true}, 2),
          kBool);
  add_raw("remove recursive byte 2", MsgType::kRemove,
          Patched(Remove{"/r", false}, Remove{"/r", true}, 2), kBool);
  add_raw("mkdir parents byte 2", MsgType::kMkdir,
          Patched(Mkdir{"/d", 0755, false}, Mkdir{"/d", 0755, true}, 2), kBool);

  // enums out of range
  auto pipe = exec_with([](Exec& e) { e.stdin_mode = StdinMode::kPipe; });
  add_raw("exec stdin mode 2", MsgType::kExec, Patched(exec, pipe, 2), "unknown stdin mode");
  add_raw("exec stdin mode 255", MsgType::kExec, Patched(exec, pipe, 255), "unknown stdin mode");
  const Output out1{OutputFd::kStdout, "x"};
  const Output out2{OutputFd::kStderr, "x"};
  add_raw("output fd 0", MsgType::kOutput, Patched(out1, out2, 0), "output fd must be 1 or 2");
  add_raw("output fd 3", MsgType::kOutput, Patched(out1, out2, 3), "output fd must be 1 or 2");
  FileInfo file{.name = "f", .type = FileType::kFile};
  FileInfo dir{.name = "f", .type = FileType::kDirectory};
  for (uint8_t t : {0, 5, 255}) {
    add_raw("stat_result file type " + std::to_string(t), MsgType::kStatResult,
            Patched(StatResult{file}, StatResult{dir}, t), "unknown file type");
    add_raw("entries file type " + std::to_string(t), MsgType::kEntries,
            Patched(Entries{{file, file}}, Entries{{file, dir}}, t), "unknown file type");
  }
  const ErrorMsg err1{ErrorCode::kInvalidArgument, 0, "m"};
  const ErrorMsg err2{ErrorCode::kNotFound, 0, "m"};
  add_raw("error code 0", MsgType::kError, Patched(err1, err2, 0), "unknown error code");
  add_raw("error code 14", MsgType::kError, Patched(err1, err2, 14), "unknown error code");
  add_raw("error code 0x100", MsgType::kError, Bytes().U16(0x100).I32(0).Str("m").str(),
          "unknown error code");
  add("error with negative errno", ErrorMsg{ErrorCode::kInternal, -1, "m"}, "negative errno");
  add("error message over 4096 bytes", ErrorMsg{ErrorCode::kInternal, 0, std::string(4097, 'm')},
      "error message is longer than 4096");

  // exec
  add("exec with argv and shell", exec_with([](Exec& e) { e.shell = "true"; }),
      "exactly one of argv and shell");
  add("exec with neither argv nor shell", exec_with([](Exec& e) { e.argv.clear(); }),
      "exactly one of argv and shell");
  add("exec argv[0] empty", exec_with([](Exec& e) { e.argv = {"", "x"}; }), "argv[0] is empty");
  add("exec NUL in argv[0]", exec_with([&](Exec& e) { e.argv[0] = nul; }),
      "argv entry contains a NUL");
  add("exec NUL in argv[1]", exec_with([&](Exec& e) { e.argv[1] = nul; }),
      "argv entry contains a NUL");
  add("exec NUL in env", exec_with([&](Exec& e) { e.env = {"A=" + nul}; }),
      "env entry contains a NUL");
  add("exec NUL in cwd", exec_with([&](Exec& e) { e.cwd = nul; }), "cwd contains a NUL");
  add("exec NUL in shell", exec_with([&](Exec& e) {
        e.argv.clear();
        e.shell = nul;
      }),
      "shell command contains a NUL");
  add("exec NUL in user", exec_with([&](Exec& e) { e.user = nul; }), "user contains a NUL");
  add("exec env without '='", exec_with([](Exec& e) {
        e.env = {"A=1", "NOEQUALS"};
      }),
      "env entry is not KEY=VALUE");
  add("exec env starting with '='", exec_with([](Exec& e) { e.env = {"=1"}; }),
      "env entry is not KEY=VALUE");
  add("exec env empty", exec_with([](Exec& e) { e.env = {""}; }), "env entry is not KEY=VALUE");
  add("exec pty rows without pty", exec_with([](Exec& e) { e.pty_rows = 24; }),
      "terminal size given without pty");
  add("exec pty cols without pty", exec_with([](Exec& e) { e.pty_cols = 80; }),
      "terminal size given without pty");
  add("exec user over 256 bytes", exec_with([](Exec& e) { e.user = std::string(257, 'u'); }),
      "user is longer than 256");
  add("exec cwd over 4096 bytes", exec_with([](Exec& e) { e.cwd = std::string(4097, 'c'); }),
      "cwd is longer than 4096");

  // paths
  const Message with_nul_path[] = {FileWrite{nul, 0644, false, false},
                                   FileRead{nul, 0, 0},
                                   Stat{nul},
                                   List{nul},
                                   Remove{nul, false},
                                   Mkdir{nul, 0755, false}};
  for (const auto& m : with_nul_path) add(Name(m) + " NUL in path", m, "path contains a NUL");
  const Message with_empty_path[] = {FileWrite{"", 0644, false, false},
                                     FileRead{"", 0, 0},
                                     Stat{""},
                                     List{""},
                                     Remove{"", false},
                                     Mkdir{"", 0755, false}};
  for (const auto& m : with_empty_path) add(Name(m) + " empty path", m, "path is empty");
  add("stat path over 4096 bytes", Stat{std::string(4097, 'p')}, "path is longer than 4096");

  // modes
  add("file_write mode 010000", FileWrite{"/f", 010000, false, false},
      "mode has bits outside 07777");
  add("mkdir mode 0xffffffff", Mkdir{"/d", 0xffffffffu, false}, "mode has bits outside 07777");
  add("stat_result mode 010644",
      StatResult{FileInfo{.name = "f", .type = FileType::kFile, .mode = 010644}},
      "mode has bits outside 07777");

  // exec stream control and replies
  add("signal 0", Signal{0}, "signal number out of range");
  add("signal 65", Signal{65}, "signal number out of range");
  add("signal -9", Signal{-9}, "signal number out of range");
  add("resize 0 rows", Resize{0, 80}, "terminal size must be non-zero");
  add("resize 0 cols", Resize{24, 0}, "terminal size must be non-zero");
  add("started pid 0", Started{0}, "pid must be positive");
  add("started pid -5", Started{-5}, "pid must be positive");
  add("exited code 256", Exited{.exit_code = 256}, "exit code out of range");
  add("exited code -2", Exited{.exit_code = -2}, "exit code out of range");
  add("exited code and signal", Exited{.exit_code = 0, .term_signal = 9},
      "exactly one of exit code and signal");
  add("exited neither code nor signal", Exited{.exit_code = -1, .term_signal = 0},
      "exactly one of exit code and signal");
  add("exited signal 65", Exited{.exit_code = -1, .term_signal = 65}, "signal out of range");

  // lengths and counts
  add_raw("stdin_data length past the payload", MsgType::kStdinData,
          Bytes().U32(100).Raw("only ten..").str(), "payload ends early");
  add_raw("data length 0xffffffff", MsgType::kData, Bytes().U32(0xffffffffu).Raw("x").str(),
          "data is longer than");
  add_raw("output length past the payload", MsgType::kOutput,
          Bytes().U8(1).U32(6).Raw("five.").str(), "payload ends early");
  add_raw("stat path length past the payload", MsgType::kStat, Bytes().U32(10).Raw("/a").str(),
          "payload ends early");
  add_raw("hello build id length past the payload", MsgType::kHello,
          Bytes().U16(1).U32(200).U64(0).str(), "payload ends early");
  add_raw("exec argv count 0xffffffff", MsgType::kExec, Bytes().U32(0xffffffffu).str(),
          "too many argv");
  add_raw("exec argv count 4097", MsgType::kExec,
          Bytes().U32(4097).Raw(std::string(4097 * 4, '\0')).str(), "too many argv");
  add_raw("exec argv count past the payload", MsgType::kExec,
          Bytes().U32(4096).Str("/bin/true").str(), "argv count exceeds the payload");
  add_raw("exec env count 0xffffffff", MsgType::kExec,
          Bytes().U32(1).Str("/bin/true").Str("").Str("").U32(0xffffffffu).str(), "too many env");
  add_raw("quiesce wake path relative", MsgType::kQuiesce, Bytes().Str("run/wake").str(),
          "wake path must be absolute");
  add_raw("quiesce wake path empty", MsgType::kQuiesce, Bytes().Str("").str(),
          "path");
  add_raw("entries count 0xffffffff", MsgType::kEntries, Bytes().U32(0xffffffffu).str(),
          "too many entries");
  add_raw("entries count past the payload", MsgType::kEntries,
          Bytes().U32(1000).Info("a", 1, 0, 0, 0, 0, 0, "").str(),
          "entries count exceeds the payload");
  return v;
}

TEST(MessagesTest, RejectionTable) {
  auto cases = BadPayloads();
  ASSERT_GT(cases.size(), 80u);
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    ExpectRejected(c.type, c.payload, c.reason);
  }
}

TEST(MessagesTest, HugeCountsAreRejectedWithoutAllocating) {
  const std::pair<MsgType, std::string> payloads[] = {
      {MsgType::kExec, Bytes().U32(0xffffffffu).Str("x").str()},
      {MsgType::kExec, Bytes().U32(4096).str()},
      {MsgType::kExec, Bytes().U32(1).Str("/bin/true").Str("").Str("").U32(0xffffffffu).str()},
      {MsgType::kExec, Bytes().U32(1).Str("/bin/true").Str("").Str("").U32(4096).str()},
      {MsgType::kEntries, Bytes().U32(0xffffffffu).str()},
      {MsgType::kEntries, Bytes().U32(28000).str()},
      {MsgType::kData, Bytes().U32(kMaxPayload).str()},
      {MsgType::kStdinData, Bytes().U32(kMaxPayload).str()},
  };
  for (const auto& [type, payload] : payloads) {
    SCOPED_TRACE(std::string(MsgTypeName(type)) + " of " + std::to_string(payload.size()));
    std::optional<Result<Message>> r;
    size_t largest = LargestAllocationDuring([&] { r.emplace(DecodeMessage(type, payload)); });
    ASSERT_TRUE(r.has_value());
    EXPECT_FALSE(r->has_value());
    // A short payload needs no more than an error message's worth of memory.
    EXPECT_LT(largest, 4096u);
  }
}

TEST(MessagesTest, ErrorMsgConversions) {
  Error e(ErrorCode::kPermissionDenied, "opening /root: EACCES", EACCES);
  ErrorMsg m = ToErrorMsg(e);
  EXPECT_EQ(m.code, ErrorCode::kPermissionDenied);
  EXPECT_EQ(m.sys_errno, EACCES);
  EXPECT_EQ(m.message, "opening /root: EACCES");
  Error back = FromErrorMsg(m);
  EXPECT_EQ(back.code(), e.code());
  EXPECT_EQ(back.sys_errno(), e.sys_errno());
  EXPECT_EQ(back.message(), e.message());

  // A long message is cut to what the decoder accepts, so the frame stays valid.
  ErrorMsg long_msg = ToErrorMsg(Error(ErrorCode::kInternal, std::string(10000, 'x')));
  EXPECT_EQ(long_msg.message.size(), 4096u);
  auto decoded = DecodeAll(EncodeFrame(0, long_msg));
  ASSERT_EQ(decoded.size(), 1u);
  EXPECT_TRUE(decoded[0].second == Message(long_msg));
}

}  // namespace
}  // namespace airlock::protocol
