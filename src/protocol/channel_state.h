#pragma once
// ChannelState: the ordering rules of the protocol, enforced on what the peer sends.
//
// Each end of a channel keeps one. It checks every message received from the peer against the
// streams it knows (handshake first, streams opened by the daemon with ids that only grow,
// data only on streams that take it, a closing message ends a stream) and records what its own
// side sends. docs/design/protocol.md lists the rules.

#include <cstdint>
#include <unordered_map>

#include "common/error.h"
#include "protocol/messages.h"

namespace airlock::protocol {

enum class Role { kDaemon, kAgent };

enum class Verdict {
  kAccept,  // handle the message
  kLate,    // for a stream this side already closed (e.g. stdin after exit): drop it quietly
};

class ChannelState {
 public:
  explicit ChannelState(Role self) : self_(self) {}

  // Checks a message received from the peer on `stream` and updates the state. An error means
  // the peer broke the protocol; the channel should be closed.
  [[nodiscard]] Result<Verdict> Receive(uint32_t stream, const Message& msg);
  // Records a message this side sends. Precondition: it follows the rules (a bug otherwise).
  void Send(uint32_t stream, const Message& msg);

  bool handshake_done() const { return hello_received_ && hello_sent_; }
  size_t open_streams() const { return streams_.size(); }
  bool IsOpen(uint32_t stream) const { return streams_.contains(stream); }

 private:
  enum class Kind { kExec, kFileWrite, kFileRead, kStat, kList, kRemove, kMkdir, kAttach, kProcList,
                    kQuiesce };
  struct Stream {
    Kind kind;
    bool stdin_open = false;   // exec with a stdin pipe the daemon has not closed
    bool pty = false;          // exec on a terminal
    bool started = false;      // exec: the agent sent kStarted; attach: kAttached
    bool background = false;   // exec: kStarted closes the stream
    bool detached = false;     // attach: the daemon sent kDetach
    bool upload_open = false;  // file write: the daemon has not sent kDataEnd
  };

  Result<Verdict> FromDaemon(uint32_t stream, const Message& msg);
  Result<Verdict> FromAgent(uint32_t stream, const Message& msg);
  void Open(uint32_t stream, const Message& msg);
  // The daemon's streams: an open one, or a verdict for one that is not open.
  Result<Stream*> Find(uint32_t stream, const Message& msg);

  Role self_;
  bool hello_received_ = false;
  bool hello_sent_ = false;
  uint32_t highest_stream_ = 0;
  std::unordered_map<uint32_t, Stream> streams_;
};

}  // namespace airlock::protocol
