#include "runtime/gvisor/trace_points.h"

#include <cstring>
#include <optional>

#include "runtime/engine.h"

namespace airlock::gvisor {
namespace {

constexpr size_t kHeaderSize = 8;

Error Malformed(const std::string& what) {
  return Error(ErrorCode::kInvalidArgument, "a malformed trace point: " + what);
}

// One field of a protocol buffer: its number, and its value as a varint or as bytes.
struct Field {
  uint32_t number = 0;
  uint64_t varint = 0;       // wire types 0, 1, 5
  std::string_view bytes;    // wire type 2
  bool is_bytes = false;
};

// Reads the fields of one message in order. Next is nullopt at the end, or when the next field
// runs past it (`ended_early` then says so; the caller decides whether that is an error).
class Reader {
 public:
  explicit Reader(std::string_view data) : data_(data) {}

  Result<std::optional<Field>> Next() {
    if (data_.empty()) return std::nullopt;
    std::string_view rest = data_;
    auto key = Varint(rest);
    if (!key) return Stop();
    Field f;
    if ((*key >> 3) == 0 || (*key >> 3) > 0x1fffffff) return std::unexpected(Malformed("field 0"));
    f.number = static_cast<uint32_t>(*key >> 3);
    switch (*key & 7) {
      case 0: {
        auto v = Varint(rest);
        if (!v) return Stop();
        f.varint = *v;
        break;
      }
      case 1:
      case 5: {
        const size_t n = (*key & 7) == 1 ? 8 : 4;
        if (rest.size() < n) return Stop();
        uint64_t v = 0;
        std::memcpy(&v, rest.data(), n);  // little-endian, as the hosts gVisor runs on
        f.varint = v;
        rest.remove_prefix(n);
        break;
      }
      case 2: {
        auto n = Varint(rest);
        if (!n) return Stop();
        if (*n > rest.size()) return Stop();
        f.bytes = rest.substr(0, *n);
        f.is_bytes = true;
        rest.remove_prefix(*n);
        break;
      }
      default:
        return std::unexpected(Malformed("wire type " + std::to_string(*key & 7)));
    }
    data_ = rest;
    return f;
  }
  bool ended_early() const { return ended_early_; }

 private:
  // A varint off the front of `in`; nullopt when `in` ends inside it (or it is over 10 bytes).
  static std::optional<uint64_t> Varint(std::string_view& in) {
    uint64_t value = 0;
    for (size_t i = 0; i < in.size() && i < 10; ++i) {
      const auto byte = static_cast<uint8_t>(in[i]);
      value |= static_cast<uint64_t>(byte & 0x7f) << (7 * i);
      if ((byte & 0x80) == 0) {
        in.remove_prefix(i + 1);
        return value;
      }
    }
    return std::nullopt;
  }
  Result<std::optional<Field>> Stop() {
    ended_early_ = true;
    data_ = {};
    return std::nullopt;
  }

  std::string_view data_;
  bool ended_early_ = false;
};

// The fields of ContextData the engine asks for: thread_id (2), thread_group_id (4),
// credentials (7: effective_uid is its field 2).
Status ReadContext(std::string_view bytes, TracePoint& point) {
  Reader r(bytes);
  while (true) {
    auto f = r.Next();
    if (!f) return std::unexpected(f.error());
    if (!*f) break;
    if ((*f)->number == 2 && !(*f)->is_bytes) point.tid = static_cast<int32_t>((*f)->varint);
    if ((*f)->number == 4 && !(*f)->is_bytes) point.tgid = static_cast<int32_t>((*f)->varint);
    if ((*f)->number == 7 && (*f)->is_bytes) {
      point.euid = 0;  // proto3 leaves out zeros: credentials without effective_uid are root's
      Reader creds((*f)->bytes);
      while (true) {
        auto c = creds.Next();
        if (!c) return std::unexpected(c.error());
        if (!*c) break;
        if ((*c)->number == 2 && !(*c)->is_bytes) point.euid = static_cast<uint32_t>((*c)->varint);
      }
      if (creds.ended_early()) return std::unexpected(Malformed("credentials"));
    }
  }
  if (r.ended_early()) return std::unexpected(Malformed("context data"));
  return {};
}

}  // namespace

Result<TracePoint> DecodeTracePoint(std::string_view message, bool truncated) {
  if (message.size() < kHeaderSize) return std::unexpected(Malformed("shorter than its header"));
  const auto u16 = [&](size_t at) {
    return static_cast<uint16_t>(static_cast<uint8_t>(message[at]) |
                                 static_cast<uint8_t>(message[at + 1]) << 8);
  };
  TracePoint point;
  const uint16_t header_size = u16(0);
  point.type = u16(2);
  for (size_t i = 0; i < 4; ++i) {
    point.dropped |= static_cast<uint32_t>(static_cast<uint8_t>(message[4 + i])) << (8 * i);
  }
  if (header_size < kHeaderSize || header_size > message.size()) {
    return std::unexpected(Malformed("header size " + std::to_string(header_size)));
  }
  using T = TraceType;
  const auto type = static_cast<T>(point.type);
  if (type != T::kContainerStart && type != T::kClone && type != T::kExec &&
      type != T::kExitNotifyParent) {
    return point;  // a point this reader does not use: its header is enough
  }
  // The argv: ExecveInfo's field 3, Start's field 4.
  const uint32_t argv_field = type == T::kExec ? 3 : type == T::kContainerStart ? 4 : 0;
  runtime::ProcessEvent capped;  // its caps apply to the argv kept
  Reader r(message.substr(header_size));
  while (true) {
    auto f = r.Next();
    if (!f) return std::unexpected(f.error());
    if (!*f) break;
    const Field& field = **f;
    if (field.number == 1 && field.is_bytes) {
      if (auto st = ReadContext(field.bytes, point); !st) return std::unexpected(st.error());
    } else if (field.number == argv_field && field.is_bytes) {
      capped.AddArg(field.bytes);
    } else if (type == T::kClone && !field.is_bytes && field.number == 3) {
      point.created_tid = static_cast<int32_t>(field.varint);
    } else if (type == T::kClone && !field.is_bytes && field.number == 4) {
      point.created_tgid = static_cast<int32_t>(field.varint);
    } else if (type == T::kExitNotifyParent && !field.is_bytes && field.number == 2) {
      point.exit_status = static_cast<int32_t>(field.varint);
    }
  }
  if (r.ended_early() && !truncated) return std::unexpected(Malformed("a field runs past its end"));
  point.argv = std::move(capped.argv);
  // A message cut by the socket may have had more arguments.
  point.cut = capped.argv_truncated || (truncated && argv_field != 0);
  return point;
}

Result<uint32_t> DecodeHandshake(std::string_view message) {
  Reader r(message);
  std::optional<uint32_t> version;
  while (true) {
    auto f = r.Next();
    if (!f) return std::unexpected(f.error());
    if (!*f) break;
    if ((*f)->number == 1 && !(*f)->is_bytes) version = static_cast<uint32_t>((*f)->varint);
  }
  if (r.ended_early() || !version) return std::unexpected(Malformed("handshake"));
  return *version;
}

std::string EncodeHandshake() {
  static_assert(kTraceWireVersion < 0x80, "one byte of varint");
  return std::string{'\x08', static_cast<char>(kTraceWireVersion)};
}

}  // namespace airlock::gvisor
