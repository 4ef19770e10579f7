#pragma once
// Percentiles over a set of samples, printed the same way by every benchmark.

#include <algorithm>
#include <cstdio>
#include <numeric>
#include <string>
#include <vector>

namespace airlock::bench {

struct Summary {
  std::string name;
  size_t n = 0;
  double p50 = 0, p90 = 0, p99 = 0, mean = 0, min = 0, max = 0;  // microseconds
};

inline double Percentile(const std::vector<double>& sorted, double q) {
  if (sorted.empty()) return 0;
  // Nearest rank: the smallest sample with at least q of the samples at or below it.
  size_t rank = static_cast<size_t>(q * static_cast<double>(sorted.size()) + 0.999999);
  return sorted[std::clamp<size_t>(rank, 1, sorted.size()) - 1];
}

inline Summary Summarize(std::string name, std::vector<double> us) {
  std::sort(us.begin(), us.end());
  Summary s{std::move(name), us.size()};
  if (us.empty()) return s;
  s.p50 = Percentile(us, 0.50);
  s.p90 = Percentile(us, 0.90);
  s.p99 = Percentile(us, 0.99);
  s.mean = std::accumulate(us.begin(), us.end(), 0.0) / static_cast<double>(us.size());
  s.min = us.front();
  s.max = us.back();
  return s;
}

inline void PrintHeader() {
  std::printf("%-34s %7s %10s %10s %10s %10s %10s\n", "benchmark", "n", "p50 us", "p90 us",
              "p99 us", "mean us", "max us");
}

inline void Print(const Summary& s) {
  std::printf("%-34s %7zu %10.1f %10.1f %10.1f %10.1f %10.1f\n", s.name.c_str(), s.n, s.p50, s.p90,
              s.p99, s.mean, s.max);
}

inline std::string Json(const Summary& s) {
  std::string name;  // as JSON string content: quotes and backslashes escaped, controls blanked
  for (char c : s.name) {
    if (c == '"' || c == '\\') name += '\\';
    if (static_cast<unsigned char>(c) < 0x20) c = ' ';
    name += c;
  }
  char buf[1024];
  std::snprintf(buf, sizeof buf,
                "{\"name\":\"%s\",\"n\":%zu,\"p50_us\":%.2f,\"p90_us\":%.2f,\"p99_us\":%.2f,"
                "\"mean_us\":%.2f,\"min_us\":%.2f,\"max_us\":%.2f}",
                name.c_str(), s.n, s.p50, s.p90, s.p99, s.mean, s.min, s.max);
  return buf;
}

}  // namespace airlock::bench
