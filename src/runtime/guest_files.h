#pragma once
// The files of the guest contract (docs/design/guest.md) that an engine writes into a sandbox's
// root, and what a root on the host's /usr shows of the host: shared by every engine that builds
// its roots on the host (the jail, gVisor). Nothing beyond airlock_common: the jail's static
// launcher links it.

#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/error.h"

namespace airlock::runtime::guest {

// The directories of the host's /usr that a sandbox on the host-/usr root sees, read-only, where
// the host has them (docs/design/jail.md says why each): programs, their libraries, the data
// they read and what compilers need. Nothing else of the host's /usr shows: not /usr/local (what
// the host's operator installed), /usr/src, /usr/games, nor whatever else the host keeps there.
inline constexpr const char* kHostUsrDirs[] = {"bin",    "sbin",    "lib",     "lib32", "lib64",
                                               "libx32", "libexec", "include", "share"};

// The top-level directories a host may have as symlinks into /usr (merged /usr) or not.
inline constexpr const char* kHostTopDirs[] = {"bin", "sbin", "lib", "lib32", "lib64", "libx32"};

// What the sandbox's own /usr/local holds at first (empty directories, written in its layer),
// as Debian's base-files lays it out.
inline constexpr const char* kUsrLocalDirs[] = {"bin",  "etc",   "include", "lib",
                                                "sbin", "share", "src"};

// The /etc files of a fresh sandbox: name -> contents. `nameserver` "": no network.
std::vector<std::pair<std::string, std::string>> EtcFiles(const std::string& hostname,
                                                          const std::string& nameserver = "");

// passwd or group text: `ours` (root, user, nobody, ...), then every line of `existing` whose
// name and id are not one of ours.
std::string MergeAccounts(std::string_view existing, std::string_view ours);

// Each of `names` in the host's directory `host` ("" for /) as the host has it, at the same name
// in `dir` of a template: a symlink is copied (it resolves inside the sandbox), a directory gets
// an empty mount point; what the host lacks is removed (a state dir can outlive a change of the
// host). Returns the names that are directories, to bind.
[[nodiscard]] Result<std::vector<std::string>> MirrorHostEntries(
    const std::string& host, const std::string& dir, std::span<const char* const> names);

}  // namespace airlock::runtime::guest
