// airlock cp: files and directory trees between this machine and a sandbox.
//
// Plain files travel as raw bytes (PUT / GET .../files). Directories travel as tar streams
// (PUT / GET .../files/tar), made and unpacked here by the system tar (GNU tar, pax format),
// run as a child with pipes: a tar reader and writer of our own would be more code to trust
// than the one every distribution ships. Whether a remote path is a directory is asked with
// GET .../files/list.

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <sstream>

#include "cli/commands.h"
#include "cli/subprocess.h"
#include "common/unique_fd.h"

namespace airlock::cli {

namespace fs = std::filesystem;

namespace {

using nlohmann::json;

constexpr uint64_t kTarBodyLimit = (1ull << 30) + (1ull << 20);  // the API's 1 GiB and headers

struct RemotePath {
  std::string id;
  std::string path;
};

bool IsIdChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-';
}

// "ID:PATH" when what comes before the first ':' is a sandbox id; else a local path.
std::optional<RemotePath> ParseRemote(const std::string& text) {
  const size_t colon = text.find(':');
  if (colon == std::string::npos || colon == 0 || colon > 64) return std::nullopt;
  const std::string id = text.substr(0, colon);
  if (id[0] == '-' || !std::all_of(id.begin(), id.end(), IsIdChar)) return std::nullopt;
  return RemotePath{id, text.substr(colon + 1)};
}

// The last component of `path`, ignoring trailing slashes; "" for "/", "." and "..", whose
// contents are copied rather than the directory under a name.
std::string BaseName(std::string path) {
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  const size_t slash = path.rfind('/');
  std::string base = slash == std::string::npos ? path : path.substr(slash + 1);
  return base == "." || base == ".." || base == "/" ? "" : base;
}

std::string Join(const std::string& dir, const std::string& name) {
  if (name.empty()) return dir;
  return dir.ends_with('/') ? dir + name : dir + "/" + name;
}

std::string Errno(const std::string& what) { return what + ": " + std::strerror(errno); }

Outcome<std::string> ReadLocalFile(const std::string& path) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd) return CommandError(Errno("cannot read " + path));
  std::string data;
  char buf[65536];
  for (;;) {
    ssize_t n = ::read(fd.get(), buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return CommandError(Errno("reading " + path));
    if (n == 0) return data;
    data.append(buf, static_cast<size_t>(n));
  }
}

Outcome<int> WriteLocalFile(const std::string& path, std::string_view data) {
  UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  if (!fd) return CommandError(Errno("cannot write " + path));
  if (!WriteAll(fd.get(), data)) return CommandError(Errno("writing " + path));
  return 0;
}

// The names in a local directory, sorted, without "." and "..".
Outcome<std::vector<std::string>> LocalEntries(const std::string& dir) {
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return CommandError(Errno("cannot list " + dir));
  std::vector<std::string> names;
  while (dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (name != "." && name != "..") names.push_back(name);
  }
  ::closedir(d);
  std::sort(names.begin(), names.end());
  return names;
}

enum class RemoteKind { kMissing, kDirectory, kOther };

// What `path` is in the sandbox: a directory lists; a 404 is missing; any other 4xx from the
// list (e.g. "not a directory") is taken to be something else, which the next call will meet.
Outcome<RemoteKind> StatRemote(Api& api, const RemotePath& remote) {
  auto reply = api.Call(
      "GET", SandboxTarget(remote.id, "/files/list?path=") + client::UrlEncode(remote.path));
  if (reply) return RemoteKind::kDirectory;
  const std::string& message = reply.error().message;
  if (message.starts_with("not_found:")) return RemoteKind::kMissing;
  if (message.starts_with("invalid_argument:") || message.starts_with("failed_precondition:") ||
      message.starts_with("permission_denied:")) {
    return RemoteKind::kOther;
  }
  return std::unexpected(reply.error());
}

Outcome<int> Upload(Api& api, const std::string& local, const RemotePath& remote) {
  struct stat st;
  if (::stat(local.c_str(), &st) != 0) return CommandError(Errno("cannot copy " + local));
  if (!S_ISDIR(st.st_mode) && !S_ISREG(st.st_mode)) {
    return CommandError("cannot copy " + local + ": not a regular file or a directory");
  }
  auto kind = StatRemote(api, remote);
  if (!kind) return std::unexpected(kind.error());
  const std::string target =
      *kind == RemoteKind::kDirectory ? Join(remote.path, BaseName(local)) : remote.path;

  if (S_ISREG(st.st_mode)) {
    auto data = ReadLocalFile(local);
    if (!data) return std::unexpected(data.error());
    char mode[8];
    std::snprintf(mode, sizeof mode, "%04o", st.st_mode & 07777);
    auto put = api.Call(
        "PUT",
        SandboxTarget(remote.id, "/files?path=") + client::UrlEncode(target) + "&mode=" + mode,
        *data, "application/octet-stream");
    if (!put) return std::unexpected(put.error());
    return 0;
  }

  if (*kind == RemoteKind::kOther) {
    return CommandError("cannot copy directory " + local + " onto " + remote.id + ":" +
                        remote.path + ", which is not a directory");
  }
  auto names = LocalEntries(local);
  if (!names) return std::unexpected(names.error());
  const std::string query = "?path=" + client::UrlEncode(target);
  if (names->empty()) {  // tar refuses to make an empty archive: make the directory instead
    auto made =
        api.Call("POST", SandboxTarget(remote.id, "/files/mkdir") + query + "&parents=true");
    if (!made) return std::unexpected(made.error());
    return 0;
  }
  std::vector<std::string> argv = {
      "tar", "--format=pax", "--numeric-owner", "-C", local, "-cf", "-", "--"};
  argv.insert(argv.end(), names->begin(), names->end());
  auto tar = RunProgram(argv, {});
  if (!tar) return std::unexpected(tar.error());
  api.AllowAtLeast(std::chrono::minutes(30));
  auto put =
      api.Call("PUT", SandboxTarget(remote.id, "/files/tar") + query, *tar, "application/x-tar");
  if (!put) return std::unexpected(put.error());
  return 0;
}

Outcome<int> Download(Api& api, const RemotePath& remote, const std::string& local) {
  auto kind = StatRemote(api, remote);
  if (!kind) return std::unexpected(kind.error());
  struct stat st;
  const bool local_is_dir = ::stat(local.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
  const bool local_exists = local_is_dir || ::access(local.c_str(), F_OK) == 0;
  const std::string query = "?path=" + client::UrlEncode(remote.path);

  if (*kind != RemoteKind::kDirectory) {  // a file, or missing: GET says which
    const std::string base = BaseName(remote.path);
    const std::string target = local_is_dir ? Join(local, base) : local;
    if (local_is_dir && base.empty()) {
      return CommandError("cannot name the copy of " + remote.id + ":" + remote.path);
    }
    auto got = api.Call("GET", SandboxTarget(remote.id, "/files") + query);
    if (!got) return std::unexpected(got.error());
    return WriteLocalFile(target, got->body);
  }

  if (local_exists && !local_is_dir) {
    return CommandError("cannot copy directory " + remote.id + ":" + remote.path + " onto " +
                        local + ", which is not a directory");
  }
  const std::string target = local_is_dir ? Join(local, BaseName(remote.path)) : local;
  api.set_body_limit(kTarBodyLimit);
  api.AllowAtLeast(std::chrono::minutes(30));
  auto tar = api.Call("GET", SandboxTarget(remote.id, "/files/tar") + query);
  if (!tar) return std::unexpected(tar.error());
  if (::mkdir(target.c_str(), 0755) != 0 && errno != EEXIST) {
    return CommandError(Errno("cannot make " + target));
  }
  // The archive comes from the sandbox: treat it as hostile. GNU tar already refuses absolute
  // names and "..", and delays symlinks that point outside. Device nodes (which a root caller
  // would really make) are refused from the listing first; owners are never taken from the
  // sandbox's uids; and no set-user-id or set-group-id bit survives the copy.
  auto listing = RunProgram({"tar", "-tvf", "-"}, tar->body);
  if (!listing) return std::unexpected(listing.error());
  std::istringstream lines(*listing);
  for (std::string line; std::getline(lines, line);) {
    if (line.starts_with('b') || line.starts_with('c')) {
      return CommandError("refusing " + remote.id + ":" + remote.path +
                          ": the archive holds a device node: " + line);
    }
  }
  auto unpacked = RunProgram(
      {"tar", "--no-same-owner", "--no-same-permissions", "-C", target, "-xf", "-"}, tar->body);
  if (!unpacked) return std::unexpected(unpacked.error());
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(target, ec);
       !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
    if (it->is_symlink(ec)) continue;
    const fs::perms p = it->status(ec).permissions();
    if ((p & (fs::perms::set_uid | fs::perms::set_gid)) != fs::perms::none) {
      fs::permissions(it->path(), fs::perms::set_uid | fs::perms::set_gid,
                      fs::perm_options::remove, ec);  // symlinks were skipped above
    }
  }
  if (ec) return CommandError("checking what was unpacked in " + target + ": " + ec.message());
  return 0;
}

}  // namespace

Outcome<int> CmdCp(const CommandArgs& in, Globals& globals) {
  auto args = Parse("cp", in, {}, globals);
  if (!args) return std::unexpected(args.error());
  if (args->help) return PrintUsage("cp");
  if (args->positional.size() != 2) return UsageError("cp", "wants exactly SRC and DST");
  const auto src = ParseRemote(args->positional[0]);
  const auto dst = ParseRemote(args->positional[1]);
  if (src.has_value() == dst.has_value()) {
    return UsageError("cp", "exactly one of SRC and DST must be ID:PATH");
  }
  const RemotePath& remote = src ? *src : *dst;
  if (remote.path.empty()) return UsageError("cp", "ID:PATH needs a path after the ':'");
  auto api = Api::Connect(globals);
  if (!api) return std::unexpected(api.error());
  return src ? Download(*api, *src, args->positional[1]) : Upload(*api, args->positional[0], *dst);
}

}  // namespace airlock::cli
