#pragma once
// Logging through spdlog (compiled into airlock_common by spdlog_lib.cc, so the static agent can
// use it too).
// Use the spdlog calls directly: spdlog::info("created {}", id); LogFields for a line whose
// fields a log collector should see as fields (one per API request).

#include <spdlog/spdlog.h>

#include <string>
#include <string_view>
#include <vector>

namespace airlock {

enum class LogFormat {
  kText,  // "[time] [program] [level] message"
  kJson,  // {"time": "...Z", "level": "info", "program": "airlockd", "msg": "...", fields...}
};

// Sets the default logger on stderr. `level` is one of trace, debug, info, warn, error, off; an
// unknown name keeps info. Call once, early in main.
void InitLogging(std::string_view program, std::string_view level,
                 LogFormat format = LogFormat::kText);

struct LogField {
  std::string name;
  std::string value;
  bool number = false;  // JSON: written bare, not as a string
};

// One line with fields: in JSON each field is a member of the line's object; in text they
// follow the message as name=value.
void LogFields(spdlog::level::level_enum level, std::string_view message,
               const std::vector<LogField>& fields);

// `text` as the inside of a JSON string: quotes, backslashes and control bytes escaped, and any
// byte that is not part of valid UTF-8 replaced with U+FFFD.
std::string JsonEscape(std::string_view text);

}  // namespace airlock
