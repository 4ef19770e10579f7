#include "net/tls_client_hello.h"

#include <cstdint>

namespace airlock::net {
namespace {

constexpr uint8_t kHandshakeRecord = 22;
constexpr uint8_t kClientHello = 1;
constexpr uint16_t kServerNameExtension = 0;
constexpr uint8_t kHostNameType = 0;
constexpr size_t kMaxRecordBytes = (1u << 14) + 2048;  // TLSPlaintext limit, with slack

// A cursor over untrusted bytes: every read says whether the bytes were there.
class Reader {
 public:
  explicit Reader(std::string_view data) : data_(data) {}
  bool U8(uint8_t& out) {
    if (data_.size() < 1) return false;
    out = static_cast<uint8_t>(data_[0]);
    data_.remove_prefix(1);
    return true;
  }
  bool U16(uint16_t& out) {
    if (data_.size() < 2) return false;
    out = static_cast<uint16_t>(static_cast<uint8_t>(data_[0]) << 8 | static_cast<uint8_t>(data_[1]));
    data_.remove_prefix(2);
    return true;
  }
  bool U24(uint32_t& out) {
    if (data_.size() < 3) return false;
    out = static_cast<uint32_t>(static_cast<uint8_t>(data_[0])) << 16 |
          static_cast<uint32_t>(static_cast<uint8_t>(data_[1])) << 8 |
          static_cast<uint8_t>(data_[2]);
    data_.remove_prefix(3);
    return true;
  }
  bool Bytes(size_t n, std::string_view& out) {
    if (data_.size() < n) return false;
    out = data_.substr(0, n);
    data_.remove_prefix(n);
    return true;
  }
  // A vector with a length prefix of `width` bytes.
  bool Vector(int width, std::string_view& out) {
    uint32_t n = 0;
    if (width == 1) {
      uint8_t v;
      if (!U8(v)) return false;
      n = v;
    } else if (width == 2) {
      uint16_t v;
      if (!U16(v)) return false;
      n = v;
    } else {
      if (!U24(n)) return false;
    }
    return Bytes(n, out);
  }
  bool empty() const { return data_.empty(); }

 private:
  std::string_view data_;
};

ClientHelloScan Invalid(std::string error) {
  return ClientHelloScan{ClientHelloScan::State::kInvalid, "", std::move(error)};
}

// The body of a complete ClientHello handshake message.
ClientHelloScan ParseBody(std::string_view body) {
  Reader r(body);
  std::string_view skip;
  uint16_t version;
  if (!r.U16(version) || !r.Bytes(32, skip)) return Invalid("ClientHello too short");
  std::string_view session_id, suites, compression;
  if (!r.Vector(1, session_id) || session_id.size() > 32) return Invalid("bad session id");
  if (!r.Vector(2, suites) || suites.empty() || suites.size() % 2 != 0) {
    return Invalid("bad cipher suites");
  }
  if (!r.Vector(1, compression) || compression.empty()) return Invalid("bad compression methods");
  ClientHelloScan out{ClientHelloScan::State::kComplete, "", ""};
  if (r.empty()) return out;  // no extensions at all: no SNI
  std::string_view extensions;
  if (!r.Vector(2, extensions) || !r.empty()) return Invalid("bad extensions length");
  Reader ext(extensions);
  bool seen_sni = false;
  while (!ext.empty()) {
    uint16_t type;
    std::string_view data;
    if (!ext.U16(type) || !ext.Vector(2, data)) return Invalid("truncated extension");
    if (type != kServerNameExtension) continue;
    if (seen_sni) return Invalid("two server_name extensions");
    seen_sni = true;
    Reader sni(data);
    std::string_view list;
    if (!sni.Vector(2, list) || !sni.empty()) return Invalid("bad server_name list length");
    Reader names(list);
    while (!names.empty()) {
      uint8_t name_type;
      std::string_view name;
      if (!names.U8(name_type) || !names.Vector(2, name)) return Invalid("truncated server name");
      if (name_type != kHostNameType) continue;
      if (!out.sni.empty()) return Invalid("more than one host_name");
      if (name.empty()) return Invalid("empty host_name");
      out.sni = std::string(name);
    }
  }
  return out;
}

}  // namespace

bool LooksLikeTls(std::string_view bytes) {
  return !bytes.empty() && static_cast<uint8_t>(bytes[0]) == kHandshakeRecord &&
         (bytes.size() < 2 || bytes[1] == 3);
}

ClientHelloScan ScanClientHello(std::string_view bytes) {
  // Gather the handshake bytes from consecutive records until the message is whole.
  std::string handshake;
  Reader records(bytes);
  size_t consumed = 0;
  while (true) {
    if (handshake.size() >= 4) {
      uint32_t length = static_cast<uint32_t>(static_cast<uint8_t>(handshake[1])) << 16 |
                        static_cast<uint32_t>(static_cast<uint8_t>(handshake[2])) << 8 |
                        static_cast<uint8_t>(handshake[3]);
      if (static_cast<uint8_t>(handshake[0]) != kClientHello) {
        return Invalid("first handshake message is not a ClientHello");
      }
      if (length + 4 > kMaxClientHelloBytes) return Invalid("ClientHello too large");
      if (handshake.size() >= length + 4) {
        return ParseBody(std::string_view(handshake).substr(4, length));
      }
    }
    if (consumed >= kMaxClientHelloBytes) return Invalid("ClientHello too large");
    uint8_t type;
    uint16_t version, length;
    std::string_view fragment;
    if (!records.U8(type)) return ClientHelloScan{};
    if (type != kHandshakeRecord) return Invalid("not a TLS handshake record");
    if (!records.U16(version)) return ClientHelloScan{};
    if ((version >> 8) != 3) return Invalid("not a TLS record version");
    if (!records.U16(length)) return ClientHelloScan{};
    if (length == 0 || length > kMaxRecordBytes) return Invalid("bad TLS record length");
    if (!records.Bytes(length, fragment)) return ClientHelloScan{};
    consumed += 5 + length;
    handshake.append(fragment);
  }
}

}  // namespace airlock::net
