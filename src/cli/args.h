#pragma once
// Hand-rolled argument parsing for the CLI's commands: long flags (--name VALUE, --name=VALUE, or
// a switch), the few short ones a command declares (-i, -t, -s SIG), positionals, and an optional
// command tail (exec's and run's CMD [ARG...]).

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "cli/outcome.h"

namespace airlock::cli {

struct FlagSpec {
  std::string_view name;  // without the leading "--"
  bool takes_value;
  char short_name = 0;  // also "-c" (switches combine: "-it"; a value follows: "-s KILL", "-sKILL")
};

// The flags every command accepts as well as the top level: --url, --api-key, --json.
extern const std::vector<FlagSpec> kGlobalFlags;

struct Args {
  // Each use in order, under the long name (short flags too); "" for switches.
  std::map<std::string, std::vector<std::string>> flags;
  std::vector<std::string> positional;
  std::vector<std::string> tail;  // the command to run, for exec and run
  bool help = false;              // --help or -h was given

  bool Has(const std::string& name) const { return flags.contains(name); }
  // The last value given for `name`, if any.
  std::optional<std::string> Last(const std::string& name) const;
  // Every value given for `name`, in order.
  std::vector<std::string> All(const std::string& name) const;
};

// Parses `in` for `command` against `specs` plus kGlobalFlags. "--" ends the flags. With
// `tail_after` set, the tail (less a leading "--") starts right after that many positionals, so
// `exec ID ls -l` passes "-l" to ls; with 0 it starts at the first argument that is not a flag.
// Errors are usage errors.
[[nodiscard]] Outcome<Args> ParseArgs(std::string_view command, std::span<const std::string> in,
                                      std::span<const FlagSpec> specs,
                                      std::optional<size_t> tail_after = std::nullopt);

// "K=V" -> {K, V}; K must not be empty.
[[nodiscard]] Outcome<std::pair<std::string, std::string>> ParseKeyValue(std::string_view command,
                                                                         std::string_view flag,
                                                                         const std::string& text);
// A whole decimal integer, or a usage error naming the flag.
[[nodiscard]] Outcome<int64_t> ParseInteger(std::string_view command, std::string_view flag,
                                            const std::string& text);
// A finite decimal number (fractions allowed), or a usage error naming the flag.
[[nodiscard]] Outcome<double> ParseNumber(std::string_view command, std::string_view flag,
                                          const std::string& text);

}  // namespace airlock::cli
