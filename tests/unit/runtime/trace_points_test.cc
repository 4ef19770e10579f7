// gVisor's trace points as the remote sink sends them (runtime/gvisor/trace_points.h): messages
// built here byte by byte, as protocol buffers, and hostile ones the decoder must refuse.

#include "runtime/gvisor/trace_points.h"

#include <gtest/gtest.h>

#include <string>

#include "runtime/engine.h"

namespace airlock::gvisor {
namespace {

std::string Varint(uint64_t v) {
  std::string out;
  while (v >= 0x80) {
    out += static_cast<char>((v & 0x7f) | 0x80);
    v >>= 7;
  }
  out += static_cast<char>(v);
  return out;
}
std::string Int(uint32_t field, int64_t v) { return Varint(field << 3) + Varint(static_cast<uint64_t>(v)); }
std::string Bytes(uint32_t field, const std::string& v) {
  return Varint(field << 3 | 2) + Varint(v.size()) + v;
}
std::string Header(uint16_t type, uint32_t dropped) {
  std::string h(8, '\0');
  h[0] = 8;
  h[2] = static_cast<char>(type);
  for (int i = 0; i < 4; ++i) h[4 + i] = static_cast<char>(dropped >> (8 * i));
  return h;
}
// ContextData: thread 7, group `tgid`, credentials with effective uid `euid`.
std::string Context(int32_t tgid, uint32_t euid) {
  return Bytes(1, Int(2, 7) + Int(4, tgid) + Bytes(7, euid == 0 ? "" : Int(2, euid)));
}

TEST(TracePointsTest, AnExecCarriesItsProcessUidAndArgv) {
  const std::string msg = Header(3, 2) + Context(12, 1000) + Bytes(2, "/usr/bin/dash") +
                          Bytes(3, "sh") + Bytes(3, "-c") + Bytes(3, "exit 3") +
                          Bytes(4, "SECRET=never-kept");
  auto p = DecodeTracePoint(msg, false);
  ASSERT_TRUE(p) << p.error().message();
  EXPECT_EQ(p->type, 3);
  EXPECT_EQ(p->dropped, 2u);
  EXPECT_EQ(p->tgid, 12);
  EXPECT_EQ(p->tid, 7);
  EXPECT_EQ(p->euid, 1000);
  EXPECT_EQ(p->argv, (std::vector<std::string>{"sh", "-c", "exit 3"}));
  EXPECT_FALSE(p->cut);
}

TEST(TracePointsTest, RootsCredentialsAreEmptyAndNoCredentialsIsUnknown) {
  auto root = DecodeTracePoint(Header(3, 0) + Context(1, 0) + Bytes(3, "a"), false);
  ASSERT_TRUE(root);
  EXPECT_EQ(root->euid, 0);
  auto none = DecodeTracePoint(Header(3, 0) + Bytes(1, Int(4, 5)) + Bytes(3, "a"), false);
  ASSERT_TRUE(none);
  EXPECT_EQ(none->euid, -1);
  EXPECT_EQ(none->tgid, 5);
}

TEST(TracePointsTest, ACloneAndAnExitCarryTheirFields) {
  auto clone = DecodeTracePoint(Header(2, 0) + Context(1, 0) + Int(3, 9) + Int(4, 9) + Int(6, 0x4100), false);
  ASSERT_TRUE(clone);
  EXPECT_EQ(clone->tgid, 1);
  EXPECT_EQ(clone->created_tid, 9);
  EXPECT_EQ(clone->created_tgid, 9);
  auto exit = DecodeTracePoint(Header(4, 0) + Context(9, 0) + Int(2, 3 << 8), false);
  ASSERT_TRUE(exit);
  EXPECT_EQ(exit->exit_status, 3 << 8);
  runtime::ProcessEvent e;
  e.SetWaitStatus(exit->exit_status);
  EXPECT_EQ(e.exit_code, 3);
  e.SetWaitStatus(9);  // SIGKILL
  EXPECT_EQ(e.signal, 9);
  EXPECT_EQ(e.exit_code, -1);
}

TEST(TracePointsTest, TheArgvIsCappedAsTheJailsIs) {
  std::string many = Header(3, 0) + Context(3, 0);
  for (int i = 0; i < 40; ++i) many += Bytes(3, "a" + std::to_string(i));
  auto p = DecodeTracePoint(many, false);
  ASSERT_TRUE(p);
  EXPECT_EQ(p->argv.size(), runtime::ProcessEvent::kMaxArgs);
  EXPECT_TRUE(p->cut);
  auto big = DecodeTracePoint(Header(3, 0) + Context(3, 0) + Bytes(3, "cat") + Bytes(3, std::string(6000, 'x')), false);
  ASSERT_TRUE(big);
  EXPECT_TRUE(big->cut);
  ASSERT_EQ(big->argv.size(), 2u);
  EXPECT_EQ(big->argv[0].size() + big->argv[1].size(), runtime::ProcessEvent::kMaxArgvBytes);
}

TEST(TracePointsTest, AMessageTheSocketCutKeepsWhatIsWholeAndSaysSo) {
  const std::string whole = Header(3, 0) + Context(4, 0) + Bytes(3, "ls") + Bytes(3, "-l") + Bytes(3, "/a-long-path");
  auto cut = DecodeTracePoint(whole.substr(0, whole.size() - 4), true);
  ASSERT_TRUE(cut) << cut.error().message();
  EXPECT_EQ(cut->argv, (std::vector<std::string>{"ls", "-l"}));
  EXPECT_TRUE(cut->cut);
  // The same bytes not marked cut by the socket: malformed.
  EXPECT_FALSE(DecodeTracePoint(whole.substr(0, whole.size() - 4), false));
}

TEST(TracePointsTest, HostileMessagesAreRefusedNotRead) {
  const std::string ctx = Context(4, 0);
  for (const std::string& bad : {
           std::string("\x08\x00\x03", 3),                      // shorter than its header
           std::string("\x04\x00\x03\x00\x00\x00\x00\x00", 8),  // header size under 8
           std::string("\xff\x00\x03\x00\x00\x00\x00\x00", 8),  // header size past the end
           Header(3, 0) + Varint(1 << 3 | 2) + Varint(1'000'000) + "x",  // a length past the end
           Header(3, 0) + Varint(1 << 3 | 3),                   // a group (wire type 3)
           Header(3, 0) + std::string(11, '\xff'),              // a varint that never ends
           Header(3, 0) + Bytes(1, Varint(2 << 3) + "\xff"),    // a context cut inside
           Header(3, 0) + Varint(0) + Varint(1),                // field 0
       }) {
    EXPECT_FALSE(DecodeTracePoint(bad, false)) << testing::PrintToString(bad);
  }
  // A type this reader does not use: its header only.
  auto other = DecodeTracePoint(Header(11, 5) + "\xff\xff", false);
  ASSERT_TRUE(other);
  EXPECT_EQ(other->dropped, 5u);
  EXPECT_TRUE(other->argv.empty());
}

TEST(TracePointsTest, TheHandshakeRoundTrips) {
  auto v = DecodeHandshake(EncodeHandshake());
  ASSERT_TRUE(v);
  EXPECT_EQ(*v, kTraceWireVersion);
  EXPECT_FALSE(DecodeHandshake(""));
  EXPECT_FALSE(DecodeHandshake("\x08"));
}

}  // namespace
}  // namespace airlock::gvisor
