#pragma once
// The uplink (docs/design/network.md, "Uplink"): where "open" sandboxes go out, and, when it is a
// network namespace, where the egress proxy and the DNS stubs make their upstream sockets too.
//
//   network_uplink = "eth0"           an interface of the host (masqueraded out of it)
//   network_uplink = "netns:vpn"      the network namespace /run/netns/vpn
//   network_uplink = "/proc/42/ns/net"  a network namespace by its file
//
// With a namespace, nothing a sandbox sends leaves through the host's own network: the daemon
// links the host to the namespace with a transit veth and a policy route, and the namespace
// masquerades (networks.cc makes and removes all of it).

#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "common/error.h"
#include "common/unique_fd.h"
#include "net/socket_factory.h"

namespace airlock::net {

struct Uplink {
  std::string interface;   // an interface of the host, or
  std::string netns_path;  // the file of a network namespace
  std::string netns_name;  // NAME when given as netns:NAME

  bool empty() const { return interface.empty() && netns_path.empty(); }
  bool is_netns() const { return !netns_path.empty(); }
};

// Reads network_uplink: "" (no uplink), an interface name, "netns:NAME" (/run/netns/NAME) or an
// absolute path. A namespace must exist, be a network namespace and not the caller's own;
// kInvalidArgument (the message names the setting and says what is wrong) otherwise.
[[nodiscard]] Result<Uplink> ParseUplink(const std::string& spec);

// Whether `path` is a network namespace (nsfs, NS_GET_NSTYPE says CLONE_NEWNET).
[[nodiscard]] Status CheckNetns(const std::string& path);

// A thread that lives in another network namespace: what it runs (sockets it makes, programs it
// starts, /proc/sys/net it opens) is that namespace's. The daemon's other threads stay where they
// are. Run and Socket may be called from any thread, one task at a time.
class NetnsThread {
 public:
  [[nodiscard]] static Result<std::unique_ptr<NetnsThread>> Start(const std::string& netns_path);
  ~NetnsThread();
  NetnsThread(const NetnsThread&) = delete;
  NetnsThread& operator=(const NetnsThread&) = delete;

  // Runs `task` on the thread and waits for it.
  void Run(const std::function<void()>& task);
  // A close-on-exec socket(2) in the namespace.
  [[nodiscard]] Result<UniqueFd> Socket(int domain, int type);
  // Socket as a SocketFactory; the NetnsThread must outlive whoever holds it.
  SocketFactory Factory();

 private:
  NetnsThread() = default;
  void Loop();

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> tasks_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace airlock::net
