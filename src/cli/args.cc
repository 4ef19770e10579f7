#include "cli/args.h"

#include <charconv>
#include <cmath>
#include <cstdlib>

namespace airlock::cli {

const std::vector<FlagSpec> kGlobalFlags = {
    {"url", true},
    {"api-key", true},
    {"json", false},
};

std::optional<std::string> Args::Last(const std::string& name) const {
  auto it = flags.find(name);
  if (it == flags.end() || it->second.empty()) return std::nullopt;
  return it->second.back();
}

std::vector<std::string> Args::All(const std::string& name) const {
  auto it = flags.find(name);
  return it == flags.end() ? std::vector<std::string>() : it->second;
}

namespace {

const FlagSpec* FindSpec(std::string_view name, std::span<const FlagSpec> specs) {
  for (const auto& spec : specs) {
    if (spec.name == name) return &spec;
  }
  for (const auto& spec : kGlobalFlags) {
    if (spec.name == name) return &spec;
  }
  return nullptr;
}

const FlagSpec* FindShort(char name, std::span<const FlagSpec> specs) {
  for (const auto& spec : specs) {
    if (spec.short_name != 0 && spec.short_name == name) return &spec;
  }
  return nullptr;
}

}  // namespace

Outcome<Args> ParseArgs(std::string_view command, std::span<const std::string> in,
                        std::span<const FlagSpec> specs, std::optional<size_t> tail_after) {
  const std::string cmd(command);
  Args out;
  size_t i = 0;
  auto take_tail = [&](size_t from) {
    if (from < in.size() && in[from] == "--") ++from;
    out.tail.assign(in.begin() + static_cast<ptrdiff_t>(from), in.end());
  };
  for (; i < in.size(); ++i) {
    // exec ID CMD...: whatever follows the ID is the command, flags included.
    if (tail_after && *tail_after > 0 && out.positional.size() == *tail_after) {
      take_tail(i);
      return out;
    }
    const std::string& arg = in[i];
    if (arg == "--") {
      if (tail_after) {
        take_tail(i);
        return out;
      }
      out.positional.insert(out.positional.end(), in.begin() + static_cast<ptrdiff_t>(i) + 1,
                            in.end());
      return out;
    }
    if (arg == "-h" || arg == "--help") {
      out.help = true;
      continue;
    }
    if (!arg.starts_with("--")) {
      if (arg.size() > 1 && arg[0] == '-') {
        // One or more short flags: "-it", "-d", "-s KILL", "-sKILL".
        for (size_t k = 1; k < arg.size(); ++k) {
          const FlagSpec* spec = FindShort(arg[k], specs);
          if (spec == nullptr) {
            return UsageError(cmd, "unknown flag " + (arg.size() == 2 ? arg : "-" + arg.substr(k, 1) +
                                                                               " in " + arg));
          }
          const std::string name(spec->name);
          if (!spec->takes_value) {
            out.flags[name].push_back("");
            continue;
          }
          if (k + 1 < arg.size()) {
            out.flags[name].push_back(arg.substr(k + 1));
          } else if (i + 1 < in.size()) {
            out.flags[name].push_back(in[++i]);
          } else {
            return UsageError(cmd, "-" + arg.substr(k, 1) + " needs a value");
          }
          break;
        }
        continue;
      }
      if (tail_after && *tail_after == 0) {  // run CMD...: the first non-flag starts the command
        take_tail(i);
        return out;
      }
      out.positional.push_back(arg);
      continue;
    }
    std::string name = arg.substr(2);
    std::optional<std::string> value;
    if (size_t eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name.resize(eq);
    }
    const FlagSpec* spec = FindSpec(name, specs);
    if (spec == nullptr) return UsageError(cmd, "unknown flag --" + name);
    if (!spec->takes_value) {
      if (value) return UsageError(cmd, "--" + name + " takes no value");
      out.flags[name].push_back("");
      continue;
    }
    if (!value) {
      if (i + 1 >= in.size()) return UsageError(cmd, "--" + name + " needs a value");
      value = in[++i];
    }
    out.flags[name].push_back(*value);
  }
  if (tail_after && out.positional.size() == *tail_after) take_tail(in.size());
  return out;
}

Outcome<std::pair<std::string, std::string>> ParseKeyValue(std::string_view command,
                                                           std::string_view flag,
                                                           const std::string& text) {
  size_t eq = text.find('=');
  if (eq == std::string::npos || eq == 0) {
    return UsageError(std::string(command),
                      "--" + std::string(flag) + " wants KEY=VALUE, got '" + text + "'");
  }
  return std::pair(text.substr(0, eq), text.substr(eq + 1));
}

Outcome<int64_t> ParseInteger(std::string_view command, std::string_view flag,
                              const std::string& text) {
  int64_t value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || ec != std::errc() || end != text.data() + text.size()) {
    return UsageError(std::string(command),
                      "--" + std::string(flag) + " wants a whole number, got '" + text + "'");
  }
  return value;
}

Outcome<double> ParseNumber(std::string_view command, std::string_view flag,
                            const std::string& text) {
  char* end = nullptr;
  errno = 0;
  const double value = text.empty() ? 0 : std::strtod(text.c_str(), &end);
  if (text.empty() || errno != 0 || end != text.c_str() + text.size() || !std::isfinite(value)) {
    return UsageError(std::string(command),
                      "--" + std::string(flag) + " wants a number, got '" + text + "'");
  }
  return value;
}

}  // namespace airlock::cli
