// airlock admin: the operator's commands. `backup FILE`: an online, consistent copy of the
// daemon's store (GET /v1/admin/backup), written whole or not at all (docs/install.md, "Backups").

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "cli/commands.h"

namespace airlock::cli {
namespace {

constexpr std::string_view kSqliteMagic{"SQLite format 3\0", 16};

Outcome<int> Backup(const Args& args, Globals& globals) {
  if (args.positional.size() != 2) return UsageError("admin", "backup wants one FILE");
  const std::string file = args.positional[1];
  auto api = Api::Connect(globals);
  if (!api) return std::unexpected(api.error());
  api->set_body_limit(64ull << 30);
  auto reply = api->Call("GET", "/v1/admin/backup");
  if (!reply) return std::unexpected(reply.error());
  if (!reply->body.starts_with(kSqliteMagic)) {
    return CommandError("the daemon's reply is not an SQLite database (" +
                        std::to_string(reply->body.size()) + " bytes)");
  }
  if (file == "-") {
    if (!WriteAll(STDOUT_FILENO, reply->body)) return CommandError("writing stdout failed");
    return 0;
  }
  // Whole or not at all: a private file beside FILE, synced, then renamed over it.
  const std::string partial = file + ".partial";
  const int fd = ::open(partial.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return CommandError("creating " + partial + ": " + std::strerror(errno));
  const bool written = WriteAll(fd, reply->body) && ::fsync(fd) == 0;
  const int saved = errno;
  ::close(fd);
  if (!written || ::rename(partial.c_str(), file.c_str()) != 0) {
    const int err = written ? errno : saved;
    ::unlink(partial.c_str());
    return CommandError("writing " + file + ": " + std::strerror(err));
  }
  if (globals.json) return PrintJson({{"file", file}, {"bytes", reply->body.size()}});
  std::fprintf(stderr, "backed up the store (%zu bytes) to %s\n", reply->body.size(), file.c_str());
  return 0;
}

}  // namespace

Outcome<int> CmdAdmin(const CommandArgs& in, Globals& globals) {
  auto args = Parse("admin", in, {}, globals);
  if (!args) return std::unexpected(args.error());
  if (args->help) return PrintUsage("admin");
  if (args->positional.empty()) return UsageError("admin", "wants a subcommand: backup");
  if (args->positional[0] == "backup") return Backup(*args, globals);
  return UsageError("admin", "unknown subcommand " + args->positional[0]);
}

}  // namespace airlock::cli
