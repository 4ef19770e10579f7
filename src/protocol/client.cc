#include "protocol/client.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>

#include "common/syscall.h"

namespace airlock::protocol {
namespace {

constexpr size_t kSendHighWater = 1 << 20;

Error StreamError(const Message& msg) { return FromErrorMsg(std::get<ErrorMsg>(msg)); }

}  // namespace

Result<LocalAgent> StartLocalAgent(const std::string& agent_path,
                                   const std::vector<std::string>& args) {
  std::vector<std::string> argv = {agent_path, "--fd", "3"};
  argv.insert(argv.end(), args.begin(), args.end());
  std::vector<char*> cargv;
  for (auto& a : argv) cargv.push_back(a.data());
  cargv.push_back(nullptr);
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0) {
    return FailErrno("socketpair", errno);
  }
  UniqueFd ours(sv[0]), theirs(sv[1]);
  pid_t pid = ::fork();
  if (pid < 0) return FailErrno("fork", errno);
  if (pid == 0) {
    // dup2 onto itself would leave close-on-exec set.
    if (theirs.get() == 3 ? ::fcntl(3, F_SETFD, 0) < 0 : ::dup2(theirs.get(), 3) < 0) _exit(126);
    ::execv(cargv[0], cargv.data());
    _exit(127);
  }
  return LocalAgent{pid, std::move(ours)};
}

Result<BlockingClient> BlockingClient::Connect(UniqueFd fd, std::string build_id) {
  if (auto st = SetNonBlocking(fd.get(), true); !st) return std::unexpected(st.error());
  BlockingClient client(std::move(fd));
  if (auto st = client.Send(0, Hello{kProtocolVersion, std::move(build_id), 0}); !st) {
    return std::unexpected(st.error());
  }
  auto first = client.Receive(std::chrono::seconds(30));
  if (!first) return std::unexpected(first.error().Wrap("waiting for the agent's hello"));
  client.peer_hello_ = std::get<Hello>(first->second);
  return client;
}

Status BlockingClient::Send(uint32_t stream, const Message& msg) {
  state_.Send(stream, msg);
  AppendFrame(out_, stream, msg);
  while (out_.size() > kSendHighWater) {
    if (auto st = Flush(); !st) return st;
  }
  return Flush();
}

Status BlockingClient::SendRaw(std::string_view bytes) {
  out_.append(bytes);
  return Flush();
}

Status BlockingClient::Flush() {
  while (!out_.empty()) {
    ssize_t n = RetryEintr([&] { return ::write(fd_.get(), out_.data(), out_.size()); });
    if (n > 0) {
      out_.erase(0, static_cast<size_t>(n));
      continue;
    }
    if (errno != EAGAIN) return FailErrno("writing to the agent channel", errno);
    // The agent is not reading: read what it sends meanwhile, so neither side blocks.
    pollfd p{fd_.get(), POLLIN | POLLOUT, 0};
    if (RetryEintr([&] { return ::poll(&p, 1, 60000); }) <= 0) {
      return Fail(ErrorCode::kDeadlineExceeded, "agent channel stayed full for 60 s");
    }
    if (p.revents & POLLIN) {
      char buf[65536];
      ssize_t r = RetryEintr([&] { return ::read(fd_.get(), buf, sizeof buf); });
      if (r > 0) decoder_.Feed(std::string_view(buf, static_cast<size_t>(r)));
      if (r == 0) return Fail(ErrorCode::kUnavailable, "agent closed the channel");
    }
  }
  return {};
}

Result<std::pair<uint32_t, Message>> BlockingClient::Receive(
    std::optional<std::chrono::milliseconds> timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout.value_or(receive_timeout_);
  while (true) {
    auto next = decoder_.Next();
    if (!next) return std::unexpected(next.error());
    if (*next) {
      Frame& f = **next;
      auto msg = DecodeMessage(f.type, f.payload);
      if (!msg) return std::unexpected(msg.error());
      auto verdict = state_.Receive(f.stream, *msg);
      if (!verdict) return std::unexpected(verdict.error());
      return std::make_pair(f.stream, std::move(*msg));
    }
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return Fail(ErrorCode::kDeadlineExceeded, "no frame from the agent");
    pollfd p{fd_.get(), static_cast<short>(POLLIN | (out_.empty() ? 0 : POLLOUT)), 0};
    int r = RetryEintr([&] { return ::poll(&p, 1, static_cast<int>(left.count())); });
    if (r < 0) return FailErrno("poll", errno);
    if (p.revents & POLLOUT) {
      if (auto st = Flush(); !st) return std::unexpected(st.error());
    }
    if (p.revents & (POLLIN | POLLHUP | POLLERR)) {
      char buf[65536];
      ssize_t n = RetryEintr([&] { return ::read(fd_.get(), buf, sizeof buf); });
      if (n < 0 && errno != EAGAIN) return FailErrno("reading the agent channel", errno);
      if (n == 0) return Fail(ErrorCode::kUnavailable, "agent closed the channel");
      if (n > 0) decoder_.Feed(std::string_view(buf, static_cast<size_t>(n)));
    }
  }
}

Result<uint32_t> BlockingClient::StartExec(const protocol::Exec& request) {
  uint32_t stream = NextStream();
  if (auto st = Send(stream, request); !st) return std::unexpected(st.error());
  return stream;
}

Result<ExecResult> BlockingClient::Exec(const protocol::Exec& request,
                                        std::string_view stdin_data) {
  auto stream = StartExec(request);
  if (!stream) return std::unexpected(stream.error());
  if (request.stdin_mode == StdinMode::kPipe) {
    for (size_t off = 0; off < stdin_data.size(); off += kMaxChunk) {
      auto st = Send(*stream, StdinData{std::string(stdin_data.substr(off, kMaxChunk))});
      if (!st) return std::unexpected(st.error());
    }
    if (auto st = Send(*stream, StdinClose{}); !st) return std::unexpected(st.error());
  }
  auto all = WaitAll({*stream});
  if (!all) return std::unexpected(all.error());
  return std::move(all->at(*stream));
}

Result<Message> BlockingClient::NextFor(uint32_t stream,
                                        std::optional<std::chrono::milliseconds> wait) {
  if (auto it = parked_.find(stream); it != parked_.end() && !it->second.empty()) {
    Message msg = std::move(it->second.front());
    it->second.erase(it->second.begin());
    if (it->second.empty()) parked_.erase(it);
    return msg;
  }
  const auto deadline = std::chrono::steady_clock::now() + wait.value_or(receive_timeout_);
  while (true) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    auto got = Receive(std::max(left, std::chrono::milliseconds(0)));
    if (!got) return std::unexpected(got.error());
    auto& [from, msg] = *got;
    if (from == stream) return std::move(msg);
    if (from == 0) {
      if (std::holds_alternative<ErrorMsg>(msg)) return std::unexpected(StreamError(msg));
      continue;
    }
    parked_[from].push_back(std::move(msg));
  }
}

Result<std::map<uint32_t, Result<ExecResult>>> BlockingClient::WaitAll(
    const std::vector<uint32_t>& streams) {
  std::map<uint32_t, ExecResult> pending;
  std::map<uint32_t, Result<ExecResult>> done;
  for (uint32_t s : streams) pending[s];
  auto apply = [&](uint32_t stream, Message& msg) {
    ExecResult& r = pending.at(stream);
    if (auto* started = std::get_if<Started>(&msg)) {
      r.pid = started->pid;
    } else if (auto* out = std::get_if<Output>(&msg)) {
      (out->fd == OutputFd::kStdout ? r.stdout_data : r.stderr_data) += out->data;
    } else if (auto* exited = std::get_if<Exited>(&msg)) {
      r.exit = *exited;
      done.emplace(stream, std::move(r));
      pending.erase(stream);
    } else if (std::holds_alternative<ErrorMsg>(msg)) {
      done.emplace(stream, std::unexpected(StreamError(msg)));
      pending.erase(stream);
    }
  };
  for (uint32_t s : streams) {
    auto it = parked_.find(s);
    if (it == parked_.end()) continue;
    auto msgs = std::move(it->second);
    parked_.erase(it);
    for (auto& m : msgs) {
      if (pending.contains(s)) apply(s, m);
    }
  }
  while (!pending.empty()) {
    auto got = Receive();
    if (!got) return std::unexpected(got.error());
    auto& [stream, msg] = *got;
    if (stream == 0) {
      if (std::holds_alternative<ErrorMsg>(msg)) return std::unexpected(StreamError(msg));
      continue;
    }
    if (pending.contains(stream)) {
      apply(stream, msg);
    } else {
      parked_[stream].push_back(std::move(msg));
    }
  }
  return done;
}

Result<uint64_t> BlockingClient::FinishFileStream(uint32_t stream, std::string* data,
                                                  std::vector<FileInfo>* entries) {
  while (true) {
    Result<std::pair<uint32_t, Message>> got;
    if (auto it = parked_.find(stream); it != parked_.end() && !it->second.empty()) {
      got = std::make_pair(stream, std::move(it->second.front()));
      it->second.erase(it->second.begin());
    } else {
      got = Receive();
    }
    if (!got) return std::unexpected(got.error());
    auto& [s, msg] = *got;
    if (s == 0 && std::holds_alternative<ErrorMsg>(msg)) return std::unexpected(StreamError(msg));
    if (s != stream) {
      if (s != 0) parked_[s].push_back(std::move(msg));
      continue;
    }
    if (auto* d = std::get_if<Data>(&msg); d && data) {
      *data += d->data;
    } else if (auto* e = std::get_if<Entries>(&msg); e && entries) {
      for (auto& info : e->entries) entries->push_back(std::move(info));
    } else if (auto* done = std::get_if<Done>(&msg)) {
      return done->count;
    } else if (auto* st = std::get_if<StatResult>(&msg); st && entries) {
      entries->push_back(st->info);
      return 1;
    } else if (std::holds_alternative<ErrorMsg>(msg)) {
      return std::unexpected(StreamError(msg));
    } else {
      return Fail(ErrorCode::kProtocol,
                  "unexpected " + std::string(MsgTypeName(TypeOf(msg))) + " on a file stream");
    }
  }
}

Result<std::vector<ProcessInfo>> BlockingClient::ListProcesses() {
  uint32_t stream = NextStream();
  if (auto st = Send(stream, ProcList{}); !st) return std::unexpected(st.error());
  std::vector<ProcessInfo> out;
  while (true) {
    auto msg = NextFor(stream);
    if (!msg) return std::unexpected(msg.error());
    if (auto* batch = std::get_if<Processes>(&*msg)) {
      for (auto& p : batch->processes) out.push_back(std::move(p));
    } else if (std::holds_alternative<Done>(*msg)) {
      return out;
    } else if (std::holds_alternative<ErrorMsg>(*msg)) {
      return std::unexpected(StreamError(*msg));
    } else {
      return Fail(ErrorCode::kProtocol, "unexpected " + std::string(MsgTypeName(TypeOf(*msg))) +
                                            " on a proc_list stream");
    }
  }
}

Result<std::pair<uint32_t, Attached>> BlockingClient::Attach(const protocol::Attach& request) {
  uint32_t stream = NextStream();
  if (auto st = Send(stream, request); !st) return std::unexpected(st.error());
  auto msg = NextFor(stream);
  if (!msg) return std::unexpected(msg.error());
  if (auto* attached = std::get_if<Attached>(&*msg)) return std::make_pair(stream, *attached);
  if (std::holds_alternative<ErrorMsg>(*msg)) return std::unexpected(StreamError(*msg));
  return Fail(ErrorCode::kProtocol,
              "unexpected " + std::string(MsgTypeName(TypeOf(*msg))) + " answering attach");
}

Result<Message> BlockingClient::Detach(uint32_t stream) {
  if (auto st = Send(stream, protocol::Detach{}); !st) return std::unexpected(st.error());
  while (true) {
    auto msg = NextFor(stream);
    if (!msg) return std::unexpected(msg.error());
    if (std::holds_alternative<Done>(*msg) || std::holds_alternative<Exited>(*msg)) return msg;
    if (std::holds_alternative<ErrorMsg>(*msg)) return std::unexpected(StreamError(*msg));
    // Output still in flight before the end: dropped.
  }
}

Status BlockingClient::WriteFile(const std::string& path, std::string_view data, uint32_t mode,
                                 bool create_parents) {
  uint32_t stream = NextStream();
  if (auto st = Send(stream, FileWrite{path, mode, create_parents, false}); !st) return st;
  for (size_t off = 0; off < data.size(); off += kMaxChunk) {
    std::string chunk(data.substr(off, kMaxChunk));
    if (auto st = Send(stream, Data{std::move(chunk)}); !st) return st;
  }
  if (auto st = Send(stream, DataEnd{}); !st) return st;
  auto n = FinishFileStream(stream, nullptr, nullptr);
  if (!n) return std::unexpected(n.error());
  if (*n != data.size()) {
    return Fail(ErrorCode::kInternal, "agent wrote " + std::to_string(*n) + " of " +
                                          std::to_string(data.size()) + " bytes");
  }
  return {};
}

Result<std::string> BlockingClient::ReadFile(const std::string& path, uint64_t offset,
                                             uint64_t length) {
  uint32_t stream = NextStream();
  if (auto st = Send(stream, FileRead{path, offset, length}); !st) {
    return std::unexpected(st.error());
  }
  std::string data;
  auto n = FinishFileStream(stream, &data, nullptr);
  if (!n) return std::unexpected(n.error());
  return data;
}

Result<FileInfo> BlockingClient::Stat(const std::string& path) {
  uint32_t stream = NextStream();
  if (auto st = Send(stream, protocol::Stat{path}); !st) return std::unexpected(st.error());
  std::vector<FileInfo> infos;
  auto n = FinishFileStream(stream, nullptr, &infos);
  if (!n) return std::unexpected(n.error());
  return infos.at(0);
}

Result<std::vector<FileInfo>> BlockingClient::List(const std::string& path) {
  uint32_t stream = NextStream();
  if (auto st = Send(stream, protocol::List{path}); !st) return std::unexpected(st.error());
  std::vector<FileInfo> infos;
  auto n = FinishFileStream(stream, nullptr, &infos);
  if (!n) return std::unexpected(n.error());
  return infos;
}

Result<uint64_t> BlockingClient::Remove(const std::string& path, bool recursive) {
  uint32_t stream = NextStream();
  if (auto st = Send(stream, protocol::Remove{path, recursive}); !st) {
    return std::unexpected(st.error());
  }
  return FinishFileStream(stream, nullptr, nullptr);
}

Status BlockingClient::Mkdir(const std::string& path, uint32_t mode, bool parents) {
  uint32_t stream = NextStream();
  if (auto st = Send(stream, protocol::Mkdir{path, mode, parents}); !st) return st;
  auto n = FinishFileStream(stream, nullptr, nullptr);
  if (!n) return std::unexpected(n.error());
  return {};
}

Status BlockingClient::Ping(uint64_t nonce) {
  if (auto st = Send(0, protocol::Ping{nonce}); !st) return st;
  while (true) {
    auto got = Receive();
    if (!got) return std::unexpected(got.error());
    auto& [stream, msg] = *got;
    if (auto* pong = std::get_if<Pong>(&msg); pong && stream == 0) {
      if (pong->nonce == nonce) return {};
      return Fail(ErrorCode::kProtocol, "pong carries the wrong nonce");
    }
    if (stream != 0) parked_[stream].push_back(std::move(msg));
  }
}

Status BlockingClient::Quiesce(const std::string& wake_path) {
  const uint32_t stream = NextStream();
  if (auto st = Send(stream, protocol::Quiesce{wake_path}); !st) return st;
  auto msg = NextFor(stream);
  if (!msg) return std::unexpected(msg.error());
  if (std::holds_alternative<ErrorMsg>(*msg)) return std::unexpected(StreamError(*msg));
  if (!std::holds_alternative<Done>(*msg)) {
    return Fail(ErrorCode::kProtocol,
                "unexpected " + std::string(MsgTypeName(TypeOf(*msg))) + " on a quiesce stream");
  }
  // The agent closes the other channels before this one: its end is the last.
  auto after = Receive();
  if (after) {
    return Fail(ErrorCode::kProtocol, "the agent sent " +
                                          std::string(MsgTypeName(TypeOf(after->second))) +
                                          " after it quiesced");
  }
  if (after.error().code() != ErrorCode::kUnavailable) return std::unexpected(after.error());
  return {};
}

}  // namespace airlock::protocol
