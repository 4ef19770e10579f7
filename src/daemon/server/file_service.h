#pragma once
// FileService: a sandbox's files through its agent, confined to the sandbox's root: read, write,
// list, make directories, delete, and a directory as a tar stream both ways (made and unpacked by
// tar inside the sandbox, so a hostile tree or archive is handled with the sandbox's rights
// only). Paths that are not absolute are taken from the guest's home (runtime/guest.h). Like
// ExecService it owns no state: each call borrows an agent channel from the SandboxTable. Every
// method blocks: call them on the worker pool.

#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/error.h"
#include "daemon/api/types.h"
#include "daemon/server/sandbox_table.h"
#include "protocol/client.h"

namespace airlock::daemon {

class FileService {
 public:
  explicit FileService(SandboxTable& sandboxes) : sandboxes_(sandboxes) {}

  [[nodiscard]] Result<std::string> ReadFile(const std::string& id, const api::FileQuery& query);
  [[nodiscard]] Result<protocol::FileInfo> WriteFile(const std::string& id,
                                                     const api::FileQuery& query,
                                                     std::string_view data);
  [[nodiscard]] Status DeleteFile(const std::string& id, const api::FileQuery& query);
  [[nodiscard]] Result<std::vector<protocol::FileInfo>> ListFiles(const std::string& id,
                                                                  const api::FileQuery& query);
  [[nodiscard]] Result<protocol::FileInfo> MakeDirectory(const std::string& id,
                                                         const api::FileQuery& query);
  // A tar stream of the directory's contents, and its extraction (api::kMaxTarBytes at most).
  [[nodiscard]] Result<std::string> ReadTar(const std::string& id, const api::FileQuery& query);
  [[nodiscard]] Status WriteTar(const std::string& id, const api::FileQuery& query,
                                std::string_view tar);

 private:
  // What the public methods do; they record it (docs/design/recorder.md).
  Result<std::string> Read(const std::string& id, const api::FileQuery& query);
  Result<protocol::FileInfo> Write(const std::string& id, const api::FileQuery& query,
                                   std::string_view data);
  Result<std::string> MakeTar(const std::string& id, const api::FileQuery& query);
  Status Unpack(const std::string& id, const api::FileQuery& query, std::string_view tar);
  // Records a `type` event with `data` (and the error, if `outcome` is one); returns `outcome`.
  template <typename T>
  Result<T> Recorded(const std::string& id, std::string type, nlohmann::json data,
                     Result<T> outcome);
  // Runs tar (ReadTar, WriteTar) in the sandbox; a template without tar is kUnimplemented.
  Result<protocol::ExecResult> RunTar(const std::string& id, AgentChannel& channel,
                                      const protocol::Exec& exec, std::string_view stdin_data);
  // The entry for `path` (after a write or mkdir), named as a listing names it; gives the
  // channel back.
  Result<protocol::FileInfo> Describe(const std::string& id, AgentChannel& channel,
                                      const std::string& path);

  SandboxTable& sandboxes_;
};

}  // namespace airlock::daemon
