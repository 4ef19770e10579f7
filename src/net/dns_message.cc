#include "net/dns_message.h"

#include <algorithm>
#include <map>

namespace airlock::net::dns {
namespace {

using boost::asio::ip::address;

constexpr uint16_t kFlagQr = 0x8000;
constexpr uint16_t kFlagTc = 0x0200;
constexpr uint16_t kFlagRd = 0x0100;
constexpr uint16_t kFlagRa = 0x0080;

Error Malformed(const std::string& what) {
  return Error(ErrorCode::kProtocol, "malformed DNS message: " + what);
}

// A bounds-checked cursor over a packet. Every read fails rather than run past the end.
class Reader {
 public:
  explicit Reader(std::span<const uint8_t> packet) : packet_(packet) {}

  size_t offset() const { return offset_; }
  size_t remaining() const { return packet_.size() - offset_; }

  Result<uint8_t> U8() {
    if (remaining() < 1) return std::unexpected(Malformed("truncated"));
    return packet_[offset_++];
  }
  Result<uint16_t> U16() {
    if (remaining() < 2) return std::unexpected(Malformed("truncated"));
    uint16_t v = static_cast<uint16_t>(packet_[offset_] << 8 | packet_[offset_ + 1]);
    offset_ += 2;
    return v;
  }
  Result<uint32_t> U32() {
    auto hi = U16();
    if (!hi) return std::unexpected(hi.error());
    auto lo = U16();
    if (!lo) return std::unexpected(lo.error());
    return static_cast<uint32_t>(*hi) << 16 | *lo;
  }
  Result<std::span<const uint8_t>> Bytes(size_t n) {
    if (remaining() < n) return std::unexpected(Malformed("truncated"));
    auto s = packet_.subspan(offset_, n);
    offset_ += n;
    return s;
  }

  // A possibly compressed name. A pointer must point strictly before the start of the run of
  // labels it ends (the name itself, or the previous pointer's target): the starts then only
  // move backwards, so no chain of pointers can loop. The hop cap bounds the work anyway.
  Result<std::vector<std::string>> Name() {
    std::vector<std::string> labels;
    size_t pos = offset_;
    size_t segment_start = offset_;
    size_t wire_length = 1;  // the final zero byte
    int hops = 0;
    bool jumped = false;
    while (true) {
      if (pos >= packet_.size()) return std::unexpected(Malformed("truncated name"));
      uint8_t len = packet_[pos];
      if ((len & 0xC0) == 0xC0) {
        if (pos + 1 >= packet_.size()) return std::unexpected(Malformed("truncated pointer"));
        size_t target = static_cast<size_t>(len & 0x3F) << 8 | packet_[pos + 1];
        // Names start after the header; a pointer into it reads the flags as labels.
        if (target < kHeaderSize || target >= segment_start) {
          return std::unexpected(Malformed("compression pointer not backwards"));
        }
        if (++hops > kMaxPointerHops) {
          return std::unexpected(Malformed("too many compression pointers"));
        }
        if (!jumped) offset_ = pos + 2;
        jumped = true;
        pos = target;
        segment_start = target;
        continue;
      }
      if ((len & 0xC0) != 0) return std::unexpected(Malformed("reserved label type"));
      if (len == 0) {
        if (!jumped) offset_ = pos + 1;
        return labels;
      }
      wire_length += 1 + len;
      if (wire_length > kMaxNameWireLength) return std::unexpected(Malformed("name too long"));
      if (pos + 1 + len > packet_.size()) return std::unexpected(Malformed("truncated label"));
      labels.emplace_back(reinterpret_cast<const char*>(packet_.data() + pos + 1), len);
      pos += 1 + len;
    }
  }

 private:
  std::span<const uint8_t> packet_;
  size_t offset_ = 0;
};

struct Header {
  uint16_t id = 0;
  uint16_t flags = 0;
  uint16_t qdcount = 0, ancount = 0, nscount = 0, arcount = 0;
};

Result<Header> ReadHeader(Reader& r) {
  if (r.remaining() < kHeaderSize) return std::unexpected(Malformed("shorter than a header"));
  Header h;
  h.id = *r.U16();
  h.flags = *r.U16();
  h.qdcount = *r.U16();
  h.ancount = *r.U16();
  h.nscount = *r.U16();
  h.arcount = *r.U16();
  return h;
}

Result<Question> ReadQuestion(Reader& r) {
  Question q;
  auto labels = r.Name();
  if (!labels) return std::unexpected(labels.error());
  q.labels = std::move(*labels);
  auto qtype = r.U16();
  if (!qtype) return std::unexpected(qtype.error());
  auto qclass = r.U16();
  if (!qclass) return std::unexpected(qclass.error());
  q.qtype = *qtype;
  q.qclass = *qclass;
  return q;
}

struct Record {
  std::vector<std::string> owner;
  uint16_t type = 0;
  uint16_t rclass = 0;
  uint32_t ttl = 0;
  size_t rdata_offset = 0;  // in the packet, for names inside rdata (CNAME)
  std::span<const uint8_t> rdata;
};

Result<Record> ReadRecord(Reader& r) {
  Record rec;
  auto owner = r.Name();
  if (!owner) return std::unexpected(owner.error());
  rec.owner = std::move(*owner);
  auto type = r.U16();
  auto rclass = r.U16();
  auto ttl = r.U32();
  auto rdlength = r.U16();
  if (!type || !rclass || !ttl || !rdlength) return std::unexpected(Malformed("truncated record"));
  rec.type = *type;
  rec.rclass = *rclass;
  rec.ttl = *ttl;
  rec.rdata_offset = r.offset();
  auto rdata = r.Bytes(*rdlength);
  if (!rdata) return std::unexpected(Malformed("rdata runs past the end"));
  rec.rdata = *rdata;
  return rec;
}

char Lower(char c) { return (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c; }

std::string LowerLabel(const std::string& label) {
  std::string out = label;
  std::transform(out.begin(), out.end(), out.begin(), Lower);
  return out;
}

std::vector<std::string> LowerLabels(const std::vector<std::string>& labels) {
  std::vector<std::string> out;
  out.reserve(labels.size());
  for (const auto& l : labels) out.push_back(LowerLabel(l));
  return out;
}

void PutU16(std::vector<uint8_t>& out, uint16_t v) {
  out.push_back(static_cast<uint8_t>(v >> 8));
  out.push_back(static_cast<uint8_t>(v & 0xFF));
}

void PutU32(std::vector<uint8_t>& out, uint32_t v) {
  PutU16(out, static_cast<uint16_t>(v >> 16));
  PutU16(out, static_cast<uint16_t>(v & 0xFFFF));
}

void PutName(std::vector<uint8_t>& out, const std::vector<std::string>& labels) {
  for (const auto& label : labels) {
    out.push_back(static_cast<uint8_t>(label.size()));
    out.insert(out.end(), label.begin(), label.end());
  }
  out.push_back(0);
}

void PutHeader(std::vector<uint8_t>& out, uint16_t id, uint16_t flags, uint16_t qd, uint16_t an) {
  PutU16(out, id);
  PutU16(out, flags);
  PutU16(out, qd);
  PutU16(out, an);
  PutU16(out, 0);
  PutU16(out, 0);
}

}  // namespace

const char* RcodeName(Rcode rcode) {
  switch (rcode) {
    case Rcode::kNoError:
      return "NOERROR";
    case Rcode::kFormErr:
      return "FORMERR";
    case Rcode::kServFail:
      return "SERVFAIL";
    case Rcode::kNxDomain:
      return "NXDOMAIN";
    case Rcode::kNotImp:
      return "NOTIMP";
    case Rcode::kRefused:
      return "REFUSED";
  }
  return "RCODE?";
}

Result<Query> ParseQuery(std::span<const uint8_t> packet) {
  Reader r(packet);
  auto header = ReadHeader(r);
  if (!header) return std::unexpected(header.error());
  if (header->flags & kFlagQr) return std::unexpected(Malformed("QR set in a query"));
  if (header->qdcount != 1) return std::unexpected(Malformed("query without exactly one question"));
  if (header->ancount != 0 || header->nscount != 0) {
    return std::unexpected(Malformed("query with answer or authority records"));
  }
  if (header->arcount > 1)
    return std::unexpected(Malformed("query with several additional records"));
  Query q;
  q.id = header->id;
  q.opcode = static_cast<uint8_t>((header->flags >> 11) & 0xF);
  q.recursion_desired = (header->flags & kFlagRd) != 0;
  auto question = ReadQuestion(r);
  if (!question) return std::unexpected(question.error());
  q.question = std::move(*question);
  if (header->arcount == 1) {
    auto opt = ReadRecord(r);
    if (!opt) return std::unexpected(opt.error());
    if (opt->type != kTypeOpt || !opt->owner.empty()) {
      return std::unexpected(Malformed("additional record in a query is not EDNS OPT"));
    }
  }
  if (r.remaining() != 0) return std::unexpected(Malformed("trailing bytes after the query"));
  return q;
}

std::optional<uint16_t> QueryIdForError(std::span<const uint8_t> packet) {
  if (packet.size() < kHeaderSize) return std::nullopt;
  if (packet[2] & 0x80) return std::nullopt;  // QR: a response; answering it could loop
  return static_cast<uint16_t>(packet[0] << 8 | packet[1]);
}

std::optional<std::string> NormalizedName(const std::vector<std::string>& labels) {
  if (labels.empty()) return std::nullopt;
  std::string name;
  for (const auto& label : labels) {
    if (label.empty() || label.size() > kMaxLabelLength) return std::nullopt;
    if (!name.empty()) name.push_back('.');
    for (char c : label) {
      char l = Lower(c);
      bool ok = (l >= 'a' && l <= 'z') || (l >= '0' && l <= '9') || l == '-' || l == '_';
      if (!ok) return std::nullopt;
      name.push_back(l);
    }
  }
  return name;
}

Result<std::vector<std::string>> SplitName(std::string_view name) {
  if (!name.empty() && name.back() == '.') name.remove_suffix(1);
  std::vector<std::string> labels;
  if (name.empty()) return labels;
  size_t wire_length = 1;
  size_t start = 0;
  while (true) {
    size_t dot = name.find('.', start);
    std::string_view label = name.substr(start, dot == std::string_view::npos ? dot : dot - start);
    if (label.empty() || label.size() > kMaxLabelLength) {
      return Fail(ErrorCode::kInvalidArgument,
                  "DNS name '" + std::string(name) + "': empty label or one over 63 bytes");
    }
    wire_length += 1 + label.size();
    if (wire_length > kMaxNameWireLength) {
      return Fail(ErrorCode::kInvalidArgument, "DNS name over 255 bytes");
    }
    labels.emplace_back(label);
    if (dot == std::string_view::npos) break;
    start = dot + 1;
  }
  return labels;
}

std::vector<uint8_t> BuildResponse(const Query& query, Rcode rcode,
                                   std::span<const address> addresses, uint32_t ttl) {
  uint16_t flags = kFlagQr | kFlagRa | static_cast<uint16_t>((query.opcode & 0xF) << 11) |
                   static_cast<uint16_t>(rcode);
  if (query.recursion_desired) flags |= kFlagRd;
  std::vector<uint8_t> out;
  out.reserve(kMaxUdpPayload);
  PutHeader(out, query.id, flags, 1, 0);
  PutName(out, query.question.labels);
  PutU16(out, query.question.qtype);
  PutU16(out, query.question.qclass);
  if (rcode != Rcode::kNoError) return out;
  uint16_t answers = 0;
  for (const auto& a : addresses) {
    bool v4 = a.is_v4();
    if ((query.question.qtype == kTypeA) != v4) continue;
    if (query.question.qtype != kTypeA && query.question.qtype != kTypeAaaa) continue;
    size_t rdlength = v4 ? 4 : 16;
    if (out.size() + 2 + 10 + rdlength > kMaxUdpPayload) break;
    // The owner is the question name, which always starts at offset 12: a pointer to it.
    PutU16(out, 0xC000 | kHeaderSize);
    PutU16(out, v4 ? kTypeA : kTypeAaaa);
    PutU16(out, kClassIn);
    PutU32(out, ttl);
    PutU16(out, static_cast<uint16_t>(rdlength));
    if (v4) {
      auto bytes = a.to_v4().to_bytes();
      out.insert(out.end(), bytes.begin(), bytes.end());
    } else {
      auto bytes = a.to_v6().to_bytes();
      out.insert(out.end(), bytes.begin(), bytes.end());
    }
    ++answers;
  }
  out[6] = static_cast<uint8_t>(answers >> 8);
  out[7] = static_cast<uint8_t>(answers & 0xFF);
  return out;
}

std::vector<uint8_t> BuildErrorResponse(uint16_t id, Rcode rcode) {
  std::vector<uint8_t> out;
  PutHeader(out, id, kFlagQr | kFlagRa | static_cast<uint16_t>(rcode), 0, 0);
  return out;
}

std::vector<uint8_t> BuildQuery(uint16_t id, const std::vector<std::string>& labels,
                                uint16_t qtype) {
  std::vector<uint8_t> out;
  PutHeader(out, id, kFlagRd, 1, 0);
  PutName(out, labels);
  PutU16(out, qtype);
  PutU16(out, kClassIn);
  return out;
}

Result<UpstreamAnswer> ParseResponse(std::span<const uint8_t> packet, uint16_t id,
                                     const std::vector<std::string>& labels, uint16_t qtype) {
  Reader r(packet);
  auto header = ReadHeader(r);
  if (!header) return std::unexpected(header.error());
  if (!(header->flags & kFlagQr)) return std::unexpected(Malformed("QR clear in a response"));
  if (header->id != id) return std::unexpected(Malformed("response id does not match"));
  if (header->qdcount != 1) {
    return std::unexpected(Malformed("response without exactly one question"));
  }
  if (header->ancount > kMaxResponseRecords) {
    return std::unexpected(Malformed("too many answer records"));
  }
  UpstreamAnswer answer;
  answer.rcode = static_cast<Rcode>(header->flags & 0xF);
  answer.truncated = (header->flags & kFlagTc) != 0;
  auto question = ReadQuestion(r);
  if (!question) return std::unexpected(question.error());
  const std::vector<std::string> want = LowerLabels(labels);
  if (LowerLabels(question->labels) != want || question->qtype != qtype ||
      question->qclass != kClassIn) {
    return std::unexpected(Malformed("response to a different question"));
  }
  if (answer.truncated) return answer;  // the rest is partial by definition

  std::map<std::vector<std::string>, std::pair<std::vector<std::string>, uint32_t>> cnames;
  std::map<std::vector<std::string>, std::vector<std::pair<address, uint32_t>>> owned;
  for (int i = 0; i < header->ancount; ++i) {
    auto rec = ReadRecord(r);
    if (!rec) return std::unexpected(rec.error());
    if (rec->rclass != kClassIn) continue;
    auto owner = LowerLabels(rec->owner);
    if (rec->type == kTypeCname) {
      Reader target_reader(packet);
      auto skipped = target_reader.Bytes(rec->rdata_offset);
      (void)skipped;
      auto target = target_reader.Name();
      if (!target) return std::unexpected(target.error());
      if (target_reader.offset() != rec->rdata_offset + rec->rdata.size()) {
        return std::unexpected(Malformed("CNAME rdata length does not match its name"));
      }
      // A second CNAME for one owner is invalid; keep the first rather than guess.
      cnames.emplace(std::move(owner), std::make_pair(LowerLabels(*target), rec->ttl));
    } else if (rec->type == qtype && qtype == kTypeA) {
      if (rec->rdata.size() != 4) return std::unexpected(Malformed("A rdata is not 4 bytes"));
      boost::asio::ip::address_v4::bytes_type b;
      std::copy(rec->rdata.begin(), rec->rdata.end(), b.begin());
      owned[owner].emplace_back(boost::asio::ip::address_v4(b), rec->ttl);
    } else if (rec->type == qtype && qtype == kTypeAaaa) {
      if (rec->rdata.size() != 16) return std::unexpected(Malformed("AAAA rdata is not 16 bytes"));
      boost::asio::ip::address_v6::bytes_type b;
      std::copy(rec->rdata.begin(), rec->rdata.end(), b.begin());
      owned[owner].emplace_back(boost::asio::ip::address_v6(b), rec->ttl);
    }
  }

  std::vector<std::string> current = want;
  uint32_t ttl = UINT32_MAX;
  for (int hop = 0; hop <= kMaxCnameHops; ++hop) {
    if (auto it = owned.find(current); it != owned.end()) {
      for (const auto& [addr, rec_ttl] : it->second) {
        answer.addresses.push_back(addr);
        ttl = std::min(ttl, rec_ttl);
      }
      answer.ttl = ttl;
      return answer;
    }
    auto it = cnames.find(current);
    if (it == cnames.end()) break;
    ttl = std::min(ttl, it->second.second);
    current = it->second.first;
  }
  // No addresses: NXDOMAIN, NODATA, or a chain that leaves the answer section or runs too long.
  answer.ttl = 0;
  return answer;
}

}  // namespace airlock::net::dns
