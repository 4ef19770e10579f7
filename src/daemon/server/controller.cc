#include "daemon/server/controller.h"

#include <chrono>
#include <cmath>
#include <utility>

#include "common/ids.h"
#include "common/log.h"

namespace airlock::daemon {
namespace {

using store::SandboxRecord;
using store::SandboxState;

int64_t NowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

store::SandboxLimits ToStoreLimits(const runtime::Limits& limits) {
  return {.cpus = limits.cpus,
          .memory_mb = static_cast<int64_t>(limits.memory_mb),
          .pids_max = static_cast<int64_t>(limits.pids_max),
          .disk_mb = static_cast<int64_t>(limits.disk_mb)};
}

protocol::Exec ToProtocolExec(const api::ExecRequest& request) {
  protocol::Exec exec;
  if (request.is_shell()) {
    exec.shell = request.cmd;
  } else {
    exec.argv = request.argv;
  }
  exec.cwd = request.cwd;
  exec.env = api::EnvList(request.env);
  exec.user = request.user;
  exec.stdin_mode =
      request.stdin_data.empty() ? protocol::StdinMode::kNull : protocol::StdinMode::kPipe;
  exec.timeout_ms =
      std::max<uint64_t>(1, static_cast<uint64_t>(std::llround(request.timeout_seconds * 1000)));
  return exec;
}

}  // namespace

std::shared_ptr<Controller::Live> Controller::FindLive(const std::string& id) {
  std::lock_guard lock(mu_);
  auto it = live_.find(id);
  return it == live_.end() ? nullptr : it->second;
}

Status Controller::CleanUpPreviousRun() {
  auto records = store_.List();
  if (!records) return std::unexpected(records.error().Wrap("listing records at start"));
  for (const SandboxRecord& rec : *records) {
    if (rec.state == SandboxState::kDestroyed) continue;
    if (rec.state != SandboxState::kDestroying) {
      auto moved = store_.Transition(rec.id, {}, SandboxState::kDestroying);
      if (!moved) {
        spdlog::warn("start: cannot move {} to destroying: {}", rec.id, moved.error().message());
        continue;
      }
    }
    spdlog::info("start: destroying {} (was {}; adoption is not implemented)", rec.id,
                 store::SandboxStateName(rec.state));
    if (auto st = FinishDestroy(rec.id); !st) {
      spdlog::warn("start: {}", st.error().message());
    }
  }
  return {};
}

Result<SandboxRecord> Controller::Create(const api::CreateSandboxRequest& request) {
  SandboxRecord record;
  record.id = NewSandboxId();
  record.state = SandboxState::kCreating;
  record.engine = std::string(runtime_.name());
  record.template_name = request.template_name;
  record.limits = ToStoreLimits(request.limits);
  record.env = api::EnvList(request.env);
  record.metadata = request.metadata;
  record.expires_at_ms = NowMs() + request.ttl_seconds * 1000;
  const std::string id = record.id;
  // The record exists before any resource does, so a crash during the create leaves a trace.
  if (auto inserted = store_.Insert(record); !inserted) {
    return std::unexpected(inserted.error().Wrap("recording " + id));
  }
  auto fail = [&](Error error) -> Result<SandboxRecord> {
    if (auto marked = store_.MarkFailed(id, error.message()); !marked) {
      spdlog::error("marking {} failed: {}", id, marked.error().message());
    }
    return std::unexpected(std::move(error));  // the engine's messages name the id already
  };

  runtime::SandboxSpec spec;
  spec.id = id;
  spec.template_name = request.template_name;
  spec.limits = request.limits;
  spec.env = record.env;
  auto sandbox = runtime_.Create(spec);
  if (!sandbox) return fail(std::move(sandbox.error()));
  auto destroy_and_fail = [&](Error error) {
    if (auto st = runtime_.Destroy(id); !st) {
      spdlog::error("undoing the create of {}: {}", id, st.error().message());
    }
    return fail(std::move(error));
  };
  auto client = protocol::BlockingClient::Connect((*sandbox)->TakeAgentChannel(),
                                                  "airlockd " AIRLOCK_BUILD_ID);
  if (!client) return destroy_and_fail(client.error().Wrap("connecting to the agent"));
  const runtime::SandboxInfo& info = (*sandbox)->info();
  if (auto st = store_.SetRuntimeInfo(id, info.init_pid, info.resources); !st) {
    return destroy_and_fail(std::move(st.error()));
  }
  auto live = std::make_shared<Live>();
  live->client.emplace(std::move(*client));
  {
    std::lock_guard lock(mu_);
    live_[id] = live;
  }
  const SandboxState from[] = {SandboxState::kCreating};
  auto running = store_.Transition(id, from, SandboxState::kRunning);
  if (!running) {
    {
      std::lock_guard lock(mu_);
      live_.erase(id);
    }
    return destroy_and_fail(std::move(running.error()));
  }
  spdlog::info("created {} (agent pid {} on the host)", id, info.init_pid);
  return running;
}

Result<SandboxRecord> Controller::Get(const std::string& id) {
  auto record = store_.Get(id);
  if (record && record->state == SandboxState::kDestroyed) {
    return Fail(ErrorCode::kNotFound, "sandbox " + id + " does not exist");
  }
  if (!record && record.error().code() == ErrorCode::kNotFound) {
    return Fail(ErrorCode::kNotFound, "sandbox " + id + " does not exist");
  }
  return record;
}

Result<std::vector<SandboxRecord>> Controller::List(const api::ListFilter& filter) {
  store::ListFilter query;
  if (filter.state) {
    auto state = store::ParseSandboxState(*filter.state);
    if (!state) return Fail(ErrorCode::kInvalidArgument, "unknown state " + *filter.state);
    if (*state == SandboxState::kDestroyed) return std::vector<SandboxRecord>{};
    query.states = {*state};
  } else {
    for (SandboxState s : store::kAllSandboxStates) {
      if (s != SandboxState::kDestroyed) query.states.push_back(s);
    }
  }
  for (const auto& [key, value] : filter.metadata) query.metadata.emplace_back(key, value);
  return store_.List(query);
}

Result<SandboxRecord> Controller::Patch(const std::string& id,
                                        const api::PatchSandboxRequest& request) {
  std::lock_guard lock(patch_mu_);
  auto record = Get(id);
  if (!record) return record;
  api::Metadata metadata = record->metadata;
  if (auto st = request.ApplyMetadata(metadata); !st) return std::unexpected(st.error());
  if (request.ttl_seconds) {
    record = store_.UpdateTtl(id, NowMs() + *request.ttl_seconds * 1000);
    if (!record) return record;
  }
  if (!request.metadata.empty()) record = store_.UpdateMetadata(id, std::move(metadata));
  return record;
}

Status Controller::FinishDestroy(const std::string& id) {
  if (auto st = runtime_.Destroy(id); !st) {
    if (auto marked = store_.MarkFailed(id, st.error().message()); !marked) {
      spdlog::error("marking {} failed: {}", id, marked.error().message());
    }
    return std::unexpected(st.error().Wrap("destroying " + id));
  }
  {
    std::lock_guard lock(mu_);
    live_.erase(id);  // an exec still running keeps its Live until it sees the channel close
  }
  const SandboxState from[] = {SandboxState::kDestroying};
  if (auto done = store_.Transition(id, from, SandboxState::kDestroyed); !done) {
    return std::unexpected(done.error().Wrap("recording the destroy of " + id));
  }
  spdlog::info("destroyed {}", id);
  return {};
}

Status Controller::Destroy(const std::string& id) {
  std::shared_ptr<Live> live = FindLive(id);
  std::unique_lock<std::mutex> lock;
  if (live) lock = std::unique_lock(live->lifecycle_mu);
  if (auto record = Get(id); !record) return std::unexpected(record.error());
  const SandboxState from[] = {SandboxState::kRunning, SandboxState::kPaused,
                               SandboxState::kFailed};
  if (auto moved = store_.Transition(id, from, SandboxState::kDestroying); !moved) {
    return std::unexpected(moved.error());
  }
  return FinishDestroy(id);
}

Result<SandboxRecord> Controller::Pause(const std::string& id) {
  std::shared_ptr<Live> live = FindLive(id);
  std::unique_lock<std::mutex> lock;
  if (live) lock = std::unique_lock(live->lifecycle_mu);
  auto record = Get(id);
  if (!record) return record;
  const SandboxState from[] = {SandboxState::kRunning};
  if (auto st = store::RequireState(id, record->state, from); !st) {
    return std::unexpected(st.error());
  }
  if (!live) return Fail(ErrorCode::kUnavailable, "sandbox " + id + " is not held by this daemon");
  if (auto st = runtime_.Pause(id); !st) {
    return std::unexpected(st.error().Wrap("pausing " + id));
  }
  return store_.Transition(id, from, SandboxState::kPaused);
}

Result<SandboxRecord> Controller::Resume(const std::string& id) {
  std::shared_ptr<Live> live = FindLive(id);
  std::unique_lock<std::mutex> lock;
  if (live) lock = std::unique_lock(live->lifecycle_mu);
  auto record = Get(id);
  if (!record) return record;
  const SandboxState from[] = {SandboxState::kPaused};
  if (auto st = store::RequireState(id, record->state, from); !st) {
    return std::unexpected(st.error());
  }
  if (!live) return Fail(ErrorCode::kUnavailable, "sandbox " + id + " is not held by this daemon");
  if (auto st = runtime_.Resume(id); !st) {
    return std::unexpected(st.error().Wrap("resuming " + id));
  }
  return store_.Transition(id, from, SandboxState::kRunning);
}

Result<protocol::ExecResult> Controller::Exec(const std::string& id,
                                              const api::ExecRequest& request) {
  const SandboxState running[] = {SandboxState::kRunning};
  std::shared_ptr<Live> live = FindLive(id);
  if (!live) {
    // Not held here: unknown, destroyed, failed, or (not yet possible) another daemon's.
    auto record = Get(id);
    if (!record) return std::unexpected(record.error());
    if (auto st = store::RequireState(id, record->state, running); !st) {
      return std::unexpected(st.error());
    }
    return Fail(ErrorCode::kUnavailable, "sandbox " + id + " is not held by this daemon");
  }
  std::lock_guard exec_lock(live->exec_mu);
  // Checked after waiting for the lock: the sandbox may have been paused or destroyed meanwhile.
  auto record = Get(id);
  if (!record) return std::unexpected(record.error());
  if (auto st = store::RequireState(id, record->state, running); !st) {
    return std::unexpected(st.error());
  }
  if (!live->client) {
    return Fail(ErrorCode::kUnavailable, "the agent channel of " + id + " is closed");
  }
  protocol::Exec exec = ToProtocolExec(request);
  // The agent ends the command at its timeout (plus the kill grace); until then it may be
  // silent for as long as it likes.
  live->client->set_receive_timeout(std::chrono::milliseconds(exec.timeout_ms) +
                                    std::chrono::seconds(30));
  auto result = live->client->Exec(exec, request.stdin_data);
  if (!result) {
    // A destroy during the exec closes the channel; report the state rather than the EOF.
    auto now = Get(id);
    if (!now) return std::unexpected(now.error());
    if (auto st = store::RequireState(id, now->state, running); !st) {
      return std::unexpected(st.error());
    }
    // The agent's "not found" / "permission denied" are about the command, its cwd or its
    // user, not the sandbox: the caller must change the request (400), not look for the id.
    Error error = std::move(result.error()).Wrap("exec in " + id);
    if (error.code() == ErrorCode::kNotFound || error.code() == ErrorCode::kPermissionDenied) {
      return Fail(ErrorCode::kInvalidArgument, error.message());
    }
    return std::unexpected(std::move(error));
  }
  return result;
}

void Controller::DestroyAll() {
  std::vector<std::string> ids;
  {
    std::lock_guard lock(mu_);
    for (const auto& [id, live] : live_) ids.push_back(id);
  }
  for (const std::string& id : ids) {
    if (auto st = Destroy(id); !st) {
      spdlog::error("shutdown: {}", st.error().message());
    }
  }
}

}  // namespace airlock::daemon
