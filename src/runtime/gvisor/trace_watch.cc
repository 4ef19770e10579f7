#include "runtime/gvisor/trace_watch.h"

#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/clock.h"
#include "common/log.h"
#include "common/syscall.h"
#include "runtime/gvisor/trace_points.h"

namespace airlock::gvisor {
namespace {

// Messages read from one connection before the others get a turn.
constexpr int kMessagesPerTurn = 64;

Status Watch(int epoll, int fd) {
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.fd = fd;
  if (::epoll_ctl(epoll, EPOLL_CTL_ADD, fd, &ev) < 0) return FailErrno("epoll_ctl", errno);
  return {};
}

}  // namespace

std::string TraceWatch::SessionConfig(const std::string& socket_path) {
  const auto point = [](const char* name) {
    return nlohmann::json{{"name", name}, {"context_fields", {"thread_id", "group_id", "credentials"}}};
  };
  return nlohmann::json{
      {"trace_session",
       {{"name", "Default"},
        {"points",
         {point("container/start"), point("sentry/clone"), point("sentry/execve"),
          point("sentry/exit_notify_parent")}},
        // A sink that cannot connect leaves the sandbox to start without it (logged here as
        // no events; the sandbox must not fail for its record's sake).
        {"sinks",
         {{{"name", "remote"},
           {"config", {{"endpoint", socket_path}}},
           {"ignore_setup_error", true}}}}}}}
      .dump(1);
}

Result<std::unique_ptr<TraceWatch>> TraceWatch::Start(runtime::ProcessEventSink sink) {
  UniqueFd epoll(::epoll_create1(EPOLL_CLOEXEC));
  if (!epoll) return FailErrno("epoll_create1", errno);
  UniqueFd stop(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!stop) return FailErrno("eventfd", errno);
  if (auto st = Watch(epoll.get(), stop.get()); !st) return std::unexpected(st.error());
  std::unique_ptr<TraceWatch> watch(new TraceWatch(std::move(epoll), std::move(stop), std::move(sink)));
  watch->reader_ = std::thread([w = watch.get()] { w->Loop(); });
  return watch;
}

TraceWatch::TraceWatch(UniqueFd epoll, UniqueFd stop, runtime::ProcessEventSink sink)
    : epoll_(std::move(epoll)), stop_(std::move(stop)), queue_(std::move(sink)) {}

TraceWatch::~TraceWatch() {
  const uint64_t one = 1;
  (void)!::write(stop_.get(), &one, sizeof one);
  if (reader_.joinable()) reader_.join();
  std::lock_guard lock(mu_);
  for (auto& [id, box] : boxes_) Close(box);
}

Status TraceWatch::Add(const std::string& id, const std::string& socket_path) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (socket_path.size() >= sizeof addr.sun_path) {
    return Fail(ErrorCode::kInvalidArgument,
                "the trace socket's path is over " + std::to_string(sizeof addr.sun_path - 1) +
                    " bytes: " + socket_path);
  }
  std::memcpy(addr.sun_path, socket_path.c_str(), socket_path.size() + 1);
  UniqueFd fd(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!fd) return FailErrno("socket", errno);
  std::lock_guard lock(mu_);
  Box& box = boxes_[id];
  Close(box);
  if (::unlink(socket_path.c_str()) < 0 && errno != ENOENT) {
    return FailErrno("removing " + socket_path, errno);
  }
  if (::bind(fd.get(), reinterpret_cast<const sockaddr*>(&addr), sizeof addr) < 0) {
    return FailErrno("binding " + socket_path, errno);
  }
  box.path = socket_path;  // bound: Close removes it from now on
  if (::chmod(socket_path.c_str(), 0600) < 0) return FailErrno("chmod " + socket_path, errno);
  if (::listen(fd.get(), 4) < 0) return FailErrno("listening on " + socket_path, errno);
  if (auto st = Watch(epoll_.get(), fd.get()); !st) return st;
  fds_[fd.get()] = id;
  box.listener = std::move(fd);
  return {};
}

bool TraceWatch::Watching(const std::string& id) const {
  std::lock_guard lock(mu_);
  auto it = boxes_.find(id);
  return it != boxes_.end() && it->second.listener;
}

void TraceWatch::Remove(const std::string& id) {
  std::lock_guard lock(mu_);
  auto it = boxes_.find(id);
  if (it == boxes_.end()) return;
  Close(it->second);
  boxes_.erase(it);
}

runtime::ProcessEventCounters TraceWatch::Counts() const { return queue_.Counts(); }

void TraceWatch::Hangup(Box& box) {
  if (!box.conn) return;
  fds_.erase(box.conn.get());
  box.conn.Reset();  // closing takes it out of epoll_
  box.handshaken = false;
}

void TraceWatch::Close(Box& box) {
  Hangup(box);
  if (box.listener) {
    fds_.erase(box.listener.get());
    box.listener.Reset();
  }
  if (!box.path.empty()) ::unlink(box.path.c_str());
  box.path.clear();
}

void TraceWatch::Loop() {
  epoll_event events[16];
  while (true) {
    const int n = RetryEintr([&] { return ::epoll_wait(epoll_.get(), events, 16, -1); });
    if (n < 0) {
      spdlog::error("gVisor's process events: epoll_wait: {}", std::strerror(errno));
      return;
    }
    std::lock_guard lock(mu_);
    for (int i = 0; i < n; ++i) {
      const int fd = events[i].data.fd;
      if (fd == stop_.get()) return;
      // A socket closed by Add or Remove since epoll_wait returned is no longer in fds_ (and
      // its number may be another's now: then it is simply read when ready).
      auto owner = fds_.find(fd);
      if (owner == fds_.end()) continue;
      const std::string id = owner->second;
      auto box = boxes_.find(id);
      if (box == boxes_.end()) continue;
      if (fd == box->second.listener.get()) {
        Accept(id, box->second);
      } else if (fd == box->second.conn.get()) {
        Read(id, box->second);
      }
    }
  }
}

void TraceWatch::Accept(const std::string& id, Box& box) {
  UniqueFd conn(::accept4(box.listener.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC));
  if (!conn) return;  // gone meanwhile (EAGAIN, ECONNABORTED)
  // A new session (a restore, or `runsc trace create` after a restart) replaces the old one;
  // what is known of the sandbox's processes stays (a restore keeps their pids).
  Hangup(box);
  if (auto st = Watch(epoll_.get(), conn.get()); !st) {
    spdlog::warn("process events of {}: {}", id, st.error().message());
    return;
  }
  fds_[conn.get()] = id;
  box.conn = std::move(conn);
  box.handshaken = false;
  box.dropped_seen = 0;
}

void TraceWatch::Read(const std::string& id, Box& box) {
  std::vector<char> buffer(kMaxMessage);
  for (int i = 0; i < kMessagesPerTurn; ++i) {
    // MSG_TRUNC: the message's whole length, even where it did not fit (the rest is gone).
    const ssize_t n = ::recv(box.conn.get(), buffer.data(), buffer.size(), MSG_TRUNC | MSG_DONTWAIT);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;
    if (n <= 0) {  // the Sentry ended (a checkpoint, a destroy) or the socket failed
      Hangup(box);
      return;
    }
    const bool truncated = static_cast<size_t>(n) > buffer.size();
    const std::string_view message(buffer.data(), truncated ? buffer.size() : static_cast<size_t>(n));
    if (!box.handshaken) {
      auto version = DecodeHandshake(message);
      if (!version || *version < kTraceWireVersion) {
        spdlog::warn("process events of {}: runsc's trace handshake refused ({})", id,
                     version ? "version " + std::to_string(*version) : version.error().message());
        Hangup(box);
        return;
      }
      const std::string reply = EncodeHandshake();
      if (::send(box.conn.get(), reply.data(), reply.size(), MSG_NOSIGNAL | MSG_DONTWAIT) !=
          static_cast<ssize_t>(reply.size())) {
        Hangup(box);
        return;
      }
      box.handshaken = true;
      continue;
    }
    OnMessage(id, box, message, truncated);
  }
}

void TraceWatch::OnMessage(const std::string& id, Box& box, std::string_view message,
                           bool truncated) {
  auto point = DecodeTracePoint(message, truncated);
  if (!point) {
    queue_.CountLost();
    return;
  }
  queue_.CountLost(static_cast<uint32_t>(point->dropped - box.dropped_seen));  // it wraps
  box.dropped_seen = point->dropped;
  using T = TraceType;
  const auto type = static_cast<T>(point->type);
  if (type == T::kClone) {
    // A thread is no new process; a process with a known pid again is (pids are reused).
    if (point->created_tgid == point->tgid || point->created_tgid <= 0) return;
    box.processes.erase(point->created_tgid);
    if (box.processes.size() >= kMaxTracked) {
      queue_.CountDropped();  // its parent will be unknown, its exit unreported
      return;
    }
    box.processes[point->created_tgid] = Process{.ppid = point->tgid};
    return;
  }
  if (type == T::kExec || type == T::kContainerStart) {
    if (point->tgid <= 0) {
      queue_.CountLost();
      return;
    }
    runtime::ProcessEvent event;
    event.kind = runtime::ProcessEvent::Kind::kExec;
    event.at_ms = UnixNowMs();
    event.pid = point->tgid;
    event.uid = point->euid;
    event.argv = std::move(point->argv);
    event.argv_truncated = point->cut;
    auto known = box.processes.find(point->tgid);
    if (known == box.processes.end() && box.processes.size() < kMaxTracked) {
      known = box.processes.emplace(point->tgid, Process{}).first;
    }
    if (known != box.processes.end()) {
      event.ppid = known->second.ppid;
      known->second.uid = point->euid;
      known->second.reported = true;
    } else {
      queue_.CountDropped();  // reported, but its exit will not be
    }
    queue_.Push(id, std::move(event));
    return;
  }
  if (type == T::kExitNotifyParent) {
    auto known = box.processes.find(point->tgid);
    if (known == box.processes.end()) return;
    const Process p = known->second;
    box.processes.erase(known);
    if (!p.reported) return;  // a fork that never ran a program of its own
    runtime::ProcessEvent event;
    event.kind = runtime::ProcessEvent::Kind::kExit;
    event.at_ms = UnixNowMs();
    event.pid = point->tgid;
    event.ppid = p.ppid;
    event.uid = p.uid;
    event.SetWaitStatus(point->exit_status);
    queue_.Push(id, std::move(event));
  }
}

}  // namespace airlock::gvisor
