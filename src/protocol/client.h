#pragma once
// BlockingClient: a synchronous client for one agent channel, for tests, benchmarks and the
// demo. (The daemon drives channels asynchronously; this one waits.) Not thread-safe.

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "common/error.h"
#include "common/unique_fd.h"
#include "protocol/channel_state.h"
#include "protocol/frame_decoder.h"
#include "protocol/messages.h"

namespace airlock::protocol {

struct ExecResult {
  int32_t pid = 0;
  std::string stdout_data;
  std::string stderr_data;
  Exited exit;  // exit code, signal, duration, flags
};

// An agent process started by this process, serving the other end of `channel` as its fd 3.
struct LocalAgent {
  pid_t pid = -1;
  UniqueFd channel;
};
// Starts `agent_path --fd 3 args...` on a fresh socketpair (demos, benchmarks, tests).
Result<LocalAgent> StartLocalAgent(const std::string& agent_path,
                                   const std::vector<std::string>& args);

class BlockingClient {
 public:
  // Sends hello on `fd` (a connected stream socket) and waits for the agent's.
  static Result<BlockingClient> Connect(UniqueFd fd, std::string build_id = "airlock-test");

  const Hello& peer_hello() const { return peer_hello_; }
  int fd() const { return fd_.get(); }

  // Runs one command to completion; `stdin_data` is sent (and stdin closed) when the request
  // has a stdin pipe. An error the agent returns for the stream comes back as an Error.
  Result<ExecResult> Exec(const protocol::Exec& request, std::string_view stdin_data = {});
  // Starts commands without waiting; WaitAll collects them, keyed by stream id.
  Result<uint32_t> StartExec(const protocol::Exec& request);
  Result<std::map<uint32_t, Result<ExecResult>>> WaitAll(const std::vector<uint32_t>& streams);
  // The next frame for `stream` (started / output / exited / error), as it arrives; frames of
  // other streams read meanwhile are kept for their own callers. For streaming a command.
  // kDeadlineExceeded after `wait` (default: the receive timeout) without one.
  Result<Message> NextFor(uint32_t stream,
                          std::optional<std::chrono::milliseconds> wait = std::nullopt);

  // The agent's process table.
  Result<std::vector<ProcessInfo>> ListProcesses();
  // Opens an attach stream; the agent's kAttached answer comes back with the stream id. Its
  // later frames are read with NextFor; Detach ends it (see messages.h).
  Result<std::pair<uint32_t, Attached>> Attach(const protocol::Attach& request);
  // Sends kDetach and reads the stream to its end (kDone, or kExited if the process ended
  // first); the last message.
  Result<Message> Detach(uint32_t stream);

  Status WriteFile(const std::string& path, std::string_view data, uint32_t mode = 0644,
                   bool create_parents = false);
  Result<std::string> ReadFile(const std::string& path, uint64_t offset = 0, uint64_t length = 0);
  Result<FileInfo> Stat(const std::string& path);
  Result<std::vector<FileInfo>> List(const std::string& path);
  Result<uint64_t> Remove(const std::string& path, bool recursive = false);
  Status Mkdir(const std::string& path, uint32_t mode = 0755, bool parents = false);
  Status Ping(uint64_t nonce);
  // Quiesces the agent (messages.h, Quiesce) and waits until it has closed this channel, the
  // last of its channels to close: on success nothing of the agent's is connected to the host.
  // The client is spent after it.
  Status Quiesce(const std::string& wake_path);

  // Low level, for tests of the agent's handling of bad input.
  uint32_t NextStream() { return ++last_stream_; }
  Status Send(uint32_t stream, const Message& msg);
  Status SendRaw(std::string_view bytes);
  // The next frame from the agent, decoded and checked; an error on timeout (default: the
  // receive timeout below) or end of channel.
  Result<std::pair<uint32_t, Message>> Receive(
      std::optional<std::chrono::milliseconds> timeout = std::nullopt);
  // How long the waiting calls (Exec, WaitAll, file operations, Ping) wait for the agent's next
  // frame before giving up; 60 s unless set. A command may be silent for longer than this only
  // if the caller raises it (e.g. to the command's timeout plus a margin).
  void set_receive_timeout(std::chrono::milliseconds timeout) { receive_timeout_ = timeout; }

 private:
  explicit BlockingClient(UniqueFd fd) : fd_(std::move(fd)) {}
  // Sends everything queued while reading frames, so neither side can block the other.
  Status Flush();
  // Collects a file stream's data/entries until done, or its error.
  Result<uint64_t> FinishFileStream(uint32_t stream, std::string* data,
                                    std::vector<FileInfo>* entries);

  UniqueFd fd_;
  Hello peer_hello_;
  FrameDecoder decoder_;
  ChannelState state_{Role::kDaemon};
  std::string out_;
  uint32_t last_stream_ = 0;
  std::chrono::milliseconds receive_timeout_ = std::chrono::seconds(60);
  // Frames read while waiting for something else, by stream.
  std::map<uint32_t, std::vector<Message>> parked_;
};

}  // namespace airlock::protocol
