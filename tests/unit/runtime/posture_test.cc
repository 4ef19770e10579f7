// The posture checker against processes that are not sandboxed: a plain host child must fail
// the checks a sandbox passes, and one that set no_new_privs and a seccomp filter must pass
// exactly those two. (A real sandbox passing every check: tests/unit/runtime/jail_test.cc and
// the security suite.)

#include "runtime/jail/posture.h"

#include <gtest/gtest.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <map>
#include <string>

namespace airlock::jail {
namespace {

// A child that waits to be killed, after `setup` ran in it; killed and reaped on destruction.
class Child {
 public:
  explicit Child(void (*setup)()) {
    int ready[2];
    EXPECT_EQ(::pipe(ready), 0);
    pid_ = ::fork();
    if (pid_ == 0) {
      ::close(ready[0]);
      if (setup) setup();
      (void)!::write(ready[1], "x", 1);
      for (;;) ::pause();
    }
    ::close(ready[1]);
    char c;
    EXPECT_EQ(::read(ready[0], &c, 1), 1);
    ::close(ready[0]);
  }
  ~Child() {
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
  }
  pid_t pid() const { return pid_; }

 private:
  pid_t pid_ = -1;
};

// check name -> ok, for one pid.
std::map<std::string, bool> ByName(const std::vector<PostureCheck>& checks) {
  std::map<std::string, bool> out;
  for (const PostureCheck& c : checks) out[c.check] = c.ok;
  return out;
}

PostureExpectations Expect() {
  PostureExpectations e;
  e.host_pid = ::getpid();
  e.nofile = 4096;
  e.cgroup_suffix = "/airlock/sbx-posture-test";
  return e;
}

TEST(PostureTest, APlainHostProcessFailsEveryIsolationCheck) {
  Child child(nullptr);
  const auto checks = CheckPosture({child.pid()}, Expect());
  const auto ok = ByName(checks);
  EXPECT_FALSE(ok.at("seccomp"));
  EXPECT_FALSE(ok.at("no_new_privs"));
  for (const char* ns : {"ns user", "ns pid", "ns mnt", "ns uts", "ns ipc", "ns net", "ns cgroup"}) {
    EXPECT_FALSE(ok.at(ns)) << ns << ": the child shares our namespaces";
  }
  EXPECT_FALSE(ok.at("cgroup")) << "the child is in no sandbox cgroup";
  // Our own user namespace maps ids to themselves (the host's, or a container's identity map).
  EXPECT_FALSE(ok.at("uid_map"));
  if (::geteuid() == 0) {
    EXPECT_FALSE(ok.at("capabilities")) << "root's child has capabilities";
  }
  EXPECT_FALSE(IsNamespaceInit(child.pid()));
  // Every failed check is a finding, with what was seen.
  const auto findings = Findings(checks);
  EXPECT_GE(findings.size(), 11u);
  for (const PostureCheck& f : findings) {
    EXPECT_FALSE(f.ok);
    EXPECT_FALSE(f.detail.empty()) << f.check;
    EXPECT_EQ(f.pid, child.pid());
  }
}

TEST(PostureTest, NoNewPrivsAndSeccompAreSeenWhenSet) {
  Child child(+[] {
    ::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0);
    sock_filter allow[] = {BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW)};
    sock_fprog prog{1, allow};
    ::prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog);
  });
  const auto ok = ByName(CheckPosture({child.pid()}, Expect()));
  EXPECT_TRUE(ok.at("seccomp"));
  EXPECT_TRUE(ok.at("no_new_privs"));
  EXPECT_FALSE(ok.at("ns user"));
}

TEST(PostureTest, ExtraFdsAndRaisedLimitsAreFindings) {
  Child child(+[] {
    ::dup2(STDERR_FILENO, 9);  // a leaked fd
    rlimit core{RLIM_INFINITY, RLIM_INFINITY};
    ::setrlimit(RLIMIT_CORE, &core);
  });
  const auto checks = CheckPosture({child.pid()}, Expect());
  for (const PostureCheck& c : checks) {
    if (c.check == "fds") {
      EXPECT_FALSE(c.ok) << c.detail;
      EXPECT_NE(c.detail.find("9="), std::string::npos) << c.detail;
    }
    if (c.check == "rlimits") {
      EXPECT_FALSE(c.ok) << c.detail;
    }
  }
}

TEST(PostureTest, AProcessThatIsGoneIsAFinding) {
  pid_t gone;
  {
    Child child(nullptr);
    gone = child.pid();
  }
  const auto checks = CheckPosture({gone}, Expect());
  ASSERT_EQ(checks.size(), 1u);
  EXPECT_EQ(checks[0].check, "exists");
  EXPECT_FALSE(checks[0].ok);
}

}  // namespace
}  // namespace airlock::jail
