#include "runtime/jail/proc_events.h"

#include <linux/cn_proc.h>
#include <linux/connector.h>
#include <linux/netlink.h>
#include <poll.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <chrono>
#include <cstring>
#include <exception>
#include <vector>

#include "common/log.h"
#include "common/syscall.h"

namespace airlock::jail {
namespace {

using runtime::ProcessEvent;

// Sends `op`; the kernel answers every listener with a PROC_EVENT_NONE whose ack is `ack` + 1
// (and whose seq is its own counter's, not ours).
Status SendOp(int fd, proc_cn_mcast_op op, uint32_t ack) {
  // One netlink message: a cn_msg carrying the op.
  constexpr size_t kLength = NLMSG_LENGTH(sizeof(cn_msg) + sizeof(proc_cn_mcast_op));
  alignas(nlmsghdr) char r[NLMSG_SPACE(sizeof(cn_msg) + sizeof(proc_cn_mcast_op))] = {};
  auto* header = reinterpret_cast<nlmsghdr*>(r);
  header->nlmsg_len = kLength;
  header->nlmsg_type = NLMSG_DONE;
  auto* message = static_cast<cn_msg*>(NLMSG_DATA(header));
  message->id.idx = CN_IDX_PROC;
  message->id.val = CN_VAL_PROC;
  message->ack = ack;
  message->len = sizeof(proc_cn_mcast_op);
  std::memcpy(message->data, &op, sizeof op);
  sockaddr_nl kernel{};
  kernel.nl_family = AF_NETLINK;
  if (RetryEintr([&] {
        return ::sendto(fd, r, kLength, 0, reinterpret_cast<const sockaddr*>(&kernel),
                        sizeof kernel);
      }) < 0) {
    return FailErrno("sending to the process events connector", errno);
  }
  return {};
}

// Calls `each(cn_msg)` for every connector message from the kernel in one datagram.
template <typename F>
void ForEachMessage(const char* buf, ssize_t len, F&& each) {
  // NLMSG_OK and NLMSG_NEXT, without their signed/unsigned comparisons.
  size_t left = len > 0 ? static_cast<size_t>(len) : 0;
  for (auto* h = reinterpret_cast<const nlmsghdr*>(buf);
       left >= sizeof(nlmsghdr) && h->nlmsg_len >= sizeof(nlmsghdr) && h->nlmsg_len <= left;
       left -= std::min<size_t>(left, NLMSG_ALIGN(h->nlmsg_len)),
                  h = reinterpret_cast<const nlmsghdr*>(reinterpret_cast<const char*>(h) +
                                                        NLMSG_ALIGN(h->nlmsg_len))) {
    if (h->nlmsg_type == NLMSG_NOOP || h->nlmsg_type == NLMSG_ERROR) continue;
    if (h->nlmsg_len < NLMSG_LENGTH(sizeof(cn_msg))) continue;
    auto* m = static_cast<const cn_msg*>(NLMSG_DATA(h));
    if (m->id.idx != CN_IDX_PROC || m->id.val != CN_VAL_PROC) continue;
    if (NLMSG_LENGTH(sizeof(cn_msg) + m->len) > h->nlmsg_len) continue;
    each(*m);
  }
}

// Receives one datagram, from the kernel only. -1 with errno, or its length.
ssize_t ReceiveFromKernel(int fd, char* buf, size_t size) {
  while (true) {
    sockaddr_nl from{};
    socklen_t from_len = sizeof from;
    ssize_t n = RetryEintr([&] {
      return ::recvfrom(fd, buf, size, MSG_DONTWAIT, reinterpret_cast<sockaddr*>(&from),
                        &from_len);
    });
    if (n < 0 || from.nl_pid == 0) return n;
  }
}

// Opens a socket, joins the connector's process events group and has the kernel acknowledge
// the subscription (it answers only a process in the initial user and pid namespaces, and
// refuses one without CAP_NET_ADMIN there).
Result<UniqueFd> Subscribe() {
  UniqueFd fd(::socket(AF_NETLINK, SOCK_DGRAM | SOCK_CLOEXEC, NETLINK_CONNECTOR));
  if (!fd) {
    return FailErrno(
        "opening the kernel's process events connector (netlink; only in the initial network "
        "namespace)",
        errno);
  }
  sockaddr_nl self{};
  self.nl_family = AF_NETLINK;
  self.nl_groups = CN_IDX_PROC;
  if (::bind(fd.get(), reinterpret_cast<const sockaddr*>(&self), sizeof self) < 0) {
    return FailErrno("joining the process events connector's group", errno);
  }
  // Room for bursts (as root, beyond rmem_max); what overflows is counted as lost.
  const int bytes = 8 << 20;
  if (::setsockopt(fd.get(), SOL_SOCKET, SO_RCVBUFFORCE, &bytes, sizeof bytes) < 0) {
    (void)::setsockopt(fd.get(), SOL_SOCKET, SO_RCVBUF, &bytes, sizeof bytes);
  }
  // Every subscriber's answer goes to every listener: ours is told by an ack of this process's
  // and this call's.
  static std::atomic<uint32_t> calls{0};
  const uint32_t ack = (static_cast<uint32_t>(::getpid()) << 12) + (calls++ & 0xfff);
  if (auto st = SendOp(fd.get(), PROC_CN_MCAST_LISTEN, ack); !st) return std::unexpected(st.error());
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  alignas(nlmsghdr) char buf[16384];
  while (true) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) break;
    pollfd p{fd.get(), POLLIN, 0};
    if (RetryEintr([&] { return ::poll(&p, 1, static_cast<int>(left.count())); }) <= 0) break;
    ssize_t n = ReceiveFromKernel(fd.get(), buf, sizeof buf);
    if (n < 0) {
      if (errno == EAGAIN || errno == ENOBUFS) continue;
      return FailErrno("reading the process events connector", errno);
    }
    std::optional<uint32_t> err;
    ForEachMessage(buf, n, [&](const cn_msg& m) {
      proc_event ev{};
      std::memcpy(&ev, m.data, std::min<size_t>(m.len, sizeof ev));
      if (ev.what == proc_event::PROC_EVENT_NONE && m.ack == ack + 1) {
        err = ev.event_data.ack.err;
      }
    });
    if (!err) continue;
    if (*err != 0) {
      return FailErrno("subscribing to the kernel's process events (it needs CAP_NET_ADMIN)",
                       static_cast<int>(*err));
    }
    return fd;
  }
  return Fail(ErrorCode::kFailedPrecondition,
              "the kernel did not acknowledge a subscription to its process events (it answers "
              "only a process in the initial user and pid namespaces)");
}

int64_t UnixMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// The connector stamps events with CLOCK_MONOTONIC: the same instant in unix ms.
int64_t MonotonicToUnixMs(uint64_t monotonic_ns) {
  timespec mono{};
  ::clock_gettime(CLOCK_MONOTONIC, &mono);
  const int64_t now_mono_ns = int64_t{mono.tv_sec} * 1'000'000'000 + mono.tv_nsec;
  return UnixMs() - (now_mono_ns - static_cast<int64_t>(monotonic_ns)) / 1'000'000;
}

// What the watch reads of /proc/PID/status.
struct ProcStatus {
  int64_t ppid = 0;            // on the host
  int64_t euid = -1;           // on the host
  std::vector<int64_t> nspid;  // outermost first
};

std::vector<int64_t> Numbers(std::string_view text) {
  std::vector<int64_t> out;
  const char* p = text.data();
  const char* end = p + text.size();
  while (p < end) {
    while (p < end && (*p == ' ' || *p == '\t')) ++p;
    int64_t n = 0;
    auto [next, ec] = std::from_chars(p, end, n);
    if (ec != std::errc()) break;
    out.push_back(n);
    p = next;
  }
  return out;
}

std::optional<ProcStatus> ReadStatus(pid_t pid) {
  auto text = ReadFileToString("/proc/" + std::to_string(pid) + "/status", 8192);
  if (!text) return std::nullopt;
  ProcStatus s;
  std::string_view rest = *text;
  while (!rest.empty()) {
    const size_t eol = std::min(rest.find('\n'), rest.size());
    std::string_view line = rest.substr(0, eol);
    rest.remove_prefix(std::min(eol + 1, rest.size()));
    auto field = [&](std::string_view name) -> std::optional<std::string_view> {
      if (!line.starts_with(name)) return std::nullopt;
      return line.substr(name.size());
    };
    if (auto ppid = field("PPid:")) {
      auto n = Numbers(*ppid);
      if (!n.empty()) s.ppid = n[0];
    } else if (auto uids = field("Uid:")) {
      auto n = Numbers(*uids);
      if (n.size() >= 2) s.euid = n[1];
    } else if (auto nspid = field("NSpid:")) {
      s.nspid = Numbers(*nspid);
    }
  }
  return s;
}

std::optional<std::pair<uint64_t, uint64_t>> PidNamespace(pid_t pid) {
  struct stat st{};
  if (::stat(("/proc/" + std::to_string(pid) + "/ns/pid").c_str(), &st) < 0) return std::nullopt;
  return std::pair<uint64_t, uint64_t>{st.st_dev, st.st_ino};
}

}  // namespace

void ParseCmdline(std::string_view bytes, bool more, ProcessEvent& event) {
  event.argv.clear();
  event.argv_truncated = more;
  if (!bytes.empty() && bytes.back() == '\0') bytes.remove_suffix(1);
  if (bytes.empty()) return;
  while (true) {
    const size_t nul = std::min(bytes.find('\0'), bytes.size());
    if (!event.AddArg(bytes.substr(0, nul)) || nul == bytes.size()) return;
    bytes.remove_prefix(nul + 1);
  }
}

std::string ProcessWatch::CanSubscribe() {
  auto fd = Subscribe();
  if (!fd) return fd.error().message();
  (void)SendOp(fd->get(), PROC_CN_MCAST_IGNORE, 0);
  return "";
}

Result<std::unique_ptr<ProcessWatch>> ProcessWatch::Start(runtime::ProcessEventSink sink) {
  auto fd = Subscribe();
  if (!fd) return std::unexpected(fd.error());
  UniqueFd stop(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!stop) {
    int err = errno;
    (void)SendOp(fd->get(), PROC_CN_MCAST_IGNORE, 0);
    return FailErrno("eventfd", err);
  }
  return std::unique_ptr<ProcessWatch>(
      new ProcessWatch(std::move(*fd), std::move(stop), std::move(sink)));
}

ProcessWatch::ProcessWatch(UniqueFd socket, UniqueFd stop, runtime::ProcessEventSink sink)
    : socket_(std::move(socket)), stop_(std::move(stop)), queue_(std::move(sink)) {
  reader_ = std::thread([this] { ReadLoop(); });
}

ProcessWatch::~ProcessWatch() {
  stop_requested_ = true;
  const uint64_t one = 1;
  (void)!::write(stop_.get(), &one, sizeof one);
  reader_.join();  // the queue's thread goes with it, after
  // The kernel counts listeners (and skips its work for none): this one leaves.
  (void)SendOp(socket_.get(), PROC_CN_MCAST_IGNORE, 0);
}

Status ProcessWatch::Add(const std::string& id, pid_t init_pid, uid_t uid_base) {
  auto ns = PidNamespace(init_pid);
  auto status = ReadStatus(init_pid);
  if (!ns || !status || status->nspid.empty()) {
    return Fail(ErrorCode::kNotFound, "the init (pid " + std::to_string(init_pid) + ") of " + id +
                                          " is gone: its processes cannot be watched");
  }
  std::lock_guard lock(boxes_mu_);
  boxes_[id] = Box{id, *ns, status->nspid.size(), uid_base};
  return {};
}

void ProcessWatch::Remove(const std::string& id) {
  std::lock_guard lock(boxes_mu_);
  boxes_.erase(id);
}

runtime::ProcessEventCounters ProcessWatch::Counts() const { return queue_.Counts(); }

std::optional<ProcessWatch::Box> ProcessWatch::BoxIn(
    const std::pair<uint64_t, uint64_t>& pidns) const {
  std::lock_guard lock(boxes_mu_);
  for (const auto& [id, box] : boxes_) {
    if (box.pidns == pidns) return box;
  }
  return std::nullopt;
}

std::optional<ProcessWatch::Box> ProcessWatch::BoxOf(pid_t pid) const {
  auto ns = PidNamespace(pid);
  return ns ? BoxIn(*ns) : std::nullopt;
}

bool ProcessWatch::Held(const std::string& id) const {
  std::lock_guard lock(boxes_mu_);
  return boxes_.contains(id);
}

void ProcessWatch::ReadLoop() {
  std::vector<char> buf(65536);  // aligned for nlmsghdr, as every new'd block is
  while (true) {
    pollfd p[2] = {{stop_.get(), POLLIN, 0}, {socket_.get(), POLLIN, 0}};
    if (RetryEintr([&] { return ::poll(p, 2, -1); }) < 0) {
      spdlog::error("process events: poll: {}", std::strerror(errno));
      return;
    }
    if (p[0].revents != 0) return;
    while (!stop_requested_.load()) {  // a storm may never leave the socket empty
      ssize_t n = ReceiveFromKernel(socket_.get(), buf.data(), buf.size());
      if (n < 0) {
        if (errno == ENOBUFS) {  // the socket overflowed: events are gone, how many unknown
          queue_.CountLost();
          Prune();
          vanished_.clear();
          continue;
        }
        if (errno != EAGAIN) spdlog::error("process events: recv: {}", std::strerror(errno));
        break;
      }
      ForEachMessage(buf.data(), n, [&](const cn_msg& m) { OnEvent(m.data, m.len); });
    }
  }
}

void ProcessWatch::OnEvent(const void* data, size_t size) {
  proc_event ev{};
  std::memcpy(&ev, data, std::min(size, sizeof ev));
  if (ev.what == proc_event::PROC_EVENT_EXEC) {
    OnExec(ev.event_data.exec.process_tgid, MonotonicToUnixMs(ev.timestamp_ns));
  } else if (ev.what == proc_event::PROC_EVENT_EXIT &&
             ev.event_data.exit.process_pid == ev.event_data.exit.process_tgid) {
    // A thread's end is not the process's: only its leader's counts.
    OnExit(ev.event_data.exit.process_tgid, ev.event_data.exit.parent_tgid,
           ev.event_data.exit.exit_code, MonotonicToUnixMs(ev.timestamp_ns));
  }
}

void ProcessWatch::OnExec(pid_t tgid, int64_t at_ms) {
  auto ns = PidNamespace(tgid);
  auto box = ns ? BoxIn(*ns) : std::nullopt;
  // Gone already, nobody knows whose: its exit names the parent (OnExit).
  auto vanished = [&] {
    if (vanished_.size() >= kMaxVanished) {
      queue_.CountLost();
    } else {
      vanished_[tgid] = at_ms;
    }
  };
  if (!box) {
    tracked_.erase(tgid);  // the pid is someone else's now (the exit was lost)
    if (!ns) vanished();
    return;
  }
  ProcessEvent event;
  event.kind = ProcessEvent::Kind::kExec;
  event.at_ms = at_ms;
  const std::string proc = "/proc/" + std::to_string(tgid);
  // The argv first, the process being most likely still there.
  auto cmdline = ReadFileToString(proc + "/cmdline", 2 * ProcessEvent::kMaxArgvBytes);
  auto status = ReadStatus(tgid);
  if (cmdline && !cmdline->empty()) {
    ParseCmdline(*cmdline, cmdline->size() == 2 * ProcessEvent::kMaxArgvBytes, event);
  } else {
    event.argv_lost = true;  // exited (a zombie has no argv left) or gone
  }
  if (status && status->nspid.size() == box->level) {
    event.pid = status->nspid.back();
    if (status->euid >= box->uid_base && status->euid < int64_t{box->uid_base} + 65536) {
      event.uid = status->euid - box->uid_base;
    }
    const pid_t parent = static_cast<pid_t>(status->ppid);
    if (auto it = tracked_.find(parent); it != tracked_.end() && it->second.id == box->id) {
      event.ppid = it->second.pid;
    } else if (auto ps = ReadStatus(parent); ps && ps->nspid.size() == box->level) {
      event.ppid = ps->nspid.back();  // the agent (PID 1) or a process whose exec was missed
    }
  } else {
    tracked_.erase(tgid);
    vanished();  // reaped meanwhile: as above
    return;
  }
  if (tracked_.size() >= kMaxTracked && !tracked_.contains(tgid)) Prune();
  if (tracked_.size() >= kMaxTracked && !tracked_.contains(tgid)) {
    queue_.CountDropped();  // its exit will not be reported
  } else {
    tracked_[tgid] = Tracked{box->id, event.pid, event.ppid, event.uid};
  }
  queue_.Push(box->id, std::move(event));
}

void ProcessWatch::OnExit(pid_t tgid, pid_t parent_tgid, uint32_t exit_code, int64_t at_ms) {
  ProcessEvent exit;
  exit.kind = ProcessEvent::Kind::kExit;
  exit.at_ms = at_ms;
  exit.SetWaitStatus(static_cast<int>(exit_code));
  if (auto it = tracked_.find(tgid); it != tracked_.end()) {
    Tracked t = std::move(it->second);
    tracked_.erase(it);
    if (!Held(t.id)) return;
    exit.pid = t.pid;
    exit.ppid = t.ppid;
    exit.uid = t.uid;
    queue_.Push(t.id, std::move(exit));
    return;
  }
  auto v = vanished_.find(tgid);
  if (v == vanished_.end()) return;
  const int64_t exec_ms = v->second;
  vanished_.erase(v);
  // An exec that was gone before it was looked at: whose it was, its parent tells (tracked,
  // or still there to be looked at).
  ProcessEvent exec;
  exec.at_ms = exec_ms;
  exec.argv_lost = true;
  std::string id;
  if (auto it = tracked_.find(parent_tgid); it != tracked_.end()) {
    id = it->second.id;
    exec.ppid = it->second.pid;
  } else if (auto box = BoxOf(parent_tgid)) {
    id = box->id;
    if (auto ps = ReadStatus(parent_tgid); ps && ps->nspid.size() == box->level) {
      exec.ppid = ps->nspid.back();
    }
  }
  if (id.empty() || !Held(id)) return;
  exit.ppid = exec.ppid;
  queue_.Push(id, std::move(exec));
  queue_.Push(id, std::move(exit));
}

void ProcessWatch::Prune() {
  std::erase_if(tracked_, [&](const auto& entry) {
    return (::kill(entry.first, 0) < 0 && errno == ESRCH) || !Held(entry.second.id);
  });
}

}  // namespace airlock::jail
