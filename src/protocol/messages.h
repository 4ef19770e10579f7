#pragma once
// The messages carried in frame payloads, with their encoders and a strict decoder.
//
// Payload encoding: fields in the order declared below, no tags, no padding.
// Integers are little-endian fixed width; bool is one byte, 0 or 1; string and bytes are a u32
// length then the bytes; a list is a u32 count then the elements. A decoder that finds a short
// payload, trailing bytes, a bad enum or a value out of range rejects the whole frame.

#include <cstdint>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "common/error.h"
#include "protocol/wire.h"

namespace airlock::protocol {

struct Hello {
  static constexpr MsgType kType = MsgType::kHello;
  uint16_t version = kProtocolVersion;
  std::string build_id;   // "airlock-agent 0.1.0 (git abc123)"; at most 256 bytes
  uint64_t features = 0;  // capability bits; none defined in version 1, must be zero
  bool operator==(const Hello&) const = default;
};

struct Ping {
  static constexpr MsgType kType = MsgType::kPing;
  uint64_t nonce = 0;
  bool operator==(const Ping&) const = default;
};

struct Pong {
  static constexpr MsgType kType = MsgType::kPong;
  uint64_t nonce = 0;
  bool operator==(const Pong&) const = default;
};

enum class StdinMode : uint8_t {
  kNull = 0,  // stdin is /dev/null
  kPipe = 1,  // stdin is a pipe fed by kStdinData until kStdinClose
};

struct Exec {
  static constexpr MsgType kType = MsgType::kExec;
  std::vector<std::string> argv;  // exactly one of argv and shell is set
  std::string shell;              // run as /bin/sh -c <shell>
  std::string cwd;                // empty: the user's home directory, else "/"
  std::vector<std::string> env;   // "KEY=VALUE", on top of the agent's defaults
  std::string user;               // name or uid from the sandbox's /etc/passwd; empty: default
  StdinMode stdin_mode = StdinMode::kNull;
  uint64_t timeout_ms = 0;     // 0: no timeout
  uint64_t output_cap = 0;     // stdout + stderr bytes delivered; 0: the agent's default
  uint32_t kill_grace_ms = 0;  // SIGTERM -> SIGKILL grace on timeout; 0: the agent's default
  bool pty = false;            // stdin/stdout/stderr on one terminal (output as stdout)
  uint16_t pty_rows = 0;
  uint16_t pty_cols = 0;
  // The process belongs to the agent, not to this stream: kStarted answers and closes the stream,
  // output goes to a ring of `ring_bytes` (0: the agent's default) that attachments read.
  bool background = false;
  uint32_t ring_bytes = 0;  // at most kMaxRingBytes
  bool operator==(const Exec&) const = default;
};

inline constexpr uint32_t kMaxRingBytes = 64u << 20;

enum class AttachOutput : uint8_t {
  kNone = 0,    // control only (stdin, signal, resize) and the exit
  kReplay = 1,  // the ring's contents, then live output (background processes only)
  kLive = 2,    // live output only (background processes only)
};

// Opens a stream on a process the agent started. Answered by kAttached (or kError: no such
// process, or output asked of a foreground one). The stream then carries kStdinData,
// kStdinClose, kSignal, kResize and kDetach from the daemon, and kOutput / kDropped from the
// agent; it ends with kExited when the process ends, or kDone after kDetach, or kDone after the
// replay when `follow` is false and the process still runs.
struct Attach {
  static constexpr MsgType kType = MsgType::kAttach;
  int32_t pid = 0;
  AttachOutput output = AttachOutput::kNone;
  bool follow = true;
  bool operator==(const Attach&) const = default;
};

struct Detach {
  static constexpr MsgType kType = MsgType::kDetach;
  bool operator==(const Detach&) const = default;
};

struct Attached {
  static constexpr MsgType kType = MsgType::kAttached;
  int32_t pid = 0;
  bool background = false;
  bool pty = false;
  bool stdin_open = false;  // a pipe or terminal that takes kStdinData now
  bool running = false;
  bool operator==(const Attached&) const = default;
};

struct Dropped {
  static constexpr MsgType kType = MsgType::kDropped;
  uint64_t bytes = 0;
  bool operator==(const Dropped&) const = default;
};

struct ProcList {
  static constexpr MsgType kType = MsgType::kProcList;
  bool operator==(const ProcList&) const = default;
};

// Readies the agent for a memory checkpoint of its sandbox (docs/agent.md, "Quiesce"): refused
// (kError, kFailedPrecondition) while any channel has a stream in progress; otherwise answered
// with kDone, after which the agent closes every channel and its listening socket (nothing of
// the host is held open across the checkpoint) and waits, serving its background processes,
// until a file appears at `wake_path` (made once the sandbox is restored); then it removes the
// file and listens again where it listened.
struct Quiesce {
  static constexpr MsgType kType = MsgType::kQuiesce;
  std::string wake_path;  // absolute
  bool operator==(const Quiesce&) const = default;
};

struct StdinData {
  static constexpr MsgType kType = MsgType::kStdinData;
  std::string data;
  bool operator==(const StdinData&) const = default;
};

struct StdinClose {
  static constexpr MsgType kType = MsgType::kStdinClose;
  bool operator==(const StdinClose&) const = default;
};

struct Signal {
  static constexpr MsgType kType = MsgType::kSignal;
  int32_t signo = 0;  // 1..64, delivered to the exec's process group
  bool operator==(const Signal&) const = default;
};

struct Resize {
  static constexpr MsgType kType = MsgType::kResize;
  uint16_t rows = 0;
  uint16_t cols = 0;
  bool operator==(const Resize&) const = default;
};

struct Started {
  static constexpr MsgType kType = MsgType::kStarted;
  int32_t pid = 0;  // as the agent sees it (inside the sandbox's pid namespace)
  bool operator==(const Started&) const = default;
};

enum class OutputFd : uint8_t { kStdout = 1, kStderr = 2 };

struct Output {
  static constexpr MsgType kType = MsgType::kOutput;
  OutputFd fd = OutputFd::kStdout;
  std::string data;
  bool operator==(const Output&) const = default;
};

struct Exited {
  static constexpr MsgType kType = MsgType::kExited;
  int32_t exit_code = -1;     // -1 when killed by a signal
  int32_t term_signal = 0;    // the signal that ended the process, 0 if it exited
  uint64_t duration_us = 0;   // from spawn to the process's exit
  bool timed_out = false;     // the agent killed the process tree at its timeout
  bool truncated = false;     // output beyond output_cap was dropped
  bool oom_killed = false;    // the kernel's OOM killer ended it (when the agent can tell)
  uint64_t stdout_bytes = 0;  // produced, including any dropped
  uint64_t stderr_bytes = 0;
  bool operator==(const Exited&) const = default;
};

// One entry of the agent's process table.
struct ProcessInfo {
  int32_t pid = 0;
  std::string command;  // the shell line or argv joined with spaces, at most kMaxCommandInfo
  bool background = false;
  bool pty = false;
  bool stdin_open = false;
  bool running = false;
  int64_t started_unix_ms = 0;
  int64_t ended_unix_ms = 0;  // 0 while running
  Exited exit{.exit_code = 0};  // meaningful once !running
  bool operator==(const ProcessInfo&) const = default;
};
inline constexpr size_t kMaxCommandInfo = 1024;

struct Processes {
  static constexpr MsgType kType = MsgType::kProcesses;
  std::vector<ProcessInfo> processes;
  bool operator==(const Processes&) const = default;
};

struct FileWrite {
  static constexpr MsgType kType = MsgType::kFileWrite;
  std::string path;
  uint32_t mode = 0644;  // permission bits only (07777)
  bool create_parents = false;
  bool append = false;  // append instead of truncating
  bool operator==(const FileWrite&) const = default;
};

struct Data {
  static constexpr MsgType kType = MsgType::kData;
  std::string data;
  bool operator==(const Data&) const = default;
};

struct DataEnd {
  static constexpr MsgType kType = MsgType::kDataEnd;
  bool operator==(const DataEnd&) const = default;
};

struct FileRead {
  static constexpr MsgType kType = MsgType::kFileRead;
  std::string path;
  uint64_t offset = 0;
  uint64_t length = 0;  // 0: to the end of the file
  bool operator==(const FileRead&) const = default;
};

struct Stat {
  static constexpr MsgType kType = MsgType::kStat;
  std::string path;  // the last component is not followed if it is a symlink
  bool operator==(const Stat&) const = default;
};

enum class FileType : uint8_t { kFile = 1, kDirectory = 2, kSymlink = 3, kOther = 4 };

struct FileInfo {
  std::string name;  // the last path component (list) or the path asked for (stat)
  FileType type = FileType::kFile;
  uint32_t mode = 0;  // permission bits (07777)
  uint64_t size = 0;
  int64_t mtime_ns = 0;
  uint32_t uid = 0;
  uint32_t gid = 0;
  std::string link_target;  // symlinks only
  bool operator==(const FileInfo&) const = default;
};

struct StatResult {
  static constexpr MsgType kType = MsgType::kStatResult;
  FileInfo info;
  bool operator==(const StatResult&) const = default;
};

struct List {
  static constexpr MsgType kType = MsgType::kList;
  std::string path;
  bool operator==(const List&) const = default;
};

struct Entries {
  static constexpr MsgType kType = MsgType::kEntries;
  std::vector<FileInfo> entries;
  bool operator==(const Entries&) const = default;
};

struct Remove {
  static constexpr MsgType kType = MsgType::kRemove;
  std::string path;
  bool recursive = false;
  bool operator==(const Remove&) const = default;
};

struct Mkdir {
  static constexpr MsgType kType = MsgType::kMkdir;
  std::string path;
  uint32_t mode = 0755;
  bool parents = false;  // like mkdir -p: no error if it exists as a directory
  bool operator==(const Mkdir&) const = default;
};

struct Done {
  static constexpr MsgType kType = MsgType::kDone;
  uint64_t count = 0;  // bytes written or read, entries listed or removed
  bool operator==(const Done&) const = default;
};

struct ErrorMsg {
  static constexpr MsgType kType = MsgType::kError;
  ErrorCode code = ErrorCode::kInternal;
  int32_t sys_errno = 0;
  std::string message;  // at most 4096 bytes
  bool operator==(const ErrorMsg&) const = default;
};

using Message = std::variant<Hello, Ping, Pong, Exec, StdinData, StdinClose, Signal, Resize,
                             Started, Output, Exited, FileWrite, Data, DataEnd, FileRead, Stat,
                             StatResult, List, Entries, Remove, Mkdir, Done, ErrorMsg, Attach,
                             Detach, Attached, Dropped, ProcList, Processes, Quiesce>;

MsgType TypeOf(const Message& msg);

// Appends one whole frame (header and payload) carrying `msg` on `stream`.
// Precondition: msg is valid (encoding a message the decoder would reject is a bug).
void AppendFrame(std::string& out, uint32_t stream, const Message& msg);
std::string EncodeFrame(uint32_t stream, const Message& msg);
// The hot path for output and file data: frames `data` without building a message first.
void AppendOutputFrame(std::string& out, uint32_t stream, OutputFd fd, std::string_view data);
void AppendDataFrame(std::string& out, uint32_t stream, std::string_view data);

// Decodes and validates one payload of the given type. Never crashes on any input.
[[nodiscard]] Result<Message> DecodeMessage(MsgType type, std::string_view payload);

// An ErrorMsg from an Error, and back.
ErrorMsg ToErrorMsg(const Error& error);
Error FromErrorMsg(const ErrorMsg& msg);

}  // namespace airlock::protocol
