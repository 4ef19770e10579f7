#include "net/tls_authority.h"

#include <fcntl.h>
#include <openssl/bn.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/rand.h>
#include <openssl/x509v3.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <ctime>
#include <string_view>
#include <utility>

#include "common/unique_fd.h"
#include "net/policy.h"

// The error of a failed Status or Result, returned from the enclosing function (abseil's
// RETURN_IF_ERROR); and `decl` (`Key key`) bound to a Result's value, or its error returned
// (ASSIGN_OR_RETURN). Most steps here are one OpenSSL call each that can fail.
#define AIRLOCK_TRY(expr)                                             \
  do {                                                                \
    auto status_ = (expr);                                            \
    if (!status_) return std::unexpected(std::move(status_.error())); \
  } while (0)
#define AIRLOCK_CONCAT_INNER(a, b) a##b
#define AIRLOCK_CONCAT(a, b) AIRLOCK_CONCAT_INNER(a, b)
#define AIRLOCK_ASSIGN_OR_RETURN(decl, expr) \
  AIRLOCK_ASSIGN_OR_RETURN_IMPL(AIRLOCK_CONCAT(result_, __LINE__), decl, expr)
#define AIRLOCK_ASSIGN_OR_RETURN_IMPL(result, decl, expr)         \
  auto result = (expr);                                           \
  if (!result) return std::unexpected(std::move(result.error())); \
  decl = std::move(*result)

namespace airlock::net {

namespace asio = boost::asio;
using SystemClock = std::chrono::system_clock;

namespace {

template <typename T, void (*Free)(T*)>
struct FreeWith {
  void operator()(T* p) const { Free(p); }
};
using Bio = std::unique_ptr<BIO, FreeWith<BIO, BIO_free_all>>;
using Key = std::unique_ptr<EVP_PKEY, FreeWith<EVP_PKEY, EVP_PKEY_free>>;
using Cert = std::unique_ptr<X509, FreeWith<X509, X509_free>>;
using Extension = std::unique_ptr<X509_EXTENSION, FreeWith<X509_EXTENSION, X509_EXTENSION_free>>;
using Bignum = std::unique_ptr<BIGNUM, FreeWith<BIGNUM, BN_free>>;
using SslContext = std::shared_ptr<asio::ssl::context>;

constexpr char kKeyFile[] = "ca.key";
constexpr char kCertFile[] = "ca.crt";
// Far more than a PEM key or certificate takes; a bound on what a wrong path makes us read.
constexpr size_t kMaxPemBytes = 1 << 20;
// The most a CN may hold (ub-common-name, RFC 5280): longer names are in the SAN only.
constexpr size_t kMaxCommonNameBytes = 64;
// ALPN's wire form: the one protocol the interceptor speaks.
constexpr unsigned char kAlpnHttp11[] = {8, 'h', 't', 't', 'p', '/', '1', '.', '1'};
// TLS 1.2 suites with forward secrecy and AEAD only (1.3's are all of that). The leaves have
// ECDSA keys, so these are the ones a handshake with them can use.
constexpr char kTls12Ciphers[] =
    "ECDHE-ECDSA-AES128-GCM-SHA256:ECDHE-ECDSA-AES256-GCM-SHA384:ECDHE-ECDSA-CHACHA20-POLY1305";

// `what`, then OpenSSL's queued errors (the queue is left empty for the next call on this
// thread).
Error OpensslError(std::string_view what, ErrorCode code = ErrorCode::kInternal) {
  std::string message(what);
  const char* separator = ": ";
  while (unsigned long e = ERR_get_error()) {
    char text[256];
    ERR_error_string_n(e, text, sizeof text);
    message += separator;
    message += text;
    separator = "; ";
  }
  return Error(code, std::move(message));
}
std::unexpected<Error> FailOpenssl(std::string_view what) {
  return std::unexpected(OpensslError(what));
}

// Refuses to give a passphrase: OpenSSL's default would prompt on the daemon's terminal.
int NoPassphrase(char*, int, int, void*) { return -1; }

// The name a certificate may be issued for: lowercased, without a trailing dot.
Result<std::string> CertificateName(std::string_view host) {
  auto name = NormaliseName(host);
  if (!name || LooksLikeIpv4(*name)) {
    std::string shown(host.substr(0, 64));
    return Fail(ErrorCode::kInvalidArgument,
                "\"" + shown + (host.size() > shown.size() ? "...\"" : "\"") +
                    " is not a DNS name a certificate can be issued for (not an address, not a "
                    "wildcard, 1-253 bytes of labels of 1-63 of [a-z0-9_-])");
  }
  return std::move(*name);
}

Result<Key> NewP256Key() {
  Key key(EVP_EC_gen("P-256"));
  if (!key) return FailOpenssl("making a P-256 key");
  return key;
}

// What was written to a memory BIO.
std::string Text(BIO* bio) {
  char* data = nullptr;
  long size = BIO_get_mem_data(bio, &data);
  return std::string(data, static_cast<size_t>(size));
}
std::string CertPem(const X509* cert) {
  Bio bio(BIO_new(BIO_s_mem()));
  AIRLOCK_CHECK(bio && PEM_write_bio_X509(bio.get(), cert) == 1);
  return Text(bio.get());
}
std::string KeyPem(const EVP_PKEY* key) {
  Bio bio(BIO_new(BIO_s_mem()));
  AIRLOCK_CHECK(
      bio && PEM_write_bio_PrivateKey(bio.get(), key, nullptr, nullptr, 0, nullptr, nullptr) == 1);
  return Text(bio.get());
}

SystemClock::time_point TimePoint(const ASN1_TIME* time) {
  struct tm tm {};
  AIRLOCK_CHECK(ASN1_TIME_to_tm(time, &tm) == 1);
  return SystemClock::from_time_t(::timegm(&tm));
}

// "Jan  2 03:04:05 2035 GMT".
std::string TimeText(const ASN1_TIME* time) {
  Bio bio(BIO_new(BIO_s_mem()));
  AIRLOCK_CHECK(bio && ASN1_TIME_print(bio.get(), time) == 1);
  return Text(bio.get());
}

Status SetValidity(X509* cert, SystemClock::time_point not_before,
                   SystemClock::time_point not_after) {
  if (!ASN1_TIME_set(X509_getm_notBefore(cert), SystemClock::to_time_t(not_before)) ||
      !ASN1_TIME_set(X509_getm_notAfter(cert), SystemClock::to_time_t(not_after))) {
    return FailOpenssl("setting a certificate's validity");
  }
  return {};
}

// A positive serial of 128 random bits (RFC 5280 allows up to 20 octets; CAs use 64 bits or
// more of randomness so that serials cannot be predicted).
Status SetRandomSerial(X509* cert) {
  Bignum serial(BN_new());
  if (!serial || BN_rand(serial.get(), 128, BN_RAND_TOP_ANY, BN_RAND_BOTTOM_ANY) != 1 ||
      !BN_to_ASN1_INTEGER(serial.get(), X509_get_serialNumber(cert))) {
    return FailOpenssl("making a certificate serial");
  }
  return {};
}

Status AddCommonName(X509_NAME* name, const std::string& cn) {
  if (X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC,
                                 reinterpret_cast<const unsigned char*>(cn.c_str()), -1, -1,
                                 0) != 1) {
    return FailOpenssl("setting the common name " + cn);
  }
  return {};
}

// An extension in openssl.cnf's syntax ("critical,CA:TRUE,pathlen:0"), made for `cert` as
// issued by `issuer`.
Status AddExtension(X509* cert, X509* issuer, int nid, const std::string& value) {
  X509V3_CTX ctx;
  X509V3_set_ctx_nodb(&ctx);
  X509V3_set_ctx(&ctx, issuer, cert, nullptr, nullptr, 0);
  Extension ext(X509V3_EXT_conf_nid(nullptr, &ctx, nid, value.c_str()));
  if (!ext || X509_add_ext(cert, ext.get(), -1) != 1) {
    return FailOpenssl(std::string("adding the certificate extension ") + OBJ_nid2sn(nid) + " " +
                       value);
  }
  return {};
}

// The body of a certificate: version 3, a random serial, its validity and public key.
Result<Cert> NewCertificate(EVP_PKEY* key, SystemClock::time_point not_before,
                            SystemClock::time_point not_after) {
  Cert cert(X509_new());
  if (!cert || X509_set_version(cert.get(), X509_VERSION_3) != 1 ||
      X509_set_pubkey(cert.get(), key) != 1) {
    return FailOpenssl("making a certificate");
  }
  AIRLOCK_TRY(SetRandomSerial(cert.get()));
  AIRLOCK_TRY(SetValidity(cert.get(), not_before, not_after));
  return cert;
}

// The CA: a fresh P-256 key and its self-signed certificate, as CertificateAuthority's header
// describes it.
Result<std::pair<Key, Cert>> NewAuthority(SystemClock::time_point now) {
  AIRLOCK_ASSIGN_OR_RETURN(Key key, NewP256Key());
  AIRLOCK_ASSIGN_OR_RETURN(Cert cert,
                           NewCertificate(key.get(), now - kBackdate, now + kCaLifetime));
  // A short id tells two daemons' CAs apart in a certificate viewer.
  unsigned char id[4];
  if (RAND_bytes(id, sizeof id) != 1) return FailOpenssl("making the CA's id");
  char hex[9];
  std::snprintf(hex, sizeof hex, "%02x%02x%02x%02x", id[0], id[1], id[2], id[3]);
  X509* c = cert.get();
  AIRLOCK_TRY(AddCommonName(X509_get_subject_name(c), std::string("Airlock egress CA ") + hex));
  if (X509_set_issuer_name(c, X509_get_subject_name(c)) != 1) {
    return FailOpenssl("setting the CA's issuer");
  }
  // pathlen:0: it signs leaves only, never another CA.
  for (auto [nid, value] : {std::pair{NID_basic_constraints, "critical,CA:TRUE,pathlen:0"},
                            {NID_key_usage, "critical,keyCertSign,cRLSign"},
                            {NID_subject_key_identifier, "hash"}}) {
    AIRLOCK_TRY(AddExtension(c, c, nid, value));
  }
  if (X509_sign(c, key.get(), EVP_sha256()) == 0) return FailOpenssl("signing the CA certificate");
  return std::pair{std::move(key), std::move(cert)};
}

struct Leaf {
  Key key;
  Cert cert;
  SystemClock::time_point not_after;
};

// A leaf for `name` (already a CertificateName) signed by the CA, as Issue describes it.
Result<Leaf> NewLeaf(const std::string& name, EVP_PKEY* ca_key, X509* ca_cert,
                     SystemClock::time_point ca_not_after, SystemClock::time_point now) {
  if (ca_not_after <= now) {
    return Fail(ErrorCode::kFailedPrecondition,
                "the egress CA certificate expired on " + TimeText(X509_get0_notAfter(ca_cert)) +
                    ": move ca.key and ca.crt away and restart to make a new CA");
  }
  // The CA's end is an upper bound: a chain is valid only while all of it is.
  const auto not_after = std::min(now + kLeafLifetime, ca_not_after);
  AIRLOCK_ASSIGN_OR_RETURN(Key key, NewP256Key());
  AIRLOCK_ASSIGN_OR_RETURN(Cert cert, NewCertificate(key.get(), now - kBackdate, not_after));
  X509* c = cert.get();
  // A name too long for a CN is carried by the SAN alone, which must then be critical.
  const bool fits_cn = name.size() <= kMaxCommonNameBytes;
  if (fits_cn) AIRLOCK_TRY(AddCommonName(X509_get_subject_name(c), name));
  if (X509_set_issuer_name(c, X509_get_subject_name(ca_cert)) != 1) {
    return FailOpenssl("setting a leaf's issuer");
  }
  for (auto [nid, value] : {std::pair<int, std::string>{NID_basic_constraints, "critical,CA:FALSE"},
                            {NID_key_usage, "critical,digitalSignature"},
                            {NID_ext_key_usage, "serverAuth"},
                            {NID_subject_alt_name, (fits_cn ? "DNS:" : "critical,DNS:") + name},
                            {NID_subject_key_identifier, "hash"},
                            {NID_authority_key_identifier, "keyid"}}) {
    AIRLOCK_TRY(AddExtension(c, ca_cert, nid, value));
  }
  if (X509_sign(c, ca_key, EVP_sha256()) == 0) {
    return FailOpenssl("signing the certificate for " + name);
  }
  return Leaf{std::move(key), std::move(cert), not_after};
}

// ALPN on the server: http/1.1 when the client offers it, else no ALPN at all (the client then
// speaks HTTP/1.1 by default), never anything else: the interceptor reads HTTP/1.1 only.
int SelectHttp11(SSL*, const unsigned char** out, unsigned char* out_size, const unsigned char* in,
                 unsigned int in_size, void*) {
  const std::string_view wanted(reinterpret_cast<const char*>(kAlpnHttp11) + 1,
                                sizeof kAlpnHttp11 - 1);
  for (unsigned int i = 0; i < in_size;) {
    const unsigned int size = in[i];
    if (i + 1 + size > in_size) break;
    if (std::string_view(reinterpret_cast<const char*>(in + i + 1), size) == wanted) {
      *out = in + i + 1;
      *out_size = static_cast<unsigned char>(size);
      return SSL_TLSEXT_ERR_OK;
    }
    i += 1 + size;
  }
  return SSL_TLSEXT_ERR_NOACK;
}

// A context of our own making (asio's own constructor throws, and sets a TLS 1.0 minimum).
Result<SslContext> NewContext(const SSL_METHOD* method) {
  SSL_CTX* native = SSL_CTX_new(method);
  if (!native) return FailOpenssl("making a TLS context");
  auto context = std::make_shared<asio::ssl::context>(native);
  SSL_CTX_set_options(native, SSL_OP_NO_COMPRESSION | SSL_OP_NO_RENEGOTIATION);
  if (SSL_CTX_set_min_proto_version(native, TLS1_2_VERSION) != 1) {
    return FailOpenssl("setting TLS 1.2 as the minimum");
  }
  return context;
}

Result<SslContext> NewServerContext(const Leaf& leaf, X509* ca_cert) {
  AIRLOCK_ASSIGN_OR_RETURN(SslContext context, NewContext(TLS_server_method()));
  SSL_CTX* native = context->native_handle();
  if (SSL_CTX_set_max_proto_version(native, TLS1_3_VERSION) != 1 ||
      SSL_CTX_set_cipher_list(native, kTls12Ciphers) != 1 ||
      SSL_CTX_use_certificate(native, leaf.cert.get()) != 1 ||
      SSL_CTX_use_PrivateKey(native, leaf.key.get()) != 1 ||
      SSL_CTX_add1_chain_cert(native, ca_cert) != 1) {
    return FailOpenssl("making a TLS server context");
  }
  SSL_CTX_set_options(native, SSL_OP_CIPHER_SERVER_PREFERENCE);
  SSL_CTX_set_alpn_select_cb(native, SelectHttp11, nullptr);
  return context;
}

// What is at `name` in the directory: nullopt when there is nothing.
struct OpenedFile {
  UniqueFd fd;
  struct stat st;
};
Result<std::optional<OpenedFile>> OpenIn(int dir_fd, const std::string& dir, const char* name) {
  UniqueFd fd(::openat(dir_fd, name, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK));
  if (!fd) {
    if (errno == ENOENT) return std::nullopt;
    return FailErrno("opening " + dir + "/" + name, errno);
  }
  OpenedFile file{std::move(fd), {}};
  if (::fstat(file.fd.get(), &file.st) != 0) return FailErrno("stat " + dir + "/" + name, errno);
  if (!S_ISREG(file.st.st_mode)) {
    return Fail(ErrorCode::kFailedPrecondition, dir + "/" + name + " is not a regular file");
  }
  return file;
}

Result<std::string> ReadAll(int fd, const std::string& path) {
  std::string data;
  char buf[16 * 1024];
  while (true) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return FailErrno("reading " + path, errno);
    if (n == 0) return data;
    data.append(buf, static_cast<size_t>(n));
    if (data.size() > kMaxPemBytes) {
      return Fail(ErrorCode::kFailedPrecondition, path + " is over 1 MiB: not a PEM file");
    }
  }
}

Status WriteAll(int fd, std::string_view data, const std::string& path) {
  while (!data.empty()) {
    ssize_t n = ::write(fd, data.data(), data.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return FailErrno("writing " + path, errno);
    data.remove_prefix(static_cast<size_t>(n));
  }
  return {};
}

// Writes `name` in the directory whole or not at all, never over a file that is there: a
// temporary file is written and synced, then linked to the name (link(2) fails on an existing
// name, where rename(2) would replace it).
Status WriteNew(int dir_fd, const std::string& dir, const char* name, std::string_view data,
                mode_t mode) {
  const std::string path = dir + "/" + name;
  unsigned char random[6];
  if (RAND_bytes(random, sizeof random) != 1) return FailOpenssl("naming a temporary file");
  char suffix[13];
  std::snprintf(suffix, sizeof suffix, "%02x%02x%02x%02x%02x%02x", random[0], random[1], random[2],
                random[3], random[4], random[5]);
  const std::string temp = std::string(".") + name + "." + suffix + ".tmp";
  UniqueFd fd(
      ::openat(dir_fd, temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, mode));
  if (!fd) return FailErrno("creating " + dir + "/" + temp, errno);
  ScopeExit remove_temp([&] { ::unlinkat(dir_fd, temp.c_str(), 0); });
  // The mode asked for, whatever the umask took away from it.
  if (::fchmod(fd.get(), mode) != 0) return FailErrno("chmod " + dir + "/" + temp, errno);
  AIRLOCK_TRY(WriteAll(fd.get(), data, path));
  if (::fsync(fd.get()) != 0) return FailErrno("fsync " + dir + "/" + temp, errno);
  if (::linkat(dir_fd, temp.c_str(), dir_fd, name, 0) != 0) {
    if (errno == EEXIST) {
      return Fail(
          ErrorCode::kFailedPrecondition,
          path + " appeared while the CA was being made: is another airlockd using " + dir + "?");
    }
    return FailErrno("linking " + path, errno);
  }
  return {};
}

// Reads and checks the pair that is there; nothing is changed on disk.
Result<std::pair<Key, Cert>> LoadAuthority(const std::string& dir, OpenedFile key_file,
                                           OpenedFile cert_file, SystemClock::time_point now) {
  const std::string key_path = dir + "/" + kKeyFile;
  const std::string cert_path = dir + "/" + kCertFile;
  if ((key_file.st.st_mode & 077) != 0) {
    char mode[8];
    std::snprintf(mode, sizeof mode, "%04o", key_file.st.st_mode & 07777);
    return Fail(ErrorCode::kFailedPrecondition,
                key_path + " is mode " + mode +
                    ": the CA's private key must be readable by its owner only (chmod 600 " +
                    key_path + ")");
  }
  if (key_file.st.st_uid != ::geteuid()) {
    return Fail(ErrorCode::kFailedPrecondition,
                key_path + " is owned by uid " + std::to_string(key_file.st.st_uid) +
                    ", not by airlockd's (uid " + std::to_string(::geteuid()) +
                    "): another user could replace the CA");
  }
  AIRLOCK_ASSIGN_OR_RETURN(const std::string key_pem, ReadAll(key_file.fd.get(), key_path));
  AIRLOCK_ASSIGN_OR_RETURN(const std::string cert_pem, ReadAll(cert_file.fd.get(), cert_path));

  Bio key_bio(BIO_new_mem_buf(key_pem.data(), static_cast<int>(key_pem.size())));
  Key key(key_bio ? PEM_read_bio_PrivateKey(key_bio.get(), nullptr, NoPassphrase, nullptr)
                  : nullptr);
  if (!key) {
    const bool encrypted = key_pem.find("ENCRYPTED") != std::string::npos;
    return std::unexpected(
        OpensslError(key_path + (encrypted ? " is encrypted: airlockd needs the key unencrypted"
                                           : " holds no PEM private key"),
                     ErrorCode::kFailedPrecondition));
  }
  Bio cert_bio(BIO_new_mem_buf(cert_pem.data(), static_cast<int>(cert_pem.size())));
  Cert cert(cert_bio ? PEM_read_bio_X509(cert_bio.get(), nullptr, NoPassphrase, nullptr) : nullptr);
  if (!cert) {
    return std::unexpected(
        OpensslError(cert_path + " holds no PEM certificate", ErrorCode::kFailedPrecondition));
  }
  if (X509_check_private_key(cert.get(), key.get()) != 1) {
    ERR_clear_error();
    return Fail(ErrorCode::kFailedPrecondition,
                cert_path + " is not the certificate of the key in " + key_path +
                    ": restore the pair, or move both away to make a new CA");
  }
  // 1: CA:TRUE, and keyCertSign if it has a keyUsage. Anything else would make every handshake
  // through it fail at the client, far from the cause.
  if (X509_check_ca(cert.get()) != 1) {
    return Fail(ErrorCode::kFailedPrecondition,
                cert_path +
                    " is not a CA certificate (basicConstraints CA:TRUE, keyUsage "
                    "keyCertSign)");
  }
  time_t t = SystemClock::to_time_t(now);
  if (X509_cmp_time(X509_get0_notAfter(cert.get()), &t) <= 0) {
    return Fail(ErrorCode::kFailedPrecondition,
                cert_path + " expired on " + TimeText(X509_get0_notAfter(cert.get())) +
                    ": move ca.key and ca.crt away to make a new CA (sandboxes then trust the "
                    "new one)");
  }
  if (X509_cmp_time(X509_get0_notBefore(cert.get()), &t) > 0) {
    return Fail(ErrorCode::kFailedPrecondition, cert_path + " is not valid before " +
                                                    TimeText(X509_get0_notBefore(cert.get())) +
                                                    ": is this host's clock right?");
  }
  return std::pair{std::move(key), std::move(cert)};
}

// Makes the pair and writes it: the key first, so that a crash between the two leaves a key
// without a certificate, which the next start refuses rather than use.
Result<std::pair<Key, Cert>> CreateAuthority(int dir_fd, const std::string& dir,
                                             SystemClock::time_point now) {
  AIRLOCK_ASSIGN_OR_RETURN(auto made, NewAuthority(now));
  AIRLOCK_TRY(WriteNew(dir_fd, dir, kKeyFile, KeyPem(made.first.get()), 0600));
  // A key of ours without its certificate is of no use to anyone: removed if the second write
  // fails, so the next start makes the pair again.
  ScopeExit remove_key([&] { ::unlinkat(dir_fd, kKeyFile, 0); });
  AIRLOCK_TRY(WriteNew(dir_fd, dir, kCertFile, CertPem(made.second.get()), 0644));
  remove_key.Dismiss();
  if (::fsync(dir_fd) != 0) return FailErrno("fsync " + dir, errno);
  return made;
}

}  // namespace

CertificateAuthority::CertificateAuthority(EVP_PKEY* key, X509* cert, std::string cert_pem,
                                           SystemClock::time_point not_after, WallClock now)
    : key_(key),
      cert_(cert),
      cert_pem_(std::move(cert_pem)),
      not_after_(not_after),
      now_(std::move(now)) {}

Result<std::unique_ptr<CertificateAuthority>> CertificateAuthority::LoadOrCreate(
    const std::string& dir) {
  return LoadOrCreate(dir, [] { return SystemClock::now(); });
}

Result<std::unique_ptr<CertificateAuthority>> CertificateAuthority::LoadOrCreate(
    const std::string& dir, WallClock now) {
  if (::mkdir(dir.c_str(), 0700) == 0) {
    // 0700 whatever the umask: the key's directory is the daemon's alone.
    if (::chmod(dir.c_str(), 0700) != 0) return FailErrno("chmod " + dir, errno);
  } else if (errno != EEXIST) {
    return FailErrno("making the CA directory " + dir, errno);
  }
  UniqueFd dir_fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!dir_fd) return FailErrno("opening the CA directory " + dir, errno);
  AIRLOCK_ASSIGN_OR_RETURN(auto key_file, OpenIn(dir_fd.get(), dir, kKeyFile));
  AIRLOCK_ASSIGN_OR_RETURN(auto cert_file, OpenIn(dir_fd.get(), dir, kCertFile));

  if (key_file.has_value() != cert_file.has_value()) {
    // Half a CA is never completed or replaced: sandboxes may trust the certificate, and the key
    // may be restorable. The operator decides.
    const std::string there = key_file ? kKeyFile : kCertFile;
    const std::string missing = key_file ? kCertFile : kKeyFile;
    return Fail(ErrorCode::kFailedPrecondition, "the egress CA in " + dir + ": " + dir + "/" +
                                                    there + " is there but " + dir + "/" + missing +
                                                    " is not: restore it, or move " + there +
                                                    " away to make a new CA");
  }
  auto pair = key_file ? LoadAuthority(dir, std::move(*key_file), std::move(*cert_file), now())
                       : CreateAuthority(dir_fd.get(), dir, now());
  if (!pair) return std::unexpected(std::move(pair.error()).Wrap("the egress CA in " + dir));
  auto [key, cert] = std::move(*pair);
  const auto not_after = TimePoint(X509_get0_notAfter(cert.get()));
  std::string pem = CertPem(cert.get());
  return std::unique_ptr<CertificateAuthority>(new CertificateAuthority(
      key.release(), cert.release(), std::move(pem), not_after, std::move(now)));
}

const std::string& CertificateAuthority::certificate_pem() const { return cert_pem_; }

Result<IssuedCertificate> CertificateAuthority::Issue(const std::string& host) {
  AIRLOCK_ASSIGN_OR_RETURN(const std::string name, CertificateName(host));
  AIRLOCK_ASSIGN_OR_RETURN(const Leaf leaf,
                           NewLeaf(name, key_.get(), cert_.get(), not_after_, now_()));
  return IssuedCertificate{CertPem(leaf.cert.get()), KeyPem(leaf.key.get())};
}

Result<std::shared_ptr<asio::ssl::context>> CertificateAuthority::ServerContext(
    const std::string& host) {
  AIRLOCK_ASSIGN_OR_RETURN(const std::string name, CertificateName(host));
  const auto now = now_();
  // Kept until a week is left, or for good once its end is the CA's: a new leaf could not
  // last longer.
  auto fresh = [&](const CachedContext& c) {
    return c.not_after - now >= kRenewBefore || c.not_after >= not_after_;
  };
  {
    std::lock_guard lock(mu_);
    if (auto it = by_host_.find(name); it != by_host_.end() && fresh(*it->second)) {
      lru_.splice(lru_.begin(), lru_, it->second);
      return it->second->context;
    }
  }
  // Made outside the lock: a miss takes a key generation and a signature, and hits for other
  // hosts should not wait for it.
  AIRLOCK_ASSIGN_OR_RETURN(const Leaf leaf,
                           NewLeaf(name, key_.get(), cert_.get(), not_after_, now));
  AIRLOCK_ASSIGN_OR_RETURN(SslContext context, NewServerContext(leaf, cert_.get()));

  std::lock_guard lock(mu_);
  if (auto it = by_host_.find(name); it != by_host_.end()) {
    // Another thread made one meanwhile: its context is the one every caller gets.
    if (fresh(*it->second)) {
      lru_.splice(lru_.begin(), lru_, it->second);
      return it->second->context;
    }
    lru_.erase(it->second);
    by_host_.erase(it);
  }
  lru_.push_front(CachedContext{name, context, leaf.not_after});
  by_host_.emplace(name, lru_.begin());
  if (lru_.size() > kMaxCachedContexts) {
    // Connections still using it keep it alive; only the cache lets go.
    by_host_.erase(lru_.back().host);
    lru_.pop_back();
  }
  return context;
}

size_t CertificateAuthority::cached_contexts() const {
  std::lock_guard lock(mu_);
  return lru_.size();
}

Result<std::shared_ptr<asio::ssl::context>> UpstreamContext(const std::string& extra_ca_file) {
  AIRLOCK_ASSIGN_OR_RETURN(SslContext context, NewContext(TLS_client_method()));
  SSL_CTX* native = context->native_handle();
  SSL_CTX_set_verify(native, SSL_VERIFY_PEER, nullptr);
  if (SSL_CTX_set_default_verify_paths(native) != 1) {
    return FailOpenssl("loading the system's trusted certificates");
  }
  // 0 is success here, unlike the rest of OpenSSL.
  if (SSL_CTX_set_alpn_protos(native, kAlpnHttp11, sizeof kAlpnHttp11) != 0) {
    return FailOpenssl("setting ALPN http/1.1");
  }
  if (extra_ca_file.empty()) return context;

  UniqueFd fd(::open(extra_ca_file.c_str(), O_RDONLY | O_CLOEXEC | O_NOCTTY));
  if (!fd) return FailErrno("opening the extra CA file " + extra_ca_file, errno);
  AIRLOCK_ASSIGN_OR_RETURN(const std::string pem, ReadAll(fd.get(), extra_ca_file));
  ERR_clear_error();  // the end of the loop below is told by the last error
  Bio bio(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
  if (!bio) return FailOpenssl("reading " + extra_ca_file);
  X509_STORE* store = SSL_CTX_get_cert_store(native);
  int added = 0;
  while (Cert cert{PEM_read_bio_X509(bio.get(), nullptr, NoPassphrase, nullptr)}) {
    if (X509_STORE_add_cert(store, cert.get()) != 1) {
      return FailOpenssl("trusting a certificate of " + extra_ca_file);
    }
    ++added;
  }
  // The loop ends at the end of the file ("no start line"), or at a block that is not a
  // certificate, which is the operator's mistake to hear about.
  const unsigned long last = ERR_peek_last_error();
  if (ERR_GET_LIB(last) == ERR_LIB_PEM && ERR_GET_REASON(last) == PEM_R_NO_START_LINE) {
    ERR_clear_error();
  } else if (last != 0) {
    return std::unexpected(OpensslError("the extra CA file " + extra_ca_file + " is malformed",
                                        ErrorCode::kInvalidArgument));
  }
  if (added == 0) {
    return Fail(ErrorCode::kInvalidArgument,
                "the extra CA file " + extra_ca_file + " holds no PEM certificate");
  }
  return context;
}

Status PrepareUpstream(SSL* ssl, const std::string& host) {
  if (auto ip = ParseIpLiteral(host)) {
    // An address is checked against the certificate's IP addresses; SNI never names one.
    if (X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(ssl), ip->to_string().c_str()) != 1) {
      return FailOpenssl("verifying the upstream's address " + host);
    }
    return {};
  }
  auto name = NormaliseName(host);
  if (!name || LooksLikeIpv4(*name)) {
    return Fail(ErrorCode::kInvalidArgument,
                "\"" + host + "\" is neither a DNS name nor an address to verify a server by");
  }
  SSL_set_hostflags(ssl, X509_CHECK_FLAG_NO_PARTIAL_WILDCARDS);
  if (SSL_set_tlsext_host_name(ssl, name->c_str()) != 1 || SSL_set1_host(ssl, name->c_str()) != 1) {
    return FailOpenssl("verifying the upstream's name " + *name);
  }
  return {};
}

}  // namespace airlock::net
