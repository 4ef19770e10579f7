// The sandbox DNS library: the codec against hand-built and hostile packets, the resolver and the
// stub against a FakeAuthority that counts every query, the egress proxy's address cache.
// Everything stays on 127.0.0.1.

#include "net/dns.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "net/address_cache.h"
#include "unit/net/fake_authority.h"

namespace airlock::net::dns {
namespace {

namespace asio = boost::asio;
using asio::ip::address;
using asio::ip::make_address;
using asio::ip::udp;
using Bytes = std::vector<uint8_t>;
using testing::FakeAuthority;

// ---------------------------------------------------------------------------------------------
// Hand-built packets (independent of the encoder under test).

void Put16(Bytes& b, uint16_t v) {
  b.push_back(static_cast<uint8_t>(v >> 8));
  b.push_back(static_cast<uint8_t>(v));
}

void PutLabels(Bytes& b, std::initializer_list<std::string> labels) {
  for (const auto& l : labels) {
    b.push_back(static_cast<uint8_t>(l.size()));
    b.insert(b.end(), l.begin(), l.end());
  }
  b.push_back(0);
}

Bytes Header(uint16_t id, uint16_t flags, uint16_t qd, uint16_t an, uint16_t ns, uint16_t ar) {
  Bytes b;
  Put16(b, id);
  Put16(b, flags);
  Put16(b, qd);
  Put16(b, an);
  Put16(b, ns);
  Put16(b, ar);
  return b;
}

// A query for www.example.com A with RD, id 0x1234.
Bytes ValidQuery() {
  Bytes b = Header(0x1234, 0x0100, 1, 0, 0, 0);
  PutLabels(b, {"www", "example", "com"});
  Put16(b, kTypeA);
  Put16(b, kClassIn);
  return b;
}

Bytes QueryFor(uint16_t id, const std::string& name, uint16_t qtype) {
  Bytes b = Header(id, 0x0100, 1, 0, 0, 0);
  size_t start = 0;
  while (start < name.size()) {
    size_t dot = name.find('.', start);
    if (dot == std::string::npos) dot = name.size();
    b.push_back(static_cast<uint8_t>(dot - start));
    b.insert(b.end(), name.begin() + static_cast<long>(start),
             name.begin() + static_cast<long>(dot));
    start = dot + 1;
  }
  b.push_back(0);
  Put16(b, qtype);
  Put16(b, kClassIn);
  return b;
}

// A response to ValidQuery(): CNAME www.example.com -> edge.example.com (compressed against
// the question), then edge.example.com A 192.0.2.7 (owner compressed to the CNAME's rdata).
Bytes ValidResponse() {
  Bytes b = Header(0x1234, 0x8180, 1, 2, 0, 0);
  PutLabels(b, {"www", "example", "com"});  // offset 12; "example" at 16
  Put16(b, kTypeA);
  Put16(b, kClassIn);
  Put16(b, 0xC00C);  // owner: the question name
  Put16(b, kTypeCname);
  Put16(b, kClassIn);
  Put16(b, 0);
  Put16(b, 120);
  size_t rdata_at = b.size() + 2;
  Put16(b, 7);  // rdlength: "edge" label (5) + pointer (2)
  b.push_back(4);
  b.insert(b.end(), {'e', 'd', 'g', 'e'});
  Put16(b, 0xC010);                                    // -> "example.com" at offset 16
  Put16(b, static_cast<uint16_t>(0xC000 | rdata_at));  // owner: edge.example.com
  Put16(b, kTypeA);
  Put16(b, kClassIn);
  Put16(b, 0);
  Put16(b, 60);
  Put16(b, 4);
  b.insert(b.end(), {192, 0, 2, 7});
  return b;
}

std::vector<std::string> Labels(const std::string& name) {
  auto l = SplitName(name);
  EXPECT_TRUE(l.has_value()) << name;
  return l.value_or(std::vector<std::string>{});
}

// ---------------------------------------------------------------------------------------------
// Codec

TEST(DnsCodec, QueryRoundTrip) {
  Bytes q = BuildQuery(0xBEEF, Labels("Api.Example.com."), kTypeAaaa);
  auto parsed = ParseQuery(q);
  ASSERT_TRUE(parsed) << parsed.error().message();
  EXPECT_EQ(parsed->id, 0xBEEF);
  EXPECT_EQ(parsed->opcode, 0);
  EXPECT_TRUE(parsed->recursion_desired);
  EXPECT_EQ(parsed->question.qtype, kTypeAaaa);
  EXPECT_EQ(parsed->question.qclass, kClassIn);
  EXPECT_EQ(parsed->question.labels, (std::vector<std::string>{"Api", "Example", "com"}));
  EXPECT_EQ(NormalizedName(parsed->question.labels), "api.example.com");
}

TEST(DnsCodec, HandBuiltQueryParses) {
  auto parsed = ParseQuery(ValidQuery());
  ASSERT_TRUE(parsed) << parsed.error().message();
  EXPECT_EQ(parsed->id, 0x1234);
  EXPECT_EQ(NormalizedName(parsed->question.labels), "www.example.com");
}

TEST(DnsCodec, QueryWithEdnsOptParses) {
  Bytes q = ValidQuery();
  q[11] = 1;       // arcount
  q.push_back(0);  // root owner
  Put16(q, kTypeOpt);
  Put16(q, 4096);
  Put16(q, 0);
  Put16(q, 0);
  Put16(q, 0);
  auto parsed = ParseQuery(q);
  ASSERT_TRUE(parsed) << parsed.error().message();
  EXPECT_EQ(parsed->question.qtype, kTypeA);
}

TEST(DnsCodec, NormalizedNameRefusesWhatNoPolicyCanList) {
  EXPECT_EQ(NormalizedName({"_Dmarc", "X-Y", "COM"}), "_dmarc.x-y.com");
  EXPECT_FALSE(NormalizedName({}));              // the root
  EXPECT_FALSE(NormalizedName({"a b", "com"}));  // space
  EXPECT_FALSE(NormalizedName({"a.b", "com"}));  // a dot inside a label
  EXPECT_FALSE(NormalizedName({std::string("ex\0ample", 8), "com"}));
  EXPECT_FALSE(NormalizedName({"caf\xc3\xa9", "com"}));  // UTF-8
  EXPECT_FALSE(NormalizedName({"*", "example", "com"}));
  EXPECT_FALSE(NormalizedName({"", "com"}));
}

TEST(DnsCodec, SplitNameLimits) {
  EXPECT_EQ(Labels("example.com."), (std::vector<std::string>{"example", "com"}));
  EXPECT_TRUE(SplitName("").value().empty());
  EXPECT_TRUE(SplitName(std::string(63, 'a') + ".com").has_value());
  EXPECT_FALSE(SplitName(std::string(64, 'a') + ".com").has_value());
  EXPECT_FALSE(SplitName("a..com").has_value());
  EXPECT_FALSE(SplitName(".com").has_value());
  // 4 labels of 63: 4 * 64 + 1 = 257 bytes on the wire.
  std::string l63(63, 'b');
  EXPECT_FALSE(SplitName(l63 + "." + l63 + "." + l63 + "." + l63).has_value());
  EXPECT_TRUE(SplitName(l63 + "." + l63 + "." + l63 + "." + std::string(61, 'c')).has_value());
}

TEST(DnsCodec, ResponseRoundTripEchoesQuestionCase) {
  Bytes q = BuildQuery(7, Labels("WwW.ExAmPle.CoM"), kTypeA);
  auto query = ParseQuery(q).value();
  std::vector<address> addrs{make_address("192.0.2.1"), make_address("2001:db8::1"),
                             make_address("192.0.2.2")};
  Bytes r = BuildResponse(query, Rcode::kNoError, addrs, 30);
  // The question is echoed byte for byte, so resolvers that randomise case accept it.
  ASSERT_GE(r.size(), q.size());
  EXPECT_TRUE(std::equal(q.begin() + 12, q.end(), r.begin() + 12));
  auto parsed = ParseResponse(r, 7, Labels("www.example.com"), kTypeA);
  ASSERT_TRUE(parsed) << parsed.error().message();
  EXPECT_EQ(parsed->rcode, Rcode::kNoError);
  EXPECT_EQ(parsed->ttl, 30u);
  EXPECT_EQ(parsed->addresses,
            (std::vector<address>{make_address("192.0.2.1"), make_address("192.0.2.2")}));
  EXPECT_EQ(r[2] & 0x80, 0x80);  // QR
  EXPECT_EQ(r[2] & 0x01, 0x01);  // RD echoed
}

TEST(DnsCodec, AaaaResponseSkipsV4) {
  auto query = ParseQuery(BuildQuery(9, Labels("v6.example"), kTypeAaaa)).value();
  std::vector<address> addrs{make_address("192.0.2.1"), make_address("2001:db8::5")};
  auto parsed = ParseResponse(BuildResponse(query, Rcode::kNoError, addrs, 5), 9,
                              Labels("v6.example"), kTypeAaaa);
  ASSERT_TRUE(parsed);
  EXPECT_EQ(parsed->addresses, (std::vector<address>{make_address("2001:db8::5")}));
}

TEST(DnsCodec, ResponseStaysWithin512Bytes) {
  auto query =
      ParseQuery(BuildQuery(1, Labels(std::string(60, 'x') + ".example"), kTypeAaaa)).value();
  std::vector<address> addrs;
  for (int i = 0; i < 100; ++i) {
    addrs.push_back(make_address("2001:db8::" + std::to_string(i + 1)));
  }
  Bytes r = BuildResponse(query, Rcode::kNoError, addrs, 30);
  EXPECT_LE(r.size(), kMaxUdpPayload);
  auto parsed = ParseResponse(r, 1, query.question.labels, kTypeAaaa);
  ASSERT_TRUE(parsed);
  EXPECT_GT(parsed->addresses.size(), 5u);
  EXPECT_LT(parsed->addresses.size(), 100u);
}

TEST(DnsCodec, ErrorResponses) {
  auto query = ParseQuery(ValidQuery()).value();
  std::vector<address> addrs{make_address("192.0.2.1")};
  for (Rcode rc : {Rcode::kNxDomain, Rcode::kRefused, Rcode::kServFail, Rcode::kNotImp}) {
    Bytes r = BuildResponse(query, rc, addrs, 30);  // addresses ignored for errors
    auto parsed = ParseResponse(r, 0x1234, Labels("www.example.com"), kTypeA);
    ASSERT_TRUE(parsed) << RcodeName(rc);
    EXPECT_EQ(parsed->rcode, rc);
    EXPECT_TRUE(parsed->addresses.empty());
    EXPECT_EQ(r[7], 0);  // ancount
  }
  Bytes formerr = BuildErrorResponse(0xABCD, Rcode::kFormErr);
  ASSERT_EQ(formerr.size(), kHeaderSize);
  EXPECT_EQ(formerr[0], 0xAB);
  EXPECT_EQ(formerr[1], 0xCD);
  EXPECT_EQ(formerr[3] & 0xF, 1);
  EXPECT_EQ(formerr[5], 0);  // no question
}

TEST(DnsCodec, ParsesCompressedCnameChain) {
  auto parsed = ParseResponse(ValidResponse(), 0x1234, Labels("www.example.com"), kTypeA);
  ASSERT_TRUE(parsed) << parsed.error().message();
  EXPECT_EQ(parsed->addresses, (std::vector<address>{make_address("192.0.2.7")}));
  EXPECT_EQ(parsed->ttl, 60u);  // min(CNAME 120, A 60)
}

TEST(DnsCodec, ResponseMatchingIsStrict) {
  Bytes r = ValidResponse();
  EXPECT_FALSE(ParseResponse(r, 0x1235, Labels("www.example.com"), kTypeA));     // id
  EXPECT_FALSE(ParseResponse(r, 0x1234, Labels("www.example.org"), kTypeA));     // name
  EXPECT_FALSE(ParseResponse(r, 0x1234, Labels("www.example.com"), kTypeAaaa));  // type
  EXPECT_TRUE(ParseResponse(r, 0x1234, Labels("WWW.EXAMPLE.COM"), kTypeA));      // case-blind
  Bytes no_qr = r;
  no_qr[2] &= 0x7F;
  EXPECT_FALSE(ParseResponse(no_qr, 0x1234, Labels("www.example.com"), kTypeA));
}

// Builds a response to "a.test" A whose answers are the given records (owner, type, data).
struct Rr {
  std::string owner;
  uint16_t type;
  std::string data;  // dotted quad for A, a name for CNAME
  uint32_t ttl = 100;
};
Bytes ResponseWith(const std::string& qname, const std::vector<Rr>& rrs) {
  Bytes b = Header(1, 0x8180, 1, static_cast<uint16_t>(rrs.size()), 0, 0);
  Bytes name = QueryFor(0, qname, kTypeA);
  b.insert(b.end(), name.begin() + 12, name.end());
  for (const auto& rr : rrs) {
    Bytes owner = QueryFor(0, rr.owner, 0);
    b.insert(b.end(), owner.begin() + 12, owner.end() - 4);
    Put16(b, rr.type);
    Put16(b, kClassIn);
    Put16(b, static_cast<uint16_t>(rr.ttl >> 16));
    Put16(b, static_cast<uint16_t>(rr.ttl));
    Bytes rdata;
    if (rr.type == kTypeA) {
      rdata.resize(4);
      inet_pton(AF_INET, rr.data.c_str(), rdata.data());
    } else {
      Bytes target = QueryFor(0, rr.data, 0);
      rdata.assign(target.begin() + 12, target.end() - 4);
    }
    Put16(b, static_cast<uint16_t>(rdata.size()));
    b.insert(b.end(), rdata.begin(), rdata.end());
  }
  return b;
}

TEST(DnsCodec, CnameChainsStayInsideTheAnswerAndAreBounded) {
  // Records for names off the chain are not answers, whatever the upstream says.
  auto off_chain = ParseResponse(ResponseWith("a.test", {{"evil.test", kTypeA, "10.0.0.1"}}), 1,
                                 Labels("a.test"), kTypeA);
  ASSERT_TRUE(off_chain);
  EXPECT_TRUE(off_chain->addresses.empty());

  auto loop = ParseResponse(
      ResponseWith("a.test", {{"a.test", kTypeCname, "b.test"}, {"b.test", kTypeCname, "a.test"}}),
      1, Labels("a.test"), kTypeA);
  ASSERT_TRUE(loop);
  EXPECT_TRUE(loop->addresses.empty());

  std::vector<Rr> long_chain;
  for (int i = 0; i < kMaxCnameHops + 2; ++i) {
    long_chain.push_back({i == 0 ? "a.test" : "c" + std::to_string(i) + ".test", kTypeCname,
                          "c" + std::to_string(i + 1) + ".test"});
  }
  long_chain.push_back({"c" + std::to_string(kMaxCnameHops + 2) + ".test", kTypeA, "192.0.2.9"});
  auto too_long = ParseResponse(ResponseWith("a.test", long_chain), 1, Labels("a.test"), kTypeA);
  ASSERT_TRUE(too_long);
  EXPECT_TRUE(too_long->addresses.empty());

  auto ok = ParseResponse(ResponseWith("a.test", {{"a.test", kTypeCname, "b.test", 50},
                                                  {"b.test", kTypeA, "192.0.2.3", 400}}),
                          1, Labels("a.test"), kTypeA);
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->addresses, (std::vector<address>{make_address("192.0.2.3")}));
  EXPECT_EQ(ok->ttl, 50u);
}

// Each of these must be refused by ParseQuery, cleanly.
std::vector<std::pair<std::string, Bytes>> MalformedQueries() {
  std::vector<std::pair<std::string, Bytes>> cases;
  Bytes valid = ValidQuery();
  cases.emplace_back("empty", Bytes{});
  cases.emplace_back("one byte", Bytes{0x12});
  cases.emplace_back("11-byte header", Bytes(valid.begin(), valid.begin() + 11));
  cases.emplace_back("header only", Bytes(valid.begin(), valid.begin() + 12));
  cases.emplace_back("name cut mid-label", Bytes(valid.begin(), valid.begin() + 16));
  cases.emplace_back("no root byte", Bytes(valid.begin(), valid.begin() + 28));
  cases.emplace_back("qtype cut", Bytes(valid.begin(), valid.end() - 3));
  cases.emplace_back("qclass cut", Bytes(valid.begin(), valid.end() - 1));
  {
    Bytes b = valid;
    b.push_back(0);
    cases.emplace_back("trailing byte", b);
  }
  {
    Bytes b = valid;
    b[2] |= 0x80;
    cases.emplace_back("QR set", b);
  }
  {
    Bytes b = valid;
    b[5] = 0;
    cases.emplace_back("qdcount 0", b);
  }
  {
    Bytes b = valid;
    b[5] = 2;
    cases.emplace_back("qdcount 2, one question", b);
  }
  {
    Bytes b = valid;
    b[4] = 0xFF;
    b[5] = 0xFF;
    cases.emplace_back("qdcount 65535", b);
  }
  {
    Bytes b = valid;
    b[7] = 1;
    cases.emplace_back("ancount 1 in a query", b);
  }
  {
    Bytes b = valid;
    b[9] = 1;
    cases.emplace_back("nscount 1 in a query", b);
  }
  {
    Bytes b = valid;
    b[11] = 1;
    cases.emplace_back("arcount 1, nothing there", b);
  }
  {
    Bytes b = valid;
    b[11] = 2;
    cases.emplace_back("arcount 2", b);
  }
  {
    Bytes b = valid;
    b[11] = 1;
    PutLabels(b, {"x"});  // an additional record that is not OPT
    Put16(b, kTypeA);
    Put16(b, kClassIn);
    Put16(b, 0);
    Put16(b, 0);
    Put16(b, 4);
    b.insert(b.end(), {1, 2, 3, 4});
    cases.emplace_back("additional A record", b);
  }
  {
    Bytes b = valid;
    b[11] = 1;
    b.push_back(0);
    Put16(b, kTypeOpt);
    Put16(b, 4096);
    Put16(b, 0);
    Put16(b, 0);
    Put16(b, 10);  // rdlength past the end
    cases.emplace_back("OPT rdata past the end", b);
  }
  {
    Bytes b = Header(1, 0x0100, 1, 0, 0, 0);
    b.push_back(64);
    b.insert(b.end(), 64, 'a');
    b.push_back(0);
    Put16(b, 1);
    Put16(b, 1);
    cases.emplace_back("64-byte label", b);
  }
  {
    Bytes b = Header(1, 0x0100, 1, 0, 0, 0);
    for (int i = 0; i < 5; ++i) {
      b.push_back(60);
      b.insert(b.end(), 60, 'a');
    }
    b.push_back(0);
    Put16(b, 1);
    Put16(b, 1);
    cases.emplace_back("name of 306 bytes", b);
  }
  {
    Bytes b = Header(1, 0x0100, 1, 0, 0, 0);
    b.push_back(0x40);  // reserved label type 01
    b.push_back(0);
    Put16(b, 1);
    Put16(b, 1);
    cases.emplace_back("label type 0x40", b);
  }
  {
    Bytes b = Header(1, 0x0100, 1, 0, 0, 0);
    b.push_back(0x80);  // reserved label type 10
    b.push_back(0);
    Put16(b, 1);
    Put16(b, 1);
    cases.emplace_back("label type 0x80", b);
  }
  {
    Bytes b = Header(1, 0x0100, 1, 0, 0, 0);
    Put16(b, 0xC00C);  // points at itself
    Put16(b, 1);
    Put16(b, 1);
    cases.emplace_back("pointer to itself", b);
  }
  {
    Bytes b = Header(1, 0x0100, 1, 0, 0, 0);
    Put16(b, 0xC020);  // forward
    Put16(b, 1);
    Put16(b, 1);
    b.resize(0x30, 0);
    cases.emplace_back("forward pointer", b);
  }
  {
    Bytes b = Header(1, 0x0100, 1, 0, 0, 0);
    Put16(b, 0xC100);  // far past the end
    Put16(b, 1);
    Put16(b, 1);
    cases.emplace_back("pointer past the end", b);
  }
  {
    Bytes b = Header(1, 0x0100, 1, 0, 0, 0);
    b.push_back(0xC0);  // pointer cut in half
    cases.emplace_back("half a pointer", b);
  }
  {
    // Two labels, then a pointer back to the first label: "a.a.a.a..." forever.
    Bytes b = Header(1, 0x0100, 1, 0, 0, 0);
    b.push_back(1);
    b.push_back('a');
    Put16(b, 0xC00C);
    Put16(b, 1);
    Put16(b, 1);
    cases.emplace_back("pointer loop through a label", b);
  }
  {
    // A pointer into the header (offset 2): reads flags and counts as labels, must not pass.
    Bytes b = Header(1, 0x0100, 1, 0, 0, 0);
    Put16(b, 0xC002);
    Put16(b, 1);
    Put16(b, 1);
    cases.emplace_back("pointer into the header", b);
  }
  {
    Bytes b = Header(1, 0x0100, 1, 0, 0, 0);
    b.push_back(10);  // label longer than the rest
    b.insert(b.end(), {'a', 'b'});
    cases.emplace_back("label past the end", b);
  }
  return cases;
}

TEST(DnsCodec, MalformedQueriesAreRefused) {
  auto cases = MalformedQueries();
  ASSERT_GE(cases.size(), 25u);
  for (const auto& [what, bytes] : cases) {
    auto parsed = ParseQuery(bytes);
    EXPECT_FALSE(parsed.has_value()) << what;
    if (!parsed) {
      EXPECT_EQ(parsed.error().code(), ErrorCode::kProtocol) << what;
    }
  }
}

TEST(DnsCodec, MalformedResponsesAreRefused) {
  Bytes valid = ValidResponse();
  auto labels = Labels("www.example.com");
  std::vector<std::pair<std::string, Bytes>> cases;
  for (size_t cut : {size_t{5}, size_t{12}, size_t{30}, valid.size() - 1, valid.size() - 5}) {
    cases.emplace_back("cut at " + std::to_string(cut),
                       Bytes(valid.begin(), valid.begin() + static_cast<long>(cut)));
  }
  {
    Bytes b = valid;
    b[7] = 3;  // one more answer than there is
    cases.emplace_back("ancount too high", b);
  }
  {
    Bytes b = valid;
    b[6] = 0x01;  // 256 + 2 answers
    cases.emplace_back("ancount over the record cap", b);
  }
  {
    Bytes b = valid;
    b[b.size() - 5] = 5;  // A rdlength 5 with 4 bytes there
    cases.emplace_back("A rdlength past the end", b);
  }
  {
    Bytes b = valid;
    b[b.size() - 5] = 3;  // A rdlength 3
    b.pop_back();
    cases.emplace_back("A rdata of 3 bytes", b);
  }
  {
    Bytes b = valid;
    // The CNAME target's pointer (at 0x2B..0x2C region) turned into a self pointer.
    size_t rdata_at = 12 + 17 + 4 + 2 + 2 + 2 + 4 + 2;  // after question and CNAME fixed part
    b[rdata_at + 5] = 0xC0;
    b[rdata_at + 6] = static_cast<uint8_t>(rdata_at + 5);
    cases.emplace_back("CNAME target pointer to itself", b);
  }
  for (const auto& [what, bytes] : cases) {
    EXPECT_FALSE(ParseResponse(bytes, 0x1234, labels, kTypeA).has_value()) << what;
  }
}

TEST(DnsCodec, MutatedPacketsNeverCrash) {
  std::mt19937 rng(20240601);
  const std::vector<Bytes> seeds{
      ValidQuery(), ValidResponse(),
      ResponseWith("a.test", {{"a.test", kTypeCname, "b.test"}, {"b.test", kTypeA, "192.0.2.3"}})};
  size_t accepted_queries = 0;
  for (int i = 0; i < 10000; ++i) {
    Bytes b = seeds[static_cast<size_t>(i) % seeds.size()];
    int mutations = 1 + static_cast<int>(rng() % 4);
    for (int m = 0; m < mutations; ++m) {
      switch (rng() % 4) {
        case 0:  // flip a byte
          if (!b.empty()) b[rng() % b.size()] = static_cast<uint8_t>(rng());
          break;
        case 1:  // truncate
          if (!b.empty()) b.resize(rng() % b.size());
          break;
        case 2:  // insert a byte
          b.insert(b.begin() + static_cast<long>(rng() % (b.size() + 1)),
                   static_cast<uint8_t>(rng()));
          break;
        case 3:  // a compression pointer somewhere
          if (b.size() > 2) {
            size_t at = rng() % (b.size() - 1);
            b[at] = static_cast<uint8_t>(0xC0 | (rng() & 0x3F));
            b[at + 1] = static_cast<uint8_t>(rng());
          }
          break;
      }
    }
    if (auto q = ParseQuery(b)) {
      ++accepted_queries;
      size_t wire = 1;
      for (const auto& l : q->question.labels) {
        ASSERT_LE(l.size(), kMaxLabelLength);
        wire += 1 + l.size();
      }
      ASSERT_LE(wire, kMaxNameWireLength);
    }
    auto r = ParseResponse(b, 0x1234, Labels("www.example.com"), kTypeA);
    if (r) {
      ASSERT_LE(r->addresses.size(), static_cast<size_t>(kMaxResponseRecords));
    }
    (void)QueryIdForError(b);
  }
  // Some mutations (a flipped qtype byte, say) leave a valid query: the loop did reach the end.
  EXPECT_GT(accepted_queries, 0u);
}

// ---------------------------------------------------------------------------------------------
// Resolver

udp::endpoint Loopback(uint16_t port) { return udp::endpoint(make_address("127.0.0.1"), port); }

class ResolverTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auth_.Set("www.example.com", {.a = {"192.0.2.10", "192.0.2.11"}, .ttl = 300});
    auth_.Set("v6.example.com", {.aaaa = {"2001:db8::10"}, .ttl = 60});
    auth_.Set("alias.example.com", {.cname = "mid.example.net", .ttl = 90});
    auth_.Set("mid.example.net", {.cname = "host.example.org", .ttl = 400});
    auth_.Set("host.example.org", {.a = {"192.0.2.20"}, .ttl = 200});
  }
  std::vector<udp::endpoint> Upstream() { return {Loopback(auth_.port())}; }

  FakeAuthority auth_;
};

TEST_F(ResolverTest, A) {
  auto r = Resolve("www.example.com", kTypeA, Upstream(), std::chrono::seconds(2));
  ASSERT_TRUE(r) << r.error().message();
  EXPECT_EQ(r->rcode, Rcode::kNoError);
  EXPECT_EQ(r->addresses,
            (std::vector<address>{make_address("192.0.2.10"), make_address("192.0.2.11")}));
  EXPECT_EQ(r->ttl, 300u);
  EXPECT_EQ(auth_.queries(), 1u);
}

TEST_F(ResolverTest, Aaaa) {
  auto r = Resolve("V6.Example.COM.", kTypeAaaa, Upstream(), std::chrono::seconds(2));
  ASSERT_TRUE(r) << r.error().message();
  EXPECT_EQ(r->addresses, (std::vector<address>{make_address("2001:db8::10")}));
  EXPECT_EQ(r->ttl, 60u);
}

TEST_F(ResolverTest, CnameChain) {
  auto r = Resolve("alias.example.com", kTypeA, Upstream(), std::chrono::seconds(2));
  ASSERT_TRUE(r) << r.error().message();
  EXPECT_EQ(r->addresses, (std::vector<address>{make_address("192.0.2.20")}));
  EXPECT_EQ(r->ttl, 90u);  // the smallest on the chain
}

TEST_F(ResolverTest, NxDomain) {
  auto r = Resolve("nothing.example.com", kTypeA, Upstream(), std::chrono::seconds(2));
  ASSERT_TRUE(r) << r.error().message();
  EXPECT_EQ(r->rcode, Rcode::kNxDomain);
  EXPECT_TRUE(r->addresses.empty());
  EXPECT_EQ(auth_.queries_for("nothing.example.com"), 1u);
}

TEST_F(ResolverTest, NoDataForTheOtherFamily) {
  auto r = Resolve("www.example.com", kTypeAaaa, Upstream(), std::chrono::seconds(2));
  ASSERT_TRUE(r);
  EXPECT_EQ(r->rcode, Rcode::kNoError);
  EXPECT_TRUE(r->addresses.empty());
}

TEST_F(ResolverTest, TimesOutOnASilentServer) {
  auth_.silent = true;
  auto start = std::chrono::steady_clock::now();
  auto r = Resolve("www.example.com", kTypeA, Upstream(), std::chrono::milliseconds(300));
  auto took = std::chrono::steady_clock::now() - start;
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code(), ErrorCode::kDeadlineExceeded) << r.error().message();
  EXPECT_GE(took, std::chrono::milliseconds(250));
  EXPECT_LT(took, std::chrono::seconds(2));
  EXPECT_EQ(auth_.queries(), 1u);
}

TEST_F(ResolverTest, ReplyWithWrongIdIsIgnored) {
  auth_.only_wrong_id = true;
  auto r = Resolve("www.example.com", kTypeA, Upstream(), std::chrono::milliseconds(300));
  ASSERT_FALSE(r);  // the only reply had the wrong id: as if nothing came
  EXPECT_EQ(r.error().code(), ErrorCode::kDeadlineExceeded);

  auth_.only_wrong_id = false;
  auth_.wrong_id_first = true;
  auto ok = Resolve("www.example.com", kTypeA, Upstream(), std::chrono::seconds(2));
  ASSERT_TRUE(ok) << ok.error().message();
  EXPECT_EQ(ok->addresses.size(), 2u);
}

TEST_F(ResolverTest, ServFailIsAnError) {
  auth_.servfail = true;
  auto r = Resolve("www.example.com", kTypeA, Upstream(), std::chrono::seconds(2));
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code(), ErrorCode::kUnavailable);
  EXPECT_NE(r.error().message().find("SERVFAIL"), std::string::npos) << r.error().message();
}

TEST_F(ResolverTest, MovesOnToTheNextUpstream) {
  // A bound socket that never answers, then the authority.
  int silent = socket(AF_INET, SOCK_DGRAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(silent, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  socklen_t len = sizeof(addr);
  getsockname(silent, reinterpret_cast<sockaddr*>(&addr), &len);
  std::vector<udp::endpoint> upstream{Loopback(ntohs(addr.sin_port)), Loopback(auth_.port())};
  auto r = Resolve("www.example.com", kTypeA, upstream, std::chrono::milliseconds(1000));
  close(silent);
  ASSERT_TRUE(r) << r.error().message();
  EXPECT_EQ(r->addresses.size(), 2u);
}

TEST_F(ResolverTest, TcpFallbackOnTruncation) {
  if (!auth_.has_tcp()) GTEST_SKIP() << "the fake authority could not bind TCP on its UDP port";
  auth_.truncate_udp = true;
  auto r = Resolve("www.example.com", kTypeA, Upstream(), std::chrono::seconds(2));
  ASSERT_TRUE(r) << r.error().message();
  EXPECT_EQ(r->addresses.size(), 2u);
  EXPECT_EQ(auth_.tcp_queries(), 1u);
  EXPECT_EQ(auth_.queries(), 2u);  // one UDP, one TCP
}

// A socket factory (a namespace uplink's) makes every socket of a resolution, UDP and the TCP
// retry; one that fails means nothing is sent.
TEST_F(ResolverTest, SocketsComeFromTheFactory) {
  if (!auth_.has_tcp()) GTEST_SKIP() << "the fake authority could not bind TCP on its UDP port";
  std::vector<int> types;
  SocketFactory counting = [&types](int domain, int type) -> Result<UniqueFd> {
    types.push_back(type);
    return UniqueFd(socket(domain, type | SOCK_CLOEXEC, 0));
  };
  auth_.truncate_udp = true;
  auto r = Resolve("www.example.com", kTypeA, Upstream(), std::chrono::seconds(2), counting);
  ASSERT_TRUE(r) << r.error().message();
  EXPECT_EQ(r->addresses.size(), 2u);
  EXPECT_EQ(types, (std::vector<int>{SOCK_DGRAM, SOCK_STREAM}));

  SocketFactory failing = [](int, int) -> Result<UniqueFd> {
    return Fail(ErrorCode::kUnavailable, "no namespace");
  };
  const uint64_t before = auth_.queries();
  auto refused = Resolve("www.example.com", kTypeA, Upstream(), std::chrono::seconds(1), failing);
  ASSERT_FALSE(refused);
  EXPECT_EQ(auth_.queries(), before);
}

TEST_F(ResolverTest, BadArguments) {
  EXPECT_EQ(Resolve("www.example.com", kTypeA, {}, std::chrono::seconds(1)).error().code(),
            ErrorCode::kInvalidArgument);
  EXPECT_EQ(Resolve("www.example.com", 15, Upstream(), std::chrono::seconds(1)).error().code(),
            ErrorCode::kInvalidArgument);
  EXPECT_EQ(Resolve("a..b", kTypeA, Upstream(), std::chrono::seconds(1)).error().code(),
            ErrorCode::kInvalidArgument);
  EXPECT_EQ(Resolve(".", kTypeA, Upstream(), std::chrono::seconds(1)).error().code(),
            ErrorCode::kInvalidArgument);
  EXPECT_EQ(auth_.queries(), 0u);
}

TEST_F(ResolverTest, ManyAsyncResolutionsOnOneIoContext) {
  asio::io_context io;
  int done = 0, ok = 0;
  for (int i = 0; i < 50; ++i) {
    AsyncResolve(io.get_executor(), i % 2 ? "www.example.com" : "alias.example.com", kTypeA,
                 Upstream(), std::chrono::seconds(2), [&](Result<ResolveResult> r) {
                   ++done;
                   if (r && !r->addresses.empty()) ++ok;
                 });
  }
  io.run();
  EXPECT_EQ(done, 50);
  EXPECT_EQ(ok, 50);
  EXPECT_EQ(auth_.queries(), 50u);
}

// ---------------------------------------------------------------------------------------------
// Stub

// A blocking UDP client on 127.0.0.1.
class Client {
 public:
  Client() {
    fd_ = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    SetTimeout(std::chrono::milliseconds(3000));
  }
  ~Client() { close(fd_); }
  void SetTimeout(std::chrono::milliseconds t) {
    timeval tv{static_cast<time_t>(t.count() / 1000),
               static_cast<suseconds_t>((t.count() % 1000) * 1000)};
    setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  }
  void Send(const udp::endpoint& to, const Bytes& b) {
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(to.port());
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(sendto(fd_, b.data(), b.size(), 0, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)),
              static_cast<ssize_t>(b.size()));
  }
  std::optional<Bytes> Receive() {
    Bytes b(4096);
    ssize_t n = recv(fd_, b.data(), b.size(), 0);
    if (n < 0) return std::nullopt;
    b.resize(static_cast<size_t>(n));
    return b;
  }

 private:
  int fd_ = -1;
};

struct Reply {
  Rcode rcode;
  std::vector<address> addresses;
  uint32_t ttl;
};

class StubTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auth_.Set("www.example.com", {.a = {"192.0.2.10"}, .aaaa = {"2001:db8::10"}, .ttl = 300});
    auth_.Set("short.example.com", {.a = {"192.0.2.12"}, .ttl = 5});
    auth_.Set("alias.example.com", {.cname = "host.example.org", .ttl = 300});
    auth_.Set("host.example.org", {.a = {"192.0.2.20"}, .ttl = 300});
    auth_.Set("rebind.example.com", {.a = {"10.0.0.5", "192.0.2.30", "127.0.0.1"}});
    auth_.Set("metadata.example.com", {.a = {"169.254.169.254"}});
    allowed_ = {"www.example.com",    "short.example.com",    "alias.example.com",
                "rebind.example.com", "metadata.example.com", "gone.example.com"};
    options_.listen = Loopback(0);
    options_.client_qps = 1e6;  // the rate limit has its own test
    options_.client_burst = 1e6;
    options_.upstream_timeout = std::chrono::milliseconds(1000);
  }

  void StartStub() {
    DnsHooks hooks;
    hooks.allowed = [this](const address& client, const std::string& name) -> std::optional<bool> {
      std::lock_guard lock(mu_);
      hook_names_.push_back(name);
      if (unknown_client_ || client != make_address("127.0.0.1")) return std::nullopt;
      if (allow_all_) return true;
      if (name.ends_with(".cdn.example")) return true;
      return allowed_.contains(name);
    };
    hooks.address_ok = [](const address& a) {
      if (a.is_loopback()) return false;
      if (a.is_v4()) {
        auto b = a.to_v4().to_bytes();
        if (b[0] == 10 || (b[0] == 169 && b[1] == 254) || (b[0] == 192 && b[1] == 168)) {
          return false;
        }
      }
      return true;
    };
    hooks.upstream = {Loopback(auth_.port())};
    hooks.on_event = [this](const DnsEvent& e) {
      std::lock_guard lock(mu_);
      events_.push_back(e);
    };
    auto stub = DnsStub::Start(io_, options_, std::move(hooks));
    ASSERT_TRUE(stub) << stub.error().message();
    stub_ = std::move(*stub);
    thread_ = std::thread([this] { io_.run(); });
  }

  void TearDown() override {
    if (stub_) stub_->Stop();
    work_.reset();
    if (thread_.joinable()) {
      io_.stop();
      thread_.join();
    }
  }

  std::optional<Bytes> AskRaw(const Bytes& query) {
    Client c;
    c.Send(stub_->local_endpoint(), query);
    return c.Receive();
  }

  // Asks the stub and parses its answer (which must echo the question).
  std::optional<Reply> Ask(const std::string& name, uint16_t qtype) {
    uint16_t id = next_id_++;
    auto raw = AskRaw(QueryFor(id, name, qtype));
    if (!raw) return std::nullopt;
    auto labels = SplitName(name).value();
    auto parsed = ParseResponse(*raw, id, labels, qtype);
    EXPECT_TRUE(parsed) << parsed.error().message();
    if (!parsed) return std::nullopt;
    return Reply{parsed->rcode, parsed->addresses, parsed->ttl};
  }

  std::vector<DnsEvent> Events() {
    std::lock_guard lock(mu_);
    return events_;
  }

  asio::io_context io_;
  asio::executor_work_guard<asio::io_context::executor_type> work_{io_.get_executor()};
  std::thread thread_;
  FakeAuthority auth_;
  DnsStubOptions options_;
  std::unique_ptr<DnsStub> stub_;
  std::mutex mu_;
  std::set<std::string> allowed_;
  bool unknown_client_ = false;
  bool allow_all_ = false;
  std::vector<std::string> hook_names_;
  std::vector<DnsEvent> events_;
  uint16_t next_id_ = 100;
};

TEST_F(StubTest, AllowedNameIsAnsweredWithTheAuthoritysAddress) {
  StartStub();
  auto a = Ask("www.example.com", kTypeA);
  ASSERT_TRUE(a);
  EXPECT_EQ(a->rcode, Rcode::kNoError);
  EXPECT_EQ(a->addresses, (std::vector<address>{make_address("192.0.2.10")}));
  EXPECT_EQ(a->ttl, 30u);  // 300 upstream, capped
  auto aaaa = Ask("www.example.com", kTypeAaaa);
  ASSERT_TRUE(aaaa);
  EXPECT_EQ(aaaa->addresses, (std::vector<address>{make_address("2001:db8::10")}));
  EXPECT_EQ(auth_.queries(), 2u);
  auto events = Events();
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events[0].verdict, DnsVerdict::kAllowed);
  EXPECT_EQ(events[0].name, "www.example.com");
  EXPECT_EQ(events[0].qtype, kTypeA);
  EXPECT_EQ(events[0].client, make_address("127.0.0.1"));
  EXPECT_EQ(events[0].answers, (std::vector<address>{make_address("192.0.2.10")}));
}

TEST_F(StubTest, DeniedNameGetsNxDomainAndNothingGoesUpstream) {
  StartStub();
  auth_.Set("evil.example", {.a = {"192.0.2.66"}});  // it exists; the policy says no
  auto r = Ask("evil.example", kTypeA);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->rcode, Rcode::kNxDomain);
  EXPECT_TRUE(r->addresses.empty());
  EXPECT_EQ(auth_.queries(), 0u);
  auto events = Events();
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].verdict, DnsVerdict::kDenied);
  EXPECT_EQ(events[0].rcode, Rcode::kNxDomain);
}

TEST_F(StubTest, ExfiltrationThroughDeniedNamesReachesNoAuthority) {
  StartStub();
  std::mt19937_64 rng(7);
  const uint16_t types[] = {kTypeA, kTypeAaaa, 16 /*TXT*/, 15 /*MX*/, 255 /*ANY*/};
  int nxdomain = 0;
  Client c;
  for (int i = 0; i < 1000; ++i) {
    char hex[33];
    snprintf(hex, sizeof(hex), "%016llx%016llx", static_cast<unsigned long long>(rng()),
             static_cast<unsigned long long>(rng()));
    std::string name = std::string(hex) + ".evil.example";
    uint16_t id = static_cast<uint16_t>(i);
    uint16_t qtype = types[i % 5];
    c.Send(stub_->local_endpoint(), QueryFor(id, name, qtype));
    auto raw = c.Receive();
    ASSERT_TRUE(raw) << i;
    auto parsed = ParseResponse(*raw, id, SplitName(name).value(), qtype);
    ASSERT_TRUE(parsed);
    if (parsed->rcode == Rcode::kNxDomain && parsed->addresses.empty()) ++nxdomain;
  }
  EXPECT_EQ(nxdomain, 1000);
  EXPECT_EQ(auth_.queries(), 0u);
  EXPECT_EQ(stub_->counters().upstream_queries.load(), 0u);
  EXPECT_EQ(stub_->counters().denied.load(), 1000u);
}

TEST_F(StubTest, NamesNoPolicyCanListNeverGoUpstream) {
  allow_all_ = true;  // even a policy that allows everything does not see these
  StartStub();
  std::vector<Bytes> queries;
  {
    Bytes b = Header(1, 0x0100, 1, 0, 0, 0);
    PutLabels(b, {"ex ample", "com"});
    Put16(b, kTypeA);
    Put16(b, kClassIn);
    queries.push_back(b);
  }
  {
    Bytes b = Header(2, 0x0100, 1, 0, 0, 0);
    PutLabels(b, {"a.b", "com"});  // a dot inside a label
    Put16(b, kTypeA);
    Put16(b, kClassIn);
    queries.push_back(b);
  }
  {
    Bytes b = Header(3, 0x0100, 1, 0, 0, 0);
    PutLabels(b, {std::string("x\0y", 3), "com"});
    Put16(b, kTypeA);
    Put16(b, kClassIn);
    queries.push_back(b);
  }
  {
    Bytes b = Header(4, 0x0100, 1, 0, 0, 0);
    b.push_back(0);  // the root
    Put16(b, kTypeA);
    Put16(b, kClassIn);
    queries.push_back(b);
  }
  for (const auto& q : queries) {
    auto raw = AskRaw(q);
    ASSERT_TRUE(raw);
    ASSERT_GE(raw->size(), kHeaderSize);
    EXPECT_EQ((*raw)[3] & 0xF, static_cast<int>(Rcode::kNxDomain));
    EXPECT_EQ((*raw)[0], q[0]);
    EXPECT_EQ((*raw)[1], q[1]);
  }
  EXPECT_EQ(auth_.queries(), 0u);
  std::lock_guard lock(mu_);
  EXPECT_TRUE(hook_names_.empty());
}

TEST_F(StubTest, CaseAndTrailingDotAreNormalisedForThePolicy) {
  StartStub();
  uint16_t id = 4242;
  auto raw = AskRaw(QueryFor(id, "WWW.Example.COM.", kTypeA));
  ASSERT_TRUE(raw);
  auto parsed = ParseResponse(*raw, id, Labels("www.example.com"), kTypeA);
  ASSERT_TRUE(parsed);
  EXPECT_EQ(parsed->addresses, (std::vector<address>{make_address("192.0.2.10")}));
  // The question comes back in the case it was asked.
  Bytes q = QueryFor(id, "WWW.Example.COM", kTypeA);
  EXPECT_TRUE(std::equal(q.begin() + 12, q.end(), raw->begin() + 12));
  std::lock_guard lock(mu_);
  ASSERT_EQ(hook_names_.size(), 1u);
  EXPECT_EQ(hook_names_[0], "www.example.com");
}

TEST_F(StubTest, RebindingAddressesAreFiltered) {
  StartStub();
  auto r = Ask("rebind.example.com", kTypeA);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->rcode, Rcode::kNoError);
  EXPECT_EQ(r->addresses, (std::vector<address>{make_address("192.0.2.30")}));
  auto metadata = Ask("metadata.example.com", kTypeA);
  ASSERT_TRUE(metadata);
  EXPECT_EQ(metadata->rcode, Rcode::kNoError);  // NODATA: the name exists, nothing usable
  EXPECT_TRUE(metadata->addresses.empty());
  // And from the cache too.
  auto again = Ask("metadata.example.com", kTypeA);
  ASSERT_TRUE(again);
  EXPECT_TRUE(again->addresses.empty());
  EXPECT_EQ(auth_.queries_for("metadata.example.com"), 1u);
}

TEST_F(StubTest, CnameIsFlattened) {
  StartStub();
  uint16_t id = 77;
  auto raw = AskRaw(QueryFor(id, "alias.example.com", kTypeA));
  ASSERT_TRUE(raw);
  auto parsed = ParseResponse(*raw, id, Labels("alias.example.com"), kTypeA);
  ASSERT_TRUE(parsed);
  EXPECT_EQ(parsed->addresses, (std::vector<address>{make_address("192.0.2.20")}));
  // One record, an A owned by the question name: host.example.org never reaches the sandbox.
  EXPECT_EQ((*raw)[7], 1);
  std::string text(raw->begin(), raw->end());
  EXPECT_EQ(text.find("host"), std::string::npos);
}

TEST_F(StubTest, CacheHitDoesNotRequery) {
  StartStub();
  auto first = Ask("www.example.com", kTypeA);
  auto second = Ask("www.example.com", kTypeA);
  auto third = Ask("WWW.EXAMPLE.COM", kTypeA);
  ASSERT_TRUE(first && second && third);
  EXPECT_EQ(second->addresses, first->addresses);
  EXPECT_EQ(third->addresses, first->addresses);
  EXPECT_LE(second->ttl, first->ttl);
  EXPECT_GT(second->ttl, 0u);
  EXPECT_EQ(auth_.queries_for("www.example.com"), 1u);
  EXPECT_EQ(stub_->counters().cache_hits.load(), 2u);
  auto events = Events();
  ASSERT_EQ(events.size(), 3u);
  EXPECT_FALSE(events[0].cached);
  EXPECT_TRUE(events[1].cached);
}

TEST_F(StubTest, CacheRespectsTheTtl) {
  options_.max_ttl = 1;
  StartStub();
  ASSERT_TRUE(Ask("short.example.com", kTypeA));
  ASSERT_TRUE(Ask("short.example.com", kTypeA));
  EXPECT_EQ(auth_.queries_for("short.example.com"), 1u);
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));
  auto r = Ask("short.example.com", kTypeA);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->addresses, (std::vector<address>{make_address("192.0.2.12")}));
  EXPECT_EQ(auth_.queries_for("short.example.com"), 2u);
}

TEST_F(StubTest, CacheIsBounded) {
  options_.cache_entries = 4;
  StartStub();
  for (int i = 0; i < 10; ++i) {
    std::string name = "n" + std::to_string(i) + ".cdn.example";
    auth_.Set(name, {.a = {"198.51.100." + std::to_string(i + 1)}});
    ASSERT_TRUE(Ask(name, kTypeA));
  }
  // n0 was evicted long ago: asked again, it goes upstream again.
  ASSERT_TRUE(Ask("n0.cdn.example", kTypeA));
  EXPECT_EQ(auth_.queries_for("n0.cdn.example"), 2u);
  ASSERT_TRUE(Ask("n0.cdn.example", kTypeA));  // and now it is cached
  EXPECT_EQ(auth_.queries_for("n0.cdn.example"), 2u);
}

TEST_F(StubTest, UnknownClientIsRefused) {
  unknown_client_ = true;
  StartStub();
  auto r = Ask("www.example.com", kTypeA);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->rcode, Rcode::kRefused);
  EXPECT_TRUE(r->addresses.empty());
  EXPECT_EQ(auth_.queries(), 0u);
  auto events = Events();
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].verdict, DnsVerdict::kRefused);
}

TEST_F(StubTest, OtherTypesOfAnAllowedNameGetNoData) {
  StartStub();
  auto txt = Ask("www.example.com", 16);
  ASSERT_TRUE(txt);
  EXPECT_EQ(txt->rcode, Rcode::kNoError);
  EXPECT_TRUE(txt->addresses.empty());
  EXPECT_EQ(auth_.queries(), 0u);
}

TEST_F(StubTest, UpstreamFailureIsServFail) {
  options_.upstream_timeout = std::chrono::milliseconds(200);
  StartStub();
  auth_.servfail = true;
  auto r = Ask("www.example.com", kTypeA);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->rcode, Rcode::kServFail);
  auth_.servfail = false;
  auth_.silent = true;
  auto t = Ask("short.example.com", kTypeA);
  ASSERT_TRUE(t);
  EXPECT_EQ(t->rcode, Rcode::kServFail);
  auto events = Events();
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events[1].verdict, DnsVerdict::kError);
  // Failures are not cached: once the authority is back, the name resolves.
  auth_.silent = false;
  auto back = Ask("www.example.com", kTypeA);
  ASSERT_TRUE(back);
  EXPECT_EQ(back->rcode, Rcode::kNoError);
}

TEST_F(StubTest, UpstreamNxDomainIsPassedOnAndCachedBriefly) {
  StartStub();
  auto r = Ask("gone.example.com", kTypeA);  // allowed, but the authority does not know it
  ASSERT_TRUE(r);
  EXPECT_EQ(r->rcode, Rcode::kNxDomain);
  ASSERT_TRUE(Ask("gone.example.com", kTypeA));
  EXPECT_EQ(auth_.queries_for("gone.example.com"), 1u);
}

TEST_F(StubTest, RateLimitKicksIn) {
  options_.client_qps = 20;
  options_.client_burst = 20;
  StartStub();
  Client c;
  c.SetTimeout(std::chrono::milliseconds(300));
  auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < 200; ++i) {
    c.Send(stub_->local_endpoint(), QueryFor(static_cast<uint16_t>(i), "evil.example", kTypeA));
  }
  auto sent = std::chrono::steady_clock::now() - start;
  int answered = 0;
  while (c.Receive()) ++answered;
  double seconds = std::chrono::duration<double>(sent).count();
  EXPECT_GE(answered, 20);
  EXPECT_LE(answered, 20 + static_cast<int>(seconds * 20) + 2);
  EXPECT_GE(stub_->counters().rate_limited.load(), 150u);
  auto events = Events();
  int limited_events = 0;
  for (const auto& e : events) limited_events += e.verdict == DnsVerdict::kRateLimited;
  EXPECT_GE(limited_events, 1);
  EXPECT_LT(limited_events, 10);  // reported per burst of drops, not per drop
  // The bucket refills.
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  auto r = Ask("evil.example", kTypeA);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->rcode, Rcode::kNxDomain);
}

TEST_F(StubTest, MalformedQueriesDoNotHurtTheStub) {
  StartStub();
  Client c;
  c.SetTimeout(std::chrono::milliseconds(100));
  int formerr = 0, silent = 0;
  for (const auto& [what, bytes] : MalformedQueries()) {
    if (bytes.empty()) continue;  // a zero-length datagram is legal UDP but tells us nothing
    c.Send(stub_->local_endpoint(), bytes);
    auto reply = c.Receive();
    if (!reply) {
      ++silent;
      // Only runts and packets that claim to be responses go unanswered.
      EXPECT_TRUE(bytes.size() < kHeaderSize || (bytes[2] & 0x80)) << what;
      continue;
    }
    ++formerr;
    ASSERT_EQ(reply->size(), kHeaderSize) << what;
    EXPECT_EQ((*reply)[0], bytes[0]) << what;
    EXPECT_EQ((*reply)[1], bytes[1]) << what;
    EXPECT_EQ((*reply)[3] & 0xF, static_cast<int>(Rcode::kFormErr)) << what;
  }
  EXPECT_GT(formerr, 20);
  EXPECT_GT(silent, 0);
  EXPECT_EQ(auth_.queries(), 0u);
  // Still serving.
  auto r = Ask("www.example.com", kTypeA);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->addresses, (std::vector<address>{make_address("192.0.2.10")}));
}

TEST_F(StubTest, NonQueryOpcodeIsNotImplemented) {
  StartStub();
  Bytes q = QueryFor(55, "www.example.com", kTypeA);
  q[2] |= 0x28;  // opcode 5 (UPDATE)
  auto raw = AskRaw(q);
  ASSERT_TRUE(raw);
  EXPECT_EQ((*raw)[3] & 0xF, static_cast<int>(Rcode::kNotImp));
  EXPECT_EQ(auth_.queries(), 0u);
}

TEST_F(StubTest, ConcurrentQueries) {
  constexpr int kNames = 200;
  // All 200 may be in flight at once when the authority is slow (sanitizer builds); the default
  // bound would SERVFAIL some of them, which InFlightResolutionsAreBounded covers.
  options_.max_upstream_inflight = kNames;
  StartStub();
  for (int i = 0; i < kNames; ++i) {
    auth_.Set("h" + std::to_string(i) + ".cdn.example",
              {.a = {"198.51.100." + std::to_string(i % 250 + 1)}});
  }
  // 10 sockets, 20 queries each, all sent before any answer is read.
  std::vector<std::unique_ptr<Client>> clients;
  for (int s = 0; s < 10; ++s) clients.push_back(std::make_unique<Client>());
  for (int i = 0; i < kNames; ++i) {
    clients[static_cast<size_t>(i % 10)]->Send(
        stub_->local_endpoint(),
        QueryFor(static_cast<uint16_t>(i), "h" + std::to_string(i) + ".cdn.example", kTypeA));
  }
  int correct = 0;
  for (int s = 0; s < 10; ++s) {
    for (int k = 0; k < kNames / 10; ++k) {
      auto raw = clients[static_cast<size_t>(s)]->Receive();
      ASSERT_TRUE(raw) << "socket " << s << " answer " << k;
      uint16_t id = static_cast<uint16_t>((*raw)[0] << 8 | (*raw)[1]);
      std::string name = "h" + std::to_string(id) + ".cdn.example";
      auto parsed = ParseResponse(*raw, id, Labels(name), kTypeA);
      ASSERT_TRUE(parsed);
      if (parsed->addresses ==
          std::vector<address>{make_address("198.51.100." + std::to_string(id % 250 + 1))}) {
        ++correct;
      } else {
        ADD_FAILURE() << name << ": " << RcodeName(parsed->rcode) << ", "
                      << parsed->addresses.size() << " addresses";
      }
    }
  }
  EXPECT_EQ(correct, kNames);
  EXPECT_EQ(auth_.queries(), static_cast<uint64_t>(kNames));
}

TEST_F(StubTest, ConcurrentQueriesForOneNameAskUpstreamOnce) {
  StartStub();
  Client c;
  for (int i = 0; i < 50; ++i) {
    c.Send(stub_->local_endpoint(), QueryFor(static_cast<uint16_t>(i), "www.example.com", kTypeA));
  }
  int answered = 0;
  for (int i = 0; i < 50; ++i) {
    auto raw = c.Receive();
    ASSERT_TRUE(raw);
    uint16_t id = static_cast<uint16_t>((*raw)[0] << 8 | (*raw)[1]);
    auto parsed = ParseResponse(*raw, id, Labels("www.example.com"), kTypeA);
    ASSERT_TRUE(parsed);
    answered += parsed->addresses.size() == 1;
  }
  EXPECT_EQ(answered, 50);
  EXPECT_EQ(auth_.queries_for("www.example.com"), 1u);
  const auto& n = stub_->counters();
  EXPECT_EQ(n.upstream_queries.load(), 1u);
  EXPECT_EQ(n.upstream_queries.load() + n.cache_hits.load() + n.coalesced.load(), 50u);
}

TEST_F(StubTest, InFlightResolutionsAreBounded) {
  options_.max_upstream_inflight = 2;
  options_.upstream_timeout = std::chrono::milliseconds(500);
  StartStub();
  auth_.silent = true;  // resolutions stay in flight until they time out
  Client c;
  for (int i = 0; i < 5; ++i) {
    c.Send(stub_->local_endpoint(),
           QueryFor(static_cast<uint16_t>(i), "s" + std::to_string(i) + ".cdn.example", kTypeA));
  }
  int servfail = 0;
  for (int i = 0; i < 5; ++i) {
    auto raw = c.Receive();
    ASSERT_TRUE(raw);
    servfail += ((*raw)[3] & 0xF) == static_cast<int>(Rcode::kServFail);
  }
  EXPECT_EQ(servfail, 5);  // 3 at once (over the bound), 2 after their timeout
  EXPECT_EQ(stub_->counters().upstream_queries.load(), 2u);
  EXPECT_EQ(auth_.queries(), 2u);
}

TEST_F(ResolverTest, ResolveAddressesAsksAaaaOnlyWhenThereIsNoA) {
  auto a = ResolveAddresses("www.example.com", Upstream(), std::chrono::seconds(2));
  ASSERT_TRUE(a) << a.error().message();
  EXPECT_EQ(a->addresses.size(), 2u);
  EXPECT_EQ(auth_.queries_for("www.example.com"), 1u);
  auto v6 = ResolveAddresses("v6.example.com", Upstream(), std::chrono::seconds(2));
  ASSERT_TRUE(v6) << v6.error().message();
  EXPECT_EQ(v6->addresses, (std::vector<address>{make_address("2001:db8::10")}));
  EXPECT_EQ(v6->ttl, 60u);
  EXPECT_EQ(auth_.queries_for("v6.example.com"), 2u);
  auto none = ResolveAddresses("nothing.example.com", Upstream(), std::chrono::seconds(2));
  ASSERT_TRUE(none);
  EXPECT_EQ(none->rcode, Rcode::kNxDomain);
  EXPECT_EQ(auth_.queries_for("nothing.example.com"), 1u);  // no AAAA after NXDOMAIN
}

// ---------------------------------------------------------------------------------------------
// The egress proxy's address cache, over a lookup of the test's own and a clock it moves.

class AddressCacheTest : public ::testing::Test {
 protected:
  AddressCache::Lookup Lookup() {
    return [this](const std::string& name) -> Result<ResolveResult> {
      ++lookups_;
      std::lock_guard lock(mu_);
      auto it = answers_.find(name);
      if (it == answers_.end()) return Fail(ErrorCode::kUnavailable, "SERVFAIL");
      return it->second;
    };
  }
  AddressCacheOptions Options() {
    AddressCacheOptions o;
    o.now = [this] { return std::chrono::steady_clock::time_point(std::chrono::seconds(now_s_)); };
    return o;
  }
  void Answer(const std::string& name, uint32_t ttl, Rcode rcode = Rcode::kNoError,
              std::vector<address> addresses = {make_address("192.0.2.1")}) {
    std::lock_guard lock(mu_);
    answers_[name] =
        ResolveResult{rcode, rcode == Rcode::kNoError ? addresses : std::vector<address>{}, ttl};
  }

  std::atomic<int> lookups_{0};
  std::atomic<int64_t> now_s_{1000};
  std::mutex mu_;
  std::map<std::string, ResolveResult> answers_;
};

TEST_F(AddressCacheTest, AnAnswerLivesItsTtlAtMostThirtySeconds) {
  AddressCache cache(Lookup(), Options());
  Answer("long.test", 3600);
  Answer("short.test", 5);
  for (const char* name : {"long.test", "short.test"}) {
    auto first = cache.Resolve(name);
    ASSERT_TRUE(first) << first.error().message();
    EXPECT_EQ(*first, (std::vector<address>{make_address("192.0.2.1")}));
  }
  EXPECT_EQ(lookups_.load(), 2);
  now_s_ += 4;
  EXPECT_TRUE(cache.Resolve("long.test"));
  EXPECT_TRUE(cache.Resolve("short.test"));
  EXPECT_EQ(lookups_.load(), 2);  // both from the cache
  now_s_ += 2;                    // 6 s: short.test's 5 s are over
  EXPECT_TRUE(cache.Resolve("short.test"));
  EXPECT_EQ(lookups_.load(), 3);
  now_s_ += 23;  // 29 s
  EXPECT_TRUE(cache.Resolve("long.test"));
  EXPECT_EQ(lookups_.load(), 3);
  now_s_ += 2;  // 31 s: past the 30 s cap, whatever the TTL said
  EXPECT_TRUE(cache.Resolve("long.test"));
  EXPECT_EQ(lookups_.load(), 4);
  EXPECT_EQ(cache.stats().hits, 3u);
}

TEST_F(AddressCacheTest, TtlZeroAndFailuresAreNotKept) {
  AddressCache cache(Lookup(), Options());
  Answer("zero.test", 0);
  EXPECT_TRUE(cache.Resolve("zero.test"));
  EXPECT_TRUE(cache.Resolve("zero.test"));
  EXPECT_EQ(lookups_.load(), 2);
  auto failed = cache.Resolve("servfail.test");  // no answer: the lookup fails
  ASSERT_FALSE(failed);
  EXPECT_EQ(failed.error().code(), ErrorCode::kUnavailable);
  EXPECT_FALSE(cache.Resolve("servfail.test"));
  EXPECT_EQ(lookups_.load(), 4);
  EXPECT_EQ(cache.size(), 0u);
  Answer("one.test", 1);  // the control: a TTL of 1 s is kept
  EXPECT_TRUE(cache.Resolve("one.test"));
  EXPECT_TRUE(cache.Resolve("one.test"));
  EXPECT_EQ(lookups_.load(), 5);
}

TEST_F(AddressCacheTest, NegativeAnswersLiveFiveSeconds) {
  AddressCache cache(Lookup(), Options());
  Answer("gone.test", 300, Rcode::kNxDomain);
  Answer("nodata.test", 300, Rcode::kNoError, {});
  for (const char* name : {"gone.test", "nodata.test"}) {
    auto r = cache.Resolve(name);
    ASSERT_FALSE(r);
    EXPECT_EQ(r.error().code(), ErrorCode::kNotFound) << name;
  }
  now_s_ += 4;
  EXPECT_FALSE(cache.Resolve("gone.test"));
  EXPECT_FALSE(cache.Resolve("nodata.test"));
  EXPECT_EQ(lookups_.load(), 2);
  now_s_ += 2;
  Answer("gone.test", 300);  // it exists now
  EXPECT_TRUE(cache.Resolve("gone.test"));
  EXPECT_EQ(lookups_.load(), 3);
}

TEST_F(AddressCacheTest, BoundedExpiredFirstThenTheNextToExpire) {
  AddressCacheOptions options = Options();
  options.max_entries = 3;
  AddressCache cache(Lookup(), options);
  Answer("a.test", 10);
  Answer("b.test", 20);
  Answer("c.test", 25);
  Answer("d.test", 25);
  for (const char* name : {"a.test", "b.test", "c.test", "d.test"})
    EXPECT_TRUE(cache.Resolve(name));
  EXPECT_EQ(cache.size(), 3u);
  EXPECT_EQ(lookups_.load(), 4);
  EXPECT_TRUE(cache.Resolve("b.test"));  // kept
  EXPECT_EQ(lookups_.load(), 4);
  EXPECT_TRUE(cache.Resolve("a.test"));  // the one closest to expiry went
  EXPECT_EQ(lookups_.load(), 5);
  // a.test is back and b.test went for it; once expired, entries go before live ones.
  now_s_ += 26;
  Answer("e.test", 25);
  EXPECT_TRUE(cache.Resolve("e.test"));
  EXPECT_EQ(cache.size(), 1u);
}

TEST_F(AddressCacheTest, ConcurrentCallersForOneNameShareOneLookup) {
  std::mutex gate_mu;
  std::condition_variable gate_cv;
  bool open = false;
  AddressCache cache(
      [&](const std::string& name) -> Result<ResolveResult> {
        ++lookups_;
        std::unique_lock lock(gate_mu);
        gate_cv.wait(lock, [&] { return open; });
        return ResolveResult{
            Rcode::kNoError, {make_address("192.0.2.7")}, name == "x.test" ? 0u : 60u};
      },
      Options());
  std::vector<std::thread> threads;
  std::atomic<int> answered{0};
  for (int i = 0; i < 8; ++i) {
    threads.emplace_back([&] {
      auto r = cache.Resolve("x.test");
      if (r && *r == std::vector<address>{make_address("192.0.2.7")}) ++answered;
    });
  }
  threads.emplace_back([&] { (void)cache.Resolve("y.test"); });  // another name: its own lookup
  for (int i = 0; i < 500 && cache.stats().coalesced < 7; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(cache.stats().coalesced, 7u);
  {
    std::lock_guard lock(gate_mu);
    open = true;
  }
  gate_cv.notify_all();
  for (auto& t : threads) t.join();
  EXPECT_EQ(answered.load(), 8);  // a TTL of 0 is not kept, but it is shared by those waiting
  EXPECT_EQ(lookups_.load(), 2);
}

TEST_F(ResolverTest, AddressCacheOverTheResolverAsksTheAuthorityOnce) {
  auth_.Set("zero.example.com", {.a = {"192.0.2.30"}, .ttl = 0});
  AddressCache cache([this](const std::string& name) {
    return ResolveAddresses(name, Upstream(), std::chrono::seconds(2));
  });
  for (int i = 0; i < 3; ++i) {
    EXPECT_TRUE(cache.Resolve("www.example.com"));
    EXPECT_TRUE(cache.Resolve("zero.example.com"));
  }
  EXPECT_EQ(auth_.queries_for("www.example.com"), 1u);
  EXPECT_EQ(auth_.queries_for("zero.example.com"), 3u);  // TTL 0: asked each time
}

TEST(DnsStubStart, BindErrorIsReturned) {
  asio::io_context io;
  DnsStubOptions options;
  options.listen = udp::endpoint(make_address("192.0.2.1"), 53);  // not an address of ours
  auto stub = DnsStub::Start(io, options, DnsHooks{});
  ASSERT_FALSE(stub);
  EXPECT_EQ(stub.error().code(), ErrorCode::kUnavailable);
}

}  // namespace
}  // namespace airlock::net::dns
