#pragma once
// The daemon <-> agent wire format: frame header, message types and limits.
// docs/design/protocol.md is the specification; keep the two in step.
//
// Every frame is a 12-byte header followed by `payload_len` bytes:
//
//   offset 0  u32  payload_len   little-endian, at most kMaxPayload
//   offset 4  u8   version       kProtocolVersion
//   offset 5  u8   type          MsgType
//   offset 6  u16  flags         reserved, must be zero
//   offset 8  u32  stream        0 = the channel itself, otherwise one exec or file operation

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace airlock::protocol {

inline constexpr uint8_t kProtocolVersion = 2;  // 2: background processes and attach
inline constexpr size_t kHeaderSize = 12;
// Largest payload either side may send or accept. Larger frames are a protocol error.
inline constexpr uint32_t kMaxPayload = 1u << 20;
// Largest data chunk (output, file data, stdin) a sender should put in one frame.
inline constexpr size_t kMaxChunk = 64 * 1024;
// Limits inside payloads.
inline constexpr size_t kMaxPathLength = 4096;
inline constexpr size_t kMaxArgs = 4096;
inline constexpr size_t kMaxEnv = 4096;

// Stable numeric values; a new type is a new protocol version. Never renumber.
enum class MsgType : uint8_t {
  // stream 0, both directions
  kHello = 1,  // first frame each way: version and build id
  kPing = 2,   // liveness; answered with kPong carrying the same nonce
  kPong = 3,
  // daemon -> agent: open a stream (stream id above every id used before on this channel)
  kExec = 10,
  kFileWrite = 11,  // followed by kData* and kDataEnd from the daemon
  kFileRead = 12,
  kStat = 13,
  kList = 14,
  kRemove = 15,
  kMkdir = 16,
  kAttach = 17,    // to a process by pid: control it, wait for it, read its output
  kProcList = 18,  // the agent's process table
  kQuiesce = 19,   // before a memory checkpoint: close every channel, wait for a wake file
  // daemon -> agent on an open exec stream
  kStdinData = 20,
  kStdinClose = 21,
  kSignal = 22,
  kResize = 23,
  kDetach = 24,  // on an attach stream: end it (answered with kDone)
  // agent -> daemon on an open exec stream
  kStarted = 30,
  kOutput = 31,
  kExited = 32,  // closes the stream
  // agent -> daemon on an attach stream
  kAttached = 33,  // first reply: what the process is
  kDropped = 34,   // output overwritten in the ring before this attachment sent it
  // file data, either direction (upload: daemon -> agent; download: agent -> daemon)
  kData = 40,
  kDataEnd = 41,
  // agent -> daemon replies
  kStatResult = 50,  // closes a kStat stream
  kEntries = 51,     // zero or more per kList stream, then kDone
  kDone = 52,        // closes a file stream with a count (bytes, entries)
  kProcesses = 53,   // zero or more per kProcList stream, then kDone
  // agent -> daemon on a stream: the operation failed, the stream is closed.
  // Either side on stream 0: the channel is broken and is about to be closed.
  kError = 60,
};

// The name used in logs and error messages: "exec", "file_write", ...; "unknown" otherwise.
std::string_view MsgTypeName(MsgType type);
bool IsKnownMsgType(uint8_t value);

struct FrameHeader {
  uint32_t payload_len = 0;
  uint8_t version = kProtocolVersion;
  MsgType type = MsgType::kHello;
  uint16_t flags = 0;
  uint32_t stream = 0;
};

struct Frame {
  MsgType type;
  uint32_t stream;
  std::string payload;
};

void AppendHeader(std::string& out, const FrameHeader& header);

}  // namespace airlock::protocol
