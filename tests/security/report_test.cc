#include "security/report.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

namespace airlock::security {
namespace {

TEST(ReportTest, CountsVerdictsAndMarksBreaches) {
  Report report("suite");
  report.Note("engine: jail");
  report.Note("engine: jail");
  report.Add(Verdict{"host files", "read /etc/shadow", true, "EACCES"});
  report.Add(Verdict{"procfs", "write core_pattern", false, "wrote 5 bytes"});
  report.Add(Figure{"API p99 during fork bomb", 12.5, "ms", "limit 1000 ms"});
  EXPECT_EQ(report.verdicts(), 2u);
  EXPECT_EQ(report.breaches(), 1u);

  auto json = report.ToJson();
  EXPECT_EQ(json["summary"]["payloads"], 2);
  EXPECT_EQ(json["summary"]["breached"], 1);
  EXPECT_EQ(json["verdicts"][1]["verdict"], "BREACH");
  EXPECT_EQ(json["figures"][0]["value"], 12.5);
  EXPECT_EQ(json["notes"].size(), 1u);

  auto md = report.ToMarkdown();
  EXPECT_NE(md.find("2 payloads: 1 contained, 1 breached."), std::string::npos) << md;
  EXPECT_NE(md.find("| procfs | write core_pattern | **BREACH** | wrote 5 bytes |"),
            std::string::npos)
      << md;
  EXPECT_NE(md.find("| API p99 during fork bomb | 12.5 | ms | limit 1000 ms |"),
            std::string::npos)
      << md;
}

TEST(ReportTest, AVerdictNamesItsEngine) {
  Report report("suite");
  report.Add(Verdict{"seccomp table", "unshare(CLONE_NEWUSER)", true, "EPERM", "gvisor"});
  report.Add(Verdict{"tenancy", "B reads A's sandbox", true, "404"});
  auto json = report.ToJson();
  EXPECT_EQ(json["verdicts"][0]["engine"], "gvisor");
  EXPECT_FALSE(json["verdicts"][1].contains("engine"));
  auto md = report.ToMarkdown();
  EXPECT_NE(md.find("| seccomp table | unshare(CLONE_NEWUSER) (gvisor) | contained | EPERM |"),
            std::string::npos)
      << md;
  EXPECT_NE(md.find("| tenancy | B reads A's sandbox | contained | 404 |"), std::string::npos)
      << md;
}

TEST(ReportTest, MarkdownCellsCannotBreakTheTable) {
  Report report("suite");
  report.Add(Verdict{"file API", "a|b\nc", true, "x|y"});
  auto md = report.ToMarkdown();
  EXPECT_NE(md.find("| file API | a\\|b c | contained | x\\|y |"), std::string::npos) << md;
}

TEST(ReportTest, WritesMarkdownAndJsonSideBySide) {
  auto dir = std::filesystem::temp_directory_path() /
             ("airlock-report-test-" + std::to_string(::getpid()));
  Report report("suite");
  report.Add(Verdict{"posture", "NoNewPrivs", true, "1"});
  ASSERT_TRUE(report.Write(dir.string(), "security"));
  std::ifstream js(dir / "security.json");
  std::stringstream text;
  text << js.rdbuf();
  EXPECT_EQ(nlohmann::json::parse(text.str())["verdicts"][0]["name"], "NoNewPrivs");
  EXPECT_TRUE(std::filesystem::exists(dir / "security.md"));
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace airlock::security
