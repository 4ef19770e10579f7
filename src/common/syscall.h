#pragma once
// EINTR-safe wrappers around the system calls that every part of Airlock uses.

#include <sys/types.h>

#include <cerrno>
#include <cstddef>
#include <span>
#include <string>
#include <string_view>

#include "common/error.h"
#include "common/unique_fd.h"

namespace airlock {

// Calls f() again while it fails with EINTR. Returns f()'s last result, errno intact.
template <typename F>
auto RetryEintr(F&& f) {
  decltype(f()) r;
  do {
    r = f();
  } while (r == -1 && errno == EINTR);
  return r;
}

// Writes all of data to a blocking fd. Fails with the errno of the write that failed.
[[nodiscard]] Status WriteAll(int fd, std::span<const std::byte> data);
[[nodiscard]] Status WriteAll(int fd, std::string_view data);
// Reads until data is full. Returns the bytes read: fewer than data.size() only at end of file.
[[nodiscard]] Result<size_t> ReadFull(int fd, std::span<std::byte> data);
// Reads a whole (small) file, at most max_bytes of it.
[[nodiscard]] Result<std::string> ReadFileToString(const std::string& path,
                                                   size_t max_bytes = 1 << 20);

[[nodiscard]] Result<UniqueFd> OpenFile(const std::string& path, int flags, mode_t mode = 0);
// A pipe with both ends O_CLOEXEC plus `extra_flags` (e.g. O_NONBLOCK). [0] reads, [1] writes.
[[nodiscard]] Status MakePipe(UniqueFd (&ends)[2], int extra_flags = 0);
[[nodiscard]] Status SetNonBlocking(int fd, bool on);

// Writes `contents` to `path` (in directory `dir`) so that `path` either does not exist or holds
// all of it, mode 0600 whatever the umask: a temp file is written and fsynced, then link(2)ed
// into place (which, like O_EXCL, fails if `path` exists), then `dir` is fsynced. For the files
// that hold a credential (admin.key, secrets.key).
[[nodiscard]] Status WriteNewPrivateFile(const std::string& dir, const std::string& path,
                                         std::string_view contents);

// Whether process `pid` exists and has not exited (a zombie, exited but not reaped yet, has).
bool ProcessRuns(pid_t pid);

}  // namespace airlock
