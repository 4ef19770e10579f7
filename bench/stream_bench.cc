// Streamed exec output through a real airlockd, in one sandbox, beside host baselines measured
// in the same run:
//
//   throughput   a command in the sandbox writes N MiB to stdout (/dev/zero, text from `yes`,
//                /dev/urandom, which arrives base64); the client reads the NDJSON events,
//                decodes each one and checks that it got exactly N bytes. Beside it: a plain
//                (buffered) exec of text under its 16 MiB cap, and N bytes written through a
//                `cat` on the host and read back through pipes.
//   first byte   from sending a streamed exec of `echo hi` to its first stdout event, beside a
//                plain exec's whole round trip of `echo hi` and fork+exec of /bin/echo on the
//                host up to the first byte read from its pipe.
//
// The cases run interleaved, so machine noise falls on every side alike. Timings are reported,
// never asserted; a wrong byte count, a failed command or a failed call ends the run with
// status 1. Needs root (airlockd does).
//
//   airlock-bench-stream [--quick] [--mib N] [--plain-mib N] [--repetitions N]
//                        [--iterations N] [--warmup N] [--json FILE]
//
// --quick: 32 MiB, 3 repetitions, 50 first-byte iterations (under 20 s). The sandbox, airlockd
// and the temporary directory are cleaned up on every path; 130 on SIGINT.

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "client/http_client.h"
#include "common/error.h"
#include "daemon/api/base64.h"
#include "daemon_process.h"
#include "flags.h"
#include "stats.h"

extern char** environ;

namespace {

using airlock::bench::g_interrupted;
using airlock::bench::InstallSignalHandlers;
using airlock::bench::WriteResults;

namespace b = airlock::bench;
using airlock::ErrorCode;
using airlock::Result;
using airlock::Status;
using airlock::client::HttpClient;
using nlohmann::json;
using Clock = std::chrono::steady_clock;

constexpr char kTag[] = "airlock-bench-stream";
constexpr char kTextLine[] = "airlock-bench-line";  // what `yes` repeats (19 bytes a line)
constexpr size_t kPiece = 64 * 1024;                // the host pipe's writes and reads
constexpr uint64_t kMiB = 1 << 20;

double Us(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::micro>(b - a).count();
}

std::string Excerpt(std::string_view s, size_t max = 200) {
  std::string out(s.substr(0, max));
  for (char& c : out) {
    if (c == '\n' || c == '\r') c = ' ';
  }
  if (s.size() > max) out += "...";
  return out;
}

// The field's string value, or "" when it is absent or not a string.
std::string Text(const json& doc, const char* field) {
  if (!doc.is_object()) return "";
  auto it = doc.find(field);
  return it != doc.end() && it->is_string() ? it->get<std::string>() : "";
}

struct Flags {
  bool quick = false;
  int mib = 256;      // streamed per throughput run
  int plain_mib = 8;  // the plain exec's output, under its 16 MiB cap (and streamed alike)
  int repetitions = 5;
  int iterations = 200;  // first-byte samples of each kind
  int warmup = 10;       // first-byte warm-up iterations; throughput: one run of each if > 0
  std::string json_path;
};

Result<Flags> ParseFlags(int argc, char** argv) {
  Flags flags;
  std::optional<int> mib, plain_mib, repetitions, iterations, warmup;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--quick") {
      flags.quick = true;
      continue;
    }
    if (i + 1 >= argc) return airlock::Fail(ErrorCode::kInvalidArgument, arg + " needs a value");
    const std::string value = argv[++i];
    auto number = [&](int min, int max, std::optional<int>& into) {
      return b::ParseIntFlag(arg, value, min, max, into);
    };
    Status st;
    if (arg == "--mib") {
      st = number(1, 65536, mib);
    } else if (arg == "--plain-mib") {
      st = number(1, 15, plain_mib);  // a plain exec keeps 16 MiB of output
    } else if (arg == "--repetitions") {
      st = number(1, 10000, repetitions);
    } else if (arg == "--iterations") {
      st = number(1, 1000000, iterations);
    } else if (arg == "--warmup") {
      st = number(0, 1000000, warmup);
    } else if (arg == "--json") {
      flags.json_path = value;
    } else {
      return airlock::Fail(ErrorCode::kInvalidArgument, "unknown argument " + arg);
    }
    if (!st) return std::unexpected(st.error());
  }
  if (flags.quick) {
    flags.mib = 32;
    flags.repetitions = 3;
    flags.iterations = 50;
    flags.warmup = 3;
  }
  flags.mib = mib.value_or(flags.mib);
  flags.plain_mib = plain_mib.value_or(flags.plain_mib);
  flags.repetitions = repetitions.value_or(flags.repetitions);
  flags.iterations = iterations.value_or(flags.iterations);
  flags.warmup = warmup.value_or(flags.warmup);
  return flags;
}

// ---- reading a streamed exec -------------------------------------------------------------------

// Splits a streamed exec's body into NDJSON lines and decodes every event, as a client would:
// each line parsed as JSON, each stdout / stderr event's data decoded (base64 when so marked).
class StreamReader {
 public:
  // Takes the next piece of the body, as HttpClient::RequestStreamed hands it over.
  void Feed(std::string_view piece) {
    const auto t0 = Clock::now();
    wire_bytes += piece.size();
    if (!problem.empty()) return;
    pending_.append(piece);
    size_t start = 0;
    for (size_t nl; problem.empty() && (nl = pending_.find('\n', scanned_)) != std::string::npos;
         start = scanned_ = nl + 1) {
      Event(std::string_view(pending_).substr(start, nl - start));
    }
    pending_.erase(0, start);
    scanned_ = pending_.size();  // no newline in what is left
    client_us += Us(t0, Clock::now());
  }

  // What the stream said, and whether it ended as it should: an exit event with exit code 0,
  // nothing truncated, nothing left over.
  [[nodiscard]] Status Check() const {
    if (!problem.empty()) return airlock::Fail(ErrorCode::kProtocol, problem);
    if (!pending_.empty()) {
      return airlock::Fail(ErrorCode::kProtocol,
                           "the stream ended inside a line: " + Excerpt(pending_));
    }
    if (!exit.is_object()) {
      return airlock::Fail(ErrorCode::kProtocol, "the stream ended without an exit event");
    }
    if (exit.value("exit_code", json()) != json(0)) {
      return airlock::Fail(ErrorCode::kInternal, "the command did not exit 0: " + exit.dump() +
                                                     "; stderr: " + Excerpt(stderr_head));
    }
    if (exit.value("truncated", json()) != json(false)) {
      return airlock::Fail(ErrorCode::kInternal, "the exit event says truncated: " + exit.dump());
    }
    return {};
  }

  uint64_t wire_bytes = 0;    // the HTTP body (NDJSON)
  uint64_t stdout_bytes = 0;  // decoded
  uint64_t stderr_bytes = 0;
  uint64_t base64_bytes = 0;  // decoded bytes that came as base64
  uint64_t events = 0;
  double client_us = 0;                           // spent here, splitting, parsing and decoding
  std::optional<Clock::time_point> first_stdout;  // when the first stdout event was decoded
  std::string stdout_head, stderr_head;           // the first bytes of each, for messages
  json exit;                                      // the exit event, once it came
  std::string problem;                            // the first thing wrong with the stream

 private:
  void Event(std::string_view line) {
    json event = json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!event.is_object()) {
      problem = "a stream line is not a JSON object: " + Excerpt(line);
      return;
    }
    ++events;
    const std::string type = Text(event, "type");
    if (type == "stdout" || type == "stderr") {
      auto data = event.find("data");
      if (data == event.end() || !data->is_string()) {
        problem = "a " + type + " event without data: " + Excerpt(line);
        return;
      }
      const std::string& text = data->get_ref<const std::string&>();
      const std::string encoding = Text(event, "data_encoding");
      std::string decoded;
      std::string_view bytes;
      if (encoding == "base64") {
        auto d = airlock::api::Base64Decode(text);
        if (!d) {
          problem = "a " + type + " event's base64: " + d.error().message();
          return;
        }
        decoded = std::move(*d);
        bytes = decoded;
        base64_bytes += bytes.size();
      } else if (encoding == "utf-8") {
        bytes = text;
      } else {
        problem = "a " + type + " event's data_encoding is '" + encoding + "'";
        return;
      }
      const bool out = type == "stdout";
      std::string& head = out ? stdout_head : stderr_head;
      if (head.size() < 512) head.append(bytes.substr(0, 512 - head.size()));
      (out ? stdout_bytes : stderr_bytes) += bytes.size();
      if (out && !first_stdout) first_stdout = Clock::now();
    } else if (type == "exit") {
      exit = std::move(event);
    } else if (type == "error") {
      const json err = event.value("error", json::object());
      problem = "error event: " + Text(err, "code") + ": " + Text(err, "message");
    }
    // "start", and event types this benchmark does not know: nothing to count.
  }

  std::string pending_;  // the start of a line not yet complete
  size_t scanned_ = 0;   // pending_ holds no newline before this
};

std::string DescribeReply(const airlock::client::HttpResponse& r) {
  return "HTTP " + std::to_string(r.status) + ": " + Excerpt(r.body, 300);
}

// ---- the sandbox -------------------------------------------------------------------------------

// One sandbox with default limits, deleted when this goes out of scope (or by Delete).
class Sandbox {
 public:
  explicit Sandbox(HttpClient& http) : http_(http) {}
  Sandbox(const Sandbox&) = delete;
  Sandbox& operator=(const Sandbox&) = delete;
  ~Sandbox() {
    if (auto st = Delete(); !st)
      std::fprintf(stderr, "%s: %s\n", kTag, st.error().message().c_str());
  }

  [[nodiscard]] Status Create() {
    auto created = http_.Request("POST", "/v1/sandboxes", "{}");
    if (!created) return std::unexpected(created.error());
    json doc = json::parse(created->body, nullptr, /*allow_exceptions=*/false);
    if (created->status != 201 || Text(doc, "id").empty()) {
      return airlock::Fail(
          ErrorCode::kInternal,
          "creating a sandbox: expected 201 with an id, got " + DescribeReply(*created));
    }
    id_ = Text(doc, "id");
    limits_ = doc.value("limits", json::object());
    return {};
  }

  // DELETE; does nothing if there is no sandbox (any more).
  [[nodiscard]] Status Delete() {
    if (id_.empty()) return {};
    const std::string id = std::exchange(id_, "");
    auto deleted = http_.Request("DELETE", "/v1/sandboxes/" + id);
    if (!deleted) return std::unexpected(deleted.error().Wrap("deleting " + id));
    if (deleted->status != 204) {
      return airlock::Fail(ErrorCode::kInternal,
                           "deleting " + id + ": expected 204, got " + DescribeReply(*deleted));
    }
    return {};
  }

  std::string exec_target() const { return "/v1/sandboxes/" + id_ + "/exec"; }
  const json& limits() const { return limits_; }

 private:
  HttpClient& http_;
  std::string id_;
  json limits_;
};

// ---- throughput --------------------------------------------------------------------------------

enum class Source { kZero, kText, kRandom };
enum class Kind { kStream, kPlain, kHostPipe };

// One throughput case: a command's stdout streamed or returned whole, or the host pipe.
struct Case {
  std::string name;
  Kind kind;
  Source source;
  uint64_t bytes;
  std::vector<double> us;  // one per repetition: request sent to the last byte decoded
  uint64_t wire_bytes = 0, base64_bytes = 0, events = 0;  // sums over the repetitions
  double client_us = 0;
};

// The request that makes the sandbox write `bytes` of `source` to stdout.
std::string ExecBody(Source source, uint64_t bytes, bool stream) {
  const std::string n = std::to_string(bytes);
  json body;
  switch (source) {
    case Source::kZero:
      body["argv"] = {"head", "-c", n, "/dev/zero"};
      break;
    case Source::kText:
      body["cmd"] = std::string("yes ") + kTextLine + " | head -c " + n;
      break;
    case Source::kRandom:
      body["argv"] = {"head", "-c", n, "/dev/urandom"};
      break;
  }
  body["timeout_seconds"] = 3600;
  if (stream) body["stream"] = true;
  return body.dump();
}

struct RunResult {
  double us = 0;
  uint64_t wire_bytes = 0, base64_bytes = 0, events = 0;
  double client_us = 0;
};

std::unexpected<airlock::Error> WrongCount(const char* what, uint64_t got, uint64_t want) {
  return airlock::Fail(ErrorCode::kInternal, std::string(what) + ": got " + std::to_string(got) +
                                                 " bytes, expected " + std::to_string(want));
}

Result<RunResult> RunStream(HttpClient& http, const std::string& target, Source source,
                            uint64_t bytes) {
  StreamReader reader;
  const std::string body = ExecBody(source, bytes, /*stream=*/true);
  const auto t0 = Clock::now();
  auto reply = http.RequestStreamed("POST", target, body,
                                    [&](std::string_view piece) { reader.Feed(piece); });
  const auto t1 = Clock::now();
  if (!reply) return std::unexpected(reply.error());
  if (reply->status != 200) {
    return airlock::Fail(ErrorCode::kInternal, "streamed exec: " + DescribeReply(*reply));
  }
  if (auto st = reader.Check(); !st) return std::unexpected(st.error());
  if (reader.stdout_bytes != bytes)
    return WrongCount("stdout streamed", reader.stdout_bytes, bytes);
  return RunResult{Us(t0, t1), reader.wire_bytes, reader.base64_bytes, reader.events,
                   reader.client_us};
}

Result<RunResult> RunPlain(HttpClient& http, const std::string& target, Source source,
                           uint64_t bytes) {
  const std::string body = ExecBody(source, bytes, /*stream=*/false);
  const auto t0 = Clock::now();
  auto reply = http.Request("POST", target, body);
  const auto t1 = Clock::now();
  if (!reply) return std::unexpected(reply.error());
  if (reply->status != 200) {
    return airlock::Fail(ErrorCode::kInternal, "plain exec: " + DescribeReply(*reply));
  }
  json doc = json::parse(reply->body, nullptr, /*allow_exceptions=*/false);
  const std::string encoding = Text(doc, "stdout_encoding");
  if (!doc.is_object() || !doc.contains("stdout") || !doc["stdout"].is_string()) {
    return airlock::Fail(ErrorCode::kProtocol, "plain exec: no stdout in " + Excerpt(reply->body));
  }
  uint64_t got = 0, base64 = 0;
  if (encoding == "base64") {
    auto decoded = airlock::api::Base64Decode(doc["stdout"].get_ref<const std::string&>());
    if (!decoded) return std::unexpected(decoded.error().Wrap("plain exec's stdout"));
    got = base64 = decoded->size();
  } else {
    got = doc["stdout"].get_ref<const std::string&>().size();
  }
  const auto t2 = Clock::now();
  if (doc.value("exit_code", json()) != json(0) || doc.value("truncated", json()) != json(false)) {
    return airlock::Fail(ErrorCode::kInternal,
                         "plain exec: expected exit code 0, not truncated; got exit_code " +
                             doc.value("exit_code", json()).dump() + ", truncated " +
                             doc.value("truncated", json()).dump() + ", stderr " +
                             Excerpt(Text(doc, "stderr")));
  }
  if (got != bytes) return WrongCount("plain exec's stdout", got, bytes);
  return RunResult{Us(t0, t2), reply->body.size(), base64, 1, Us(t1, t2)};
}

std::string HostBinary(const std::string& name) {
  const std::string usr = "/usr/bin/" + name;
  return ::access(usr.c_str(), X_OK) == 0 ? usr : "/bin/" + name;
}

// Forks and execs `argv` with stdin and stdout as given (-1: inherited); the pid, or -1.
pid_t Spawn(const std::vector<std::string>& args, int in, int out) {
  std::vector<std::string> copy = args;  // built before the fork
  std::vector<char*> argv;
  for (auto& a : copy) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = ::fork();
  if (pid == 0) {
    if (in >= 0) ::dup2(in, STDIN_FILENO);
    if (out >= 0) ::dup2(out, STDOUT_FILENO);
    ::execve(argv[0], argv.data(), environ);
    ::_exit(127);
  }
  return pid;
}

Status WaitOk(pid_t pid, const std::string& what) {
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) return airlock::FailErrno("waitpid " + what, errno);
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    return airlock::Fail(ErrorCode::kInternal,
                         what + " ended with wait status " + std::to_string(status));
  }
  return {};
}

// `bytes` written into a host `cat` and read back, through two pipes, from this one thread;
// timed from the fork to cat's exit.
Result<RunResult> RunHostPipe(uint64_t bytes) {
  std::string piece;
  while (piece.size() < kPiece) piece += std::string(kTextLine) + "\n";
  piece.resize(kPiece);
  std::vector<char> buffer(kPiece);
  const auto t0 = Clock::now();
  int to_cat[2], from_cat[2];
  if (::pipe2(to_cat, O_CLOEXEC) != 0) return airlock::FailErrno("pipe2", errno);
  if (::pipe2(from_cat, O_CLOEXEC) != 0) {
    const int e = errno;
    ::close(to_cat[0]);
    ::close(to_cat[1]);
    return airlock::FailErrno("pipe2", e);
  }
  const pid_t pid = Spawn({HostBinary("cat")}, to_cat[0], from_cat[1]);
  const int spawn_errno = errno;
  ::close(to_cat[0]);
  ::close(from_cat[1]);
  int writer = to_cat[1], reader = from_cat[0];
  if (pid < 0) {
    ::close(writer);
    ::close(reader);
    return airlock::FailErrno("fork", spawn_errno);
  }
  ::fcntl(writer, F_SETFL, O_NONBLOCK);
  uint64_t sent = 0, got = 0;
  Status ok;  // until something fails
  while (ok) {
    pollfd fds[2] = {{reader, POLLIN, 0}, {writer, POLLOUT, 0}};
    if (::poll(fds, writer >= 0 ? 2 : 1, -1) < 0) {
      if (errno != EINTR) ok = airlock::FailErrno("poll", errno);
      continue;
    }
    if (writer >= 0 && (fds[1].revents & (POLLOUT | POLLERR | POLLHUP))) {
      const size_t want = static_cast<size_t>(std::min<uint64_t>(kPiece, bytes - sent));
      ssize_t n = ::write(writer, piece.data(), want);
      if (n < 0 && errno != EAGAIN && errno != EINTR) {
        ok = airlock::FailErrno("writing to cat", errno);
      } else if (n > 0) {
        sent += static_cast<uint64_t>(n);
      }
      if (sent == bytes) {
        ::close(writer);
        writer = -1;
      }
    }
    if (fds[0].revents & (POLLIN | POLLHUP | POLLERR)) {
      ssize_t n = ::read(reader, buffer.data(), buffer.size());
      if (n < 0 && errno != EINTR) ok = airlock::FailErrno("reading from cat", errno);
      if (n == 0) break;
      if (n > 0) got += static_cast<uint64_t>(n);
    }
  }
  if (writer >= 0) ::close(writer);
  ::close(reader);
  Status waited = WaitOk(pid, "cat");
  const auto t1 = Clock::now();
  if (!ok) return std::unexpected(ok.error());
  if (!waited) return std::unexpected(waited.error());
  if (got != bytes) return WrongCount("host pipe through cat", got, bytes);
  return RunResult{Us(t0, t1), got, 0, 0, 0};
}

// ---- first byte --------------------------------------------------------------------------------

constexpr char kEchoOutput[] = "hi\n";

// A streamed `echo hi`: microseconds to the first stdout event, and to the end of the stream.
Result<std::pair<double, double>> StreamEcho(HttpClient& http, const std::string& target) {
  StreamReader reader;
  const auto t0 = Clock::now();
  auto reply = http.RequestStreamed("POST", target, R"({"stream":true,"argv":["echo","hi"]})",
                                    [&](std::string_view piece) { reader.Feed(piece); });
  const auto t1 = Clock::now();
  if (!reply) return std::unexpected(reply.error());
  if (reply->status != 200) {
    return airlock::Fail(ErrorCode::kInternal, "streamed echo: " + DescribeReply(*reply));
  }
  if (auto st = reader.Check(); !st) return std::unexpected(st.error().Wrap("streamed echo"));
  if (reader.stdout_head != kEchoOutput || !reader.first_stdout) {
    return airlock::Fail(ErrorCode::kInternal,
                         "streamed echo: stdout was '" + Excerpt(reader.stdout_head) + "'");
  }
  return std::pair{Us(t0, *reader.first_stdout), Us(t0, t1)};
}

// A plain `echo hi`: microseconds for the whole round trip.
Result<double> PlainEcho(HttpClient& http, const std::string& target) {
  const auto t0 = Clock::now();
  auto reply = http.Request("POST", target, R"({"argv":["echo","hi"]})");
  const auto t1 = Clock::now();
  if (!reply) return std::unexpected(reply.error());
  json doc = json::parse(reply->body, nullptr, /*allow_exceptions=*/false);
  if (reply->status != 200 || Text(doc, "stdout") != kEchoOutput ||
      doc.value("exit_code", json()) != json(0)) {
    return airlock::Fail(ErrorCode::kInternal,
                         "plain echo: expected 200 with stdout 'hi', got " + DescribeReply(*reply));
  }
  return Us(t0, t1);
}

// fork+exec of /bin/echo hi on the host: microseconds to the first byte read from its pipe.
Result<double> HostEcho() {
  const auto t0 = Clock::now();
  int out[2];
  if (::pipe2(out, O_CLOEXEC) != 0) return airlock::FailErrno("pipe2", errno);
  const pid_t pid = Spawn({HostBinary("echo"), "hi"}, -1, out[1]);
  const int spawn_errno = errno;
  ::close(out[1]);
  if (pid < 0) {
    ::close(out[0]);
    return airlock::FailErrno("fork", spawn_errno);
  }
  std::string got;
  std::optional<Clock::time_point> first;
  char buf[64];
  while (true) {
    ssize_t n = ::read(out[0], buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    if (!first) first = Clock::now();
    got.append(buf, static_cast<size_t>(n));
  }
  ::close(out[0]);
  if (auto st = WaitOk(pid, "/bin/echo"); !st) return std::unexpected(st.error());
  if (got != kEchoOutput || !first) {
    return airlock::Fail(ErrorCode::kInternal, "host echo printed '" + Excerpt(got) + "'");
  }
  return Us(t0, *first);
}

// ---- the run -----------------------------------------------------------------------------------

std::string LoadAverage() {
  std::ifstream in("/proc/loadavg");
  std::string one, five, fifteen;
  in >> one >> five >> fifteen;
  return one + " " + five + " " + fifteen;
}

// MB/s (10^6 bytes per second) of `bytes` in `us` microseconds.
double MBps(uint64_t bytes, double us) { return us > 0 ? static_cast<double>(bytes) / us : 0; }

struct Throughput {
  const Case* c;
  b::Summary duration;
  double p50 = 0, min = 0, max = 0;  // MB/s at the p50, the slowest, the fastest duration
  std::optional<double> vs_host;     // p50 MB/s over the host pipe's at the same size
};

std::vector<Throughput> SummarizeCases(const std::vector<Case>& cases) {
  std::vector<Throughput> out;
  for (const auto& c : cases) {
    Throughput t{&c, b::Summarize(c.name + " " + std::to_string(c.bytes / kMiB) + " MiB", c.us)};
    t.p50 = MBps(c.bytes, t.duration.p50);
    t.min = MBps(c.bytes, t.duration.max);
    t.max = MBps(c.bytes, t.duration.min);
    out.push_back(std::move(t));
  }
  for (auto& t : out) {
    for (const auto& host : out) {
      if (host.c->kind == Kind::kHostPipe && host.c->bytes == t.c->bytes && host.p50 > 0 &&
          t.c->kind != Kind::kHostPipe) {
        t.vs_host = t.p50 / host.p50;
      }
    }
  }
  return out;
}

void PrintThroughput(const std::vector<Throughput>& rows) {
  std::printf("%-30s %6s %5s %9s %9s %9s %8s %7s %8s %8s\n", "throughput", "MiB", "n", "p50 MB/s",
              "min MB/s", "max MB/s", "p50 s", "wire/B", "client%", "vs host");
  for (const auto& t : rows) {
    const Case& c = *t.c;
    const double total_bytes = static_cast<double>(c.bytes) * static_cast<double>(c.us.size());
    double total_us = 0;
    for (double us : c.us) total_us += us;
    std::string wire = "-", client = "-", ratio = "-";
    char buf[32];
    if (c.kind != Kind::kHostPipe && total_bytes > 0) {
      std::snprintf(buf, sizeof buf, "%.2f", static_cast<double>(c.wire_bytes) / total_bytes);
      wire = buf;
      std::snprintf(buf, sizeof buf, "%.0f", total_us > 0 ? 100 * c.client_us / total_us : 0);
      client = buf;
    }
    if (t.vs_host) {
      std::snprintf(buf, sizeof buf, "%.3fx", *t.vs_host);
      ratio = buf;
    }
    std::printf("%-30s %6llu %5zu %9.1f %9.1f %9.1f %8.3f %7s %8s %8s\n", c.name.c_str(),
                static_cast<unsigned long long>(c.bytes / kMiB), c.us.size(), t.p50, t.min, t.max,
                t.duration.p50 / 1e6, wire.c_str(), client.c_str(), ratio.c_str());
  }
}

json ThroughputJson(const Throughput& t) {
  const Case& c = *t.c;
  const double total_bytes = static_cast<double>(c.bytes) * static_cast<double>(c.us.size());
  double total_us = 0;
  for (double us : c.us) total_us += us;
  static constexpr const char* kKinds[] = {"stream", "plain", "host_pipe"};
  json doc = {{"name", c.name},        {"kind", kKinds[static_cast<int>(c.kind)]},
              {"bytes", c.bytes},      {"n", c.us.size()},
              {"mb_per_s_p50", t.p50}, {"mb_per_s_min", t.min},
              {"mb_per_s_max", t.max}, {"duration", json::parse(b::Json(t.duration))}};
  if (c.kind != Kind::kHostPipe && total_bytes > 0) {
    doc["wire_bytes_per_byte"] = static_cast<double>(c.wire_bytes) / total_bytes;
    doc["base64_share"] = static_cast<double>(c.base64_bytes) / total_bytes;
    doc["events_per_run"] = static_cast<double>(c.events) / static_cast<double>(c.us.size());
    doc["client_share"] = total_us > 0 ? c.client_us / total_us : 0;
  }
  if (t.vs_host) doc["ratio_p50_vs_host_pipe"] = *t.vs_host;
  return doc;
}

int Run(const Flags& flags) {
  const std::string load_before = LoadAverage();
  b::ScratchDir scratch(kTag);  // declared first: removed after the daemon is gone
  if (auto st = scratch.Make(); !st) {
    std::fprintf(stderr, "%s: %s\n", kTag, st.error().message().c_str());
    return 1;
  }
  b::DaemonProcess daemon(kTag, g_interrupted);
  if (auto st = daemon.Start(scratch.path() + "/daemon", scratch.path() + "/airlockd.log"); !st) {
    std::fprintf(stderr, "%s: starting airlockd: %s\n--- airlockd log ---\n%s", kTag,
                 st.error().message().c_str(), daemon.LogTail().c_str());
    return g_interrupted.load() ? 130 : 1;
  }
  auto http = HttpClient::Open(daemon.url());
  if (!http) {
    std::fprintf(stderr, "%s: %s\n", kTag, http.error().message().c_str());
    return 1;
  }
  http->set_timeout(std::chrono::minutes(10));
  Sandbox sandbox(*http);  // deleted before the daemon stops, on every path
  auto fail = [&](const std::string& what, const airlock::Error& error) {
    std::fprintf(stderr, "%s: %s: %s\n--- end of airlockd log ---\n%s---\n", kTag, what.c_str(),
                 error.message().c_str(), daemon.LogTail().c_str());
    return 1;
  };
  if (auto st = sandbox.Create(); !st) return fail("creating the sandbox", st.error());
  const std::string target = sandbox.exec_target();

  const uint64_t big = static_cast<uint64_t>(flags.mib) * kMiB;
  const uint64_t small = static_cast<uint64_t>(flags.plain_mib) * kMiB;
  std::vector<Case> cases = {
      {"stream /dev/zero", Kind::kStream, Source::kZero, big},
      {"stream text (yes)", Kind::kStream, Source::kText, big},
      {"stream /dev/urandom", Kind::kStream, Source::kRandom, big},
      {"host pipe (cat)", Kind::kHostPipe, Source::kText, big},
      {"stream text (yes)", Kind::kStream, Source::kText, small},
      {"plain exec text (yes)", Kind::kPlain, Source::kText, small},
      {"host pipe (cat)", Kind::kHostPipe, Source::kText, small},
  };
  auto run_case = [&](const Case& c, uint64_t bytes) -> Result<RunResult> {
    switch (c.kind) {
      case Kind::kStream:
        return RunStream(*http, target, c.source, bytes);
      case Kind::kPlain:
        return RunPlain(*http, target, c.source, bytes);
      case Kind::kHostPipe:
        break;
    }
    return RunHostPipe(bytes);
  };
  auto case_name = [](const Case& c, uint64_t bytes) {
    return c.name + " (" + std::to_string(bytes) + " bytes)";
  };

  // Throughput: a warm-up run of each case (at most plain-mib), then the repetitions, the
  // order rotated each time.
  std::fprintf(stderr, "%s: throughput, %d repetitions of %zu cases (%d MiB streamed)...\n", kTag,
               flags.repetitions, cases.size(), flags.mib);
  if (flags.warmup > 0) {
    for (const auto& c : cases) {
      const uint64_t bytes = std::min(c.bytes, small);
      if (g_interrupted.load()) return 130;
      if (auto r = run_case(c, bytes); !r) return fail(case_name(c, bytes), r.error());
    }
  }
  for (int rep = 0; rep < flags.repetitions; ++rep) {
    for (size_t k = 0; k < cases.size(); ++k) {
      if (g_interrupted.load()) return 130;
      Case& c = cases[(k + static_cast<size_t>(rep)) % cases.size()];
      auto r = run_case(c, c.bytes);
      if (!r) return fail(case_name(c, c.bytes), r.error());
      c.us.push_back(r->us);
      c.wire_bytes += r->wire_bytes;
      c.base64_bytes += r->base64_bytes;
      c.events += r->events;
      c.client_us += r->client_us;
    }
  }

  // First byte: the three kinds interleaved, the order rotated.
  std::fprintf(stderr, "%s: first byte, %d iterations (after %d warm-up)...\n", kTag,
               flags.iterations, flags.warmup);
  std::vector<double> stream_first, stream_whole, plain_whole, host_first;
  auto stream_echo = [&]() -> Status {
    auto r = StreamEcho(*http, target);
    if (!r) return std::unexpected(r.error());
    stream_first.push_back(r->first);
    stream_whole.push_back(r->second);
    return {};
  };
  auto plain_echo = [&]() -> Status {
    auto r = PlainEcho(*http, target);
    if (!r) return std::unexpected(r.error());
    plain_whole.push_back(*r);
    return {};
  };
  auto host_echo = [&]() -> Status {
    auto r = HostEcho();
    if (!r) return std::unexpected(r.error());
    host_first.push_back(*r);
    return {};
  };
  const std::function<Status()> kinds[] = {stream_echo, plain_echo, host_echo};
  for (int i = 0; i < flags.warmup + flags.iterations; ++i) {
    for (int k = 0; k < 3; ++k) {
      if (g_interrupted.load()) return 130;
      if (auto st = kinds[(k + i) % 3](); !st) return fail("echo hi", st.error());
    }
    if (i + 1 == flags.warmup) {
      stream_first.clear();
      stream_whole.clear();
      plain_whole.clear();
      host_first.clear();
    }
  }

  if (auto st = sandbox.Delete(); !st) return fail("deleting the sandbox", st.error());
  if (auto st = daemon.Stop(); !st) return fail("stopping airlockd", st.error());
  const std::string load_after = LoadAverage();

  const auto rows = SummarizeCases(cases);
  const b::Summary s_first = b::Summarize("stream echo hi: first stdout event", stream_first);
  const b::Summary s_whole = b::Summarize("stream echo hi: whole stream", stream_whole);
  const b::Summary p_whole = b::Summarize("plain exec echo hi: round trip", plain_whole);
  const b::Summary h_first = b::Summarize("host fork+exec echo: first byte", host_first);

  std::printf(
      "airlock-bench-stream: one sandbox (limits %s), %u cpus, load average %s before, %s "
      "after\n\n",
      sandbox.limits().dump().c_str(), std::thread::hardware_concurrency(), load_before.c_str(),
      load_after.c_str());
  PrintThroughput(rows);
  std::printf(
      "\nMB/s = 10^6 bytes/s at the p50 (min: slowest, max: fastest) of %d runs, from sending the "
      "request to the last byte decoded; wire/B: HTTP body bytes per output byte; client%%: time "
      "in this process's NDJSON parsing and decoding; vs host: p50 MB/s over the host pipe's at "
      "the same size\n\n",
      flags.repetitions);
  b::PrintHeader();
  for (const auto* s : {&s_first, &s_whole, &p_whole, &h_first}) b::Print(*s);
  const double r_host50 = s_first.p50 / h_first.p50, r_host99 = s_first.p99 / h_first.p99;
  const double r_plain50 = s_first.p50 / p_whole.p50, r_plain99 = s_first.p99 / p_whole.p99;
  std::printf("\nratio stream first stdout / host first byte: p50 %.2fx, p99 %.2fx\n", r_host50,
              r_host99);
  std::printf("ratio stream first stdout / plain exec round trip: p50 %.2fx, p99 %.2fx\n",
              r_plain50, r_plain99);

  if (!flags.json_path.empty()) {
    json throughput = json::array(), results = json::array();
    for (const auto& t : rows) {
      throughput.push_back(ThroughputJson(t));
      results.push_back(json::parse(b::Json(t.duration)));
    }
    for (const auto* s : {&s_first, &s_whole, &p_whole, &h_first})
      results.push_back(json::parse(b::Json(*s)));
    json doc = {{"benchmark", "stream"},
                {"quick", flags.quick},
                {"stream_bytes", big},
                {"plain_bytes", small},
                {"repetitions", flags.repetitions},
                {"iterations", flags.iterations},
                {"warmup", flags.warmup},
                {"cpus", std::thread::hardware_concurrency()},
                {"sandbox_limits", sandbox.limits()},
                {"load_average_before", load_before},
                {"load_average_after", load_after},
                {"throughput", std::move(throughput)},
                {"results", std::move(results)},
                {"ratio_p50_first_byte_stream_vs_host", r_host50},
                {"ratio_p99_first_byte_stream_vs_host", r_host99},
                {"ratio_p50_first_byte_stream_vs_plain_round_trip", r_plain50},
                {"ratio_p99_first_byte_stream_vs_plain_round_trip", r_plain99}};
    if (!WriteResults(kTag, flags.json_path, doc.dump())) return 1;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  auto flags = ParseFlags(argc, argv);
  if (!flags) {
    std::fprintf(stderr,
                 "airlock-bench-stream: %s\nusage: airlock-bench-stream [--quick] [--mib N] "
                 "[--plain-mib N] [--repetitions N] [--iterations N] [--warmup N] [--json FILE]\n",
                 flags.error().message().c_str());
    return 2;
  }
  if (::geteuid() != 0) {
    std::fprintf(stderr, "airlock-bench-stream: needs root (airlockd does)\n");
    return 1;
  }
  InstallSignalHandlers(kTag);
  return Run(*flags);
}
