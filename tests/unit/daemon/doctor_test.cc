// airlockd --doctor's host checks (daemon/server/doctor.h) against made-up hosts: a /proc, /sys
// and /dev tree in a temporary directory, one condition changed at a time beside a healthy
// host as the positive control. The real host and the engines are checked end to end
// (tests/integration/doctor_test.cc).

#include "daemon/server/doctor.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

namespace {

namespace fs = std::filesystem;
using airlock::daemon::CheckEngines;
using airlock::daemon::CheckHost;
using airlock::daemon::DoctorJson;
using airlock::daemon::DoctorText;
using airlock::daemon::Finding;
using airlock::daemon::HostCheckInput;
using airlock::daemon::Ready;
using airlock::daemon::Verdict;

class DoctorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/airlock-doctor-test-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    root_ = tmpl;
    // A healthy cgroup v2 host whose daemon sits in /system.slice/airlockd.service.
    Write("proc/sys/kernel/osrelease", "6.1.0-28-amd64\n");
    Write("proc/self/cgroup", "0::/system.slice/airlockd.service\n");
    Write("sys/fs/cgroup/cgroup.controllers", "cpuset cpu io memory hugetlb pids rdma misc\n");
    Write("sys/fs/cgroup/system.slice/airlockd.service/cgroup.controllers",
          "cpuset cpu io memory pids\n");
    Write("proc/sys/user/max_user_namespaces", "63456\n");
    Write("proc/filesystems", "nodev\tsysfs\nnodev\ttmpfs\n\text4\nnodev\toverlay\n");
    Write("proc/sys/kernel/seccomp/actions_avail",
          "kill_process kill_thread trap errno user_notif trace log allow\n");
    Write("proc/sys/net/ipv4/ip_forward", "0\n");
    Write("bin/nft", "", 0755);
    Write("bin/ip", "", 0755);
    Write("bin/runsc", "", 0755);
    fs::create_directories(root_ + "/dev");
    fs::create_directories(root_ + "/state");
    input_.host = {.proc = root_ + "/proc",
                   .sys = root_ + "/sys",
                   .dev = root_ + "/dev",
                   .path_env = root_ + "/nothing-here:" + root_ + "/bin"};
    input_.state_dir = root_ + "/state";
  }
  void TearDown() override { fs::remove_all(root_); }

  void Write(const std::string& rel, const std::string& text, mode_t mode = 0644) {
    const fs::path path = root_ + "/" + rel;
    fs::create_directories(path.parent_path());
    std::ofstream(path) << text;
    ::chmod(path.c_str(), mode);
  }

  // The one finding named `check` (a failure if there is not exactly one).
  Finding Get(const std::string& check) {
    Finding found;
    int n = 0;
    for (const Finding& f : CheckHost(input_)) {
      if (f.check == check) {
        found = f;
        ++n;
      }
    }
    EXPECT_EQ(n, 1) << "findings named " << check;
    return found;
  }

  std::string root_;
  HostCheckInput input_;
};

TEST_F(DoctorTest, AHealthyHostPassesEveryCheck) {
  const auto findings = CheckHost(input_);
  for (const Finding& f : findings) {
    if (f.check == "disk") continue;  // the real /tmp's: how full it is is the machine's
    EXPECT_TRUE(f.verdict == Verdict::kOk || f.verdict == Verdict::kInfo)
        << f.check << ": " << f.detail;
  }
  EXPECT_TRUE(Ready(findings));
  EXPECT_EQ(Get("cgroups").detail,
            "cgroup v2, memory, cpu, pids delegated to "
            "/system.slice/airlockd.service");
  EXPECT_EQ(Get("runsc").detail, root_ + "/bin/runsc") << "found in the second PATH entry";
  EXPECT_EQ(Get("kernel").detail, "6.1.0-28-amd64");
}

TEST_F(DoctorTest, CgroupV2WithoutDelegationFailsAndSaysHowToDelegate) {
  Write("sys/fs/cgroup/system.slice/airlockd.service/cgroup.controllers", "cpu io\n");
  const Finding f = Get("cgroups");
  EXPECT_EQ(f.verdict, Verdict::kFail);
  EXPECT_NE(f.detail.find("is not given memory, pids"), std::string::npos) << f.detail;
  EXPECT_NE(f.fix.find("Delegate=yes"), std::string::npos) << f.fix;
  EXPECT_NE(f.fix.find("echo '+memory +pids' > " + root_ +
                       "/sys/fs/cgroup/system.slice/"
                       "cgroup.subtree_control"),
            std::string::npos)
      << f.fix;
  EXPECT_FALSE(Ready(CheckHost(input_)));
}

TEST_F(DoctorTest, CgroupV1NeedsItsFourControllers) {
  fs::remove_all(root_ + "/sys/fs/cgroup");
  for (const char* c : {"memory", "cpu", "pids", "freezer", "unified"}) {
    fs::create_directories(root_ + "/sys/fs/cgroup/" + c);
  }
  Finding f = Get("cgroups");
  EXPECT_EQ(f.verdict, Verdict::kOk) << f.detail;
  EXPECT_NE(f.detail.find("hybrid"), std::string::npos) << f.detail;
  fs::remove_all(root_ + "/sys/fs/cgroup/freezer");
  f = Get("cgroups");
  EXPECT_EQ(f.verdict, Verdict::kFail);
  EXPECT_NE(f.detail.find("lacks freezer"), std::string::npos) << f.detail;
}

TEST_F(DoctorTest, UserNamespacesTurnedOffOrAbsentFail) {
  Write("proc/sys/user/max_user_namespaces", "0\n");
  Finding f = Get("user namespaces");
  EXPECT_EQ(f.verdict, Verdict::kFail);
  EXPECT_NE(f.fix.find("sysctl -w user.max_user_namespaces="), std::string::npos) << f.fix;
  fs::remove(root_ + "/proc/sys/user/max_user_namespaces");
  f = Get("user namespaces");
  EXPECT_EQ(f.verdict, Verdict::kFail);
  EXPECT_NE(f.detail.find("has none"), std::string::npos) << f.detail;
}

TEST_F(DoctorTest, AppArmorsUsernsRestrictionMattersOnlyToNonRoot) {
  Write("proc/sys/kernel/apparmor_restrict_unprivileged_userns", "1\n");
  EXPECT_EQ(Get("apparmor").verdict, Verdict::kInfo);
  input_.running_as_root = false;
  EXPECT_EQ(Get("apparmor").verdict, Verdict::kWarn);
  Write("proc/sys/kernel/apparmor_restrict_unprivileged_userns", "0\n");
  for (const Finding& f : CheckHost(input_)) EXPECT_NE(f.check, "apparmor");
}

TEST_F(DoctorTest, SelinuxEnforcingIsAWarning) {
  Write("sys/fs/selinux/enforce", "1");
  EXPECT_EQ(Get("selinux").verdict, Verdict::kWarn);
  Write("sys/fs/selinux/enforce", "0");
  for (const Finding& f : CheckHost(input_)) EXPECT_NE(f.check, "selinux");
}

TEST_F(DoctorTest, MissingRunscIsAWarningNamingWhereItLooked) {
  fs::remove(root_ + "/bin/runsc");
  Finding f = Get("runsc");
  EXPECT_EQ(f.verdict, Verdict::kWarn);
  EXPECT_NE(f.detail.find("not found in PATH"), std::string::npos) << f.detail;
  EXPECT_NE(f.fix.find("apt install runsc"), std::string::npos) << f.fix;
  // A configured path is looked at, not PATH.
  Write("bin/runsc", "", 0755);
  input_.runsc = root_ + "/opt/runsc";
  f = Get("runsc");
  EXPECT_EQ(f.verdict, Verdict::kWarn);
  EXPECT_NE(f.detail.find(root_ + "/opt/runsc"), std::string::npos) << f.detail;
  // A file that is not executable is not a runsc (not even for root).
  Write("opt/runsc", "", 0644);
  EXPECT_EQ(Get("runsc").verdict, Verdict::kWarn);
  Write("opt/runsc", "", 0755);
  EXPECT_EQ(Get("runsc").verdict, Verdict::kOk);
}

TEST_F(DoctorTest, NoNftOrIpMeansNoSandboxNetwork) {
  fs::remove(root_ + "/bin/nft");
  Finding f = Get("nft");
  EXPECT_EQ(f.verdict, Verdict::kWarn);
  EXPECT_EQ(f.fix, "apt install nftables");
  EXPECT_EQ(Get("ip").verdict, Verdict::kOk);
  fs::remove(root_ + "/bin/ip");
  EXPECT_EQ(Get("ip").fix, "apt install iproute2");
  EXPECT_TRUE(Ready(CheckHost(input_))) << "a host without networking still runs sandboxes";
}

TEST_F(DoctorTest, SeccompWithoutFiltersOrActionsFails) {
  Write("proc/sys/kernel/seccomp/actions_avail", "kill_thread allow\n");
  Finding f = Get("seccomp");
  EXPECT_EQ(f.verdict, Verdict::kFail);
  EXPECT_NE(f.detail.find("kill_process, errno, trap"), std::string::npos) << f.detail;
  fs::remove(root_ + "/proc/sys/kernel/seccomp/actions_avail");
  EXPECT_EQ(Get("seccomp").verdict, Verdict::kFail);
}

TEST_F(DoctorTest, OverlayfsMissingAndAnOldKernelAreWarnings) {
  Write("proc/filesystems", "nodev\tsysfs\n\text4\n");
  EXPECT_EQ(Get("overlayfs").verdict, Verdict::kWarn);
  Write("proc/sys/kernel/osrelease", "4.19.0-27-amd64\n");
  EXPECT_EQ(Get("kernel").verdict, Verdict::kWarn);
  Write("proc/sys/kernel/osrelease", "5.10.0-33-amd64\n");
  EXPECT_EQ(Get("kernel").verdict, Verdict::kOk);
}

TEST_F(DoctorTest, IpForwardMattersOnlyInOpenMode) {
  EXPECT_EQ(Get("ip_forward").verdict, Verdict::kInfo);
  input_.open_mode = true;
  Finding f = Get("ip_forward");
  EXPECT_EQ(f.verdict, Verdict::kOk) << "airlockd turns it on itself: " << f.detail;
  Write("proc/sys/net/ipv4/ip_forward", "1\n");
  EXPECT_EQ(Get("ip_forward").verdict, Verdict::kOk);
}

TEST_F(DoctorTest, KvmIsReportedNotJudged) {
  EXPECT_NE(Get("kvm").detail.find("no /dev/kvm"), std::string::npos);
  Write("dev/kvm", "");
  const Finding f = Get("kvm");
  EXPECT_EQ(f.verdict, Verdict::kInfo);
  EXPECT_NE(f.detail.find("guest really boots"), std::string::npos) << f.detail;
}

// Real small file systems (tmpfs; root, to mount them; skipped otherwise): one with room but
// few inodes, filled until it has almost none, and one too small for anything.
TEST_F(DoctorTest, AFullDiskFailsAndANewStateDirIsJudgedByItsParent) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to mount a small tmpfs";
  const std::string mnt = root_ + "/small";
  fs::create_directories(mnt);
  ASSERT_EQ(std::system(("mount -t tmpfs -o size=1g,nr_inodes=5000 tmpfs " + mnt).c_str()), 0);
  struct Unmount {
    std::string at;
    ~Unmount() { (void)std::system(("umount " + at).c_str()); }
  } unmount{mnt};
  input_.state_dir = mnt + "/var/lib/airlock";  // does not exist yet: its parent's fs counts
  Finding f = Get("disk");
  EXPECT_EQ(f.verdict, Verdict::kWarn) << "1 GiB is little headroom, not too little: " << f.detail;
  EXPECT_NE(f.detail.find("on the file system of " + mnt), std::string::npos) << f.detail;
  for (int i = 0; i < 1200; ++i) std::ofstream(mnt + "/f" + std::to_string(i));
  f = Get("disk");
  EXPECT_EQ(f.verdict, Verdict::kFail) << "under 4096 inodes left: " << f.detail;
  EXPECT_NE(f.detail.find("inodes free of 5000"), std::string::npos) << f.detail;

  const std::string tiny = root_ + "/tiny";
  fs::create_directories(tiny);
  ASSERT_EQ(std::system(("mount -t tmpfs -o size=1m tmpfs " + tiny).c_str()), 0);
  Unmount unmount_tiny{tiny};
  input_.state_dir = tiny;
  f = Get("disk");
  EXPECT_EQ(f.verdict, Verdict::kFail) << f.detail;
  EXPECT_NE(f.detail.find("too little to create sandboxes"), std::string::npos) << f.detail;
}

TEST(DoctorEnginesTest, TheDefaultEngineUnavailableFailsAnotherOnlyWarns) {
  std::vector<airlock::runtime::EngineStatus> engines(3);
  engines[0].name = "jail";
  engines[0].available = true;
  engines[0].description = "namespaces";
  engines[1].name = "gvisor";
  engines[1].reason = "runsc not found";
  engines[2].name = "vm";
  engines[2].enabled = false;
  engines[2].reason = "turned off";
  auto findings = CheckEngines(engines, "jail");
  ASSERT_EQ(findings.size(), 3u);
  EXPECT_EQ(findings[0].verdict, Verdict::kOk);
  EXPECT_NE(findings[0].detail.find("(the default)"), std::string::npos);
  EXPECT_EQ(findings[1].verdict, Verdict::kWarn);
  EXPECT_NE(findings[1].detail.find("runsc not found"), std::string::npos);
  EXPECT_EQ(findings[2].verdict, Verdict::kInfo);
  EXPECT_TRUE(Ready(findings));

  findings = CheckEngines(engines, "gvisor");
  EXPECT_EQ(findings[1].verdict, Verdict::kFail);
  EXPECT_FALSE(Ready(findings));
  const auto doc = DoctorJson(findings, engines, "gvisor");
  EXPECT_EQ(doc["ready"], false);
  EXPECT_EQ(doc["engines"][1]["default"], true);
  EXPECT_EQ(doc["findings"][1]["verdict"], "fail");
  EXPECT_NE(DoctorText(findings).find("fail  engine gvisor"), std::string::npos)
      << DoctorText(findings);

  findings = CheckEngines(engines, "nosuch");
  EXPECT_EQ(findings.back().check, "engine nosuch");
  EXPECT_EQ(findings.back().verdict, Verdict::kFail);
}

}  // namespace
