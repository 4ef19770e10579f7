#include "net/uplink.h"

#include <fcntl.h>
#include <linux/magic.h>
#include <linux/nsfs.h>
#include <sched.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/vfs.h>

#include <future>

namespace airlock::net {

Status CheckNetns(const std::string& path) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd) return FailErrno("network_uplink: opening " + path, errno);
  struct statfs fs {};
  if (::fstatfs(fd.get(), &fs) != 0) return FailErrno("network_uplink: " + path, errno);
  if (fs.f_type != NSFS_MAGIC) {
    return Fail(ErrorCode::kInvalidArgument,
                "network_uplink: " + path + " is not a namespace (not an nsfs file)");
  }
  int type = ::ioctl(fd.get(), NS_GET_NSTYPE);
  if (type < 0) return FailErrno("network_uplink: NS_GET_NSTYPE on " + path, errno);
  if (type != CLONE_NEWNET) {
    return Fail(ErrorCode::kInvalidArgument,
                "network_uplink: " + path + " is a namespace, but not a network namespace");
  }
  return {};
}

Result<Uplink> ParseUplink(const std::string& spec) {
  Uplink uplink;
  if (spec.empty()) return uplink;
  if (spec.starts_with("netns:")) {
    const std::string name = spec.substr(6);
    if (name.empty() || name == "." || name == ".." || name.find('/') != std::string::npos ||
        name.size() > 255) {
      return Fail(ErrorCode::kInvalidArgument,
                  "network_uplink: \"" + spec + "\": netns:NAME names a file in /run/netns");
    }
    uplink.netns_name = name;
    uplink.netns_path = "/run/netns/" + name;
  } else if (spec.starts_with("/")) {
    uplink.netns_path = spec;
  } else if (spec.find('/') != std::string::npos) {
    return Fail(ErrorCode::kInvalidArgument,
                "network_uplink: \"" + spec +
                    "\" is neither an interface nor netns:NAME nor an absolute path");
  } else {
    uplink.interface = spec;
    return uplink;
  }
  if (auto st = CheckNetns(uplink.netns_path); !st) return std::unexpected(st.error());
  // The daemon's own namespace is no uplink: the transit veth would loop into the host, and
  // the namespace's table would be the daemon's own.
  struct stat given {
  }, own{};
  if (::stat(uplink.netns_path.c_str(), &given) == 0 && ::stat("/proc/self/ns/net", &own) == 0 &&
      given.st_dev == own.st_dev && given.st_ino == own.st_ino) {
    return Fail(ErrorCode::kInvalidArgument,
                "network_uplink: " + spec +
                    " is the daemon's own network namespace (name an interface instead)");
  }
  return uplink;
}

Result<std::unique_ptr<NetnsThread>> NetnsThread::Start(const std::string& netns_path) {
  std::unique_ptr<NetnsThread> t(new NetnsThread());
  std::promise<Status> joined;
  auto result = joined.get_future();
  NetnsThread* self = t.get();
  t->thread_ = std::thread([self, netns_path, &joined] {
    UniqueFd ns(::open(netns_path.c_str(), O_RDONLY | O_CLOEXEC));
    if (!ns || ::setns(ns.get(), CLONE_NEWNET) != 0) {
      joined.set_value(FailErrno("joining the network namespace " + netns_path, errno));
      return;
    }
    joined.set_value({});
    self->Loop();
  });
  Status st = result.get();
  if (!st) {
    t->thread_.join();
    return std::unexpected(st.error());
  }
  return t;
}

NetnsThread::~NetnsThread() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void NetnsThread::Loop() {
  std::unique_lock lock(mu_);
  while (true) {
    cv_.wait(lock, [this] { return stop_ || !tasks_.empty(); });
    if (tasks_.empty()) return;  // stopping, nothing left
    auto task = std::move(tasks_.front());
    tasks_.pop_front();
    lock.unlock();
    task();
    lock.lock();
  }
}

void NetnsThread::Run(const std::function<void()>& task) {
  std::promise<void> done;
  auto finished = done.get_future();
  {
    std::lock_guard lock(mu_);
    tasks_.push_back([&task, &done] {
      task();
      done.set_value();
    });
  }
  cv_.notify_all();
  finished.wait();
}

Result<UniqueFd> NetnsThread::Socket(int domain, int type) {
  int fd = -1, err = 0;
  Run([&] {
    fd = ::socket(domain, type | SOCK_CLOEXEC, 0);
    err = errno;
  });
  if (fd < 0) return FailErrno("a socket in the uplink's network namespace", err);
  return UniqueFd(fd);
}

SocketFactory NetnsThread::Factory() {
  return [this](int domain, int type) { return Socket(domain, type); };
}

}  // namespace airlock::net
