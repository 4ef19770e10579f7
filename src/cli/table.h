#pragma once
// Aligned text for people: tables with a header row, and "key: value" lines; and the daemon's
// JSON read for them.

#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

namespace airlock::cli {

// Columns separated by at least two spaces, each as wide as its widest cell; no trailing blanks.
std::string FormatTable(const std::vector<std::string>& header,
                        const std::vector<std::vector<std::string>>& rows);

// A string field of `doc`, or "" when it is missing or not a string.
std::string Text(const nlohmann::json& doc, const char* key);

// "key:   value" lines with the values aligned.
std::string FormatKeyValues(const std::vector<std::pair<std::string, std::string>>& pairs);

}  // namespace airlock::cli
