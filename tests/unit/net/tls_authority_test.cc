// The egress CA (src/net/tls_authority.h): made once and loaded after, refused when its files are
// not as it left them; the leaves it issues, checked field by field and in real TLS handshakes
// (in memory, through a BIO pair: nothing touches the network), each with its negative control;
// the server-context cache; the upstream client context.

#include "net/tls_authority.h"

#include <gtest/gtest.h>
#include <openssl/bn.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/x509v3.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace airlock::net {
namespace {

namespace asio = boost::asio;
using SystemClock = std::chrono::system_clock;
using namespace std::chrono_literals;

template <typename T, void (*Free)(T*)>
struct FreeWith {
  void operator()(T* p) const { Free(p); }
};
using Cert = std::unique_ptr<X509, FreeWith<X509, X509_free>>;
using Key = std::unique_ptr<EVP_PKEY, FreeWith<EVP_PKEY, EVP_PKEY_free>>;
using Ssl = std::unique_ptr<SSL, FreeWith<SSL, SSL_free>>;
using SslCtx = std::unique_ptr<SSL_CTX, FreeWith<SSL_CTX, SSL_CTX_free>>;

class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/airlock-tls-test-XXXXXX";
    AIRLOCK_CHECK(::mkdtemp(tmpl) != nullptr);
    path_ = tmpl;
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  const std::string& path() const { return path_; }
  std::string operator/(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}
void WriteFile(const std::string& path, const std::string& data) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << data;
}
mode_t Mode(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 ? st.st_mode & 07777 : 0;
}

Cert ParseCert(const std::string& pem) {
  BIO* bio = BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size()));
  Cert cert(PEM_read_bio_X509(bio, nullptr, nullptr, nullptr));
  BIO_free(bio);
  return cert;
}
Key ParseKey(const std::string& pem) {
  BIO* bio = BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size()));
  Key key(PEM_read_bio_PrivateKey(bio, nullptr, nullptr, nullptr));
  BIO_free(bio);
  return key;
}

SystemClock::time_point TimeOf(const ASN1_TIME* t) {
  struct tm tm {};
  ASN1_TIME_to_tm(t, &tm);
  return SystemClock::from_time_t(::timegm(&tm));
}

bool Critical(X509* cert, int nid) {
  return X509_EXTENSION_get_critical(X509_get_ext(cert, X509_get_ext_by_NID(cert, nid, -1))) == 1;
}

std::string CommonName(X509* cert) {
  char cn[256] = "";
  X509_NAME_get_text_by_NID(X509_get_subject_name(cert), NID_commonName, cn, sizeof cn);
  return cn;
}

// The DNS names of a certificate's SAN, and how many entries of any kind it has.
std::vector<std::string> DnsNames(X509* cert, int* entries) {
  std::vector<std::string> out;
  auto* names =
      static_cast<GENERAL_NAMES*>(X509_get_ext_d2i(cert, NID_subject_alt_name, nullptr, nullptr));
  *entries = names ? sk_GENERAL_NAME_num(names) : 0;
  for (int i = 0; i < *entries; ++i) {
    const GENERAL_NAME* n = sk_GENERAL_NAME_value(names, i);
    if (n->type == GEN_DNS) {
      out.emplace_back(reinterpret_cast<const char*>(ASN1_STRING_get0_data(n->d.dNSName)),
                       ASN1_STRING_length(n->d.dNSName));
    }
  }
  GENERAL_NAMES_free(names);
  return out;
}

// A clock the test moves.
struct TestClock {
  std::atomic<int64_t> offset_s{0};
  CertificateAuthority::WallClock Fn() {
    return [this] { return SystemClock::now() + std::chrono::seconds(offset_s.load()); };
  }
};

std::unique_ptr<CertificateAuthority> MustLoad(const std::string& dir,
                                               CertificateAuthority::WallClock now = nullptr) {
  auto ca = now ? CertificateAuthority::LoadOrCreate(dir, std::move(now))
                : CertificateAuthority::LoadOrCreate(dir);
  AIRLOCK_CHECK(ca.has_value());
  return std::move(*ca);
}

// --- Handshakes in memory ---

// A client context that trusts `ca_pem` alone (no system store), verifying the peer.
SslCtx ClientTrusting(const std::string& ca_pem) {
  SslCtx ctx(SSL_CTX_new(TLS_client_method()));
  SSL_CTX_set_verify(ctx.get(), SSL_VERIFY_PEER, nullptr);
  if (!ca_pem.empty()) {
    Cert ca = ParseCert(ca_pem);
    X509_STORE_add_cert(SSL_CTX_get_cert_store(ctx.get()), ca.get());
  }
  return ctx;
}

struct Handshake {
  bool ok = false;
  long verify_result = -1;
  std::string alpn;
  int version = 0;
  int chain = 0;            // certificates the server sent
  std::string peer_cn;      // the leaf's CN as the client saw it
  std::string server_read;  // what the server read after the handshake
};

// Runs a client and a server handshake against each other over a BIO pair, then sends "ping"
// from the client. `prepare` sets the client's SSL up first (SNI, name checks, ALPN).
Handshake Shake(SSL_CTX* client_ctx, SSL_CTX* server_ctx,
                const std::function<void(SSL*)>& prepare) {
  Ssl client(SSL_new(client_ctx));
  Ssl server(SSL_new(server_ctx));
  BIO* client_bio = nullptr;
  BIO* server_bio = nullptr;
  AIRLOCK_CHECK(BIO_new_bio_pair(&client_bio, 0, &server_bio, 0) == 1);
  SSL_set_bio(client.get(), client_bio, client_bio);
  SSL_set_bio(server.get(), server_bio, server_bio);
  SSL_set_connect_state(client.get());
  SSL_set_accept_state(server.get());
  prepare(client.get());
  Handshake h;
  bool client_done = false, server_done = false;
  for (int round = 0; round < 50 && !(client_done && server_done); ++round) {
    for (auto [ssl, done] : {std::pair{client.get(), &client_done}, {server.get(), &server_done}}) {
      if (*done) continue;
      int r = SSL_do_handshake(ssl);
      if (r == 1) {
        *done = true;
        continue;
      }
      int e = SSL_get_error(ssl, r);
      if (e != SSL_ERROR_WANT_READ && e != SSL_ERROR_WANT_WRITE) {
        h.verify_result = SSL_get_verify_result(client.get());
        ERR_clear_error();
        return h;
      }
    }
  }
  h.ok = client_done && server_done;
  h.verify_result = SSL_get_verify_result(client.get());
  const unsigned char* alpn = nullptr;
  unsigned int alpn_size = 0;
  SSL_get0_alpn_selected(client.get(), &alpn, &alpn_size);
  h.alpn.assign(reinterpret_cast<const char*>(alpn), alpn_size);
  h.version = SSL_version(client.get());
  STACK_OF(X509)* chain = SSL_get_peer_cert_chain(client.get());
  h.chain = chain ? sk_X509_num(chain) : 0;
  if (X509* peer = SSL_get0_peer_certificate(client.get())) h.peer_cn = CommonName(peer);
  if (h.ok && SSL_write(client.get(), "ping", 4) == 4) {
    char buf[16];
    int n = SSL_read(server.get(), buf, sizeof buf);
    if (n > 0) h.server_read.assign(buf, static_cast<size_t>(n));
  }
  ERR_clear_error();
  return h;
}

// Sets SNI and the name check as the interceptor's upstream side does.
std::function<void(SSL*)> Verifying(const std::string& host) {
  return [host](SSL* ssl) { AIRLOCK_CHECK(PrepareUpstream(ssl, host).has_value()); };
}

// --- The CA's files ---

TEST(CertificateAuthorityTest, MadeOnceThenLoadedTheSame) {
  TempDir tmp;
  const std::string dir = tmp / "ca";
  // The modes are set whatever the umask would have made them.
  const mode_t old_umask = ::umask(077);
  auto made = CertificateAuthority::LoadOrCreate(dir);
  ::umask(old_umask);
  ASSERT_TRUE(made) << made.error().message();
  EXPECT_EQ(Mode(dir), 0700u);
  EXPECT_EQ(Mode(dir + "/ca.key"), 0600u);
  EXPECT_EQ(Mode(dir + "/ca.crt"), 0644u);
  EXPECT_EQ(ReadFile(dir + "/ca.crt"), (*made)->certificate_pem());
  // Nothing but the pair: no temporary file left behind.
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir), {}), 2);

  auto loaded = CertificateAuthority::LoadOrCreate(dir);
  ASSERT_TRUE(loaded) << loaded.error().message();
  EXPECT_EQ((*loaded)->certificate_pem(), (*made)->certificate_pem());
  // The loaded key is the one that signs: its leaves verify against the first CA's certificate.
  auto leaf = (*loaded)->ServerContext("api.example.test");
  ASSERT_TRUE(leaf) << leaf.error().message();
  SslCtx client = ClientTrusting((*made)->certificate_pem());
  EXPECT_TRUE(Shake(client.get(), (*leaf)->native_handle(), Verifying("api.example.test")).ok);

  // Another directory makes another CA.
  auto other = CertificateAuthority::LoadOrCreate(tmp / "other");
  ASSERT_TRUE(other) << other.error().message();
  EXPECT_NE((*other)->certificate_pem(), (*made)->certificate_pem());
}

TEST(CertificateAuthorityTest, TheCaCertificate) {
  TempDir tmp;
  auto ca = MustLoad(tmp / "ca");
  Cert cert = ParseCert(ca->certificate_pem());
  ASSERT_TRUE(cert);
  Key key = ParseKey(ReadFile(tmp / "ca/ca.key"));
  ASSERT_TRUE(key);
  EXPECT_TRUE(EVP_PKEY_is_a(key.get(), "EC"));
  char group[64] = "";
  EVP_PKEY_get_group_name(key.get(), group, sizeof group, nullptr);
  EXPECT_STREQ(group, "prime256v1");
  EXPECT_EQ(X509_check_private_key(cert.get(), key.get()), 1);
  // Self-signed, SHA-256.
  EXPECT_EQ(X509_NAME_cmp(X509_get_subject_name(cert.get()), X509_get_issuer_name(cert.get())), 0);
  EXPECT_EQ(X509_verify(cert.get(), key.get()), 1);
  EXPECT_EQ(X509_get_signature_nid(cert.get()), NID_ecdsa_with_SHA256);
  const std::string cn = CommonName(cert.get());
  EXPECT_TRUE(cn.starts_with("Airlock egress CA ")) << cn;
  EXPECT_GT(cn.size(), std::string("Airlock egress CA ").size()) << cn;

  auto* bc = static_cast<BASIC_CONSTRAINTS*>(
      X509_get_ext_d2i(cert.get(), NID_basic_constraints, nullptr, nullptr));
  ASSERT_NE(bc, nullptr);
  EXPECT_TRUE(bc->ca);
  ASSERT_NE(bc->pathlen, nullptr);
  EXPECT_EQ(ASN1_INTEGER_get(bc->pathlen), 0);
  BASIC_CONSTRAINTS_free(bc);
  EXPECT_TRUE(Critical(cert.get(), NID_basic_constraints));
  EXPECT_EQ(X509_get_key_usage(cert.get()), static_cast<uint32_t>(KU_KEY_CERT_SIGN | KU_CRL_SIGN));

  const auto now = SystemClock::now();
  const auto not_before = TimeOf(X509_get0_notBefore(cert.get()));
  const auto not_after = TimeOf(X509_get0_notAfter(cert.get()));
  EXPECT_LE(not_before, now);
  EXPECT_GT(not_after, now + 24h * 3650);
  EXPECT_LT(not_after, now + 24h * 3660);
}

TEST(CertificateAuthorityTest, AKeyOthersCanReadIsRefused) {
  TempDir tmp;
  const std::string dir = tmp / "ca";
  const std::string pem = MustLoad(dir)->certificate_pem();
  for (mode_t mode : {0640, 0604, 0644, 0660}) {
    ASSERT_EQ(::chmod((dir + "/ca.key").c_str(), mode), 0);
    auto ca = CertificateAuthority::LoadOrCreate(dir);
    ASSERT_FALSE(ca) << std::oct << mode;
    EXPECT_EQ(ca.error().code(), ErrorCode::kFailedPrecondition);
    EXPECT_NE(ca.error().message().find("chmod 600 " + dir + "/ca.key"), std::string::npos)
        << ca.error().message();
  }
  // Stricter than 0600 is fine (the positive control); the files were never touched.
  ASSERT_EQ(::chmod((dir + "/ca.key").c_str(), 0400), 0);
  auto ca = CertificateAuthority::LoadOrCreate(dir);
  ASSERT_TRUE(ca) << ca.error().message();
  EXPECT_EQ((*ca)->certificate_pem(), pem);
}

TEST(CertificateAuthorityTest, AKeyOfAnotherUserIsRefused) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root (chown)";
  TempDir tmp;
  const std::string dir = tmp / "ca";
  MustLoad(dir);
  ASSERT_EQ(::chown((dir + "/ca.key").c_str(), 65534, 65534), 0);
  auto ca = CertificateAuthority::LoadOrCreate(dir);
  ASSERT_FALSE(ca);
  EXPECT_NE(ca.error().message().find("owned by uid 65534"), std::string::npos)
      << ca.error().message();
}

TEST(CertificateAuthorityTest, AMismatchedPairIsRefused) {
  TempDir tmp;
  const std::string a = tmp / "a";
  MustLoad(a);
  MustLoad(tmp / "b");
  const std::string a_cert = ReadFile(a + "/ca.crt");
  WriteFile(a + "/ca.crt", ReadFile(tmp / "b/ca.crt"));
  auto ca = CertificateAuthority::LoadOrCreate(a);
  ASSERT_FALSE(ca);
  EXPECT_EQ(ca.error().code(), ErrorCode::kFailedPrecondition);
  EXPECT_NE(ca.error().message().find("is not the certificate of the key"), std::string::npos)
      << ca.error().message();
  // Refused, never replaced.
  EXPECT_EQ(ReadFile(a + "/ca.crt"), ReadFile(tmp / "b/ca.crt"));
  WriteFile(a + "/ca.crt", a_cert);
  EXPECT_TRUE(CertificateAuthority::LoadOrCreate(a));
}

TEST(CertificateAuthorityTest, HalfAPairIsRefusedAndLeftAlone) {
  TempDir tmp;
  for (const std::string kept : {"ca.key", "ca.crt"}) {
    const std::string dir = tmp / kept;
    MustLoad(dir);
    const std::string content = ReadFile(dir + "/" + kept);
    const std::string gone = kept == "ca.key" ? "ca.crt" : "ca.key";
    ASSERT_EQ(::unlink((dir + "/" + gone).c_str()), 0);
    for (int attempt = 0; attempt < 2; ++attempt) {
      auto ca = CertificateAuthority::LoadOrCreate(dir);
      ASSERT_FALSE(ca) << kept;
      EXPECT_EQ(ca.error().code(), ErrorCode::kFailedPrecondition);
      EXPECT_NE(ca.error().message().find(dir + "/" + gone + " is not"), std::string::npos)
          << ca.error().message();
      EXPECT_EQ(ReadFile(dir + "/" + kept), content);
      EXPECT_FALSE(std::filesystem::exists(dir + "/" + gone));
    }
  }
}

TEST(CertificateAuthorityTest, AnExpiredOrNotYetValidCaIsRefused) {
  TempDir tmp;
  const std::string dir = tmp / "ca";
  MustLoad(dir);
  TestClock clock;
  clock.offset_s = std::chrono::duration_cast<std::chrono::seconds>(kCaLifetime + 24h).count();
  auto late = CertificateAuthority::LoadOrCreate(dir, clock.Fn());
  ASSERT_FALSE(late);
  EXPECT_NE(late.error().message().find("expired on"), std::string::npos) << late.error().message();
  clock.offset_s = -std::chrono::duration_cast<std::chrono::seconds>(24h).count();
  auto early = CertificateAuthority::LoadOrCreate(dir, clock.Fn());
  ASSERT_FALSE(early);
  EXPECT_NE(early.error().message().find("is not valid before"), std::string::npos)
      << early.error().message();
  // A year on, it loads (the control).
  clock.offset_s = std::chrono::duration_cast<std::chrono::seconds>(24h * 365).count();
  EXPECT_TRUE(CertificateAuthority::LoadOrCreate(dir, clock.Fn()));
}

TEST(CertificateAuthorityTest, FilesThatAreNoCaAreRefused) {
  TempDir tmp;
  auto source = MustLoad(tmp / "source");
  auto leaf = source->Issue("leaf.example.test");
  ASSERT_TRUE(leaf);
  struct Case {
    std::string key, cert, error;
  };
  const std::string key_pem = ReadFile(tmp / "source/ca.key");
  // An encrypted copy of the key: refused, and no passphrase is asked for on a terminal.
  Key key = ParseKey(key_pem);
  BIO* bio = BIO_new(BIO_s_mem());
  ASSERT_EQ(PEM_write_bio_PrivateKey(bio, key.get(), EVP_aes_256_cbc(), nullptr, 0, nullptr,
                                     const_cast<char*>("secret")),
            1);
  char* data = nullptr;
  const long size = BIO_get_mem_data(bio, &data);
  const std::string encrypted(data, static_cast<size_t>(size));
  BIO_free(bio);
  for (const Case& c : std::vector<Case>{
           {leaf->key_pem, leaf->certificate_pem, "is not a CA certificate"},
           {"not a key\n", source->certificate_pem(), "holds no PEM private key"},
           {encrypted, source->certificate_pem(), "is encrypted"},
           {key_pem, "not a certificate\n", "holds no PEM certificate"},
           {key_pem, "", "holds no PEM certificate"},
       }) {
    TempDir dir;
    WriteFile(dir / "ca.key", c.key);
    ASSERT_EQ(::chmod((dir / "ca.key").c_str(), 0600), 0);
    WriteFile(dir / "ca.crt", c.cert);
    auto ca = CertificateAuthority::LoadOrCreate(dir.path());
    ASSERT_FALSE(ca) << c.error;
    EXPECT_EQ(ca.error().code(), ErrorCode::kFailedPrecondition);
    EXPECT_NE(ca.error().message().find(c.error), std::string::npos) << ca.error().message();
    EXPECT_EQ(ReadFile(dir / "ca.key"), c.key);
  }
  // A directory that is a file.
  WriteFile(tmp / "file", "x");
  EXPECT_FALSE(CertificateAuthority::LoadOrCreate(tmp / "file"));
  // ca.key that is a directory.
  TempDir odd;
  std::filesystem::create_directory(odd / "ca.key");
  WriteFile(odd / "ca.crt", source->certificate_pem());
  auto ca = CertificateAuthority::LoadOrCreate(odd.path());
  ASSERT_FALSE(ca);
  EXPECT_NE(ca.error().message().find("is not a regular file"), std::string::npos)
      << ca.error().message();
}

// --- Leaves ---

TEST(CertificateAuthorityTest, BadHostNamesAreRefused) {
  TempDir tmp;
  auto ca = MustLoad(tmp / "ca");
  const std::string label63(63, 'a');
  const std::string name253 = label63 + "." + label63 + "." + label63 + "." + std::string(61, 'b');
  ASSERT_EQ(name253.size(), 253u);
  for (const std::string& bad : {std::string(""),
                                 std::string("."),
                                 std::string("1.2.3.4"),
                                 std::string("10.0.0.1."),
                                 std::string("0x7f000001"),
                                 std::string("2852039166"),
                                 std::string("::1"),
                                 std::string("[::1]"),
                                 std::string("*.example.test"),
                                 std::string("*"),
                                 std::string("a.*.test"),
                                 std::string("a..test"),
                                 std::string(".a.test"),
                                 std::string("-a.test"),
                                 std::string("a-.test"),
                                 std::string("exa mple.test"),
                                 std::string("a.test/x"),
                                 std::string("a.test:443"),
                                 std::string("bücher.test"),
                                 std::string("a\0b.test", 8),
                                 label63 + "a.test",
                                 name253 + "c",
                                 name253 + ".c"}) {
    auto leaf = ca->Issue(bad);
    ASSERT_FALSE(leaf) << bad;
    EXPECT_EQ(leaf.error().code(), ErrorCode::kInvalidArgument) << bad;
    auto context = ca->ServerContext(bad);
    ASSERT_FALSE(context) << bad;
    EXPECT_EQ(context.error().code(), ErrorCode::kInvalidArgument) << bad;
  }
  EXPECT_EQ(ca->cached_contexts(), 0u);
  // The longest names and labels are fine (the controls).
  EXPECT_TRUE(ca->Issue(name253));
  EXPECT_TRUE(ca->Issue(label63 + ".test"));
  EXPECT_TRUE(ca->Issue("localhost"));
  EXPECT_TRUE(ca->Issue("xn--bcher-kva.test"));
}

TEST(CertificateAuthorityTest, TheLeafsFields) {
  TempDir tmp;
  auto ca = MustLoad(tmp / "ca");
  auto issued = ca->Issue("API.Example.Test.");
  ASSERT_TRUE(issued) << issued.error().message();
  Cert cert = ParseCert(issued->certificate_pem);
  Key key = ParseKey(issued->key_pem);
  ASSERT_TRUE(cert);
  ASSERT_TRUE(key);
  EXPECT_EQ(X509_check_private_key(cert.get(), key.get()), 1);
  char group[64] = "";
  EVP_PKEY_get_group_name(key.get(), group, sizeof group, nullptr);
  EXPECT_STREQ(group, "prime256v1");

  // The name, lowercased, as CN and as the SAN's one entry.
  EXPECT_EQ(CommonName(cert.get()), "api.example.test");
  int entries = 0;
  EXPECT_EQ(DnsNames(cert.get(), &entries), std::vector<std::string>{"api.example.test"});
  EXPECT_EQ(entries, 1);
  EXPECT_FALSE(Critical(cert.get(), NID_subject_alt_name));
  // A server certificate, not a CA.
  EXPECT_EQ(X509_check_ca(cert.get()), 0);
  EXPECT_TRUE(Critical(cert.get(), NID_basic_constraints));
  EXPECT_EQ(X509_get_extended_key_usage(cert.get()), static_cast<uint32_t>(XKU_SSL_SERVER));
  EXPECT_EQ(X509_get_key_usage(cert.get()), static_cast<uint32_t>(KU_DIGITAL_SIGNATURE));
  EXPECT_TRUE(Critical(cert.get(), NID_key_usage));
  EXPECT_EQ(X509_get_signature_nid(cert.get()), NID_ecdsa_with_SHA256);
  // Issued by the CA, its key named.
  Cert ca_cert = ParseCert(ca->certificate_pem());
  EXPECT_EQ(X509_check_issued(ca_cert.get(), cert.get()), X509_V_OK);
  EXPECT_EQ(ASN1_OCTET_STRING_cmp(X509_get0_authority_key_id(cert.get()),
                                  X509_get0_subject_key_id(ca_cert.get())),
            0);

  const auto now = SystemClock::now();
  const auto not_before = TimeOf(X509_get0_notBefore(cert.get()));
  const auto not_after = TimeOf(X509_get0_notAfter(cert.get()));
  EXPECT_NEAR(std::chrono::duration<double>(now - 1h - not_before).count(), 0, 60);
  EXPECT_NEAR(std::chrono::duration<double>(now + 24h * 30 - not_after).count(), 0, 60);

  // Serials: 128 random bits, positive, never the same twice.
  std::set<std::string> serials;
  for (int i = 0; i < 20; ++i) {
    auto again = ca->Issue("api.example.test");
    ASSERT_TRUE(again);
    Cert c = ParseCert(again->certificate_pem);
    BIGNUM* serial = ASN1_INTEGER_to_BN(X509_get0_serialNumber(c.get()), nullptr);
    EXPECT_LE(BN_num_bits(serial), 128);
    EXPECT_GT(BN_num_bits(serial), 64);  // 2^-64 odds of a false failure
    EXPECT_FALSE(BN_is_negative(serial));
    char* hex = BN_bn2hex(serial);
    serials.insert(hex);
    OPENSSL_free(hex);
    BN_free(serial);
    // A fresh key each time.
    EXPECT_NE(again->key_pem, issued->key_pem);
  }
  EXPECT_EQ(serials.size(), 20u);
}

TEST(CertificateAuthorityTest, ANameTooLongForACommonNameIsInTheSanOnly) {
  TempDir tmp;
  auto ca = MustLoad(tmp / "ca");
  const std::string name = std::string(60, 'a') + ".example.test";  // 73 bytes
  auto issued = ca->Issue(name);
  ASSERT_TRUE(issued) << issued.error().message();
  Cert cert = ParseCert(issued->certificate_pem);
  EXPECT_EQ(CommonName(cert.get()), "");
  int entries = 0;
  EXPECT_EQ(DnsNames(cert.get(), &entries), std::vector<std::string>{name});
  EXPECT_TRUE(Critical(cert.get(), NID_subject_alt_name));
  auto context = ca->ServerContext(name);
  ASSERT_TRUE(context);
  SslCtx client = ClientTrusting(ca->certificate_pem());
  EXPECT_TRUE(Shake(client.get(), (*context)->native_handle(), Verifying(name)).ok);
}

TEST(CertificateAuthorityTest, ALeafEndsWithTheCa) {
  TempDir tmp;
  const std::string dir = tmp / "ca";
  MustLoad(dir);
  TestClock clock;
  auto ca = MustLoad(dir, clock.Fn());
  const auto ca_end = TimeOf(X509_get0_notAfter(ParseCert(ca->certificate_pem()).get()));
  // Ten days before the CA's end, a leaf would outlive it: it ends with it instead.
  clock.offset_s =
      std::chrono::duration_cast<std::chrono::seconds>(ca_end - 24h * 10 - SystemClock::now())
          .count();
  auto issued = ca->Issue("api.example.test");
  ASSERT_TRUE(issued) << issued.error().message();
  EXPECT_EQ(TimeOf(X509_get0_notAfter(ParseCert(issued->certificate_pem).get())), ca_end);
  // Its context is kept to the end: a new one would last no longer.
  auto first = ca->ServerContext("api.example.test");
  ASSERT_TRUE(first);
  clock.offset_s += std::chrono::duration_cast<std::chrono::seconds>(24h * 5).count();
  auto later = ca->ServerContext("api.example.test");
  ASSERT_TRUE(later);
  EXPECT_EQ(first->get(), later->get());
  // Past the CA's end nothing is issued.
  clock.offset_s += std::chrono::duration_cast<std::chrono::seconds>(24h * 6).count();
  auto late = ca->Issue("api.example.test");
  ASSERT_FALSE(late);
  EXPECT_EQ(late.error().code(), ErrorCode::kFailedPrecondition);
  EXPECT_NE(late.error().message().find("expired"), std::string::npos) << late.error().message();
}

// --- Handshakes ---

TEST(CertificateAuthorityTest, AClientTrustingTheCaCompletesAHandshake) {
  TempDir tmp;
  auto ca = MustLoad(tmp / "ca");
  auto server = ca->ServerContext("api.example.test");
  ASSERT_TRUE(server) << server.error().message();
  SslCtx client = ClientTrusting(ca->certificate_pem());

  // The name asked for: verified, with the leaf and the CA sent, and data through.
  Handshake ok = Shake(client.get(), (*server)->native_handle(), Verifying("api.example.test"));
  EXPECT_TRUE(ok.ok);
  EXPECT_EQ(ok.verify_result, X509_V_OK);
  EXPECT_EQ(ok.version, TLS1_3_VERSION);
  EXPECT_EQ(ok.chain, 2);
  EXPECT_EQ(ok.peer_cn, "api.example.test");
  EXPECT_EQ(ok.server_read, "ping");
  // In upper case and with a trailing dot it is the same name.
  EXPECT_TRUE(Shake(client.get(), (*server)->native_handle(), Verifying("API.example.test.")).ok);

  // Another name: the client refuses the certificate.
  Handshake other =
      Shake(client.get(), (*server)->native_handle(), Verifying("other.example.test"));
  EXPECT_FALSE(other.ok);
  EXPECT_EQ(other.verify_result, X509_V_ERR_HOSTNAME_MISMATCH);
  // A name under it, or the parent: no wildcard was issued.
  EXPECT_FALSE(Shake(client.get(), (*server)->native_handle(), Verifying("x.api.example.test")).ok);
  EXPECT_FALSE(Shake(client.get(), (*server)->native_handle(), Verifying("example.test")).ok);
  // An address is checked as an address (and sent as no SNI): the leaf names none.
  Handshake address = Shake(client.get(), (*server)->native_handle(), Verifying("127.0.0.1"));
  EXPECT_FALSE(address.ok);
  EXPECT_EQ(address.verify_result, X509_V_ERR_IP_ADDRESS_MISMATCH);

  // A client that trusts only the system store: the CA means nothing to it.
  auto system = UpstreamContext("");
  ASSERT_TRUE(system) << system.error().message();
  Handshake untrusted =
      Shake((*system)->native_handle(), (*server)->native_handle(), Verifying("api.example.test"));
  EXPECT_FALSE(untrusted.ok);
  // The server sends the CA after the leaf: a self-signed certificate this client does not trust.
  EXPECT_EQ(untrusted.verify_result, X509_V_ERR_SELF_SIGNED_CERT_IN_CHAIN);
  // The same context told to trust the CA's file gets through (the control).
  auto trusting = UpstreamContext(tmp / "ca/ca.crt");
  ASSERT_TRUE(trusting) << trusting.error().message();
  EXPECT_TRUE(
      Shake((*trusting)->native_handle(), (*server)->native_handle(), Verifying("api.example.test"))
          .ok);
}

TEST(CertificateAuthorityTest, Tls12And13OnlyAreSpoken) {
  TempDir tmp;
  auto ca = MustLoad(tmp / "ca");
  auto server = ca->ServerContext("api.example.test");
  ASSERT_TRUE(server);
  for (int version : {TLS1_2_VERSION, TLS1_3_VERSION}) {
    SslCtx client = ClientTrusting(ca->certificate_pem());
    SSL_CTX_set_min_proto_version(client.get(), version);
    SSL_CTX_set_max_proto_version(client.get(), version);
    Handshake h = Shake(client.get(), (*server)->native_handle(), Verifying("api.example.test"));
    EXPECT_TRUE(h.ok) << version;
    EXPECT_EQ(h.version, version);
  }
  SslCtx old = ClientTrusting(ca->certificate_pem());
  SSL_CTX_set_security_level(old.get(), 0);  // let this client try TLS 1.1 at all
  SSL_CTX_set_min_proto_version(old.get(), TLS1_1_VERSION);
  SSL_CTX_set_max_proto_version(old.get(), TLS1_1_VERSION);
  EXPECT_FALSE(Shake(old.get(), (*server)->native_handle(), Verifying("api.example.test")).ok);
}

TEST(CertificateAuthorityTest, AlpnNeverYieldsH2) {
  TempDir tmp;
  auto ca = MustLoad(tmp / "ca");
  auto server = ca->ServerContext("api.example.test");
  ASSERT_TRUE(server);
  SslCtx client = ClientTrusting(ca->certificate_pem());
  auto offering = [](std::string protos) {
    return [protos](SSL* ssl) {
      AIRLOCK_CHECK(PrepareUpstream(ssl, "api.example.test").has_value());
      if (!protos.empty()) {
        AIRLOCK_CHECK(SSL_set_alpn_protos(ssl,
                                          reinterpret_cast<const unsigned char*>(protos.data()),
                                          static_cast<unsigned int>(protos.size())) == 0);
      }
    };
  };
  const std::string h2("\x02h2", 3), http11("\x08http/1.1", 9), spdy("\x06spdy/3", 7);
  struct Case {
    std::string offered, selected;
  };
  for (const Case& c : std::vector<Case>{{h2, ""},
                                         {h2 + http11, "http/1.1"},
                                         {http11 + h2, "http/1.1"},
                                         {http11, "http/1.1"},
                                         {spdy + h2, ""},
                                         {"", ""}}) {
    Handshake h = Shake(client.get(), (*server)->native_handle(), offering(c.offered));
    EXPECT_TRUE(h.ok) << c.selected;
    EXPECT_EQ(h.alpn, c.selected);
  }
  // The upstream context offers http/1.1 alone.
  auto upstream = UpstreamContext(tmp / "ca/ca.crt");
  ASSERT_TRUE(upstream);
  Handshake h = Shake((*upstream)->native_handle(), (*server)->native_handle(),
                      Verifying("api.example.test"));
  EXPECT_TRUE(h.ok);
  EXPECT_EQ(h.alpn, "http/1.1");
}

TEST(UpstreamContextTest, TrustsTheExtraCaAndNoOther) {
  TempDir tmp;
  auto a = MustLoad(tmp / "a");
  auto b = MustLoad(tmp / "b");
  auto from_a = a->ServerContext("api.example.test");
  auto from_b = b->ServerContext("api.example.test");
  ASSERT_TRUE(from_a && from_b);
  auto trusting_a = UpstreamContext(tmp / "a/ca.crt");
  ASSERT_TRUE(trusting_a) << trusting_a.error().message();
  SSL_CTX* client = (*trusting_a)->native_handle();
  EXPECT_TRUE(Shake(client, (*from_a)->native_handle(), Verifying("api.example.test")).ok);
  Handshake h = Shake(client, (*from_b)->native_handle(), Verifying("api.example.test"));
  EXPECT_FALSE(h.ok);
  EXPECT_EQ(h.verify_result, X509_V_ERR_SELF_SIGNED_CERT_IN_CHAIN);
  // Below TLS 1.2 it does not go.
  EXPECT_EQ(SSL_CTX_get_min_proto_version(client), TLS1_2_VERSION);

  // A file with both: every certificate in it is trusted.
  WriteFile(tmp / "both.pem", a->certificate_pem() + b->certificate_pem());
  auto trusting_both = UpstreamContext(tmp / "both.pem");
  ASSERT_TRUE(trusting_both) << trusting_both.error().message();
  for (auto* server : {from_a->get(), from_b->get()}) {
    EXPECT_TRUE(Shake((*trusting_both)->native_handle(), server->native_handle(),
                      Verifying("api.example.test"))
                    .ok);
  }
}

TEST(UpstreamContextTest, AnUnusableExtraCaFileIsAnError) {
  TempDir tmp;
  auto ca = MustLoad(tmp / "ca");
  WriteFile(tmp / "empty.pem", "");
  WriteFile(tmp / "text.pem", "hello\n");
  WriteFile(tmp / "key.pem", ReadFile(tmp / "ca/ca.key"));
  WriteFile(tmp / "bad.pem", ca->certificate_pem() + "-----BEGIN CERTIFICATE-----\nAAAA\n" +
                                 "-----END CERTIFICATE-----\n");
  struct Case {
    std::string file, error;
  };
  for (const Case& c : std::vector<Case>{{tmp / "missing.pem", "No such file"},
                                         {tmp / "empty.pem", "holds no PEM certificate"},
                                         {tmp / "text.pem", "holds no PEM certificate"},
                                         {tmp / "key.pem", "holds no PEM certificate"},
                                         {tmp / "bad.pem", "is malformed"},
                                         {tmp.path(), "reading"}}) {
    auto context = UpstreamContext(c.file);
    ASSERT_FALSE(context) << c.file;
    EXPECT_NE(context.error().message().find(c.error), std::string::npos)
        << context.error().message();
  }
}

TEST(UpstreamContextTest, PrepareUpstreamRefusesWhatIsNoHost) {
  auto context = UpstreamContext("");
  ASSERT_TRUE(context);
  for (const char* bad : {"", "*.example.test", "a..b", "1.2.3.999", "a b"}) {
    Ssl ssl(SSL_new((*context)->native_handle()));
    auto st = PrepareUpstream(ssl.get(), bad);
    ASSERT_FALSE(st) << bad;
    EXPECT_EQ(st.error().code(), ErrorCode::kInvalidArgument);
  }
  // A name is sent as SNI; an address is not.
  Ssl named(SSL_new((*context)->native_handle()));
  ASSERT_TRUE(PrepareUpstream(named.get(), "API.example.test"));
  EXPECT_STREQ(SSL_get_servername(named.get(), TLSEXT_NAMETYPE_host_name), "api.example.test");
  Ssl addressed(SSL_new((*context)->native_handle()));
  ASSERT_TRUE(PrepareUpstream(addressed.get(), "[::1]"));
  EXPECT_EQ(SSL_get_servername(addressed.get(), TLSEXT_NAMETYPE_host_name), nullptr);
}

// --- The cache ---

TEST(CertificateAuthorityTest, ServerContextsAreCachedByHost) {
  TempDir tmp;
  auto ca = MustLoad(tmp / "ca");
  auto first = ca->ServerContext("api.example.test");
  ASSERT_TRUE(first);
  auto again = ca->ServerContext("api.example.test");
  auto spelled = ca->ServerContext("API.Example.Test.");
  auto other = ca->ServerContext("other.example.test");
  ASSERT_TRUE(again && spelled && other);
  EXPECT_EQ(first->get(), again->get());
  EXPECT_EQ(first->get(), spelled->get());
  EXPECT_NE(first->get(), other->get());
  EXPECT_EQ(ca->cached_contexts(), 2u);
}

TEST(CertificateAuthorityTest, TheCacheEvictsTheLeastRecentlyUsed) {
  TempDir tmp;
  auto ca = MustLoad(tmp / "ca");
  auto host = [](size_t i) { return "h" + std::to_string(i) + ".example.test"; };
  std::vector<std::shared_ptr<asio::ssl::context>> made;
  for (size_t i = 0; i < kMaxCachedContexts; ++i) {
    auto context = ca->ServerContext(host(i));
    ASSERT_TRUE(context);
    made.push_back(*context);
  }
  EXPECT_EQ(ca->cached_contexts(), kMaxCachedContexts);
  // h0 used again, so h1 is now the least recently used: the next host pushes it out.
  EXPECT_EQ(ca->ServerContext(host(0))->get(), made[0].get());
  ASSERT_TRUE(ca->ServerContext(host(kMaxCachedContexts)));
  EXPECT_EQ(ca->cached_contexts(), kMaxCachedContexts);
  EXPECT_EQ(ca->ServerContext(host(0))->get(), made[0].get());
  EXPECT_EQ(ca->ServerContext(host(2))->get(), made[2].get());
  auto remade = ca->ServerContext(host(1));
  ASSERT_TRUE(remade);
  EXPECT_NE(remade->get(), made[1].get());
  // An evicted context still works for whoever holds it.
  SslCtx client = ClientTrusting(ca->certificate_pem());
  EXPECT_TRUE(Shake(client.get(), made[1]->native_handle(), Verifying(host(1))).ok);
}

TEST(CertificateAuthorityTest, AContextIsRenewedAWeekBeforeItsLeafEnds) {
  TempDir tmp;
  TestClock clock;
  auto ca = MustLoad(tmp / "ca", clock.Fn());
  auto first = ca->ServerContext("api.example.test");
  ASSERT_TRUE(first);
  auto days = [](int n) {
    return std::chrono::duration_cast<std::chrono::seconds>(24h * n).count();
  };
  clock.offset_s = days(22);  // 8 days left: kept
  EXPECT_EQ(ca->ServerContext("api.example.test")->get(), first->get());
  clock.offset_s = days(24);  // 6 days left: renewed, and the new one kept
  auto renewed = ca->ServerContext("api.example.test");
  ASSERT_TRUE(renewed);
  EXPECT_NE(renewed->get(), first->get());
  EXPECT_EQ(ca->ServerContext("api.example.test")->get(), renewed->get());
  EXPECT_EQ(ca->cached_contexts(), 1u);
  // The new leaf runs 30 days from the clock's now.
  X509* leaf = SSL_CTX_get0_certificate((*renewed)->native_handle());
  const auto expected = SystemClock::now() + std::chrono::seconds(days(24)) + kLeafLifetime;
  EXPECT_NEAR(std::chrono::duration<double>(TimeOf(X509_get0_notAfter(leaf)) - expected).count(), 0,
              60);
}

TEST(CertificateAuthorityTest, ManyThreadsShareOneContextPerHost) {
  TempDir tmp;
  auto ca = MustLoad(tmp / "ca");
  constexpr int kThreads = 8, kCalls = 200, kHosts = 12;
  std::vector<std::map<std::string, std::set<asio::ssl::context*>>> seen(kThreads);
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kCalls; ++i) {
        // Hosts every thread asks for, and one of its own now and then.
        const std::string host = i % 10 == 9
                                     ? "t" + std::to_string(t) + "-" + std::to_string(i) + ".test"
                                     : "h" + std::to_string((i * 7 + t) % kHosts) + ".test";
        auto context = ca->ServerContext(host);
        if (!context) {
          ++failures;
          continue;
        }
        seen[t][host].insert(context->get());
      }
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(failures, 0);
  std::map<std::string, std::set<asio::ssl::context*>> all;
  for (const auto& per_thread : seen) {
    for (const auto& [host, contexts] : per_thread)
      all[host].insert(contexts.begin(), contexts.end());
  }
  EXPECT_EQ(all.size(), static_cast<size_t>(kHosts + kThreads * kCalls / 10));
  for (const auto& [host, contexts] : all) EXPECT_EQ(contexts.size(), 1u) << host;
  EXPECT_EQ(ca->cached_contexts(), all.size());
  // And each of them serves its host.
  SslCtx client = ClientTrusting(ca->certificate_pem());
  EXPECT_TRUE(
      Shake(client.get(), (*all["h3.test"].begin())->native_handle(), Verifying("h3.test")).ok);
}

}  // namespace
}  // namespace airlock::net
