// The security and reliability suite's report: every payload's verdict and every figure a run
// measured, written as Markdown (for people) and JSON (for tools) side by side.
//
// A gtest binary owns one Report (Report::Global()); tests add to it as they run and
// ReportEnvironment writes it when the binary ends. Where: $AIRLOCK_REPORT_DIR, or
// "security-report" in the working directory (ctest runs in the build dir), as <name>.md and
// <name>.json. Adding is thread-safe.
#pragma once

#include <gtest/gtest.h>

#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace airlock::security {

// One hostile payload (or leak check) and what happened to it.
struct Verdict {
  std::string klass;   // the test class of SECURITY.md: "host files", "seccomp table", ...
  std::string name;    // what was tried, e.g. "read /etc/shadow"
  bool contained = false;  // the attack failed and the host canary is untouched
  std::string detail;  // what was observed: errno, exit code, bytes, counter values
  std::string engine;  // the engine the payload ran on ("" when it is not about one)
};

// One measured number.
struct Figure {
  std::string name;  // e.g. "API p99 during fork bomb"
  double value = 0;
  std::string unit;  // "ms", "MiB", "%", "count"
  std::string note;  // the limit it is held to, or how it was measured
};

class Report {
 public:
  explicit Report(std::string title) : title_(std::move(title)) {}

  // The report of this test binary; its title is set by ReportEnvironment.
  static Report& Global();

  void SetTitle(std::string title);
  void Add(Verdict verdict);
  void Add(Figure figure);
  // A line of context: engine, kernel, load, duration, parameters (each line once).
  void Note(std::string line);

  nlohmann::json ToJson() const;
  std::string ToMarkdown() const;
  // Writes <dir>/<name>.md and <dir>/<name>.json; false (with the reason on stderr) on failure.
  bool Write(const std::string& dir, const std::string& name) const;

  size_t verdicts() const;
  size_t breaches() const;  // verdicts not contained
  bool empty() const;       // no verdict and no figure

 private:
  mutable std::mutex mu_;
  std::string title_;
  std::vector<std::string> notes_;
  std::vector<Verdict> verdicts_;
  std::vector<Figure> figures_;
};

// Registers with ::testing::AddGlobalTestEnvironment; writes Report::Global() at the end.
class ReportEnvironment : public ::testing::Environment {
 public:
  ReportEnvironment(std::string name, std::string title);
  void TearDown() override;

 private:
  std::string name_;
};

// $AIRLOCK_REPORT_DIR or "security-report".
std::string ReportDir();

// The exit code a binary that ctest runs as one test reports when every test in it skipped; its
// add_test sets SKIP_RETURN_CODE to it, so ctest counts a skip, not a pass.
inline constexpr int kAllSkippedExitCode = 77;

// RUN_ALL_TESTS, but kAllSkippedExitCode when no test failed or passed and some skipped (not
// root, say). A binary with some tests passed and some skipped still passes.
int RunAllTestsForCtest();

}  // namespace airlock::security
