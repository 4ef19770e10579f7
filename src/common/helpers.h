#pragma once
// Where Airlock's helper programs (airlock-agent, airlock-jail) are, with no flag to say so
// (docs/design/install.md): beside the program asking, in an installed tree's
// <prefix>/libexec/airlock/, or, for a program run from the build tree that made it, where that
// build put them. A program outside its build tree never looks there: an installed airlockd
// uses its own helpers, not a stale build's.

#include <string>
#include <string_view>
#include <vector>

namespace airlock {

// Where `name` may be, in the order looked at, for the program at `self` (its real path).
std::vector<std::string> HelperCandidates(std::string_view name, const std::string& self);
// The first candidate that is an executable file, for this program (/proc/self/exe); "" when
// none is.
std::string FindHelper(std::string_view name);

}  // namespace airlock
