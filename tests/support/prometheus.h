#pragma once
// Checks of the Prometheus text exposition format (0.0.4) that /metrics answers in, for the
// unit tests of its rendering and the end-to-end tests of the daemon's.

#include <cstring>
#include <regex>
#include <set>
#include <sstream>
#include <string>

namespace airlock::testing {

// Every line is blank, a # HELP, a # TYPE naming a family once, or `name{labels} value` of a
// family whose TYPE came before (histograms' _bucket, _sum and _count too), every label value
// quoted. "" when valid, else the first line that is not.
inline std::string ExpositionProblems(const std::string& text) {
  static const std::regex sample(
      R"(^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[a-zA-Z_][a-zA-Z0-9_]*="[^"\\\n]*"(,[a-zA-Z_][a-zA-Z0-9_]*="[^"\\\n]*")*\})? (-?[0-9.eE+-]+|NaN|\+Inf|-Inf)$)");
  static const std::regex type(
      R"(^# TYPE ([a-zA-Z_:][a-zA-Z0-9_:]*) (counter|gauge|histogram|summary|untyped)$)");
  std::set<std::string> typed;
  std::istringstream lines(text);
  std::string line;
  std::smatch m;
  while (std::getline(lines, line)) {
    if (line.empty() || line.starts_with("# HELP ")) continue;
    if (std::regex_match(line, m, type)) {
      if (!typed.insert(m[1]).second) return "TYPE twice: " + line;
      continue;
    }
    if (!std::regex_match(line, m, sample)) return "not a sample: " + line;
    std::string family = m[1];
    for (const char* suffix : {"_bucket", "_sum", "_count"}) {
      if (!typed.contains(family) && family.ends_with(suffix)) {
        family.resize(family.size() - std::strlen(suffix));
      }
    }
    if (!typed.contains(family)) return "no TYPE before: " + line;
  }
  return "";
}

// The value of the sample `series` (`name{labels}` exactly as rendered) in `text`; -1 if absent.
inline double SeriesValue(const std::string& text, const std::string& series) {
  const std::string wanted = "\n" + series + " ";
  size_t at = ("\n" + text).find(wanted);
  if (at == std::string::npos) return -1;
  return std::stod(text.substr(at + series.size() + 1));
}

}  // namespace airlock::testing
