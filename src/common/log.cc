#include "common/log.h"

#include <spdlog/sinks/stdout_sinks.h>

#include <string>

namespace airlock {

void InitLogging(std::string_view program, std::string_view level) {
  auto logger = spdlog::stderr_logger_mt(std::string(program));
  logger->set_pattern("[%Y-%m-%dT%H:%M:%S.%e] [%n] [%l] %v");
  auto parsed = spdlog::level::from_str(std::string(level));
  if (parsed == spdlog::level::off && level != "off") parsed = spdlog::level::info;
  logger->set_level(parsed);
  spdlog::set_default_logger(std::move(logger));
}

}  // namespace airlock
