#include "daemon/api/json.h"

#include <cmath>
#include <cstdio>
#include <exception>
#include <unordered_set>
#include <utility>
#include <vector>

namespace airlock::api {
namespace {

using nlohmann::json;

constexpr size_t kMaxShown = 64;

// Thrown from the parser callback to stop parsing at the first structural problem; caught in
// ParseJsonObject, never outside it.
struct Refused {
  std::string message;
};

std::string Cut(std::string s) {
  if (s.size() > kMaxShown) {
    s.resize(kMaxShown);
    s += "...";
  }
  return s;
}

// nlohmann's what(): "[json.exception.parse_error.101] parse error at line 1, column 2: ...".
std::string WithoutExceptionId(const char* what) {
  std::string_view text(what);
  if (!text.empty() && text.front() == '[') {
    const size_t end = text.find("] ");
    if (end != std::string_view::npos) text.remove_prefix(end + 2);
  }
  return std::string(text);
}

std::string FormatBound(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.15g", v);
  return buf;
}

std::string JoinNames(std::initializer_list<std::string_view> names) {
  std::string out;
  for (std::string_view name : names) {
    if (!out.empty()) out += ", ";
    out += name;
  }
  return out;
}

}  // namespace

Result<json> ParseJsonObject(std::string_view body) {
  if (body.size() > kMaxJsonBodyBytes) {
    return Fail(ErrorCode::kTooLarge, "request body is " + std::to_string(body.size()) +
                                          " bytes; the limit for JSON bodies is " +
                                          std::to_string(kMaxJsonBodyBytes));
  }
  if (body.find_first_not_of(" \t\r\n") == std::string_view::npos) {
    return Fail(ErrorCode::kInvalidArgument, "request body is empty; expected a JSON object");
  }
  // One set of keys per open object, innermost last; arrays push nothing.
  std::vector<std::unordered_set<std::string>> open_objects;
  json::parser_callback_t check = [&](int depth, json::parse_event_t event, json& parsed) {
    switch (event) {
      case json::parse_event_t::object_start:
      case json::parse_event_t::array_start:
        if (depth >= kMaxJsonDepth) {
          throw Refused{"request body nests deeper than " + std::to_string(kMaxJsonDepth) +
                        " levels"};
        }
        if (event == json::parse_event_t::object_start) open_objects.emplace_back();
        break;
      case json::parse_event_t::object_end:
        open_objects.pop_back();
        break;
      case json::parse_event_t::key:
        if (!open_objects.back().insert(parsed.get<std::string>()).second) {
          throw Refused{"duplicate key " + Quote(parsed.get<std::string>()) + " in request body"};
        }
        break;
      default:
        break;
    }
    return true;
  };
  json parsed;
  try {
    parsed = json::parse(body.begin(), body.end(), check, /*allow_exceptions=*/true,
                         /*ignore_comments=*/false);
  } catch (const Refused& refused) {
    return Fail(ErrorCode::kInvalidArgument, refused.message);
  } catch (const json::exception& e) {
    return Fail(ErrorCode::kInvalidArgument,
                "request body is not valid JSON: " + WithoutExceptionId(e.what()));
  } catch (const std::exception& e) {  // bad_alloc and the like: not the caller's fault
    return Fail(ErrorCode::kInternal, std::string("parsing request body: ") + e.what());
  }
  if (!parsed.is_object()) {
    return Fail(ErrorCode::kInvalidArgument,
                std::string("request body must be a JSON object, got ") + parsed.type_name());
  }
  return parsed;
}

std::string Describe(const json& value) {
  try {
    return Cut(value.dump(-1, ' ', /*ensure_ascii=*/true, json::error_handler_t::replace));
  } catch (const std::exception&) {
    return "(unprintable value)";
  }
}

std::string Quote(std::string_view text) {
  // Cut the input first: a long string is not worth escaping whole.
  std::string head(text.substr(0, kMaxShown));
  std::string quoted = Describe(json(head));
  if (text.size() > kMaxShown) quoted += "...";
  return quoted;
}

std::string MemberPath(std::string_view parent, std::string_view key) {
  if (parent.empty()) return std::string(key);
  return std::string(parent) + "[" + Quote(key) + "]";
}

std::string ElementPath(std::string_view parent, size_t index) {
  return std::string(parent) + "[" + std::to_string(index) + "]";
}

Status RejectUnknownFields(const json& object, std::string_view where,
                           std::initializer_list<std::string_view> allowed) {
  for (const auto& [key, value] : object.items()) {
    bool known = false;
    for (std::string_view name : allowed) known = known || key == name;
    if (!known) {
      return Fail(ErrorCode::kInvalidArgument, "unknown field " + Quote(key) + " in " +
                                                   std::string(where) +
                                                   "; allowed: " + JoinNames(allowed));
    }
  }
  return {};
}

Result<int64_t> GetInt(const json& value, std::string_view path, int64_t min, int64_t max) {
  auto refuse = [&] {
    return Fail(ErrorCode::kInvalidArgument, std::string(path) + " must be an integer in [" +
                                                 std::to_string(min) + ", " + std::to_string(max) +
                                                 "], got " + Describe(value));
  };
  if (value.is_number_unsigned()) {
    const uint64_t v = value.get<uint64_t>();
    if (max < 0 || v > static_cast<uint64_t>(max) || (min >= 0 && v < static_cast<uint64_t>(min))) {
      return refuse();
    }
    return static_cast<int64_t>(v);
  }
  if (value.is_number_integer()) {
    const int64_t v = value.get<int64_t>();
    if (v < min || v > max) return refuse();
    return v;
  }
  return refuse();
}

Result<double> GetPositiveNumber(const json& value, std::string_view path, double max) {
  if (value.is_number()) {
    const double v = value.get<double>();
    if (std::isfinite(v) && v > 0 && v <= max) return v;
  }
  return Fail(ErrorCode::kInvalidArgument, std::string(path) + " must be a number in (0, " +
                                               FormatBound(max) + "], got " + Describe(value));
}

Result<bool> GetBool(const json& value, std::string_view path) {
  if (value.is_boolean()) return value.get<bool>();
  return Fail(ErrorCode::kInvalidArgument,
              std::string(path) + " must be true or false, got " + Describe(value));
}

Result<std::string> GetString(const json& value, std::string_view path, size_t max_bytes,
                              bool allow_nul) {
  if (!value.is_string()) {
    return Fail(ErrorCode::kInvalidArgument,
                std::string(path) + " must be a string, got " + Describe(value));
  }
  const auto& s = value.get_ref<const std::string&>();
  if (s.size() > max_bytes) {
    return Fail(ErrorCode::kInvalidArgument, std::string(path) + " must be at most " +
                                                 std::to_string(max_bytes) + " bytes, got " +
                                                 std::to_string(s.size()));
  }
  if (!allow_nul && s.find('\0') != std::string::npos) {
    return Fail(ErrorCode::kInvalidArgument, std::string(path) + " must not contain NUL (\\u0000)");
  }
  return s;
}

}  // namespace airlock::api
