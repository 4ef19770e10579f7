#include "protocol/messages.h"

#include <cstring>
#include <type_traits>

namespace airlock::protocol {
namespace {

constexpr size_t kMaxBuildId = 256;
constexpr size_t kMaxErrorMessage = 4096;
constexpr size_t kMaxArgLength = 128 * 1024;  // the kernel's MAX_ARG_STRLEN
constexpr uint32_t kModeMask = 07777;

template <typename T>
void PutInt(std::string& out, T value) {
  static_assert(std::is_integral_v<T>);
  using U = std::make_unsigned_t<T>;
  U u = static_cast<U>(value);
  for (size_t i = 0; i < sizeof(T); ++i) out.push_back(static_cast<char>((u >> (8 * i)) & 0xff));
}

void PutBool(std::string& out, bool b) { out.push_back(b ? 1 : 0); }

void PutString(std::string& out, std::string_view s) {
  PutInt<uint32_t>(out, static_cast<uint32_t>(s.size()));
  out.append(s);
}

void PutStrings(std::string& out, const std::vector<std::string>& list) {
  PutInt<uint32_t>(out, static_cast<uint32_t>(list.size()));
  for (const auto& s : list) PutString(out, s);
}

void PutFileInfo(std::string& out, const FileInfo& f) {
  PutString(out, f.name);
  PutInt<uint8_t>(out, static_cast<uint8_t>(f.type));
  PutInt<uint32_t>(out, f.mode);
  PutInt<uint64_t>(out, f.size);
  PutInt<int64_t>(out, f.mtime_ns);
  PutInt<uint32_t>(out, f.uid);
  PutInt<uint32_t>(out, f.gid);
  PutString(out, f.link_target);
}

// Reads fields from a payload. The first failure sticks; later reads return zero values, so a
// decoder reads every field and checks once at the end.
class Reader {
 public:
  explicit Reader(std::string_view in) : in_(in) {}

  template <typename T>
  T Int() {
    using U = std::make_unsigned_t<T>;
    if (!Need(sizeof(T))) return 0;
    U u = 0;
    for (size_t i = 0; i < sizeof(T); ++i) {
      u |= static_cast<U>(static_cast<uint8_t>(in_[pos_ + i])) << (8 * i);
    }
    pos_ += sizeof(T);
    return static_cast<T>(u);
  }

  bool Bool() {
    uint8_t b = Int<uint8_t>();
    if (b > 1) Fail("bool field is not 0 or 1");
    return b == 1;
  }

  std::string String(size_t max, const char* what) {
    uint32_t len = Int<uint32_t>();
    if (len > max) {
      Fail(std::string(what) + " is longer than " + std::to_string(max) + " bytes");
      return {};
    }
    if (!Need(len)) return {};
    std::string s(in_.substr(pos_, len));
    pos_ += len;
    return s;
  }

  // A count of elements that each take at least `min_element` bytes: a count that cannot fit
  // in what is left is rejected before anything is allocated.
  uint32_t Count(size_t max, size_t min_element, const char* what) {
    uint32_t n = Int<uint32_t>();
    if (n > max) {
      Fail(std::string("too many ") + what);
      return 0;
    }
    if (static_cast<uint64_t>(n) * min_element > in_.size() - pos_) {
      Fail(std::string(what) + " count exceeds the payload");
      return 0;
    }
    return n;
  }

  std::vector<std::string> Strings(size_t max_count, size_t max_len, const char* what) {
    std::vector<std::string> out;
    uint32_t n = Count(max_count, 4, what);
    out.reserve(n);
    for (uint32_t i = 0; i < n && ok(); ++i) out.push_back(String(max_len, what));
    return out;
  }

  void Fail(std::string why) {
    if (error_.empty()) error_ = std::move(why);
  }
  bool ok() const { return error_.empty(); }

  // Succeeds when every byte was consumed and nothing failed.
  Status Finish(MsgType type) {
    if (ok() && pos_ != in_.size()) Fail("trailing bytes after the last field");
    if (ok()) return {};
    return airlock::Fail(ErrorCode::kProtocol,
                         "malformed " + std::string(MsgTypeName(type)) + " frame: " + error_);
  }

 private:
  bool Need(size_t n) {
    if (!ok()) return false;
    if (in_.size() - pos_ < n) {
      Fail("payload ends early");
      return false;
    }
    return true;
  }

  std::string_view in_;
  size_t pos_ = 0;
  std::string error_;
};

bool HasNul(std::string_view s) { return s.find('\0') != std::string_view::npos; }

void CheckPath(Reader& r, const std::string& path) {
  if (path.empty()) r.Fail("path is empty");
  if (HasNul(path)) r.Fail("path contains a NUL byte");
}

std::string ReadPath(Reader& r) {
  std::string path = r.String(kMaxPathLength, "path");
  if (r.ok()) CheckPath(r, path);
  return path;
}

uint32_t ReadMode(Reader& r) {
  uint32_t mode = r.Int<uint32_t>();
  if (mode & ~kModeMask) r.Fail("mode has bits outside 07777");
  return mode;
}

FileInfo ReadFileInfo(Reader& r) {
  FileInfo f;
  f.name = r.String(kMaxPathLength, "name");
  uint8_t type = r.Int<uint8_t>();
  if (r.ok() && (type < 1 || type > 4)) r.Fail("unknown file type");
  f.type = static_cast<FileType>(type);
  f.mode = ReadMode(r);
  f.size = r.Int<uint64_t>();
  f.mtime_ns = r.Int<int64_t>();
  f.uid = r.Int<uint32_t>();
  f.gid = r.Int<uint32_t>();
  f.link_target = r.String(kMaxPathLength, "link target");
  return f;
}

// --- encoders: one per message, fields in declaration order ---

void Put(std::string& out, const Hello& m) {
  PutInt<uint16_t>(out, m.version);
  PutString(out, m.build_id);
  PutInt<uint64_t>(out, m.features);
}
void Put(std::string& out, const Ping& m) { PutInt<uint64_t>(out, m.nonce); }
void Put(std::string& out, const Pong& m) { PutInt<uint64_t>(out, m.nonce); }
void Put(std::string& out, const Exec& m) {
  PutStrings(out, m.argv);
  PutString(out, m.shell);
  PutString(out, m.cwd);
  PutStrings(out, m.env);
  PutString(out, m.user);
  PutInt<uint8_t>(out, static_cast<uint8_t>(m.stdin_mode));
  PutInt<uint64_t>(out, m.timeout_ms);
  PutInt<uint64_t>(out, m.output_cap);
  PutInt<uint32_t>(out, m.kill_grace_ms);
  PutBool(out, m.pty);
  PutInt<uint16_t>(out, m.pty_rows);
  PutInt<uint16_t>(out, m.pty_cols);
  PutBool(out, m.background);
  PutInt<uint32_t>(out, m.ring_bytes);
}
void Put(std::string& out, const Attach& m) {
  PutInt<int32_t>(out, m.pid);
  PutInt<uint8_t>(out, static_cast<uint8_t>(m.output));
  PutBool(out, m.follow);
}
void Put(std::string&, const Detach&) {}
void Put(std::string& out, const Attached& m) {
  PutInt<int32_t>(out, m.pid);
  PutBool(out, m.background);
  PutBool(out, m.pty);
  PutBool(out, m.stdin_open);
  PutBool(out, m.running);
}
void Put(std::string& out, const Dropped& m) { PutInt<uint64_t>(out, m.bytes); }
void Put(std::string&, const ProcList&) {}
void Put(std::string& out, const Quiesce& m) { PutString(out, m.wake_path); }
void Put(std::string& out, const StdinData& m) { PutString(out, m.data); }
void Put(std::string&, const StdinClose&) {}
void Put(std::string& out, const Signal& m) { PutInt<int32_t>(out, m.signo); }
void Put(std::string& out, const Resize& m) {
  PutInt<uint16_t>(out, m.rows);
  PutInt<uint16_t>(out, m.cols);
}
void Put(std::string& out, const Started& m) { PutInt<int32_t>(out, m.pid); }
void Put(std::string& out, const Output& m) {
  PutInt<uint8_t>(out, static_cast<uint8_t>(m.fd));
  PutString(out, m.data);
}
void Put(std::string& out, const Exited& m) {
  PutInt<int32_t>(out, m.exit_code);
  PutInt<int32_t>(out, m.term_signal);
  PutInt<uint64_t>(out, m.duration_us);
  PutBool(out, m.timed_out);
  PutBool(out, m.truncated);
  PutBool(out, m.oom_killed);
  PutInt<uint64_t>(out, m.stdout_bytes);
  PutInt<uint64_t>(out, m.stderr_bytes);
}
void Put(std::string& out, const Processes& m) {
  PutInt<uint32_t>(out, static_cast<uint32_t>(m.processes.size()));
  for (const auto& p : m.processes) {
    PutInt<int32_t>(out, p.pid);
    PutString(out, p.command);
    PutBool(out, p.background);
    PutBool(out, p.pty);
    PutBool(out, p.stdin_open);
    PutBool(out, p.running);
    PutInt<int64_t>(out, p.started_unix_ms);
    PutInt<int64_t>(out, p.ended_unix_ms);
    Put(out, p.exit);
  }
}
void Put(std::string& out, const FileWrite& m) {
  PutString(out, m.path);
  PutInt<uint32_t>(out, m.mode);
  PutBool(out, m.create_parents);
  PutBool(out, m.append);
}
void Put(std::string& out, const Data& m) { PutString(out, m.data); }
void Put(std::string&, const DataEnd&) {}
void Put(std::string& out, const FileRead& m) {
  PutString(out, m.path);
  PutInt<uint64_t>(out, m.offset);
  PutInt<uint64_t>(out, m.length);
}
void Put(std::string& out, const Stat& m) { PutString(out, m.path); }
void Put(std::string& out, const StatResult& m) { PutFileInfo(out, m.info); }
void Put(std::string& out, const List& m) { PutString(out, m.path); }
void Put(std::string& out, const Entries& m) {
  PutInt<uint32_t>(out, static_cast<uint32_t>(m.entries.size()));
  for (const auto& e : m.entries) PutFileInfo(out, e);
}
void Put(std::string& out, const Remove& m) {
  PutString(out, m.path);
  PutBool(out, m.recursive);
}
void Put(std::string& out, const Mkdir& m) {
  PutString(out, m.path);
  PutInt<uint32_t>(out, m.mode);
  PutBool(out, m.parents);
}
void Put(std::string& out, const Done& m) { PutInt<uint64_t>(out, m.count); }
void Put(std::string& out, const ErrorMsg& m) {
  PutInt<uint16_t>(out, static_cast<uint16_t>(m.code));
  PutInt<int32_t>(out, m.sys_errno);
  PutString(out, m.message);
}

// --- decoders ---

Message ReadExec(Reader& r) {
  Exec m;
  m.argv = r.Strings(kMaxArgs, kMaxArgLength, "argv");
  m.shell = r.String(kMaxArgLength, "shell command");
  m.cwd = r.String(kMaxPathLength, "cwd");
  m.env = r.Strings(kMaxEnv, kMaxArgLength, "env");
  m.user = r.String(256, "user");
  uint8_t stdin_mode = r.Int<uint8_t>();
  m.timeout_ms = r.Int<uint64_t>();
  m.output_cap = r.Int<uint64_t>();
  m.kill_grace_ms = r.Int<uint32_t>();
  m.pty = r.Bool();
  m.pty_rows = r.Int<uint16_t>();
  m.pty_cols = r.Int<uint16_t>();
  m.background = r.Bool();
  m.ring_bytes = r.Int<uint32_t>();
  if (!r.ok()) return m;
  if (m.ring_bytes > kMaxRingBytes) r.Fail("ring_bytes over the maximum");
  if (m.ring_bytes && !m.background) r.Fail("ring_bytes given without background");
  if (m.argv.empty() == m.shell.empty()) r.Fail("exactly one of argv and shell must be set");
  for (const auto& a : m.argv) {
    if (HasNul(a)) r.Fail("argv entry contains a NUL byte");
  }
  if (!m.argv.empty() && m.argv[0].empty()) r.Fail("argv[0] is empty");
  if (HasNul(m.shell)) r.Fail("shell command contains a NUL byte");
  if (HasNul(m.cwd)) r.Fail("cwd contains a NUL byte");
  if (HasNul(m.user)) r.Fail("user contains a NUL byte");
  for (const auto& e : m.env) {
    size_t eq = e.find('=');
    if (eq == std::string::npos || eq == 0) r.Fail("env entry is not KEY=VALUE");
    if (HasNul(e)) r.Fail("env entry contains a NUL byte");
  }
  if (stdin_mode > 1) r.Fail("unknown stdin mode");
  m.stdin_mode = static_cast<StdinMode>(stdin_mode);
  if (!m.pty && (m.pty_rows || m.pty_cols)) r.Fail("terminal size given without pty");
  return m;
}

Message ReadOutput(Reader& r) {
  Output m;
  uint8_t fd = r.Int<uint8_t>();
  if (r.ok() && fd != 1 && fd != 2) r.Fail("output fd must be 1 or 2");
  m.fd = static_cast<OutputFd>(fd);
  m.data = r.String(kMaxPayload, "data");
  return m;
}

Message ReadExited(Reader& r) {
  Exited m;
  m.exit_code = r.Int<int32_t>();
  m.term_signal = r.Int<int32_t>();
  m.duration_us = r.Int<uint64_t>();
  m.timed_out = r.Bool();
  m.truncated = r.Bool();
  m.oom_killed = r.Bool();
  m.stdout_bytes = r.Int<uint64_t>();
  m.stderr_bytes = r.Int<uint64_t>();
  if (r.ok() && (m.exit_code < -1 || m.exit_code > 255)) r.Fail("exit code out of range");
  if (r.ok() && (m.term_signal < 0 || m.term_signal > 64)) r.Fail("signal out of range");
  if (r.ok() && (m.term_signal != 0) != (m.exit_code == -1)) {
    r.Fail("exactly one of exit code and signal must be set");
  }
  return m;
}

Message ReadProcesses(Reader& r) {
  Processes m;
  // The smallest encoded entry: pid, empty command, 4 bools, 2 times and an Exited (35 bytes).
  constexpr size_t kMinEntry = 4 + 4 + 4 + 16 + 35;
  uint32_t n = r.Count(kMaxPayload / kMinEntry, kMinEntry, "processes");
  m.processes.reserve(n);
  for (uint32_t i = 0; i < n && r.ok(); ++i) {
    ProcessInfo p;
    p.pid = r.Int<int32_t>();
    p.command = r.String(kMaxCommandInfo, "command");
    p.background = r.Bool();
    p.pty = r.Bool();
    p.stdin_open = r.Bool();
    p.running = r.Bool();
    p.started_unix_ms = r.Int<int64_t>();
    p.ended_unix_ms = r.Int<int64_t>();
    p.exit = std::get<Exited>(ReadExited(r));
    if (r.ok() && p.pid <= 0) r.Fail("pid must be positive");
    m.processes.push_back(std::move(p));
  }
  return m;
}

Message ReadErrorMsg(Reader& r) {
  ErrorMsg m;
  uint16_t code = r.Int<uint16_t>();
  if (r.ok() && !IsValidErrorCode(code)) r.Fail("unknown error code");
  m.code = static_cast<ErrorCode>(code);
  m.sys_errno = r.Int<int32_t>();
  m.message = r.String(kMaxErrorMessage, "error message");
  if (r.ok() && m.sys_errno < 0) r.Fail("negative errno");
  return m;
}

Message Read(MsgType type, Reader& r) {
  switch (type) {
    case MsgType::kHello: {
      Hello m;
      m.version = r.Int<uint16_t>();
      m.build_id = r.String(kMaxBuildId, "build id");
      m.features = r.Int<uint64_t>();
      if (r.ok() && m.features != 0) r.Fail("unknown feature bits");
      return m;
    }
    case MsgType::kPing:
      return Ping{r.Int<uint64_t>()};
    case MsgType::kPong:
      return Pong{r.Int<uint64_t>()};
    case MsgType::kExec:
      return ReadExec(r);
    case MsgType::kStdinData:
      return StdinData{r.String(kMaxPayload, "data")};
    case MsgType::kStdinClose:
      return StdinClose{};
    case MsgType::kSignal: {
      Signal m{r.Int<int32_t>()};
      if (r.ok() && (m.signo < 1 || m.signo > 64)) r.Fail("signal number out of range");
      return m;
    }
    case MsgType::kResize: {
      Resize m{r.Int<uint16_t>(), r.Int<uint16_t>()};
      if (r.ok() && (m.rows == 0 || m.cols == 0)) r.Fail("terminal size must be non-zero");
      return m;
    }
    case MsgType::kStarted: {
      Started m{r.Int<int32_t>()};
      if (r.ok() && m.pid <= 0) r.Fail("pid must be positive");
      return m;
    }
    case MsgType::kOutput:
      return ReadOutput(r);
    case MsgType::kExited:
      return ReadExited(r);
    case MsgType::kFileWrite: {
      FileWrite m;
      m.path = ReadPath(r);
      m.mode = ReadMode(r);
      m.create_parents = r.Bool();
      m.append = r.Bool();
      return m;
    }
    case MsgType::kData:
      return Data{r.String(kMaxPayload, "data")};
    case MsgType::kDataEnd:
      return DataEnd{};
    case MsgType::kFileRead: {
      FileRead m;
      m.path = ReadPath(r);
      m.offset = r.Int<uint64_t>();
      m.length = r.Int<uint64_t>();
      return m;
    }
    case MsgType::kStat:
      return Stat{ReadPath(r)};
    case MsgType::kStatResult:
      return StatResult{ReadFileInfo(r)};
    case MsgType::kList:
      return List{ReadPath(r)};
    case MsgType::kEntries: {
      Entries m;
      // The smallest encoded FileInfo is 37 bytes (both strings empty).
      uint32_t n = r.Count(kMaxPayload / 37, 37, "entries");
      m.entries.reserve(n);
      for (uint32_t i = 0; i < n && r.ok(); ++i) m.entries.push_back(ReadFileInfo(r));
      return m;
    }
    case MsgType::kRemove: {
      Remove m;
      m.path = ReadPath(r);
      m.recursive = r.Bool();
      return m;
    }
    case MsgType::kMkdir: {
      Mkdir m;
      m.path = ReadPath(r);
      m.mode = ReadMode(r);
      m.parents = r.Bool();
      return m;
    }
    case MsgType::kDone:
      return Done{r.Int<uint64_t>()};
    case MsgType::kAttach: {
      Attach m;
      m.pid = r.Int<int32_t>();
      uint8_t output = r.Int<uint8_t>();
      m.follow = r.Bool();
      if (r.ok() && m.pid <= 0) r.Fail("pid must be positive");
      if (r.ok() && output > 2) r.Fail("unknown attach output mode");
      m.output = static_cast<AttachOutput>(output);
      return m;
    }
    case MsgType::kDetach:
      return Detach{};
    case MsgType::kAttached: {
      Attached m;
      m.pid = r.Int<int32_t>();
      m.background = r.Bool();
      m.pty = r.Bool();
      m.stdin_open = r.Bool();
      m.running = r.Bool();
      if (r.ok() && m.pid <= 0) r.Fail("pid must be positive");
      return m;
    }
    case MsgType::kDropped:
      return Dropped{r.Int<uint64_t>()};
    case MsgType::kProcList:
      return ProcList{};
    case MsgType::kQuiesce: {
      Quiesce m{ReadPath(r)};
      if (r.ok() && !m.wake_path.starts_with('/')) r.Fail("the wake path must be absolute");
      return m;
    }
    case MsgType::kProcesses:
      return ReadProcesses(r);
    case MsgType::kError:
      return ReadErrorMsg(r);
  }
  r.Fail("unknown message type");
  return Ping{};
}

}  // namespace

MsgType TypeOf(const Message& msg) {
  return std::visit([](const auto& m) { return std::decay_t<decltype(m)>::kType; }, msg);
}

void AppendFrame(std::string& out, uint32_t stream, const Message& msg) {
  size_t start = out.size();
  AppendHeader(out, FrameHeader{.type = TypeOf(msg), .stream = stream});
  std::visit([&](const auto& m) { Put(out, m); }, msg);
  size_t len = out.size() - start - kHeaderSize;
  AIRLOCK_CHECK(len <= kMaxPayload);
  for (size_t i = 0; i < 4; ++i) out[start + i] = static_cast<char>((len >> (8 * i)) & 0xff);
}

std::string EncodeFrame(uint32_t stream, const Message& msg) {
  std::string out;
  AppendFrame(out, stream, msg);
  return out;
}

void AppendOutputFrame(std::string& out, uint32_t stream, OutputFd fd, std::string_view data) {
  AIRLOCK_CHECK(data.size() + 5 <= kMaxPayload);
  AppendHeader(out, FrameHeader{.payload_len = static_cast<uint32_t>(data.size() + 5),
                                .type = MsgType::kOutput,
                                .stream = stream});
  PutInt<uint8_t>(out, static_cast<uint8_t>(fd));
  PutString(out, data);
}

void AppendDataFrame(std::string& out, uint32_t stream, std::string_view data) {
  AIRLOCK_CHECK(data.size() + 4 <= kMaxPayload);
  AppendHeader(out, FrameHeader{.payload_len = static_cast<uint32_t>(data.size() + 4),
                                .type = MsgType::kData,
                                .stream = stream});
  PutString(out, data);
}

Result<Message> DecodeMessage(MsgType type, std::string_view payload) {
  if (!IsKnownMsgType(static_cast<uint8_t>(type))) {
    return Fail(ErrorCode::kProtocol,
                "unknown message type " + std::to_string(static_cast<int>(type)));
  }
  Reader r(payload);
  Message msg = Read(type, r);
  if (auto st = r.Finish(type); !st) return std::unexpected(st.error());
  return msg;
}

ErrorMsg ToErrorMsg(const Error& error) {
  std::string message = error.message();
  if (message.size() > kMaxErrorMessage) message.resize(kMaxErrorMessage);
  return ErrorMsg{error.code(), error.sys_errno(), std::move(message)};
}

Error FromErrorMsg(const ErrorMsg& msg) { return Error(msg.code, msg.message, msg.sys_errno); }

}  // namespace airlock::protocol
