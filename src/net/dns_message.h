#pragma once
// DNS messages (RFC 1035) as the sandbox DNS stub needs them: parse a client's query, build the
// stub's answers (NOERROR with A/AAAA records, NXDOMAIN, REFUSED, SERVFAIL, FORMERR, NOTIMP),
// build the query the stub sends upstream and parse the upstream's response (A/AAAA answers,
// following CNAME chains inside the answer section only).
//
// Every input is untrusted bytes: a sandbox writes the queries and anything on the path can
// write the responses. The parsers bound everything (labels <= 63 bytes, names <= 255 bytes on
// the wire, compression pointers only backwards and at most kMaxPointerHops of them, record
// counts, rdata lengths) and return an error for anything they do not understand; they never
// read outside the packet. Pure functions, no IO: any thread.

#include <boost/asio/ip/address.hpp>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "common/error.h"

namespace airlock::net::dns {

inline constexpr uint16_t kTypeA = 1;
inline constexpr uint16_t kTypeCname = 5;
inline constexpr uint16_t kTypeAaaa = 28;
inline constexpr uint16_t kTypeOpt = 41;  // EDNS(0) pseudo-record in the additional section
inline constexpr uint16_t kClassIn = 1;

inline constexpr size_t kHeaderSize = 12;
inline constexpr size_t kMaxLabelLength = 63;
inline constexpr size_t kMaxNameWireLength = 255;  // RFC 1035 2.3.4, counting length bytes
inline constexpr int kMaxPointerHops = 16;         // more is never needed, only hostile
inline constexpr size_t kMaxUdpPayload = 512;      // what a client without EDNS accepts
inline constexpr int kMaxResponseRecords = 64;     // per section, in an upstream's answer
inline constexpr int kMaxCnameHops = 8;

enum class Rcode : uint8_t {
  kNoError = 0,
  kFormErr = 1,
  kServFail = 2,
  kNxDomain = 3,
  kNotImp = 4,
  kRefused = 5,
};
const char* RcodeName(Rcode rcode);

// A question as it came: labels with their original case (a reply must echo them byte for byte;
// resolvers that randomise case check it), and the lowercased dotted name when it is a host
// name at all.
struct Question {
  std::vector<std::string> labels;  // wire labels, case preserved; empty for the root
  uint16_t qtype = 0;
  uint16_t qclass = 0;
};

struct Query {
  uint16_t id = 0;
  uint8_t opcode = 0;  // 0 = QUERY; the stub answers NOTIMP to the others
  bool recursion_desired = false;
  Question question;
};

// Parses a client's query: QR clear, exactly one question, no answer or authority records, at
// most one additional record (EDNS OPT; parsed for shape and then ignored), no trailing bytes.
[[nodiscard]] Result<Query> ParseQuery(std::span<const uint8_t> packet);

// The id of a packet at least a header long whose QR bit is clear: what a FORMERR answer to an
// unparsable query is addressed with. nullopt for runts and for responses (never answer those).
std::optional<uint16_t> QueryIdForError(std::span<const uint8_t> packet);

// The lowercased name without a trailing dot, or nullopt when it is not a host name the policy
// could list: empty (the root), or a byte outside [A-Za-z0-9-_] in any label.
std::optional<std::string> NormalizedName(const std::vector<std::string>& labels);

// Splits a dotted name ("Example.com." or "example.com") into labels. Fails on empty labels and
// on labels or names over the limits.
[[nodiscard]] Result<std::vector<std::string>> SplitName(std::string_view name);

// The stub's reply to `query`: the question echoed; for NOERROR, one A or AAAA record per
// address (those of the other family are skipped) with `ttl`. Addresses that would push the
// reply past kMaxUdpPayload are left out, so TC is never needed.
std::vector<uint8_t> BuildResponse(const Query& query, Rcode rcode,
                                   std::span<const boost::asio::ip::address> addresses,
                                   uint32_t ttl);

// A header-only reply (no question) for a query that could not be parsed.
std::vector<uint8_t> BuildErrorResponse(uint16_t id, Rcode rcode);

// The query the stub sends upstream: RD set, one question, no EDNS.
std::vector<uint8_t> BuildQuery(uint16_t id, const std::vector<std::string>& labels,
                                uint16_t qtype);

struct UpstreamAnswer {
  Rcode rcode = Rcode::kNoError;
  bool truncated = false;                           // TC: retry over TCP
  std::vector<boost::asio::ip::address> addresses;  // of the asked type, at the end of the chain
  uint32_t ttl = 0;  // smallest TTL on the chain (CNAMEs and addresses); 0 when no addresses
};

// Parses an upstream's response to the query (`id`, `labels`, `qtype`): QR set, same id, the
// same question (case-insensitively), then the answer section. Addresses are those owned by the
// question name or reached from it by CNAMEs in the answer section (at most kMaxCnameHops);
// authority and additional sections are not read (nothing there is trusted).
[[nodiscard]] Result<UpstreamAnswer> ParseResponse(std::span<const uint8_t> packet, uint16_t id,
                                                   const std::vector<std::string>& labels,
                                                   uint16_t qtype);

}  // namespace airlock::net::dns
