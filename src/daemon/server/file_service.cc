#include "daemon/server/file_service.h"

#include <chrono>
#include <utility>

#include "common/sha256.h"
#include "runtime/guest.h"

namespace airlock::daemon {
namespace {

std::string BaseName(const std::string& path) {
  std::string_view p = path;
  while (p.size() > 1 && p.ends_with('/')) p.remove_suffix(1);
  const size_t slash = p.rfind('/');
  return std::string(slash == std::string_view::npos ? p : p.substr(slash + 1));
}

// Where a relative path starts: the guest's home (the guest contract, docs/design/guest.md).
std::string Resolve(const std::string& path) {
  return path.starts_with('/') ? path : std::string(runtime::guest::kHome) + "/" + path;
}

// The data of a file event about `path`, with what went through the API (size and SHA-256,
// never the bytes).
nlohmann::json FileData(const std::string& path, std::optional<std::string_view> bytes = {}) {
  nlohmann::json data = {{"path", path}};
  if (bytes) {
    data["size"] = bytes->size();
    data["sha256"] = Sha256::Of(*bytes);
  }
  return data;
}

}  // namespace

template <typename T>
Result<T> FileService::Recorded(const std::string& id, std::string type, nlohmann::json data,
                                Result<T> outcome) {
  // A call on a sandbox this daemon does not hold (destroyed, failed, unknown) did nothing to it.
  if (!sandboxes_.Find(id)) return outcome;
  if (!outcome) data["error"] = outcome.error().message();
  sandboxes_.recorder().Record(id, std::move(type), std::move(data));
  return outcome;
}

Result<std::string> FileService::ReadFile(const std::string& id, const api::FileQuery& query) {
  auto data = Read(id, query);
  const std::string path = Resolve(query.path);
  nlohmann::json event = data ? FileData(path, *data) : FileData(path);  // before data moves
  return Recorded(id, "file.read", std::move(event), std::move(data));
}

Result<std::string> FileService::Read(const std::string& id, const api::FileQuery& query) {
  auto channel = sandboxes_.Acquire(id);
  if (!channel) return std::unexpected(channel.error());
  const std::string path = Resolve(query.path);
  auto info = (*channel)->Stat(path);
  if (!info) return std::unexpected(sandboxes_.Explain(id, std::move(info.error())));
  if (info->type == protocol::FileType::kDirectory) {
    return Fail(ErrorCode::kInvalidArgument,
                path + " is a directory (list it, or read it with .../files/tar)");
  }
  if (info->size > api::kMaxFileBytes) {
    return Fail(ErrorCode::kTooLarge, path + " is " + std::to_string(info->size) +
                                          " bytes, over the cap of " +
                                          std::to_string(api::kMaxFileBytes));
  }
  // One byte past the cap tells a file that grew since the stat.
  auto data = (*channel)->ReadFile(path, 0, api::kMaxFileBytes + 1);
  if (!data) return std::unexpected(sandboxes_.Explain(id, std::move(data.error())));
  if (data->size() > api::kMaxFileBytes) {
    return Fail(ErrorCode::kTooLarge,
                path + " grew over the cap of " + std::to_string(api::kMaxFileBytes) + " bytes");
  }
  channel->Keep();
  return data;
}

Result<protocol::FileInfo> FileService::WriteFile(const std::string& id,
                                                  const api::FileQuery& query,
                                                  std::string_view data) {
  return Recorded(id, "file.write", FileData(Resolve(query.path), data), Write(id, query, data));
}

Result<protocol::FileInfo> FileService::Write(const std::string& id, const api::FileQuery& query,
                                              std::string_view data) {
  auto channel = sandboxes_.Acquire(id);
  if (!channel) return std::unexpected(channel.error());
  const std::string path = Resolve(query.path);
  (*channel)->set_receive_timeout(std::chrono::minutes(5));
  if (auto st = (*channel)->WriteFile(path, data, query.mode.value_or(0644), query.parents); !st) {
    return std::unexpected(sandboxes_.Explain(id, std::move(st.error())));
  }
  return Describe(id, *channel, path);
}

Result<protocol::FileInfo> FileService::Describe(const std::string& id, AgentChannel& channel,
                                                 const std::string& path) {
  auto info = channel->Stat(path);
  if (!info) return std::unexpected(sandboxes_.Explain(id, std::move(info.error())));
  info->name = BaseName(path);  // as a listing names it
  channel.Keep();
  return info;
}

Status FileService::DeleteFile(const std::string& id, const api::FileQuery& query) {
  nlohmann::json data = FileData(Resolve(query.path));
  if (query.recursive) data["recursive"] = true;
  auto deleted = [&]() -> Status {
    auto channel = sandboxes_.Acquire(id);
    if (!channel) return std::unexpected(channel.error());
    (*channel)->set_receive_timeout(std::chrono::minutes(5));
    if (auto removed = (*channel)->Remove(Resolve(query.path), query.recursive); !removed) {
      return std::unexpected(sandboxes_.Explain(id, std::move(removed.error())));
    }
    channel->Keep();
    return {};
  }();
  return Recorded(id, "file.delete", std::move(data), std::move(deleted));
}

Result<std::vector<protocol::FileInfo>> FileService::ListFiles(const std::string& id,
                                                               const api::FileQuery& query) {
  auto channel = sandboxes_.Acquire(id);
  if (!channel) return std::unexpected(channel.error());
  auto entries = (*channel)->List(Resolve(query.path));
  if (!entries) return std::unexpected(sandboxes_.Explain(id, std::move(entries.error())));
  channel->Keep();
  nlohmann::json data = FileData(Resolve(query.path));
  data["entries"] = entries->size();
  sandboxes_.recorder().Record(id, "file.list", std::move(data));
  return entries;
}

Result<protocol::FileInfo> FileService::MakeDirectory(const std::string& id,
                                                      const api::FileQuery& query) {
  auto channel = sandboxes_.Acquire(id);
  if (!channel) return std::unexpected(channel.error());
  const std::string path = Resolve(query.path);
  if (auto st = (*channel)->Mkdir(path, query.mode.value_or(0755), query.parents); !st) {
    return Recorded<protocol::FileInfo>(id, "file.mkdir", FileData(path),
                                        std::unexpected(sandboxes_.Explain(id, std::move(st.error()))));
  }
  return Recorded(id, "file.mkdir", FileData(path), Describe(id, *channel, path));
}

Result<protocol::ExecResult> FileService::RunTar(const std::string& id, AgentChannel& channel,
                                                 const protocol::Exec& exec,
                                                 std::string_view stdin_data) {
  channel->set_receive_timeout(std::chrono::milliseconds(exec.timeout_ms) +
                               std::chrono::minutes(1));
  auto result = channel->Exec(exec, stdin_data);
  if (!result) {
    Error error = sandboxes_.Explain(id, std::move(result.error()));
    if (error.code() == ErrorCode::kNotFound) {
      return Fail(ErrorCode::kUnimplemented,
                  "this sandbox's template has no tar: " + error.message());
    }
    return std::unexpected(std::move(error));
  }
  return result;
}

Result<std::string> FileService::ReadTar(const std::string& id, const api::FileQuery& query) {
  auto tar = MakeTar(id, query);
  const std::string path = Resolve(query.path);
  nlohmann::json event = tar ? FileData(path, *tar) : FileData(path);  // before tar moves
  return Recorded(id, "tar.read", std::move(event), std::move(tar));
}

Result<std::string> FileService::MakeTar(const std::string& id, const api::FileQuery& query) {
  auto channel = sandboxes_.Acquire(id);
  if (!channel) return std::unexpected(channel.error());
  const std::string path = Resolve(query.path);
  auto info = (*channel)->Stat(path);
  if (!info) return std::unexpected(sandboxes_.Explain(id, std::move(info.error())));
  if (info->type != protocol::FileType::kDirectory) {
    return Fail(ErrorCode::kInvalidArgument, path + " is not a directory");
  }
  protocol::Exec exec;
  exec.argv = {"tar", "--create", "--format=posix", "--file=-", "--directory=" + path, "."};
  exec.timeout_ms = 10 * 60 * 1000;
  exec.output_cap = api::kMaxTarBytes + 1;
  auto result = RunTar(id, *channel, exec, {});
  if (!result) return std::unexpected(result.error());
  if (result->exit.truncated || result->stdout_data.size() > api::kMaxTarBytes) {
    return Fail(ErrorCode::kTooLarge, "the tar stream of " + path + " is over " +
                                          std::to_string(api::kMaxTarBytes) + " bytes");
  }
  if (result->exit.exit_code != 0) {
    return Fail(ErrorCode::kInvalidArgument, "tar in the sandbox failed on " + path + ": " +
                                                 result->stderr_data.substr(0, 1024));
  }
  channel->Keep();
  return std::move(result->stdout_data);
}

Status FileService::WriteTar(const std::string& id, const api::FileQuery& query,
                             std::string_view tar) {
  return Recorded(id, "tar.write", FileData(Resolve(query.path), tar), Unpack(id, query, tar));
}

Status FileService::Unpack(const std::string& id, const api::FileQuery& query,
                           std::string_view tar) {
  auto channel = sandboxes_.Acquire(id);
  if (!channel) return std::unexpected(channel.error());
  const std::string path = Resolve(query.path);
  if (auto st = (*channel)->Mkdir(path, 0755, /*parents=*/true); !st) {
    return std::unexpected(sandboxes_.Explain(id, std::move(st.error())));
  }
  // Extracted by the sandbox's default user, inside the sandbox: whatever the archive holds
  // (absolute names, "..", links, devices) can do no more than that user could.
  protocol::Exec exec;
  exec.argv = {"tar",
               "--extract",
               "--file=-",
               "--directory=" + path,
               "--no-same-owner",
               "--no-overwrite-dir"};
  exec.stdin_mode = protocol::StdinMode::kPipe;
  exec.timeout_ms = 10 * 60 * 1000;
  exec.output_cap = 64 * 1024;
  auto result = RunTar(id, *channel, exec, tar);
  if (!result) return std::unexpected(result.error());
  if (result->exit.exit_code != 0) {
    return Fail(ErrorCode::kInvalidArgument, "tar in the sandbox could not unpack into " + path +
                                                 ": " + result->stderr_data.substr(0, 1024));
  }
  channel->Keep();
  return {};
}

}  // namespace airlock::daemon
