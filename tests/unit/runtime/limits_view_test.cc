// The jail's view of a sandbox's limits (runtime/jail/limits_view.h): the CPUs a sandbox runs
// on, the CPU list it reads, and the /proc/meminfo made from the host's and its memory cgroup.

#include "runtime/jail/limits_view.h"

#include <gtest/gtest.h>

namespace airlock::jail {
namespace {

constexpr char kHost[] =
    "MemTotal:       24684840 kB\n"
    "MemFree:        21000000 kB\n"
    "MemAvailable:   21500000 kB\n"
    "Buffers:           10000 kB\n"
    "Cached:          1000000 kB\n"
    "SwapTotal:             0 kB\n"
    "Committed_AS:    5000000 kB\n"
    "HugePages_Total:       0\n";

TEST(LimitsViewTest, ASandboxGetsCeilCpusOfTheAllowedOnesFromItsStart) {
  const std::vector<int> allowed = {0, 1, 2, 3};
  EXPECT_EQ(ViewCpus(allowed, 1, 0), (std::vector<int>{0}));
  EXPECT_EQ(ViewCpus(allowed, 0.5, 5), (std::vector<int>{1}));
  EXPECT_EQ(ViewCpus(allowed, 1.5, 3), (std::vector<int>{0, 3}));
  EXPECT_EQ(ViewCpus(allowed, 2, 1), (std::vector<int>{1, 2}));
  EXPECT_EQ(ViewCpus(allowed, 4, 2), allowed);
  EXPECT_EQ(ViewCpus(allowed, 64, 0), allowed) << "more than the host: the host's";
  EXPECT_EQ(CpuList({0}), "0\n");
  EXPECT_EQ(CpuList({0, 1, 2, 5, 7, 8}), "0-2,5,7-8\n");
}

TEST(LimitsViewTest, MeminfoShowsTheLimitAndTheCgroupsUse) {
  SandboxCgroup::MemoryUse use;
  use.limit = 256ull << 20;
  use.usage = 100ull << 20;
  use.stat = {{"cache", 30ull << 20},       {"rss", 70ull << 20},
              {"active_file", 10ull << 20}, {"inactive_file", 20ull << 20},
              {"active_anon", 60ull << 20}, {"inactive_anon", 10ull << 20},
              {"shmem", 1ull << 20}};
  const std::string view = Meminfo(kHost, use);
  EXPECT_NE(view.find("MemTotal:         262144 kB\n"), std::string::npos) << view;
  EXPECT_NE(view.find("MemFree:          159744 kB\n"), std::string::npos) << view;
  EXPECT_NE(view.find("MemAvailable:     190464 kB\n"), std::string::npos) << view;
  EXPECT_NE(view.find("Buffers:               0 kB\n"), std::string::npos) << view;
  EXPECT_NE(view.find("Cached:            30720 kB\n"), std::string::npos) << view;
  // Lines it has nothing to say about are the host's, in the host's order.
  EXPECT_NE(view.find("Committed_AS:    5000000 kB\nHugePages_Total:       0\n"), std::string::npos)
      << view;
  // Use over the limit (it can be, briefly) never makes MemFree negative.
  use.usage = 300ull << 20;
  EXPECT_NE(Meminfo(kHost, use).find("MemFree:               0 kB\n"), std::string::npos);
}

TEST(LimitsViewTest, NoLimitBelowTheHostsShowsTheHostsOwn) {
  SandboxCgroup::MemoryUse use;
  EXPECT_EQ(Meminfo(kHost, use), kHost) << "no limit";
  use.limit = 256ull << 30;
  use.usage = 1ull << 30;
  EXPECT_EQ(Meminfo(kHost, use), kHost) << "a limit above the host's memory";
}

}  // namespace
}  // namespace airlock::jail
