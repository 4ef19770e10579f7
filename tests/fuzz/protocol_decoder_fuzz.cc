// libFuzzer target for the bytes an agent channel carries: FrameDecoder, DecodeMessage and the
// ChannelState rules, as a receiver runs them. docs/design/protocol.md says how to run it.
//
// Input: byte 0 picks where the rest is split into two Feed calls (partial frames); the rest is
// the channel's bytes. Every frame is decoded; every decoded message is checked to re-encode to
// the same bytes and to decode to an equal message, and is given to two pairs of ChannelStates:
//
//  - `receivers`: one per role, each receiving every frame, as a peer would that trusts nothing.
//  - `conversation`: the frames read as a transcript of one channel in both directions. A frame
//    goes to the side it is addressed to; when that side accepts it, the sending side records it
//    with Send. This reaches the states a real exchange reaches (streams that started, uploads
//    that ended, frames that are late), which a side receiving its own messages never gets to.
//
// A state that returned an error is fed no more frames, as a receiver would close the channel.

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "common/error.h"
#include "protocol/channel_state.h"
#include "protocol/frame_decoder.h"
#include "protocol/messages.h"

namespace airlock::protocol {
namespace {

const Hello kOwnHello{kProtocolVersion, "fuzz", 0};

// A ChannelState that stops taking frames after its first error.
struct Side {
  explicit Side(Role role) : state(role) { state.Send(0, kOwnHello); }

  // Receive, returning whether the frame was taken (accepted or late).
  bool Receive(uint32_t stream, const Message& msg) {
    if (!alive) return false;
    auto verdict = state.Receive(stream, msg);
    if (!verdict) {
      AIRLOCK_CHECK(verdict.error().code() == ErrorCode::kProtocol);
      alive = false;
      return false;
    }
    return true;
  }

  ChannelState state;
  bool alive = true;
};

enum class Direction { kChannel, kFromDaemon, kFromAgent, kData };

Direction DirectionOf(uint32_t stream, MsgType type) {
  switch (type) {
    case MsgType::kHello:
    case MsgType::kPing:
    case MsgType::kPong:
      return Direction::kChannel;
    case MsgType::kError:
      return stream == 0 ? Direction::kChannel : Direction::kFromAgent;
    case MsgType::kExec:
    case MsgType::kFileWrite:
    case MsgType::kFileRead:
    case MsgType::kStat:
    case MsgType::kList:
    case MsgType::kRemove:
    case MsgType::kMkdir:
    case MsgType::kStdinData:
    case MsgType::kStdinClose:
    case MsgType::kSignal:
    case MsgType::kResize:
    case MsgType::kDataEnd:
    case MsgType::kAttach:
    case MsgType::kProcList:
    case MsgType::kQuiesce:
    case MsgType::kDetach:
      return Direction::kFromDaemon;
    case MsgType::kStarted:
    case MsgType::kOutput:
    case MsgType::kExited:
    case MsgType::kStatResult:
    case MsgType::kEntries:
    case MsgType::kDone:
    case MsgType::kAttached:
    case MsgType::kDropped:
    case MsgType::kProcesses:
      return Direction::kFromAgent;
    case MsgType::kData:
      return Direction::kData;  // upload or download
  }
  return Direction::kChannel;
}

class Conversation {
 public:
  void Deliver(uint32_t stream, const Message& msg) {
    switch (DirectionOf(stream, TypeOf(msg))) {
      case Direction::kChannel:
        agent_.Receive(stream, msg);
        daemon_.Receive(stream, msg);
        break;
      case Direction::kFromDaemon:
        FromDaemon(stream, msg);
        break;
      case Direction::kFromAgent:
        FromAgent(stream, msg);
        break;
      case Direction::kData: {
        // Upload data when the agent would take it from the daemon, else download data. The
        // agent's state is tried on a copy so that a download is not held against it.
        bool upload = false;
        if (agent_.alive) {
          ChannelState trial = agent_.state;
          upload = trial.Receive(stream, msg).has_value();
          if (upload) agent_.state = std::move(trial);
        }
        if (upload) {
          if (daemon_.alive) daemon_.state.Send(stream, msg);
        } else {
          FromAgent(stream, msg);
        }
        break;
      }
    }
    CheckSidesAgree(stream);
  }

 private:
  void FromDaemon(uint32_t stream, const Message& msg) {
    // Send's precondition is that the daemon follows the rules: only what the agent accepted.
    if (agent_.Receive(stream, msg) && daemon_.alive) daemon_.state.Send(stream, msg);
  }
  void FromAgent(uint32_t stream, const Message& msg) {
    if (daemon_.Receive(stream, msg) && agent_.alive) agent_.state.Send(stream, msg);
  }

  // Each side opens a stream on the daemon's opener and closes it on the agent's closing
  // message, so while both follow the same frames they must agree on what is open.
  void CheckSidesAgree(uint32_t stream) const {
    if (!agent_.alive || !daemon_.alive) return;
    AIRLOCK_CHECK(agent_.state.open_streams() == daemon_.state.open_streams());
    AIRLOCK_CHECK(agent_.state.IsOpen(stream) == daemon_.state.IsOpen(stream));
  }

  Side agent_{Role::kAgent};
  Side daemon_{Role::kDaemon};
};

// The invariant the fuzzer checks on every message: the strict decoder admits exactly one
// encoding per message, so re-encoding reproduces the frame and decodes to an equal message.
void CheckReencodes(const Frame& frame, const Message& msg) {
  AIRLOCK_CHECK(TypeOf(msg) == frame.type);
  std::string again = EncodeFrame(frame.stream, msg);
  AIRLOCK_CHECK(again.size() == kHeaderSize + frame.payload.size());
  AIRLOCK_CHECK(std::string_view(again).substr(kHeaderSize) == frame.payload);
  FrameDecoder decoder;
  decoder.Feed(again);
  auto next = decoder.Next();
  AIRLOCK_CHECK(next.has_value() && next->has_value());
  AIRLOCK_CHECK((*next)->stream == frame.stream && (*next)->type == frame.type);
  auto decoded = DecodeMessage((*next)->type, (*next)->payload);
  AIRLOCK_CHECK(decoded.has_value());
  AIRLOCK_CHECK(*decoded == msg);
  AIRLOCK_CHECK(decoder.buffered() == 0);
}

class Harness {
 public:
  // Returns false once the decoder has failed: the channel is unusable from then on.
  bool Feed(std::string_view bytes) {
    decoder_.Feed(bytes);
    while (true) {
      auto next = decoder_.Next();
      if (!next) {
        AIRLOCK_CHECK(next.error().code() == ErrorCode::kProtocol);
        return false;
      }
      if (!*next) return true;
      const Frame& frame = **next;
      auto msg = DecodeMessage(frame.type, frame.payload);
      if (!msg) {
        // A receiver would send an Error and close; keep decoding to reach more frames.
        AIRLOCK_CHECK(msg.error().code() == ErrorCode::kProtocol);
        continue;
      }
      CheckReencodes(frame, *msg);
      agent_receiver_.Receive(frame.stream, *msg);
      daemon_receiver_.Receive(frame.stream, *msg);
      conversation_.Deliver(frame.stream, *msg);
    }
  }

 private:
  FrameDecoder decoder_;
  Side agent_receiver_{Role::kAgent};
  Side daemon_receiver_{Role::kDaemon};
  Conversation conversation_;
};

}  // namespace
}  // namespace airlock::protocol

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  std::string_view bytes(reinterpret_cast<const char*>(data) + 1, size - 1);
  size_t split = bytes.size() * data[0] / 255;
  airlock::protocol::Harness harness;
  if (harness.Feed(bytes.substr(0, split))) harness.Feed(bytes.substr(split));
  return 0;
}
