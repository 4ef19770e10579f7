#include "protocol/wire.h"

namespace airlock::protocol {

std::string_view MsgTypeName(MsgType type) {
  switch (type) {
    case MsgType::kHello:
      return "hello";
    case MsgType::kPing:
      return "ping";
    case MsgType::kPong:
      return "pong";
    case MsgType::kExec:
      return "exec";
    case MsgType::kFileWrite:
      return "file_write";
    case MsgType::kFileRead:
      return "file_read";
    case MsgType::kStat:
      return "stat";
    case MsgType::kList:
      return "list";
    case MsgType::kRemove:
      return "remove";
    case MsgType::kMkdir:
      return "mkdir";
    case MsgType::kAttach:
      return "attach";
    case MsgType::kProcList:
      return "proc_list";
    case MsgType::kQuiesce:
      return "quiesce";
    case MsgType::kDetach:
      return "detach";
    case MsgType::kAttached:
      return "attached";
    case MsgType::kDropped:
      return "dropped";
    case MsgType::kProcesses:
      return "processes";
    case MsgType::kStdinData:
      return "stdin_data";
    case MsgType::kStdinClose:
      return "stdin_close";
    case MsgType::kSignal:
      return "signal";
    case MsgType::kResize:
      return "resize";
    case MsgType::kStarted:
      return "started";
    case MsgType::kOutput:
      return "output";
    case MsgType::kExited:
      return "exited";
    case MsgType::kData:
      return "data";
    case MsgType::kDataEnd:
      return "data_end";
    case MsgType::kStatResult:
      return "stat_result";
    case MsgType::kEntries:
      return "entries";
    case MsgType::kDone:
      return "done";
    case MsgType::kError:
      return "error";
  }
  return "unknown";
}

bool IsKnownMsgType(uint8_t value) { return MsgTypeName(static_cast<MsgType>(value)) != "unknown"; }

void AppendHeader(std::string& out, const FrameHeader& h) {
  auto put = [&](uint64_t v, size_t bytes) {
    for (size_t i = 0; i < bytes; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
  };
  put(h.payload_len, 4);
  put(h.version, 1);
  put(static_cast<uint8_t>(h.type), 1);
  put(h.flags, 2);
  put(h.stream, 4);
}

}  // namespace airlock::protocol
