#pragma once
// Strict JSON for request bodies, and the small typed getters the request types are built from.
// Every failure is kInvalidArgument (HTTP 400) with a message that names the field, the rule and
// the value received, e.g. "cpus must be a number in (0, 64], got -1". nlohmann::json throws;
// nothing here lets an exception out.

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "common/error.h"

namespace airlock::api {

// A JSON request body larger than this is kTooLarge (413). Files and tar streams are not JSON
// and have their own caps (types.h).
inline constexpr size_t kMaxJsonBodyBytes = 8u << 20;
// Requests need depth 2; the cap keeps recursive code (dump, copy, compare) far from the stack's
// end whatever a client sends. nlohmann 3.11's parser itself is iterative.
inline constexpr int kMaxJsonDepth = 32;

// Parses a request body that must be one JSON object. Refuses, before building anything deep:
// bodies over kMaxJsonBodyBytes (kTooLarge), invalid JSON (with line and column), nesting deeper
// than kMaxJsonDepth, and duplicate keys in any object (nlohmann would keep the last silently).
// Numbers that overflow a double (1e400) are invalid JSON here; integers beyond 64 bits parse as
// doubles and are refused later by the integer getters.
[[nodiscard]] Result<nlohmann::json> ParseJsonObject(std::string_view body);

// A value as shown in an error message: compact JSON, ASCII only, cut to about 64 characters.
std::string Describe(const nlohmann::json& value);
// A user-supplied string as shown in an error message: JSON-quoted, ASCII only, cut short.
std::string Quote(std::string_view text);
// The path of an object member in messages: `env["PATH"]` (top level: just the key).
std::string MemberPath(std::string_view parent, std::string_view key);
// The path of an array element in messages: `argv[3]`.
std::string ElementPath(std::string_view parent, size_t index);

// kInvalidArgument naming the first member of `object` (an object) not in `allowed`:
// `unknown field "cpu" in request body; allowed: template, ttl_seconds, ...`.
[[nodiscard]] Status RejectUnknownFields(const nlohmann::json& object, std::string_view where,
                                         std::initializer_list<std::string_view> allowed);

// Typed getters: `path` names the value in messages. Integers must be JSON integers (1.5 and
// 1e3 are refused, 2^64 and beyond too); numbers must be finite.
[[nodiscard]] Result<int64_t> GetInt(const nlohmann::json& value, std::string_view path,
                                     int64_t min, int64_t max);
// A number in (0, max].
[[nodiscard]] Result<double> GetPositiveNumber(const nlohmann::json& value, std::string_view path,
                                               double max);
[[nodiscard]] Result<bool> GetBool(const nlohmann::json& value, std::string_view path);
// A string of at most `max_bytes` bytes; `allow_nul` false refuses "\u0000".
[[nodiscard]] Result<std::string> GetString(const nlohmann::json& value, std::string_view path,
                                            size_t max_bytes, bool allow_nul);

}  // namespace airlock::api
