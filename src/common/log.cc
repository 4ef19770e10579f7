#include "common/log.h"

#include <spdlog/pattern_formatter.h>
#include <spdlog/sinks/stdout_sinks.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <string>

namespace airlock {
namespace {

std::atomic<bool> json_format{false};

// A LogFields line's payload in JSON mode: the mark, the message, the mark, the fields as JSON
// members ("a":"b","n":1). A message never starts with this byte otherwise.
constexpr char kFieldsMark = '\x1e';

// The length of the valid UTF-8 sequence at `s[i]`, or 0 if it is not one.
size_t Utf8Length(std::string_view s, size_t i) {
  const auto b = static_cast<unsigned char>(s[i]);
  size_t len = b < 0x80 ? 1 : (b >> 5) == 0x6 ? 2 : (b >> 4) == 0xE ? 3 : (b >> 3) == 0x1E ? 4 : 0;
  if (len == 0 || b == 0xC0 || b == 0xC1 || b > 0xF4 || i + len > s.size()) return 0;
  for (size_t k = 1; k < len; ++k) {
    if ((static_cast<unsigned char>(s[i + k]) & 0xC0) != 0x80) return 0;
  }
  return len;
}

class JsonFormatter final : public spdlog::formatter {
 public:
  void format(const spdlog::details::log_msg& msg, spdlog::memory_buf_t& dest) override {
    using namespace std::chrono;
    const auto since = msg.time.time_since_epoch();
    const std::time_t seconds = duration_cast<std::chrono::seconds>(since).count();
    const auto millis = duration_cast<milliseconds>(since).count() % 1000;
    std::tm utc{};
    ::gmtime_r(&seconds, &utc);
    char when[96];
    std::snprintf(when, sizeof when, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", utc.tm_year + 1900,
                  utc.tm_mon + 1, utc.tm_mday, utc.tm_hour, utc.tm_min, utc.tm_sec,
                  static_cast<int>(millis));
    const auto level = spdlog::level::to_string_view(msg.level);
    std::string_view payload(msg.payload.data(), msg.payload.size());
    std::string_view fields;
    if (payload.size() >= 2 && payload[0] == kFieldsMark) {
      const size_t end = payload.find(kFieldsMark, 1);
      if (end != std::string_view::npos) {
        fields = payload.substr(end + 1);
        payload = payload.substr(1, end - 1);
      }
    }
    std::string line =
        std::string("{\"time\":\"") + when + "\",\"level\":\"" +
        std::string(level.data(), level.size()) + "\",\"program\":\"" +
        JsonEscape(std::string_view(msg.logger_name.data(), msg.logger_name.size())) +
        "\",\"msg\":\"" + JsonEscape(payload) + "\"";
    if (!fields.empty()) line += "," + std::string(fields);
    line += "}\n";
    dest.append(line.data(), line.data() + line.size());
  }
  std::unique_ptr<spdlog::formatter> clone() const override {
    return std::make_unique<JsonFormatter>();
  }
};

}  // namespace

std::string JsonEscape(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c < 0x20 || c == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else if (c >= 0x80) {
      const size_t len = Utf8Length(text, i);
      if (len == 0) {
        out += "\xEF\xBF\xBD";  // U+FFFD
        ++i;
        continue;
      }
      out.append(text.substr(i, len));
      i += len;
      continue;
    } else {
      out += static_cast<char>(c);
    }
    ++i;
  }
  return out;
}

void InitLogging(std::string_view program, std::string_view level, LogFormat format) {
  auto logger = spdlog::stderr_logger_mt(std::string(program));
  if (format == LogFormat::kJson) {
    logger->set_formatter(std::make_unique<JsonFormatter>());
  } else {
    logger->set_pattern("[%Y-%m-%dT%H:%M:%S.%e] [%n] [%l] %v");
  }
  json_format = format == LogFormat::kJson;
  auto parsed = spdlog::level::from_str(std::string(level));
  if (parsed == spdlog::level::off && level != "off") parsed = spdlog::level::info;
  logger->set_level(parsed);
  spdlog::set_default_logger(std::move(logger));
}

void LogFields(spdlog::level::level_enum level, std::string_view message,
               const std::vector<LogField>& fields) {
  if (!spdlog::should_log(level)) return;
  std::string line;
  if (json_format) {
    line = std::string(1, kFieldsMark) + std::string(message) + kFieldsMark;
    for (size_t i = 0; i < fields.size(); ++i) {
      if (i > 0) line += ',';
      line += "\"" + JsonEscape(fields[i].name) + "\":";
      line += fields[i].number ? fields[i].value : "\"" + JsonEscape(fields[i].value) + "\"";
    }
  } else {
    line = std::string(message);
    for (const LogField& f : fields) line += " " + f.name + "=" + (f.value.empty() ? "-" : f.value);
  }
  spdlog::log(level, "{}", line);
}

}  // namespace airlock
