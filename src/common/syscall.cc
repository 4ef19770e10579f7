#include "common/syscall.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

namespace airlock {

Status WriteAll(int fd, std::span<const std::byte> data) {
  while (!data.empty()) {
    ssize_t n = RetryEintr([&] { return ::write(fd, data.data(), data.size()); });
    if (n < 0) return FailErrno("write", errno);
    data = data.subspan(static_cast<size_t>(n));
  }
  return {};
}

Status WriteAll(int fd, std::string_view data) {
  return WriteAll(fd, std::as_bytes(std::span(data.data(), data.size())));
}

Result<size_t> ReadFull(int fd, std::span<std::byte> data) {
  size_t done = 0;
  while (done < data.size()) {
    ssize_t n = RetryEintr([&] { return ::read(fd, data.data() + done, data.size() - done); });
    if (n < 0) return FailErrno("read", errno);
    if (n == 0) break;
    done += static_cast<size_t>(n);
  }
  return done;
}

Result<UniqueFd> OpenFile(const std::string& path, int flags, mode_t mode) {
  int fd = RetryEintr([&] { return ::open(path.c_str(), flags | O_CLOEXEC, mode); });
  if (fd < 0) return FailErrno("open " + path, errno);
  return UniqueFd(fd);
}

Result<std::string> ReadFileToString(const std::string& path, size_t max_bytes) {
  auto fd = OpenFile(path, O_RDONLY);
  if (!fd) return std::unexpected(fd.error());
  std::string out;
  char buf[8192];
  while (out.size() < max_bytes) {
    ssize_t n = RetryEintr([&] { return ::read(fd->get(), buf, sizeof buf); });
    if (n < 0) return FailErrno("read " + path, errno);
    if (n == 0) return out;
    out.append(buf, std::min(static_cast<size_t>(n), max_bytes - out.size()));
  }
  return out;
}

Status MakePipe(UniqueFd (&ends)[2], int extra_flags) {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC | extra_flags) < 0) return FailErrno("pipe2", errno);
  ends[0].Reset(fds[0]);
  ends[1].Reset(fds[1]);
  return {};
}

Status SetNonBlocking(int fd, bool on) {
  int flags = ::fcntl(fd, F_GETFL);
  if (flags < 0) return FailErrno("fcntl(F_GETFL)", errno);
  flags = on ? (flags | O_NONBLOCK) : (flags & ~O_NONBLOCK);
  if (::fcntl(fd, F_SETFL, flags) < 0) return FailErrno("fcntl(F_SETFL)", errno);
  return {};
}

namespace {

Status FsyncDir(const std::string& dir) {
  auto fd = OpenFile(dir, O_RDONLY | O_DIRECTORY);
  if (!fd) return std::unexpected(std::move(fd.error()));
  if (RetryEintr([&] { return ::fsync(fd->get()); }) != 0) return FailErrno("fsync " + dir, errno);
  return {};
}

}  // namespace

Status WriteNewPrivateFile(const std::string& dir, const std::string& path,
                           std::string_view contents) {
  std::string tmp = path + ".tmp";
  ::unlink(tmp.c_str());  // left over from a crash in the middle of a previous attempt
  {
    auto fd = OpenFile(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW, 0600);
    if (!fd) return std::unexpected(std::move(fd.error()));
    if (::fchmod(fd->get(), 0600) != 0) return FailErrno("chmod " + tmp, errno);  // vs umask
    auto written = WriteAll(fd->get(), contents);
    if (!written) return std::unexpected(std::move(written.error()).Wrap("writing " + tmp));
    if (RetryEintr([&] { return ::fsync(fd->get()); }) != 0) {
      return FailErrno("fsync " + tmp, errno);
    }
  }
  int linked = ::link(tmp.c_str(), path.c_str());
  int link_errno = errno;
  ::unlink(tmp.c_str());
  if (linked != 0) return FailErrno("creating " + path, link_errno);
  return FsyncDir(dir);
}

bool ProcessRuns(pid_t pid) {
  if (pid <= 0) return false;
  auto stat = ReadFileToString("/proc/" + std::to_string(pid) + "/stat", 4096);
  if (!stat) return false;
  // "pid (comm) S ...": the state follows the last ')' (comm may hold any byte).
  const size_t close = stat->rfind(')');
  if (close == std::string::npos || close + 2 >= stat->size()) return false;
  const char state = (*stat)[close + 2];
  return state != 'Z' && state != 'X';
}

}  // namespace airlock
