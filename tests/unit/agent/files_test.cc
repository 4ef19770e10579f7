// FileRoot against a root full of hostile paths and symlinks, with canary files outside it that
// must never change.

#include "agent/files.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <future>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "agent_fixture.h"
#include "common/syscall.h"

namespace airlock::agent::test {
namespace {

namespace fs = std::filesystem;
namespace p = protocol;
using namespace std::chrono_literals;

constexpr char kCanary[] = "canary: must never change\n";

// Every path below `dir`, relative to it, without descending into `skip`.
std::set<std::string> Tree(const std::string& dir, const std::string& skip = "") {
  std::set<std::string> out;
  for (auto it = fs::recursive_directory_iterator(dir); it != fs::recursive_directory_iterator();
       ++it) {
    std::string rel = fs::relative(it->path(), dir).string();
    if (!skip.empty() && rel == skip) it.disable_recursion_pending();
    out.insert(rel);
  }
  return out;
}

// The layout, with base = a fresh temporary directory:
//   base/canary.txt              outside the root
//   base/outside/canary.txt      outside the root
//   base/root/                   the FileRoot
//   base/root/etc/passwd         the sandbox's own passwd
//   base/root/etclink  -> /etc
//   base/root/up1      -> ..
//   base/root/up       -> ../../../../../../../..
//   base/root/out_abs  -> base            (absolute, pointing out)
//   base/root/out_dir  -> base/outside    (absolute, pointing out)
//   base/root/out_rel  -> ../outside      (relative, pointing out)
//   base/root/procroot -> /proc/self/root
class FileRootTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // The agent runs with umask 0 so that the modes it is asked for are exact.
    old_umask_ = ::umask(0);
    root_ = base_.Sub("root");
    outside_ = base_.Sub("outside");
    fs::create_directories(root_ + "/etc");
    fs::create_directories(outside_);
    WriteWholeFile(base_.Sub("canary.txt"), kCanary);
    WriteWholeFile(outside_ + "/canary.txt", kCanary);
    WriteWholeFile(root_ + "/etc/passwd", "sandbox passwd\n");
    fs::create_directory_symlink("/etc", root_ + "/etclink");
    fs::create_directory_symlink("..", root_ + "/up1");
    fs::create_directory_symlink("../../../../../../../..", root_ + "/up");
    fs::create_directory_symlink(base_.path(), root_ + "/out_abs");
    fs::create_directory_symlink(outside_, root_ + "/out_dir");
    fs::create_directory_symlink("../outside", root_ + "/out_rel");
    fs::create_directory_symlink("/proc/self/root", root_ + "/procroot");
    auto files = FileRoot::Open(root_);
    ASSERT_TRUE(files) << files.error().message();
    files_.emplace(std::move(*files));
    outside_before_ = Tree(base_.path(), "root");
  }

  void TearDown() override {
    // Nothing outside the root changed, whatever the test did.
    EXPECT_EQ(ReadWholeFile(base_.Sub("canary.txt")), kCanary);
    EXPECT_EQ(ReadWholeFile(outside_ + "/canary.txt"), kCanary);
    EXPECT_EQ(Tree(base_.path(), "root"), outside_before_) << "a file appeared outside the root";
    ::umask(old_umask_);
  }

  // Writes `data` through the FileRoot; true if it got written (somewhere).
  bool TryWrite(const std::string& path, std::string_view data, bool create_parents = false) {
    auto fd = files_->OpenForWrite(path, 0644, create_parents, false);
    if (!fd) return false;
    return WriteAll(fd->get(), data).has_value();
  }
  Result<std::string> TryRead(const std::string& path) {
    auto fd = files_->OpenForRead(path);
    if (!fd) return std::unexpected(fd.error());
    std::string out;
    char buf[4096];
    ssize_t n;
    while ((n = ::read(fd->get(), buf, sizeof buf)) > 0) out.append(buf, static_cast<size_t>(n));
    return out;
  }

  TempDir base_;
  std::string root_, outside_;
  std::optional<FileRoot> files_;
  std::set<std::string> outside_before_;
  mode_t old_umask_ = 022;
};

TEST_F(FileRootTest, DotDotStopsAtTheRoot) {
  for (const char* path : {"../canary.txt", "../../canary.txt", "/../canary.txt",
                           "etc/../../canary.txt", "./../../../../canary.txt"}) {
    SCOPED_TRACE(path);
    ASSERT_TRUE(TryWrite(path, "written inside\n"));
    EXPECT_EQ(ReadWholeFile(root_ + "/canary.txt"), "written inside\n");
    fs::remove(root_ + "/canary.txt");
  }
  // "outside/canary.txt" one level up from the root is the root's own "outside".
  EXPECT_FALSE(TryWrite("../outside/canary.txt", "x")) << "there is no root/outside";
}

TEST_F(FileRootTest, EtcPasswdResolvesToTheSandboxsOwn) {
  for (const char* path : {"../../etc/passwd", "/etc/passwd", "etclink/passwd",
                           "/etclink/../etc/passwd", "up/etc/passwd", "up1/etc/passwd"}) {
    SCOPED_TRACE(path);
    auto text = TryRead(path);
    ASSERT_TRUE(text) << text.error().message();
    EXPECT_EQ(*text, "sandbox passwd\n");
  }
}

TEST_F(FileRootTest, HostShadowIsNeverRead) {
  std::string host_shadow = ReadWholeFile("/etc/shadow");
  for (const char* path : {"../../../etc/shadow", "etclink/shadow", "up/etc/shadow",
                           "procroot/etc/shadow", "out_abs/../../../etc/shadow"}) {
    SCOPED_TRACE(path);
    auto text = TryRead(path);
    EXPECT_FALSE(text) << "read " << text->size() << " bytes";
    if (text && !host_shadow.empty()) {
      EXPECT_NE(*text, host_shadow);
    }
  }
}

TEST_F(FileRootTest, AbsoluteSymlinkToEtcStaysInside) {
  auto entries = files_->List("etclink");
  ASSERT_TRUE(entries) << entries.error().message();
  ASSERT_EQ(entries->size(), 1u) << "listed the host's /etc";
  EXPECT_EQ((*entries)[0].name, "passwd");
  // A new file through the link lands in the sandbox's /etc, not the host's.
  const std::string name = "airlock-test-" + std::to_string(::getpid());
  ASSERT_FALSE(fs::exists("/etc/" + name));
  bool wrote = TryWrite("etclink/" + name, "x");
  bool escaped = fs::exists("/etc/" + name);
  if (escaped) fs::remove("/etc/" + name);
  EXPECT_FALSE(escaped) << "a file was created in the host's /etc";
  EXPECT_TRUE(wrote);
  EXPECT_TRUE(fs::exists(root_ + "/etc/" + name));
}

TEST_F(FileRootTest, SymlinksPointingOutResolveInsideOrFail) {
  // Absolute: base/... is looked up below the root, where it does not exist.
  EXPECT_FALSE(TryWrite("out_abs/canary.txt", "pwned"));
  EXPECT_FALSE(TryWrite("out_dir/canary.txt", "pwned"));
  EXPECT_FALSE(TryRead("out_dir/canary.txt"));
  // Relative: ".." stops at the root, so up1 is the root itself.
  ASSERT_TRUE(TryWrite("up1/canary.txt", "inside"));
  EXPECT_EQ(ReadWholeFile(root_ + "/canary.txt"), "inside");
  EXPECT_FALSE(TryWrite("out_rel/canary.txt", "pwned"));
  // The host path of the canary, through the escaping link.
  std::string host_path = base_.Sub("canary.txt");
  EXPECT_FALSE(TryWrite("up" + host_path, "pwned"));
  // With create_parents the directories are made, inside the root.
  ASSERT_TRUE(TryWrite("up" + host_path, "inside", true));
  EXPECT_EQ(ReadWholeFile(root_ + host_path), "inside");
}

TEST_F(FileRootTest, ProcSelfRootLeadsNowhere) {
  std::string host_path = base_.Sub("canary.txt");
  EXPECT_FALSE(TryWrite("procroot" + host_path, "pwned"));
  EXPECT_FALSE(TryRead("procroot" + host_path));
  EXPECT_FALSE(TryRead("/proc/self/root" + host_path));
  EXPECT_FALSE(TryRead("/proc/1/root" + host_path));
}

TEST(FileRootMagicLinkTest, ProcMagicLinksAreRefusedEvenWithARealProc) {
  // With "/" as the root, /proc is the real one; its magic links must still not be followed.
  auto files = FileRoot::Open("/");
  ASSERT_TRUE(files);
  for (const char* path : {"/proc/self/root/etc/hostname", "/proc/self/cwd", "/proc/self/exe"}) {
    SCOPED_TRACE(path);
    auto fd = files->OpenForRead(path);
    ASSERT_FALSE(fd);
    EXPECT_EQ(fd.error().sys_errno(), ELOOP) << fd.error().message();
  }
  // Another process's links: refused too (ELOOP, or EACCES where the ptrace check comes first).
  EXPECT_FALSE(files->OpenForRead("/proc/1/root/etc/hostname"));
}

TEST_F(FileRootTest, DirectorySymlinkSwappedMidWayNeverLeadsOut) {
  // Two names swapped atomically and continuously: "d" is a real directory one moment and a
  // symlink out of the root (absolute or relative) the next.
  fs::create_directory(root_ + "/d");
  fs::create_directory(root_ + "/d2");
  fs::create_directory_symlink(outside_, root_ + "/l_abs");
  fs::create_directory_symlink("../outside", root_ + "/l_rel");
  std::atomic<bool> stop{false};
  std::atomic<long> swaps{0};
  std::thread swapper([&] {
    const std::string d = root_ + "/d", d2 = root_ + "/d2";
    const std::string la = root_ + "/l_abs", lr = root_ + "/l_rel";
    while (!stop) {
      ::renameat2(AT_FDCWD, d.c_str(), AT_FDCWD, la.c_str(), RENAME_EXCHANGE);
      ::renameat2(AT_FDCWD, d2.c_str(), AT_FDCWD, lr.c_str(), RENAME_EXCHANGE);
      swaps.fetch_add(2);
    }
  });
  long attempts = 0, written = 0, read_outside = 0;
  auto end = std::chrono::steady_clock::now() + 1s;
  while (std::chrono::steady_clock::now() < end) {
    for (const char* path :
         {"d/canary.txt", "d2/canary.txt", "d/new.txt", "l_abs/canary.txt", "l_rel/canary.txt"}) {
      ++attempts;
      written += TryWrite(path, "pwned\n", attempts % 2 == 0);
      auto text = TryRead(path);
      if (text && *text == kCanary) ++read_outside;
    }
  }
  stop = true;
  swapper.join();
  EXPECT_GT(swaps.load(), 100);
  EXPECT_GT(attempts, 100);
  EXPECT_GT(written, 0) << "no write landed inside the root either";
  EXPECT_EQ(read_outside, 0) << "read the canary outside the root";
  // TearDown checks the canaries and that nothing appeared outside.
}

TEST_F(FileRootTest, FifoIsRefusedWithoutHanging) {
  ASSERT_EQ(::mkfifo((root_ + "/fifo").c_str(), 0666), 0);
  auto attempt = std::async(std::launch::async, [&] {
    bool write_refused = !files_->OpenForWrite("fifo", 0644, false, false).has_value();
    bool append_refused = !files_->OpenForWrite("fifo", 0644, false, true).has_value();
    bool read_refused = !files_->OpenForRead("fifo").has_value();
    return write_refused && append_refused && read_refused;
  });
  if (attempt.wait_for(5s) != std::future_status::ready) {
    // Unblock the hung open (a FIFO open returns once both ends are open), then fail.
    UniqueFd unblock(::open((root_ + "/fifo").c_str(), O_RDWR | O_CLOEXEC));
    attempt.wait();
    FAIL() << "opening a FIFO hung";
  }
  EXPECT_TRUE(attempt.get()) << "a FIFO was opened as a file";
}

TEST_F(FileRootTest, DirectoryIsNotReadAsAFile) {
  auto fd = files_->OpenForRead("etc");
  ASSERT_FALSE(fd);
  EXPECT_EQ(fd.error().code(), ErrorCode::kInvalidArgument);
  EXPECT_FALSE(files_->OpenForWrite("etc", 0644, false, false));
  EXPECT_FALSE(files_->OpenForWrite("/", 0644, false, false));
}

TEST_F(FileRootTest, TheRootCannotBeRemoved) {
  for (const char* path : {"/", "", ".", "..", "//", "etc/..", "../..", "up1"}) {
    SCOPED_TRACE(path);
    auto n = files_->Remove(path, true);
    if (std::string_view(path) == "up1") {
      // A symlink to the root is removed as a symlink.
      EXPECT_TRUE(n);
      continue;
    }
    EXPECT_FALSE(n);
  }
  EXPECT_TRUE(fs::is_directory(root_));
  EXPECT_TRUE(fs::exists(root_ + "/etc/passwd"));
}

TEST_F(FileRootTest, RecursiveRemoveDoesNotFollowSymlinksOut) {
  fs::create_directories(root_ + "/tree/sub");
  WriteWholeFile(root_ + "/tree/file", "x");
  WriteWholeFile(root_ + "/tree/sub/file", "x");
  fs::create_directory_symlink(outside_, root_ + "/tree/sub/abs_link");
  fs::create_directory_symlink("../../../outside", root_ + "/tree/sub/rel_link");
  fs::create_directory_symlink("/", root_ + "/tree/slash_link");
  auto n = files_->Remove("tree", true);
  ASSERT_TRUE(n) << n.error().message();
  EXPECT_EQ(*n, 7u);  // tree, file, sub, sub/file, 2 links in sub, slash_link
  EXPECT_FALSE(fs::exists(root_ + "/tree"));
  // A symlink to an outside directory, removed by name: only the link goes.
  n = files_->Remove("out_dir", true);
  ASSERT_TRUE(n) << n.error().message();
  EXPECT_EQ(*n, 1u);
  EXPECT_FALSE(fs::is_symlink(root_ + "/out_dir"));
  // Through such a link, the path resolves inside the root, where there is nothing.
  EXPECT_FALSE(files_->Remove("out_abs/outside", true));
  EXPECT_FALSE(files_->Remove("out_abs/outside/canary.txt", false));
  // TearDown checks base/outside and its canary are intact.
}

TEST_F(FileRootTest, StatDescribesASymlinkWithoutFollowingIt) {
  auto info = files_->Stat("etclink");
  ASSERT_TRUE(info) << info.error().message();
  EXPECT_EQ(info->type, p::FileType::kSymlink);
  EXPECT_EQ(info->link_target, "/etc");
  info = files_->Stat("up");
  ASSERT_TRUE(info);
  EXPECT_EQ(info->type, p::FileType::kSymlink);
  EXPECT_EQ(info->link_target, "../../../../../../../..");
  info = files_->Stat("etc/passwd");
  ASSERT_TRUE(info);
  EXPECT_EQ(info->type, p::FileType::kFile);
  EXPECT_EQ(info->size, 15u);
  EXPECT_EQ(info->link_target, "");
  info = files_->Stat("/");
  ASSERT_TRUE(info);
  EXPECT_EQ(info->type, p::FileType::kDirectory);
  auto missing = files_->Stat("nope");
  ASSERT_FALSE(missing);
  EXPECT_EQ(missing.error().code(), ErrorCode::kNotFound);
}

TEST_F(FileRootTest, ListIsSortedAndTyped) {
  fs::create_directory(root_ + "/l");
  for (const char* name : {"b", "a", "C", "a2", "_"}) WriteWholeFile(root_ + "/l/" + name, "");
  fs::create_directory(root_ + "/l/z");
  fs::create_symlink("b", root_ + "/l/y");
  auto entries = files_->List("l");
  ASSERT_TRUE(entries) << entries.error().message();
  std::vector<std::string> names;
  for (const auto& e : *entries) names.push_back(e.name);
  EXPECT_EQ(names, (std::vector<std::string>{"C", "_", "a", "a2", "b", "y", "z"}));
  EXPECT_EQ(entries->at(5).type, p::FileType::kSymlink);
  EXPECT_EQ(entries->at(5).link_target, "b");
  EXPECT_EQ(entries->at(6).type, p::FileType::kDirectory);
  EXPECT_EQ(entries->at(0).type, p::FileType::kFile);
  EXPECT_FALSE(files_->List("l/b")) << "a file is not a directory";
}

TEST_F(FileRootTest, MkdirWithAndWithoutParents) {
  ASSERT_TRUE(files_->Mkdir("m/n/o", 0700, true));
  for (const char* dir : {"/m", "/m/n", "/m/n/o"}) {
    struct stat st;
    ASSERT_EQ(::stat((root_ + dir).c_str(), &st), 0) << dir;
    EXPECT_TRUE(S_ISDIR(st.st_mode));
    EXPECT_EQ(st.st_mode & 07777, 0700u) << dir;
  }
  EXPECT_TRUE(files_->Mkdir("m/n/o", 0700, true)) << "parents: an existing directory is fine";
  auto again = files_->Mkdir("m/n/o", 0700, false);
  ASSERT_FALSE(again);
  EXPECT_EQ(again.error().code(), ErrorCode::kAlreadyExists);
  auto orphan = files_->Mkdir("p/q", 0755, false);
  ASSERT_FALSE(orphan);
  EXPECT_EQ(orphan.error().code(), ErrorCode::kNotFound);
  ASSERT_TRUE(files_->Mkdir("p", 0755, false));
  EXPECT_TRUE(files_->Mkdir("p/q", 0755, false));
  EXPECT_FALSE(files_->Mkdir("etc/passwd/sub", 0755, true)) << "through a file";
  EXPECT_FALSE(files_->Mkdir("/", 0755, false));
}

TEST_F(FileRootTest, CreateParentsMakesTheDirectories) {
  EXPECT_FALSE(TryWrite("x/y/z.txt", "data")) << "without create_parents";
  ASSERT_TRUE(TryWrite("x/y/z.txt", "data", true));
  EXPECT_EQ(ReadWholeFile(root_ + "/x/y/z.txt"), "data");
  struct stat st;
  ASSERT_EQ(::stat((root_ + "/x/y").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0755u);
}

TEST_F(FileRootTest, AppendAndTruncate) {
  ASSERT_TRUE(TryWrite("f.txt", "abc"));
  {
    auto fd = files_->OpenForWrite("f.txt", 0644, false, true);
    ASSERT_TRUE(fd);
    ASSERT_TRUE(WriteAll(fd->get(), "def"));
  }
  EXPECT_EQ(ReadWholeFile(root_ + "/f.txt"), "abcdef");
  ASSERT_TRUE(TryWrite("f.txt", "xy"));
  EXPECT_EQ(ReadWholeFile(root_ + "/f.txt"), "xy") << "a write without append truncates";
  {
    auto fd = files_->OpenForWrite("new-append.txt", 0644, false, true);
    ASSERT_TRUE(fd) << "append creates a missing file";
    ASSERT_TRUE(WriteAll(fd->get(), "1"));
  }
  EXPECT_EQ(ReadWholeFile(root_ + "/new-append.txt"), "1");
}

TEST_F(FileRootTest, ModeBitsAreExact) {
  for (uint32_t mode : {0600u, 0640u, 0666u, 0751u, 0777u, 04755u}) {
    std::string name = "file-" + std::to_string(mode);
    auto fd = files_->OpenForWrite(name, mode, false, false);
    ASSERT_TRUE(fd) << fd.error().message();
    struct stat st;
    ASSERT_EQ(::fstat(fd->get(), &st), 0);
    EXPECT_EQ(st.st_mode & 07777, mode) << std::oct << "file mode 0" << mode;
  }
  for (uint32_t mode : {0700u, 0750u, 0777u, 01777u}) {
    std::string name = "dir-" + std::to_string(mode);
    ASSERT_TRUE(files_->Mkdir(name, mode, false));
    auto info = files_->Stat(name);
    ASSERT_TRUE(info);
    EXPECT_EQ(info->mode, mode) << std::oct << "directory mode 0" << mode;
  }
  // An existing file keeps its mode.
  ASSERT_TRUE(files_->OpenForWrite("file-384", 0777, false, false));
  EXPECT_EQ(files_->Stat("file-384")->mode, 0600u);
}

TEST_F(FileRootTest, CreatedFilesAndDirectoriesAreGivenToTheOwner) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to give files away";
  auto owned = FileRoot::Open(root_, std::make_pair(uid_t{1234}, gid_t{5678}));
  ASSERT_TRUE(owned);
  ASSERT_TRUE(owned->OpenForWrite("o/p/file", 0644, true, false));
  ASSERT_TRUE(owned->Mkdir("q", 0755, false));
  for (const char* path : {"/o", "/o/p", "/o/p/file", "/q"}) {
    struct stat st;
    ASSERT_EQ(::lstat((root_ + path).c_str(), &st), 0) << path;
    EXPECT_EQ(st.st_uid, 1234u) << path;
    EXPECT_EQ(st.st_gid, 5678u) << path;
  }
  // An existing file is not given away.
  ASSERT_TRUE(owned->OpenForWrite("etc/passwd", 0644, false, false));
  struct stat st;
  ASSERT_EQ(::stat((root_ + "/etc/passwd").c_str(), &st), 0);
  EXPECT_EQ(st.st_uid, 0u);
}

}  // namespace
}  // namespace airlock::agent::test
