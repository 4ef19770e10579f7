#include "protocol/channel_state.h"

#include <gtest/gtest.h>

#include <string>
#include <string_view>
#include <vector>

#include "protocol/messages.h"

namespace airlock::protocol {
namespace {

const Hello kHello{kProtocolVersion, "test", 0};

std::string Describe(uint32_t stream, const Message& msg) {
  return std::string(MsgTypeName(TypeOf(msg))) + " on stream " + std::to_string(stream);
}

::testing::AssertionResult Gives(ChannelState& st, uint32_t stream, const Message& msg,
                                 Verdict want) {
  auto r = st.Receive(stream, msg);
  if (!r) {
    return ::testing::AssertionFailure()
           << Describe(stream, msg) << " rejected: " << r.error().message();
  }
  if (*r != want) {
    return ::testing::AssertionFailure()
           << Describe(stream, msg) << " gave " << (*r == Verdict::kAccept ? "kAccept" : "kLate");
  }
  return ::testing::AssertionSuccess();
}

::testing::AssertionResult Accepts(ChannelState& st, uint32_t stream, const Message& msg) {
  return Gives(st, stream, msg, Verdict::kAccept);
}

::testing::AssertionResult Late(ChannelState& st, uint32_t stream, const Message& msg) {
  return Gives(st, stream, msg, Verdict::kLate);
}

// Rejected as a protocol error whose message names the frame and stream and gives `reason`.
::testing::AssertionResult Rejects(ChannelState& st, uint32_t stream, const Message& msg,
                                   std::string_view reason) {
  auto r = st.Receive(stream, msg);
  if (r) return ::testing::AssertionFailure() << Describe(stream, msg) << " was not rejected";
  const std::string& m = r.error().message();
  if (r.error().code() != ErrorCode::kProtocol) {
    return ::testing::AssertionFailure() << "code " << ErrorCodeName(r.error().code());
  }
  if (m.rfind(Describe(stream, msg) + ": ", 0) != 0) {
    return ::testing::AssertionFailure()
           << "\"" << m << "\" does not start with \"" << Describe(stream, msg) << ": \"";
  }
  if (m.find(reason) == std::string::npos) {
    return ::testing::AssertionFailure() << "\"" << m << "\" does not say \"" << reason << "\"";
  }
  return ::testing::AssertionSuccess();
}

Exec PipeExec() { return Exec{.argv = {"/bin/cat"}, .stdin_mode = StdinMode::kPipe}; }
Exec NullExec() { return Exec{.argv = {"/bin/true"}}; }
Exec PtyExec() {
  return Exec{
      .shell = "bash", .stdin_mode = StdinMode::kPipe, .pty = true, .pty_rows = 24, .pty_cols = 80};
}
Exited ExitedOk() { return Exited{.exit_code = 0}; }
ErrorMsg Err() { return ErrorMsg{ErrorCode::kNotFound, 2, "no such file"}; }
FileInfo Info() { return FileInfo{.name = "f", .type = FileType::kFile, .mode = 0644}; }

// One opener of each stream kind.
std::vector<Message> Openers() {
  return {NullExec(),
          FileWrite{"/w", 0644, false, false},
          FileRead{"/r", 0, 0},
          Stat{"/s"},
          List{"/l"},
          Remove{"/x", false},
          Mkdir{"/d", 0755, false},
          Attach{.pid = 7},
          ProcList{}};
}

// Every message type that is not an opener.
std::vector<Message> NonOpeners() {
  return {kHello,
          Ping{1},
          Pong{1},
          StdinData{"x"},
          StdinClose{},
          Signal{15},
          Resize{1, 1},
          Started{10},
          Output{OutputFd::kStdout, "o"},
          ExitedOk(),
          Data{"d"},
          DataEnd{},
          StatResult{Info()},
          Entries{{Info()}},
          Done{1},
          Err(),
          Detach{},
          Attached{.pid = 7},
          Dropped{1},
          Processes{}};
}

// --- the handshake, for both roles ---

class HandshakeTest : public ::testing::TestWithParam<Role> {};

TEST_P(HandshakeTest, HelloMustComeFirstOnStreamZero) {
  ChannelState st(GetParam());
  EXPECT_TRUE(Rejects(st, 0, Ping{1}, "the first frame must be hello on stream 0"));
  EXPECT_TRUE(Rejects(st, 0, Err(), "the first frame must be hello"));
  EXPECT_TRUE(Rejects(st, 1, NullExec(), "the first frame must be hello"));
  EXPECT_TRUE(Rejects(st, 1, Started{5}, "the first frame must be hello"));
  EXPECT_TRUE(Rejects(st, 3, kHello, "the first frame must be hello on stream 0"));
  EXPECT_FALSE(st.handshake_done());
  EXPECT_TRUE(Accepts(st, 0, kHello));
  EXPECT_FALSE(st.handshake_done()) << "this side has not sent its hello yet";
  st.Send(0, kHello);
  EXPECT_TRUE(st.handshake_done());
}

TEST_P(HandshakeTest, HandshakeNeedsBothHellos) {
  ChannelState st(GetParam());
  st.Send(0, kHello);
  EXPECT_FALSE(st.handshake_done()) << "the peer's hello has not arrived";
  EXPECT_TRUE(Accepts(st, 0, kHello));
  EXPECT_TRUE(st.handshake_done());
}

TEST_P(HandshakeTest, VersionMismatchRejected) {
  for (uint16_t version : {0, 1, 3, 0xffff}) {
    ChannelState st(GetParam());
    auto r = st.Receive(0, Hello{version, "future", 0});
    ASSERT_FALSE(r.has_value()) << "version " << version;
    EXPECT_EQ(r.error().code(), ErrorCode::kProtocol);
    EXPECT_NE(r.error().message().find("peer speaks protocol version " + std::to_string(version)),
              std::string::npos)
        << r.error().message();
    // The bad hello does not count: the channel is still waiting for one.
    EXPECT_TRUE(Rejects(st, 0, Ping{1}, "the first frame must be hello"));
  }
}

TEST_P(HandshakeTest, SecondHelloRejected) {
  ChannelState st(GetParam());
  st.Send(0, kHello);
  ASSERT_TRUE(Accepts(st, 0, kHello));
  EXPECT_TRUE(Rejects(st, 0, kHello, "second hello"));
}

TEST_P(HandshakeTest, StreamZeroCarriesOnlyPingPongAndError) {
  ChannelState st(GetParam());
  st.Send(0, kHello);
  ASSERT_TRUE(Accepts(st, 0, kHello));
  EXPECT_TRUE(Accepts(st, 0, Ping{1}));
  EXPECT_TRUE(Accepts(st, 0, Pong{1}));
  EXPECT_TRUE(Accepts(st, 0, Err()));
  for (const auto& m : Openers()) EXPECT_TRUE(Rejects(st, 0, m, "not a channel message"));
  for (const auto& m : NonOpeners()) {
    MsgType t = TypeOf(m);
    if (t == MsgType::kHello || t == MsgType::kPing || t == MsgType::kPong ||
        t == MsgType::kError) {
      continue;
    }
    EXPECT_TRUE(Rejects(st, 0, m, "not a channel message"));
  }
  EXPECT_EQ(st.open_streams(), 0u);
}

INSTANTIATE_TEST_SUITE_P(BothRoles, HandshakeTest, ::testing::Values(Role::kAgent, Role::kDaemon),
                         [](const ::testing::TestParamInfo<Role>& param_info) {
                           return param_info.param == Role::kAgent ? "Agent" : "Daemon";
                         });

// --- the agent's view: frames from the daemon ---

class AgentStateTest : public ::testing::Test {
 protected:
  void SetUp() override {
    st_.Send(0, kHello);
    ASSERT_TRUE(Accepts(st_, 0, kHello));
  }
  ChannelState st_{Role::kAgent};
};

TEST_F(AgentStateTest, EveryOpenerOpensAStream) {
  uint32_t stream = 0;
  for (const auto& m : Openers()) {
    ++stream;
    EXPECT_FALSE(st_.IsOpen(stream));
    EXPECT_TRUE(Accepts(st_, stream, m));
    EXPECT_TRUE(st_.IsOpen(stream)) << Describe(stream, m);
  }
  EXPECT_EQ(st_.open_streams(), Openers().size());
}

TEST_F(AgentStateTest, StreamIdsMustIncrease) {
  EXPECT_TRUE(Accepts(st_, 5, NullExec()));
  EXPECT_TRUE(Rejects(st_, 5, NullExec(), "stream id is not above every id used before (5)"));
  EXPECT_TRUE(Rejects(st_, 4, Stat{"/a"}, "not above every id used before (5)"));
  EXPECT_TRUE(Rejects(st_, 1, FileWrite{"/f", 0644, false, false}, "not above"));
  EXPECT_TRUE(Accepts(st_, 6, Stat{"/a"}));
  EXPECT_TRUE(Accepts(st_, 1000, List{"/"}));  // gaps are allowed
  EXPECT_TRUE(Rejects(st_, 999, List{"/"}, "not above every id used before (1000)"));
  EXPECT_TRUE(Accepts(st_, 0xffffffffu, Mkdir{"/m", 0700, false}));
  EXPECT_EQ(st_.open_streams(), 4u);

  // A closed stream's id cannot be reused either.
  st_.Send(6, StatResult{Info()});
  EXPECT_FALSE(st_.IsOpen(6));
  EXPECT_TRUE(Rejects(st_, 6, Stat{"/a"}, "not above"));
}

TEST_F(AgentStateTest, FramesOnNeverOpenedStreamsRejected) {
  EXPECT_TRUE(Rejects(st_, 1, StdinData{"x"}, "stream was never opened"));
  EXPECT_TRUE(Rejects(st_, 1, StdinClose{}, "stream was never opened"));
  EXPECT_TRUE(Rejects(st_, 1, Signal{9}, "stream was never opened"));
  EXPECT_TRUE(Rejects(st_, 1, Resize{1, 1}, "stream was never opened"));
  EXPECT_TRUE(Rejects(st_, 1, Data{"x"}, "stream was never opened"));
  EXPECT_TRUE(Rejects(st_, 1, DataEnd{}, "stream was never opened"));
  ASSERT_TRUE(Accepts(st_, 3, PipeExec()));
  EXPECT_TRUE(Rejects(st_, 4, StdinData{"x"}, "stream was never opened"));
  EXPECT_TRUE(Accepts(st_, 3, StdinData{"x"}));
}

TEST_F(AgentStateTest, GapIdsBelowTheHighestCountAsClosed) {
  // The agent keeps no record of closed ids, only the highest opened: a frame on an id that
  // was skipped is indistinguishable from one on a closed stream, so it is late, not an error.
  ASSERT_TRUE(Accepts(st_, 5, PipeExec()));
  EXPECT_TRUE(Late(st_, 3, StdinData{"x"}));
  EXPECT_TRUE(Late(st_, 3, Data{"x"}));
}

TEST_F(AgentStateTest, StdinOnlyOnAPipeExecBeforeStdinClose) {
  ASSERT_TRUE(Accepts(st_, 1, PipeExec()));
  EXPECT_TRUE(Accepts(st_, 1, StdinData{"a"}));
  EXPECT_TRUE(Accepts(st_, 1, StdinData{""}));
  EXPECT_TRUE(Accepts(st_, 1, StdinClose{}));
  EXPECT_TRUE(Rejects(st_, 1, StdinData{"b"}, "stdin is not an open pipe"));
  EXPECT_TRUE(Rejects(st_, 1, StdinClose{}, "stdin is not an open pipe"));
  EXPECT_TRUE(st_.IsOpen(1)) << "closing stdin does not close the stream";
  EXPECT_TRUE(Accepts(st_, 1, Signal{2}));

  ASSERT_TRUE(Accepts(st_, 2, NullExec()));
  EXPECT_TRUE(Rejects(st_, 2, StdinData{"a"}, "stdin is not an open pipe"));
  EXPECT_TRUE(Rejects(st_, 2, StdinClose{}, "stdin is not an open pipe"));

  ASSERT_TRUE(Accepts(st_, 3, FileWrite{"/f", 0644, false, false}));
  EXPECT_TRUE(Rejects(st_, 3, StdinData{"a"}, "not an exec stream"));
  EXPECT_TRUE(Rejects(st_, 3, StdinClose{}, "not an exec stream"));
}

TEST_F(AgentStateTest, StdinStateIsPerStream) {
  ASSERT_TRUE(Accepts(st_, 1, PipeExec()));
  ASSERT_TRUE(Accepts(st_, 2, PipeExec()));
  EXPECT_TRUE(Accepts(st_, 1, StdinClose{}));
  EXPECT_TRUE(Accepts(st_, 2, StdinData{"still open"}));
  EXPECT_TRUE(Rejects(st_, 1, StdinData{"x"}, "stdin is not an open pipe"));
}

TEST_F(AgentStateTest, SignalOnlyOnExecAndAttach) {
  ASSERT_TRUE(Accepts(st_, 1, NullExec()));
  ASSERT_TRUE(Accepts(st_, 2, PtyExec()));
  EXPECT_TRUE(Accepts(st_, 1, Signal{15}));
  EXPECT_TRUE(Accepts(st_, 2, Signal{9}));
  uint32_t stream = 2;
  for (const auto& m : Openers()) {
    if (TypeOf(m) == MsgType::kExec || TypeOf(m) == MsgType::kAttach) continue;
    ++stream;
    ASSERT_TRUE(Accepts(st_, stream, m));
    EXPECT_TRUE(Rejects(st_, stream, Signal{15}, "not an exec stream"));
    EXPECT_TRUE(Rejects(st_, stream, Resize{24, 80}, "not an exec stream"));
  }
}

TEST_F(AgentStateTest, ResizeOnlyWithPty) {
  ASSERT_TRUE(Accepts(st_, 1, PtyExec()));
  EXPECT_TRUE(Accepts(st_, 1, Resize{50, 132}));
  EXPECT_TRUE(Accepts(st_, 1, Resize{24, 80}));
  ASSERT_TRUE(Accepts(st_, 2, PipeExec()));
  EXPECT_TRUE(Rejects(st_, 2, Resize{50, 132}, "exec has no pty"));
}

TEST_F(AgentStateTest, DataOnlyOnFileWriteBeforeDataEnd) {
  ASSERT_TRUE(Accepts(st_, 1, FileWrite{"/f", 0644, false, false}));
  EXPECT_TRUE(Accepts(st_, 1, Data{"one"}));
  EXPECT_TRUE(Accepts(st_, 1, Data{"two"}));
  EXPECT_TRUE(Accepts(st_, 1, DataEnd{}));
  EXPECT_TRUE(Rejects(st_, 1, Data{"three"}, "after data_end"));
  EXPECT_TRUE(Rejects(st_, 1, DataEnd{}, "after data_end"));
  EXPECT_TRUE(st_.IsOpen(1)) << "the stream stays open until the agent's done";

  ASSERT_TRUE(Accepts(st_, 2, FileWrite{"/g", 0644, false, true}));
  EXPECT_TRUE(Accepts(st_, 2, DataEnd{})) << "an empty upload";

  uint32_t stream = 2;
  for (const auto& m : Openers()) {
    if (TypeOf(m) == MsgType::kFileWrite) continue;
    ++stream;
    ASSERT_TRUE(Accepts(st_, stream, m));
    EXPECT_TRUE(Rejects(st_, stream, Data{"x"}, "not a file_write stream"));
    EXPECT_TRUE(Rejects(st_, stream, DataEnd{}, "not a file_write stream"));
  }
}

TEST_F(AgentStateTest, DaemonFramesAfterTheAgentClosedTheStreamAreLate) {
  ASSERT_TRUE(Accepts(st_, 1, PtyExec()));
  st_.Send(1, Started{100});
  st_.Send(1, Output{OutputFd::kStdout, "hi"});
  EXPECT_TRUE(st_.IsOpen(1)) << "started and output do not close";
  st_.Send(1, ExitedOk());
  EXPECT_FALSE(st_.IsOpen(1));
  EXPECT_TRUE(Late(st_, 1, StdinData{"x"}));
  EXPECT_TRUE(Late(st_, 1, StdinClose{}));
  EXPECT_TRUE(Late(st_, 1, Signal{9}));
  EXPECT_TRUE(Late(st_, 1, Resize{10, 10}));

  // The agent failed an upload part way: the rest of the upload is in flight, and late.
  ASSERT_TRUE(Accepts(st_, 2, FileWrite{"/f", 0644, false, false}));
  ASSERT_TRUE(Accepts(st_, 2, Data{"part"}));
  st_.Send(2, Err());
  EXPECT_FALSE(st_.IsOpen(2));
  EXPECT_TRUE(Late(st_, 2, Data{"more"}));
  EXPECT_TRUE(Late(st_, 2, DataEnd{}));

  // Every closing message the agent sends closes the stream.
  ASSERT_TRUE(Accepts(st_, 3, PipeExec()));
  st_.Send(3, Err());
  EXPECT_TRUE(Late(st_, 3, StdinData{"x"}));
  ASSERT_TRUE(Accepts(st_, 4, Stat{"/s"}));
  st_.Send(4, StatResult{Info()});
  EXPECT_FALSE(st_.IsOpen(4));
  ASSERT_TRUE(Accepts(st_, 5, FileWrite{"/f", 0644, false, false}));
  ASSERT_TRUE(Accepts(st_, 5, DataEnd{}));
  st_.Send(5, Done{0});
  EXPECT_FALSE(st_.IsOpen(5));
  EXPECT_TRUE(Late(st_, 5, Data{"x"}));
  EXPECT_EQ(st_.open_streams(), 0u);

  // Late frames do not reopen anything, and an opener on a closed id is still an error.
  EXPECT_TRUE(Rejects(st_, 1, PipeExec(), "not above"));
}

TEST_F(AgentStateTest, AttachStreamTakesControlUntilDetach) {
  ASSERT_TRUE(Accepts(st_, 1, Attach{.pid = 7, .output = AttachOutput::kReplay}));
  // Whether the process takes input is the agent's to know: input is never a protocol error.
  EXPECT_TRUE(Accepts(st_, 1, StdinData{"x"}));
  EXPECT_TRUE(Accepts(st_, 1, StdinClose{}));
  EXPECT_TRUE(Accepts(st_, 1, StdinData{"dropped by the agent"}));
  EXPECT_TRUE(Accepts(st_, 1, Signal{2}));
  EXPECT_TRUE(Accepts(st_, 1, Resize{40, 100}));
  EXPECT_TRUE(Rejects(st_, 1, Data{"d"}, "not a file_write stream"));
  EXPECT_TRUE(Accepts(st_, 1, Detach{}));
  EXPECT_TRUE(Rejects(st_, 1, StdinData{"x"}, "after detach"));
  EXPECT_TRUE(Rejects(st_, 1, Detach{}, "after detach"));
  st_.Send(1, Done{0});
  EXPECT_FALSE(st_.IsOpen(1));
  // After the agent ended it (the process exited), the daemon's detach is late.
  EXPECT_TRUE(Late(st_, 1, Detach{}));
  EXPECT_TRUE(Late(st_, 1, Signal{9}));
}

TEST_F(AgentStateTest, DetachOnlyOnAttachStreams) {
  ASSERT_TRUE(Accepts(st_, 1, PipeExec()));
  EXPECT_TRUE(Rejects(st_, 1, Detach{}, "not an attach stream"));
  ASSERT_TRUE(Accepts(st_, 2, ProcList{}));
  EXPECT_TRUE(Rejects(st_, 2, Detach{}, "not an attach stream"));
  EXPECT_TRUE(Rejects(st_, 2, StdinData{"x"}, "not an exec stream"));
}

TEST_F(AgentStateTest, BackgroundExecIsClosedByItsStarted) {
  ASSERT_TRUE(Accepts(st_, 1, Exec{.argv = {"/bin/cat"},
                                   .stdin_mode = StdinMode::kPipe,
                                   .background = true}));
  st_.Send(1, Started{5});
  EXPECT_FALSE(st_.IsOpen(1));
  // Its stdin is reached through an attachment; on the exec stream it is late.
  EXPECT_TRUE(Late(st_, 1, StdinData{"x"}));
}

TEST_F(AgentStateTest, MessagesTheDaemonDoesNotSendAreRejected) {
  ASSERT_TRUE(Accepts(st_, 1, PipeExec()));
  const Message agent_only[] = {Started{10},
                                Output{OutputFd::kStdout, "o"},
                                ExitedOk(),
                                StatResult{Info()},
                                Entries{{Info()}},
                                Done{1},
                                Err(),
                                Attached{.pid = 1},
                                Dropped{1},
                                Processes{},
                                kHello,
                                Ping{1},
                                Pong{1}};
  for (const auto& m : agent_only) {
    EXPECT_TRUE(Rejects(st_, 1, m, "the daemon does not send this"));
    EXPECT_TRUE(Rejects(st_, 7, m, "the daemon does not send this"));
  }
  EXPECT_TRUE(st_.IsOpen(1));
}

TEST_F(AgentStateTest, AgentSendOnStreamZeroChangesNothing) {
  ASSERT_TRUE(Accepts(st_, 1, PipeExec()));
  st_.Send(0, Pong{1});
  st_.Send(0, Err());
  EXPECT_TRUE(st_.IsOpen(1));
  EXPECT_TRUE(Accepts(st_, 1, StdinData{"x"}));
}

// --- the daemon's view: frames from the agent ---

class DaemonStateTest : public ::testing::Test {
 protected:
  void SetUp() override {
    st_.Send(0, kHello);
    ASSERT_TRUE(Accepts(st_, 0, kHello));
  }
  ChannelState st_{Role::kDaemon};
};

TEST_F(DaemonStateTest, SendOpensStreams) {
  uint32_t stream = 0;
  for (const auto& m : Openers()) {
    st_.Send(++stream, m);
    EXPECT_TRUE(st_.IsOpen(stream));
  }
  EXPECT_EQ(st_.open_streams(), Openers().size());
}

TEST_F(DaemonStateTest, FramesOnStreamsNotOpenRejected) {
  EXPECT_TRUE(Rejects(st_, 1, Started{10}, "stream is not open"));
  EXPECT_TRUE(Rejects(st_, 1, Err(), "stream is not open"));
  st_.Send(2, NullExec());
  EXPECT_TRUE(Rejects(st_, 1, Done{0}, "stream is not open"));
  EXPECT_TRUE(Rejects(st_, 3, Started{10}, "stream is not open"));
  EXPECT_TRUE(Accepts(st_, 2, Started{10}));
}

TEST_F(DaemonStateTest, ExecStartedOnceThenOutputThenExited) {
  st_.Send(1, PipeExec());
  EXPECT_TRUE(Rejects(st_, 1, Output{OutputFd::kStdout, "early"}, "not a started exec or attach stream"));
  EXPECT_TRUE(Rejects(st_, 1, ExitedOk(), "not a started exec or attach stream"));
  EXPECT_TRUE(Accepts(st_, 1, Started{42}));
  EXPECT_TRUE(Rejects(st_, 1, Started{42}, "unexpected started"));
  EXPECT_TRUE(Accepts(st_, 1, Output{OutputFd::kStdout, "out"}));
  EXPECT_TRUE(Accepts(st_, 1, Output{OutputFd::kStderr, "err"}));
  EXPECT_TRUE(Accepts(st_, 1, Output{OutputFd::kStdout, "more"}));
  EXPECT_TRUE(st_.IsOpen(1));
  EXPECT_TRUE(Accepts(st_, 1, Exited{.exit_code = -1, .term_signal = 9}));
  EXPECT_FALSE(st_.IsOpen(1));
  EXPECT_TRUE(Rejects(st_, 1, Output{OutputFd::kStdout, "after"}, "stream is not open"));
  EXPECT_TRUE(Rejects(st_, 1, ExitedOk(), "stream is not open"));

  // The daemon's own stdin for a stream that exited is late, not a broken invariant.
  st_.Send(1, StdinData{"in flight"});
  st_.Send(1, StdinClose{});
  EXPECT_FALSE(st_.IsOpen(1));
}

TEST_F(DaemonStateTest, ExecMessagesOnlyOnExecStreams) {
  uint32_t stream = 0;
  for (const auto& m : Openers()) {
    if (TypeOf(m) == MsgType::kExec) continue;
    st_.Send(++stream, m);
    EXPECT_TRUE(Rejects(st_, stream, Started{10}, "unexpected started"));
    EXPECT_TRUE(Rejects(st_, stream, Output{OutputFd::kStdout, "o"}, "not a started exec"));
    EXPECT_TRUE(Rejects(st_, stream, ExitedOk(), "not a started exec"));
  }
}

TEST_F(DaemonStateTest, FileReadTakesDataThenDone) {
  st_.Send(1, FileRead{"/r", 0, 0});
  EXPECT_TRUE(Accepts(st_, 1, Data{"chunk1"}));
  EXPECT_TRUE(Accepts(st_, 1, Data{"chunk2"}));
  EXPECT_TRUE(Rejects(st_, 1, DataEnd{}, "the agent does not send this"));
  EXPECT_TRUE(Accepts(st_, 1, Done{12}));
  EXPECT_FALSE(st_.IsOpen(1));
  EXPECT_TRUE(Rejects(st_, 1, Data{"x"}, "stream is not open"));

  uint32_t stream = 1;
  for (const auto& m : Openers()) {
    if (TypeOf(m) == MsgType::kFileRead) continue;
    st_.Send(++stream, m);
    EXPECT_TRUE(Rejects(st_, stream, Data{"x"}, "not a file_read stream"));
  }
}

TEST_F(DaemonStateTest, ListTakesEntriesThenDone) {
  st_.Send(1, List{"/"});
  EXPECT_TRUE(Accepts(st_, 1, Entries{{Info(), Info()}}));
  EXPECT_TRUE(Accepts(st_, 1, Entries{}));
  EXPECT_TRUE(Accepts(st_, 1, Done{2}));
  EXPECT_FALSE(st_.IsOpen(1));

  st_.Send(2, List{"/empty"});
  EXPECT_TRUE(Accepts(st_, 2, Done{0})) << "an empty directory: done without entries";

  uint32_t stream = 2;
  for (const auto& m : Openers()) {
    if (TypeOf(m) == MsgType::kList) continue;
    st_.Send(++stream, m);
    EXPECT_TRUE(Rejects(st_, stream, Entries{{Info()}}, "not a list stream"));
  }
}

TEST_F(DaemonStateTest, StatResultClosesAStatStream) {
  st_.Send(1, Stat{"/s"});
  EXPECT_TRUE(Rejects(st_, 1, Done{1}, "this stream does not end with done"));
  EXPECT_TRUE(Accepts(st_, 1, StatResult{Info()}));
  EXPECT_FALSE(st_.IsOpen(1));
  EXPECT_TRUE(Rejects(st_, 1, StatResult{Info()}, "stream is not open"));

  uint32_t stream = 1;
  for (const auto& m : Openers()) {
    if (TypeOf(m) == MsgType::kStat) continue;
    st_.Send(++stream, m);
    EXPECT_TRUE(Rejects(st_, stream, StatResult{Info()}, "not a stat stream"));
  }
}

TEST_F(DaemonStateTest, DoneOnlyOnStreamsThatEndWithDone) {
  st_.Send(1, NullExec());
  ASSERT_TRUE(Accepts(st_, 1, Started{5}));
  EXPECT_TRUE(Rejects(st_, 1, Done{0}, "this stream does not end with done"));
  st_.Send(2, Stat{"/s"});
  EXPECT_TRUE(Rejects(st_, 2, Done{0}, "this stream does not end with done"));
  st_.Send(3, Remove{"/x", true});
  EXPECT_TRUE(Accepts(st_, 3, Done{17}));
  EXPECT_FALSE(st_.IsOpen(3));
  st_.Send(4, Mkdir{"/d", 0755, true});
  EXPECT_TRUE(Accepts(st_, 4, Done{1}));
  EXPECT_FALSE(st_.IsOpen(4));
  EXPECT_TRUE(st_.IsOpen(1));
  EXPECT_TRUE(st_.IsOpen(2));
}

TEST_F(DaemonStateTest, FileWriteDoneOnlyAfterDataEnd) {
  st_.Send(1, FileWrite{"/f", 0644, false, false});
  EXPECT_TRUE(Rejects(st_, 1, Done{0}, "done before the upload ended"));
  st_.Send(1, Data{"abc"});
  EXPECT_TRUE(Rejects(st_, 1, Done{3}, "done before the upload ended"));
  EXPECT_TRUE(Rejects(st_, 1, Data{"x"}, "not a file_read stream"))
      << "the agent does not send data on an upload";
  st_.Send(1, DataEnd{});
  EXPECT_TRUE(Accepts(st_, 1, Done{3}));
  EXPECT_FALSE(st_.IsOpen(1));
}

TEST_F(DaemonStateTest, ErrorClosesAnyStream) {
  uint32_t stream = 0;
  for (const auto& m : Openers()) {
    st_.Send(++stream, m);
    EXPECT_TRUE(Accepts(st_, stream, Err())) << Describe(stream, m);
    EXPECT_FALSE(st_.IsOpen(stream)) << Describe(stream, m);
    EXPECT_TRUE(Rejects(st_, stream, Err(), "stream is not open"));
  }
  // Also part way: an exec that started, an upload not yet ended.
  st_.Send(++stream, PipeExec());
  ASSERT_TRUE(Accepts(st_, stream, Started{7}));
  ASSERT_TRUE(Accepts(st_, stream, Output{OutputFd::kStderr, "dying"}));
  EXPECT_TRUE(Accepts(st_, stream, Err()));
  EXPECT_FALSE(st_.IsOpen(stream));
  st_.Send(++stream, FileWrite{"/f", 0644, false, false});
  st_.Send(stream, Data{"part"});
  EXPECT_TRUE(Accepts(st_, stream, Err()));
  EXPECT_FALSE(st_.IsOpen(stream));
  st_.Send(stream, Data{"rest, in flight"});  // late: must not trip the daemon's own check
  st_.Send(stream, DataEnd{});
  EXPECT_EQ(st_.open_streams(), 0u);
}

TEST_F(DaemonStateTest, AttachIsAnsweredByAttachedThenOutputThenAnEnd) {
  st_.Send(1, Attach{.pid = 7, .output = AttachOutput::kReplay});
  EXPECT_TRUE(Rejects(st_, 1, Output{OutputFd::kStdout, "early"}, "not a started exec or attach"));
  EXPECT_TRUE(Rejects(st_, 1, Done{0}, "done before attached"));
  EXPECT_TRUE(Rejects(st_, 1, Started{7}, "unexpected started"));
  EXPECT_TRUE(Accepts(st_, 1, Attached{.pid = 7, .running = true}));
  EXPECT_TRUE(Rejects(st_, 1, Attached{.pid = 7}, "unexpected attached"));
  EXPECT_TRUE(Accepts(st_, 1, Dropped{100}));
  EXPECT_TRUE(Accepts(st_, 1, Output{OutputFd::kStderr, "e"}));
  EXPECT_TRUE(Accepts(st_, 1, ExitedOk()));
  EXPECT_FALSE(st_.IsOpen(1));

  st_.Send(2, Attach{.pid = 8});
  EXPECT_TRUE(Accepts(st_, 2, Attached{.pid = 8}));
  st_.Send(2, Detach{});
  EXPECT_TRUE(Accepts(st_, 2, Done{0}));
  EXPECT_FALSE(st_.IsOpen(2));
  // Late input after the end is the daemon's own race, not a broken invariant.
  st_.Send(2, Signal{9});
  st_.Send(2, Detach{});
}

TEST_F(DaemonStateTest, BackgroundExecEndsWithStartedAndDroppedOnlyOnAttach) {
  st_.Send(1, Exec{.argv = {"/bin/sleep"}, .background = true});
  EXPECT_TRUE(Accepts(st_, 1, Started{9}));
  EXPECT_FALSE(st_.IsOpen(1));
  EXPECT_TRUE(Rejects(st_, 1, Output{OutputFd::kStdout, "o"}, "stream is not open"));
  st_.Send(2, PipeExec());
  ASSERT_TRUE(Accepts(st_, 2, Started{10}));
  EXPECT_TRUE(Rejects(st_, 2, Dropped{1}, "not a started exec or attach"));
  st_.Send(3, ProcList{});
  EXPECT_TRUE(Accepts(st_, 3, Processes{}));
  EXPECT_TRUE(Rejects(st_, 3, Output{OutputFd::kStdout, "o"}, "not a started exec or attach"));
  EXPECT_TRUE(Accepts(st_, 3, Done{2}));
  EXPECT_FALSE(st_.IsOpen(3));
  EXPECT_TRUE(Rejects(st_, 2, Processes{}, "not a proc_list stream"));
}

TEST_F(DaemonStateTest, MessagesTheAgentDoesNotSendAreRejected) {
  st_.Send(1, PipeExec());
  ASSERT_TRUE(Accepts(st_, 1, Started{5}));
  st_.Send(2, FileWrite{"/f", 0644, false, false});
  std::vector<Message> daemon_only = Openers();
  daemon_only.insert(daemon_only.end(), {StdinData{"x"}, StdinClose{}, Signal{9}, Resize{1, 1},
                                         DataEnd{}, kHello, Ping{1}, Pong{1}, Detach{}});
  for (const auto& m : daemon_only) {
    EXPECT_TRUE(Rejects(st_, 1, m, "the agent does not send this"));
    EXPECT_TRUE(Rejects(st_, 2, m, "the agent does not send this"));
  }
  EXPECT_TRUE(st_.IsOpen(1));
  EXPECT_TRUE(st_.IsOpen(2));
}

TEST_F(DaemonStateTest, InterleavedStreams) {
  st_.Send(1, PipeExec());
  st_.Send(2, FileRead{"/r", 0, 0});
  st_.Send(3, NullExec());
  EXPECT_TRUE(Accepts(st_, 3, Started{30}));
  EXPECT_TRUE(Accepts(st_, 2, Data{"r"}));
  EXPECT_TRUE(Accepts(st_, 1, Started{10}));
  EXPECT_TRUE(Accepts(st_, 3, Output{OutputFd::kStdout, "3"}));
  EXPECT_TRUE(Accepts(st_, 3, ExitedOk()));
  EXPECT_TRUE(Accepts(st_, 1, Output{OutputFd::kStdout, "1"}));
  EXPECT_TRUE(Accepts(st_, 2, Done{1}));
  EXPECT_EQ(st_.open_streams(), 1u);
  EXPECT_TRUE(st_.IsOpen(1));
  EXPECT_TRUE(Accepts(st_, 0, Ping{3}));
  EXPECT_TRUE(Accepts(st_, 1, ExitedOk()));
  EXPECT_EQ(st_.open_streams(), 0u);
}

TEST(ChannelStateDeathTest, DaemonSendingOutOfOrderIsABug) {
  EXPECT_DEATH(
      {
        ChannelState st(Role::kDaemon);
        st.Send(2, NullExec());
        st.Send(1, NullExec());
      },
      "check failed");
  EXPECT_DEATH(
      {
        ChannelState st(Role::kDaemon);
        st.Send(1, StdinData{"never opened"});
      },
      "check failed");
  EXPECT_DEATH(
      {
        ChannelState st(Role::kDaemon);
        st.Send(1, NullExec());
        st.Send(1, StdinData{"stdin is /dev/null"});
      },
      "check failed");
}

}  // namespace
}  // namespace airlock::protocol
