#pragma once
// Aligned text for people: tables with a header row, and "key: value" lines.

#include <string>
#include <utility>
#include <vector>

namespace airlock::cli {

// Columns separated by at least two spaces, each as wide as its widest cell; no trailing blanks.
std::string FormatTable(const std::vector<std::string>& header,
                        const std::vector<std::vector<std::string>>& rows);

// "key:   value" lines with the values aligned.
std::string FormatKeyValues(const std::vector<std::pair<std::string, std::string>>& pairs);

}  // namespace airlock::cli
