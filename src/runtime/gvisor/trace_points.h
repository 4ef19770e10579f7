#pragma once
// gVisor's trace points as its "remote" sink sends them (docs/design/gvisor.md, "Process
// events"): each message on the SOCK_SEQPACKET connection is an 8-byte header (header size,
// message type, dropped count: little-endian u16, u16, u32) then one protocol buffer. Only the
// few points the engine asks for are read, and only the fields it uses.
//
// The sender is the Sentry, which the threat model does not trust: every length is checked
// against what is left, a malformed message is an error (never a crash or an overread), and
// what is kept is capped (ProcessEvent's argv caps).

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/error.h"

namespace airlock::gvisor {

// The wire version this reader speaks (the handshake's).
inline constexpr uint32_t kTraceWireVersion = 1;

// The message types the engine reads (gVisor's MessageType enum).
enum class TraceType : uint16_t {
  kContainerStart = 1,
  kClone = 2,
  kExec = 3,
  kExitNotifyParent = 4,
};

struct TracePoint {
  uint16_t type = 0;      // any MessageType; the fields below are read for TraceType's
  uint32_t dropped = 0;   // points the Sentry could not send since the connection began (wraps)
  // The context of the task that hit the point (pids in the sandbox's root pid namespace).
  int32_t tid = 0;
  int32_t tgid = 0;
  int64_t euid = -1;      // -1: the context carried no credentials
  // kClone: the new task.
  int32_t created_tid = 0;
  int32_t created_tgid = 0;
  // kExec: the new image's argv; kContainerStart: the container's args. Capped as
  // runtime::ProcessEvent's argv; `cut` when the cap or a truncated message cut it.
  std::vector<std::string> argv;
  bool cut = false;
  // kExitNotifyParent: the wait(2) status.
  int32_t exit_status = 0;
};

// Decodes one message. `truncated`: the socket delivered only its start (the rest did not fit
// the reader's buffer); what is whole is read and an argv that was cut is marked. kInvalidArgument
// when the bytes are not such a message.
[[nodiscard]] Result<TracePoint> DecodeTracePoint(std::string_view message, bool truncated);

// The handshake's version (a Handshake message: field 1, varint); kInvalidArgument if malformed.
[[nodiscard]] Result<uint32_t> DecodeHandshake(std::string_view message);
// A Handshake message of kTraceWireVersion.
std::string EncodeHandshake();

}  // namespace airlock::gvisor
