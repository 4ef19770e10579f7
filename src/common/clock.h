#pragma once
// Wall-clock time as the store and the wire keep it: milliseconds since the Unix epoch; and
// the steady clock in milliseconds, for intervals (idle times).

#include <chrono>
#include <cstdint>

namespace airlock {

inline int64_t UnixNowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

inline int64_t SteadyNowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

inline std::chrono::system_clock::time_point FromUnixMs(int64_t ms) {
  return std::chrono::system_clock::time_point(std::chrono::milliseconds(ms));
}

}  // namespace airlock
