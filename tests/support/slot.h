#pragma once
// A number of this test process's own, for what a test names or numbers on the host: its
// daemon's network id and subnet, its fake internet. ctest runs the end-to-end tests two at a
// time, each test a process of its own; two processes never hold the same slot, so their
// namespaces, veths, nftables tables and address ranges never collide.

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>

namespace airlock::testing {

inline constexpr int kTestSlots = 200;

// This process's slot, 0 to kTestSlots - 1: the first of /run/airlock-tests/slot-N (a directory
// of the user's own under /tmp when not root) it could lock. The lock (flock, on a descriptor kept
// open and not inherited) lasts as long as the process, so a test killed by a timeout frees its
// slot too. Aborts when every slot is held.
inline int TestSlot() {
  static const int slot = [] {
    const std::string dir = ::geteuid() == 0
                                ? std::string("/run/airlock-tests")
                                : "/tmp/airlock-tests-" + std::to_string(::geteuid());
    ::mkdir(dir.c_str(), 0755);
    for (int n = 0; n < kTestSlots; ++n) {
      const std::string path = dir + "/slot-" + std::to_string(n);
      const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
      if (fd < 0) continue;
      if (::flock(fd, LOCK_EX | LOCK_NB) == 0) return n;  // fd stays open: the lock with it
      ::close(fd);
    }
    std::fprintf(stderr, "every test slot under %s is held by another process\n", dir.c_str());
    std::abort();
  }();
  return slot;
}

}  // namespace airlock::testing
