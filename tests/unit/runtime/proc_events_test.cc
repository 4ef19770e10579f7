// The jail's reading of /proc/PID/cmdline into a capped argv (runtime/jail/proc_events.h); the
// process events themselves are checked end to end by the engine conformance suite.

#include "runtime/jail/proc_events.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace airlock::jail {
namespace {

using runtime::ProcessEvent;
using namespace std::string_literals;

ProcessEvent Parse(std::string_view bytes, bool more = false) {
  ProcessEvent event;
  ParseCmdline(bytes, more, event);
  return event;
}

TEST(ParseCmdline, SplitsAtNulsAndKeepsEmptyArguments) {
  ProcessEvent e = Parse("/bin/echo\0hello-marker\0"s);
  EXPECT_EQ(e.argv, (std::vector<std::string>{"/bin/echo", "hello-marker"}));
  EXPECT_FALSE(e.argv_truncated);
  EXPECT_EQ(Parse("sh\0-c\0\0"s).argv, (std::vector<std::string>{"sh", "-c", ""}));
  // A process that rewrote its argv without NULs (setproctitle): one argument.
  EXPECT_EQ(Parse("nginx: worker process").argv,
            (std::vector<std::string>{"nginx: worker process"}));
  EXPECT_TRUE(Parse("").argv.empty());
}

TEST(ParseCmdline, CapsTheArgumentsAndTheBytes) {
  std::string many;
  for (int i = 0; i < 40; ++i) many += "a" + std::to_string(i) + '\0';
  ProcessEvent e = Parse(many);
  ASSERT_EQ(e.argv.size(), ProcessEvent::kMaxArgs);
  EXPECT_EQ(e.argv.back(), "a31");
  EXPECT_TRUE(e.argv_truncated);
  // Exactly at the cap: whole, not truncated (the control).
  std::string exact;
  for (size_t i = 0; i < ProcessEvent::kMaxArgs; ++i) exact += "b"s + '\0';
  EXPECT_FALSE(Parse(exact).argv_truncated);

  const std::string big = "/bin/cat\0"s + std::string(6000, 'x') + '\0' + "after" + '\0';
  e = Parse(big);
  ASSERT_EQ(e.argv.size(), 2u);
  EXPECT_EQ(e.argv[1], std::string(ProcessEvent::kMaxArgvBytes - 8, 'x'));
  EXPECT_TRUE(e.argv_truncated);
  // Bytes that are only the start of the file are truncated whatever they hold.
  EXPECT_TRUE(Parse("a\0b\0"s, /*more=*/true).argv_truncated);
}

}  // namespace
}  // namespace airlock::jail
