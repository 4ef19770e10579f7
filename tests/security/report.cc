#include "security/report.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace airlock::security {
namespace {

// A Markdown table cell: pipes escaped, newlines folded.
std::string Cell(const std::string& text) {
  std::string out;
  for (char c : text) {
    if (c == '|') {
      out += "\\|";
    } else if (c == '\n' || c == '\r') {
      out += ' ';
    } else {
      out += c;
    }
  }
  return out;
}

std::string FormatValue(double value) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.6g", value);
  return buf;
}

}  // namespace

Report& Report::Global() {
  static Report report("");
  return report;
}

void Report::SetTitle(std::string title) {
  std::lock_guard lock(mu_);
  title_ = std::move(title);
}

void Report::Add(Verdict verdict) {
  std::lock_guard lock(mu_);
  verdicts_.push_back(std::move(verdict));
}

void Report::Add(Figure figure) {
  std::lock_guard lock(mu_);
  figures_.push_back(std::move(figure));
}

void Report::Note(std::string line) {
  std::lock_guard lock(mu_);
  // Fixtures note their setting once per test: the report says it once.
  if (std::find(notes_.begin(), notes_.end(), line) == notes_.end()) {
    notes_.push_back(std::move(line));
  }
}

size_t Report::verdicts() const {
  std::lock_guard lock(mu_);
  return verdicts_.size();
}

bool Report::empty() const {
  std::lock_guard lock(mu_);
  return verdicts_.empty() && figures_.empty();
}

size_t Report::breaches() const {
  std::lock_guard lock(mu_);
  size_t n = 0;
  for (const auto& v : verdicts_) n += v.contained ? 0 : 1;
  return n;
}

nlohmann::json Report::ToJson() const {
  std::lock_guard lock(mu_);
  nlohmann::json out;
  out["title"] = title_;
  out["notes"] = notes_;
  size_t breached = 0;
  out["verdicts"] = nlohmann::json::array();
  for (const auto& v : verdicts_) {
    breached += v.contained ? 0 : 1;
    nlohmann::json one = {{"class", v.klass},
                          {"name", v.name},
                          {"verdict", v.contained ? "contained" : "BREACH"},
                          {"detail", v.detail}};
    if (!v.engine.empty()) one["engine"] = v.engine;
    out["verdicts"].push_back(std::move(one));
  }
  out["figures"] = nlohmann::json::array();
  for (const auto& f : figures_) {
    out["figures"].push_back(
        {{"name", f.name}, {"value", f.value}, {"unit", f.unit}, {"note", f.note}});
  }
  out["summary"] = {{"payloads", verdicts_.size()},
                    {"contained", verdicts_.size() - breached},
                    {"breached", breached}};
  return out;
}

std::string Report::ToMarkdown() const {
  std::lock_guard lock(mu_);
  std::ostringstream md;
  md << "# " << title_ << "\n\n";
  for (const auto& line : notes_) md << "- " << line << "\n";
  if (!notes_.empty()) md << "\n";
  if (!verdicts_.empty()) {
    size_t breached = 0;
    for (const auto& v : verdicts_) breached += v.contained ? 0 : 1;
    md << verdicts_.size() << " payloads: " << verdicts_.size() - breached << " contained, "
       << breached << " breached.\n\n";
    md << "| class | payload | verdict | observed |\n| --- | --- | --- | --- |\n";
    for (const auto& v : verdicts_) {
      const std::string name = v.engine.empty() ? v.name : v.name + " (" + v.engine + ")";
      md << "| " << Cell(v.klass) << " | " << Cell(name) << " | "
         << (v.contained ? "contained" : "**BREACH**") << " | " << Cell(v.detail) << " |\n";
    }
    md << "\n";
  }
  if (!figures_.empty()) {
    md << "| figure | value | unit | note |\n| --- | --- | --- | --- |\n";
    for (const auto& f : figures_) {
      md << "| " << Cell(f.name) << " | " << FormatValue(f.value) << " | " << Cell(f.unit)
         << " | " << Cell(f.note) << " |\n";
    }
    md << "\n";
  }
  return md.str();
}

bool Report::Write(const std::string& dir, const std::string& name) const {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) {
    std::fprintf(stderr, "report: cannot make %s: %s\n", dir.c_str(), ec.message().c_str());
    return false;
  }
  const std::string base = dir + "/" + name;
  std::ofstream md(base + ".md");
  md << ToMarkdown();
  std::ofstream js(base + ".json");
  js << ToJson().dump(2) << "\n";
  md.close();
  js.close();
  if (!md || !js) {
    std::fprintf(stderr, "report: cannot write %s.{md,json}\n", base.c_str());
    return false;
  }
  std::fprintf(stderr, "report: %s.md and %s.json\n", base.c_str(), base.c_str());
  return true;
}

ReportEnvironment::ReportEnvironment(std::string name, std::string title)
    : name_(std::move(name)) {
  Report::Global().SetTitle(std::move(title));
}

void ReportEnvironment::TearDown() {
  if (Report::Global().empty()) return;
  Report::Global().Write(ReportDir(), name_);
}

std::string ReportDir() {
  const char* dir = std::getenv("AIRLOCK_REPORT_DIR");
  return dir != nullptr && *dir != '\0' ? dir : "security-report";
}

int RunAllTestsForCtest() {
  const int result = RUN_ALL_TESTS();
  const ::testing::UnitTest& unit = *::testing::UnitTest::GetInstance();
  if (result == 0 && unit.successful_test_count() == 0 && unit.skipped_test_count() > 0) {
    return kAllSkippedExitCode;
  }
  return result;
}

}  // namespace airlock::security
