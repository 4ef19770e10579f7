#include "protocol/channel_state.h"

#include <string>

namespace airlock::protocol {
namespace {

std::unexpected<Error> Violation(uint32_t stream, const Message& msg, std::string_view why) {
  return Fail(ErrorCode::kProtocol, std::string(MsgTypeName(TypeOf(msg))) + " on stream " +
                                        std::to_string(stream) + ": " + std::string(why));
}

bool IsOpener(MsgType t) {
  return t == MsgType::kExec || t == MsgType::kFileWrite || t == MsgType::kFileRead ||
         t == MsgType::kStat || t == MsgType::kList || t == MsgType::kRemove ||
         t == MsgType::kMkdir || t == MsgType::kAttach || t == MsgType::kProcList ||
         t == MsgType::kQuiesce;
}

}  // namespace

Result<Verdict> ChannelState::Receive(uint32_t stream, const Message& msg) {
  MsgType type = TypeOf(msg);
  if (!hello_received_) {
    if (type != MsgType::kHello || stream != 0) {
      return Violation(stream, msg, "the first frame must be hello on stream 0");
    }
    if (std::get<Hello>(msg).version != kProtocolVersion) {
      return Fail(ErrorCode::kProtocol,
                  "peer speaks protocol version " + std::to_string(std::get<Hello>(msg).version) +
                      ", this side speaks " + std::to_string(kProtocolVersion));
    }
    hello_received_ = true;
    return Verdict::kAccept;
  }
  if (stream == 0) {
    if (type == MsgType::kPing || type == MsgType::kPong || type == MsgType::kError) {
      return Verdict::kAccept;
    }
    return Violation(stream, msg,
                     type == MsgType::kHello ? "second hello" : "not a channel message");
  }
  return self_ == Role::kAgent ? FromDaemon(stream, msg) : FromAgent(stream, msg);
}

Result<ChannelState::Stream*> ChannelState::Find(uint32_t stream, const Message& msg) {
  auto it = streams_.find(stream);
  if (it != streams_.end()) return &it->second;
  if (stream <= highest_stream_) return nullptr;  // closed: late
  return Violation(stream, msg, "stream was never opened");
}

Result<Verdict> ChannelState::FromDaemon(uint32_t stream, const Message& msg) {
  MsgType type = TypeOf(msg);
  if (IsOpener(type)) {
    if (stream <= highest_stream_) {
      return Violation(
          stream, msg,
          "stream id is not above every id used before (" + std::to_string(highest_stream_) + ")");
    }
    Open(stream, msg);
    return Verdict::kAccept;
  }
  if (type != MsgType::kStdinData && type != MsgType::kStdinClose && type != MsgType::kSignal &&
      type != MsgType::kResize && type != MsgType::kData && type != MsgType::kDataEnd &&
      type != MsgType::kDetach) {
    return Violation(stream, msg, "the daemon does not send this");
  }
  auto found = Find(stream, msg);
  if (!found) return std::unexpected(found.error());
  Stream* s = *found;
  if (s && s->kind == Kind::kAttach) {
    // What the process takes is known only to the agent (it drops input a closed stdin cannot
    // take); the daemon only must not speak after detaching.
    if (type == MsgType::kData || type == MsgType::kDataEnd) {
      return Violation(stream, msg, "not a file_write stream");
    }
    if (s->detached) return Violation(stream, msg, "after detach");
    if (type == MsgType::kDetach) s->detached = true;
    return Verdict::kAccept;
  }
  if (type == MsgType::kDetach) {
    if (!s) return Verdict::kLate;
    return Violation(stream, msg, "not an attach stream");
  }
  switch (type) {
    case MsgType::kStdinData:
    case MsgType::kStdinClose:
      if (!s) return Verdict::kLate;
      if (s->kind != Kind::kExec) return Violation(stream, msg, "not an exec stream");
      if (!s->stdin_open) return Violation(stream, msg, "stdin is not an open pipe");
      if (type == MsgType::kStdinClose) s->stdin_open = false;
      return Verdict::kAccept;
    case MsgType::kSignal:
    case MsgType::kResize:
      if (!s) return Verdict::kLate;
      if (s->kind != Kind::kExec) return Violation(stream, msg, "not an exec stream");
      if (type == MsgType::kResize && !s->pty) return Violation(stream, msg, "exec has no pty");
      return Verdict::kAccept;
    default:  // kData, kDataEnd
      if (!s) return Verdict::kLate;
      if (s->kind != Kind::kFileWrite) return Violation(stream, msg, "not a file_write stream");
      if (!s->upload_open) return Violation(stream, msg, "after data_end");
      if (type == MsgType::kDataEnd) s->upload_open = false;
      return Verdict::kAccept;
  }
}

Result<Verdict> ChannelState::FromAgent(uint32_t stream, const Message& msg) {
  MsgType type = TypeOf(msg);
  auto it = streams_.find(stream);
  if (it == streams_.end()) return Violation(stream, msg, "stream is not open");
  Stream& s = it->second;
  bool close = false;
  switch (type) {
    case MsgType::kStarted:
      if (s.kind != Kind::kExec || s.started) return Violation(stream, msg, "unexpected started");
      s.started = true;
      close = s.background;
      break;
    case MsgType::kAttached:
      if (s.kind != Kind::kAttach || s.started) return Violation(stream, msg, "unexpected attached");
      s.started = true;
      break;
    case MsgType::kOutput:
    case MsgType::kExited:
    case MsgType::kDropped:
      if ((s.kind != Kind::kExec && s.kind != Kind::kAttach) || !s.started ||
          (type == MsgType::kDropped && s.kind != Kind::kAttach)) {
        return Violation(stream, msg, "not a started exec or attach stream");
      }
      close = type == MsgType::kExited;
      break;
    case MsgType::kProcesses:
      if (s.kind != Kind::kProcList) return Violation(stream, msg, "not a proc_list stream");
      break;
    case MsgType::kData:
      if (s.kind != Kind::kFileRead) return Violation(stream, msg, "not a file_read stream");
      break;
    case MsgType::kEntries:
      if (s.kind != Kind::kList) return Violation(stream, msg, "not a list stream");
      break;
    case MsgType::kStatResult:
      if (s.kind != Kind::kStat) return Violation(stream, msg, "not a stat stream");
      close = true;
      break;
    case MsgType::kDone:
      if (s.kind == Kind::kExec || s.kind == Kind::kStat) {
        return Violation(stream, msg, "this stream does not end with done");
      }
      if (s.kind == Kind::kAttach && !s.started) {
        return Violation(stream, msg, "done before attached");
      }
      if (s.kind == Kind::kFileWrite && s.upload_open) {
        return Violation(stream, msg, "done before the upload ended");
      }
      close = true;
      break;
    case MsgType::kError:
      close = true;
      break;
    default:
      return Violation(stream, msg, "the agent does not send this");
  }
  if (close) streams_.erase(it);
  return Verdict::kAccept;
}

void ChannelState::Open(uint32_t stream, const Message& msg) {
  Stream s{};
  switch (TypeOf(msg)) {
    case MsgType::kExec: {
      const auto& e = std::get<Exec>(msg);
      s.kind = Kind::kExec;
      s.stdin_open = e.stdin_mode == StdinMode::kPipe;
      s.pty = e.pty;
      s.background = e.background;
      break;
    }
    case MsgType::kAttach:
      s.kind = Kind::kAttach;
      break;
    case MsgType::kProcList:
      s.kind = Kind::kProcList;
      break;
    case MsgType::kQuiesce:
      s.kind = Kind::kQuiesce;
      break;
    case MsgType::kFileWrite:
      s.kind = Kind::kFileWrite;
      s.upload_open = true;
      break;
    case MsgType::kFileRead:
      s.kind = Kind::kFileRead;
      break;
    case MsgType::kStat:
      s.kind = Kind::kStat;
      break;
    case MsgType::kList:
      s.kind = Kind::kList;
      break;
    case MsgType::kRemove:
      s.kind = Kind::kRemove;
      break;
    default:
      s.kind = Kind::kMkdir;
      break;
  }
  highest_stream_ = stream;
  streams_.emplace(stream, s);
}

void ChannelState::Send(uint32_t stream, const Message& msg) {
  MsgType type = TypeOf(msg);
  if (type == MsgType::kHello) {
    hello_sent_ = true;
    return;
  }
  if (stream == 0) return;
  if (self_ == Role::kDaemon) {
    // What the daemon sends is what the agent would accept: apply the same bookkeeping.
    AIRLOCK_CHECK(FromDaemon(stream, msg).has_value());
    return;
  }
  if (type == MsgType::kExited || type == MsgType::kError || type == MsgType::kDone ||
      type == MsgType::kStatResult) {
    streams_.erase(stream);
  } else if (type == MsgType::kStarted) {
    auto it = streams_.find(stream);
    if (it != streams_.end() && it->second.background) streams_.erase(it);
  }
}

}  // namespace airlock::protocol
