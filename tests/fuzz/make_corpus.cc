// Writes the seed corpus for protocol_decoder_fuzz into the directory given as argv[1]:
// one seed per message type (a hello frame, then a frame of that type) and a few exchanges
// that walk a stream through its life. Each seed starts with the byte the fuzz target reads as
// its split position (see protocol_decoder_fuzz.cc).
//
//   airlock_make_corpus tests/fuzz/corpus/protocol_decoder

#include <cerrno>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "protocol/messages.h"

namespace airlock::protocol {
namespace {

struct Seed {
  std::string name;
  uint8_t split;  // where the fuzz target splits the frames into two Feed calls (of 255)
  std::vector<std::pair<uint32_t, Message>> frames;
};

const Hello kHello{kProtocolVersion, "airlock-agent 0.1.0 (git 0123456789ab)", 0};

FileInfo Info(std::string name, FileType type) {
  return FileInfo{.name = std::move(name),
                  .type = type,
                  .mode = type == FileType::kDirectory ? 0755u : 0644u,
                  .size = 1234,
                  .mtime_ns = 1700000000123456789,
                  .uid = 1000,
                  .gid = 1000,
                  .link_target = type == FileType::kSymlink ? "target" : ""};
}

std::vector<Seed> Seeds() {
  const Exec pipe_exec{.argv = {"/bin/cat", "-"},
                       .cwd = "/tmp",
                       .env = {"LANG=C.UTF-8"},
                       .stdin_mode = StdinMode::kPipe,
                       .timeout_ms = 10000};
  const Exec pty_exec{.shell = "stty size; sleep 5",
                      .user = "nobody",
                      .stdin_mode = StdinMode::kPipe,
                      .pty = true,
                      .pty_rows = 24,
                      .pty_cols = 80};
  const Exited exited_ok{.exit_code = 0, .duration_us = 1500, .stdout_bytes = 6};
  const Exited killed{.exit_code = -1, .term_signal = 9, .duration_us = 5000000, .timed_out = true};
  const ErrorMsg not_found{ErrorCode::kNotFound, ENOENT, "opening /nope: ENOENT"};

  // One seed per message type: hello, then that message where it would be sent.
  const std::pair<uint32_t, Message> singles[] = {
      {0, kHello},  // a second hello: rejected by the rules, but a valid frame
      {0, Ping{42}},
      {0, Pong{42}},
      {1, pipe_exec},
      {1, FileWrite{"/tmp/upload.bin", 0600, true, false}},
      {1, FileRead{"/etc/hostname", 0, 0}},
      {1, Stat{"/etc"}},
      {1, List{"/home"}},
      {1, Remove{"/tmp/old", true}},
      {1, Mkdir{"/tmp/a/b", 0750, true}},
      {1, StdinData{"input line\n"}},
      {1, StdinClose{}},
      {1, Signal{15}},
      {1, Resize{40, 120}},
      {1, Started{1234}},
      {1, Output{OutputFd::kStderr, "warning\n"}},
      {1, exited_ok},
      {1, Data{std::string("\177ELF\0\1\2", 7)}},
      {1, DataEnd{}},
      {1, StatResult{Info("/etc", FileType::kDirectory)}},
      {1, Entries{{Info("a.txt", FileType::kFile), Info("lib", FileType::kSymlink)}}},
      {1, Done{7}},
      {1, Attach{.pid = 77, .output = AttachOutput::kReplay, .follow = true}},
      {1, ProcList{}},
      {1, Quiesce{"/.airlock/run/wake"}},
      {1, Detach{}},
      {1, Attached{.pid = 77, .background = true, .stdin_open = true, .running = true}},
      {1, Dropped{4096}},
      {1, Processes{{ProcessInfo{.pid = 77, .command = "python3 -m http.server", .background = true,
                                 .running = true, .started_unix_ms = 1700000000000}}}},
      {0, ErrorMsg{ErrorCode::kProtocol, 0, "malformed exec frame: payload ends early"}},
  };
  std::vector<Seed> seeds;
  for (const auto& [stream, msg] : singles) {
    seeds.push_back({std::string(MsgTypeName(TypeOf(msg))), 128, {{0, kHello}, {stream, msg}}});
  }

  // Whole exchanges, both directions in one transcript.
  seeds.push_back({"seq_exec_stdin",
                   0,
                   {{0, kHello}, {1, pipe_exec}, {1, StdinData{"hello\n"}}, {1, StdinClose{}}}});
  seeds.push_back({"seq_exec_run",
                   200,
                   {{0, kHello},
                    {1, pipe_exec},
                    {1, Started{77}},
                    {1, StdinData{"hello\n"}},
                    {1, StdinClose{}},
                    {1, Output{OutputFd::kStdout, "hello\n"}},
                    {1, Output{OutputFd::kStderr, ""}},
                    {1, exited_ok}}});
  seeds.push_back({"seq_exec_pty_killed",
                   37,
                   {{0, kHello},
                    {3, pty_exec},
                    {3, Started{78}},
                    {3, Resize{50, 132}},
                    {3, Output{OutputFd::kStdout, "50 132\r\n"}},
                    {3, Signal{9}},
                    {3, killed},
                    {3, StdinData{"late\n"}},
                    {3, Signal{9}}}});
  seeds.push_back({"seq_background_attach",
                   99,
                   {{0, kHello},
                    {1, Exec{.shell = "server", .stdin_mode = StdinMode::kPipe, .background = true,
                             .ring_bytes = 65536}},
                    {1, Started{80}},
                    {2, Attach{.pid = 80, .output = AttachOutput::kReplay}},
                    {2, Attached{.pid = 80, .background = true, .stdin_open = true, .running = true}},
                    {2, Dropped{100}},
                    {2, StdinData{"quit\n"}},
                    {2, Output{OutputFd::kStdout, "bye\n"}},
                    {2, Detach{}},
                    {2, Done{4}},
                    {3, ProcList{}},
                    {3, Processes{}},
                    {3, Done{0}}}});
  seeds.push_back({"seq_file_upload",
                   255,
                   {{0, kHello},
                    {1, FileWrite{"/tmp/up", 0644, false, false}},
                    {1, Data{std::string(300, 'u')}},
                    {1, Data{"tail"}},
                    {1, DataEnd{}},
                    {1, Done{304}}}});
  seeds.push_back({"seq_file_upload_failed",
                   90,
                   {{0, kHello},
                    {1, FileWrite{"/ro/up", 0644, false, true}},
                    {1, Data{"part"}},
                    {1, ErrorMsg{ErrorCode::kPermissionDenied, EROFS, "opening /ro/up: EROFS"}},
                    {1, Data{"late"}},
                    {1, DataEnd{}}}});
  seeds.push_back({"seq_file_download",
                   60,
                   {{0, kHello},
                    {1, FileRead{"/etc/os-release", 10, 100}},
                    {1, Data{"Debian"}},
                    {1, Done{6}}}});
  seeds.push_back(
      {"seq_list_stat",
       150,
       {{0, kHello},
        {1, List{"/"}},
        {2, Stat{"/bin"}},
        {1, Entries{{Info("bin", FileType::kSymlink), Info("etc", FileType::kDirectory)}}},
        {2, StatResult{Info("/bin", FileType::kSymlink)}},
        {1, Entries{{Info("x", FileType::kOther)}}},
        {1, Done{3}}}});
  seeds.push_back({"seq_mkdir_remove_error",
                   20,
                   {{0, kHello},
                    {1, Mkdir{"/tmp/d", 0700, false}},
                    {1, Done{1}},
                    {2, Remove{"/nope", false}},
                    {2, not_found}}});
  seeds.push_back({"seq_interleaved",
                   100,
                   {{0, kHello},
                    {1, pipe_exec},
                    {2, FileRead{"/etc/hosts", 0, 0}},
                    {0, Ping{1}},
                    {1, Started{10}},
                    {2, Data{"127.0.0.1 localhost\n"}},
                    {0, Pong{1}},
                    {1, StdinData{"x"}},
                    {2, Done{20}},
                    {1, Output{OutputFd::kStdout, "x"}},
                    {1, StdinClose{}},
                    {1, exited_ok},
                    {5, Stat{"/"}},
                    {5, StatResult{Info("/", FileType::kDirectory)}}}});
  return seeds;
}

bool WriteSeed(const std::filesystem::path& dir, const Seed& seed) {
  std::string bytes(1, static_cast<char>(seed.split));
  for (const auto& [stream, msg] : seed.frames) AppendFrame(bytes, stream, msg);
  std::ofstream out(dir / seed.name, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  out.close();
  if (!out) {
    std::fprintf(stderr, "airlock_make_corpus: writing %s failed\n", (dir / seed.name).c_str());
    return false;
  }
  return true;
}

}  // namespace
}  // namespace airlock::protocol

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s <corpus directory>\n", argv[0]);
    return 2;
  }
  std::filesystem::path dir(argv[1]);
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) {
    std::fprintf(stderr, "airlock_make_corpus: creating %s: %s\n", argv[1], ec.message().c_str());
    return 1;
  }
  auto seeds = airlock::protocol::Seeds();
  for (const auto& seed : seeds) {
    if (!airlock::protocol::WriteSeed(dir, seed)) return 1;
  }
  std::printf("wrote %zu seeds to %s\n", seeds.size(), argv[1]);
  return 0;
}
