#include "cli/table.h"

#include <algorithm>

namespace airlock::cli {

namespace {

void AppendRow(const std::vector<std::string>& row, const std::vector<size_t>& widths,
               std::string* out) {
  std::string line;
  for (size_t c = 0; c < row.size(); ++c) {
    line += row[c];
    if (c + 1 < row.size()) line.append(widths[c] - row[c].size() + 2, ' ');
  }
  *out += line + "\n";
}

}  // namespace

std::string Text(const nlohmann::json& doc, const char* key) {
  if (!doc.is_object()) return "";
  auto it = doc.find(key);
  return it != doc.end() && it->is_string() ? it->get<std::string>() : "";
}

std::string FormatTable(const std::vector<std::string>& header,
                        const std::vector<std::vector<std::string>>& rows) {
  std::vector<size_t> widths(header.size());
  for (size_t c = 0; c < header.size(); ++c) widths[c] = header[c].size();
  for (const auto& row : rows) {
    for (size_t c = 0; c < row.size() && c < widths.size(); ++c) {
      widths[c] = std::max(widths[c], row[c].size());
    }
  }
  std::string out;
  AppendRow(header, widths, &out);
  for (const auto& row : rows) AppendRow(row, widths, &out);
  return out;
}

std::string FormatKeyValues(const std::vector<std::pair<std::string, std::string>>& pairs) {
  size_t width = 0;
  for (const auto& [key, value] : pairs) width = std::max(width, key.size() + 1);
  std::string out;
  for (const auto& [key, value] : pairs) {
    out += key + ":";
    out.append(width - key.size() - 1 + 1, ' ');
    out += value + "\n";
  }
  return out;
}

}  // namespace airlock::cli
