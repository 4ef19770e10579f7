#include "daemon/server/recovery.h"

#include <charconv>
#include <set>
#include <utility>
#include <vector>

#include "common/log.h"
#include "daemon/api/types.h"

namespace airlock::daemon {
namespace {

using store::SandboxRecord;
using store::SandboxState;

}  // namespace

Result<RecoveryReport> Recovery::Run() {
  RecoveryReport report;
  // A build the previous run did not finish will not finish now; its sandbox goes below.
  std::set<std::string> unfinished_builds;
  // The memory images templates restore; every other one an engine holds goes below (a fork's
  // or a build's that a crash left).
  std::set<std::string> template_images;
  auto templates = store_.ListTemplates();
  if (!templates) {
    spdlog::error("start: listing templates: {}", templates.error().message());
  } else {
    for (store::TemplateRecord& t : *templates) {
      if (t.state == store::TemplateState::kReady) {
        if (auto settings = api::TemplateSettings::FromJson(t.spec);
            settings && !settings->memory_image.empty()) {
          template_images.insert(settings->memory_image);
        }
      }
      if (t.state != store::TemplateState::kBuilding) continue;
      t.state = store::TemplateState::kFailed;
      t.error = "airlockd stopped during the build";
      if (auto st = store_.UpdateTemplate(t); !st) spdlog::error("{}", st.error().message());
      unfinished_builds.insert(t.name);
    }
  }
  auto records = store_.List();
  if (!records) return std::unexpected(records.error().Wrap("listing records at start"));
  std::set<std::string> claimed;  // ids whose record was dealt with
  for (const SandboxRecord& rec : *records) {
    if (rec.state == SandboxState::kDestroyed) continue;
    claimed.insert(rec.id);
    One(rec, report);
  }
  // What each engine holds that no live record claims goes. An engine that is unavailable now
  // is not asked: what it holds waits for it (a hibernated sandbox is user data).
  for (runtime::Engine* engine : engines_.Available()) {
    auto found = engine->ListSandboxes();
    if (!found) {
      return std::unexpected(
          found.error().Wrap("listing the " + std::string(engine->name()) + " engine's sandboxes"));
    }
    for (const std::string& id : *found) {
      if (claimed.contains(id)) continue;
      spdlog::warn("start: removing {}, which no live record claims", id);
      if (auto st = engine->Destroy(id); !st) {
        spdlog::error("start: removing {}: {}", id, st.error().message());
        continue;
      }
      ++report.orphans_removed;
    }
    if (!templates) continue;  // which images are a template's is not known: all stay
    auto images = engine->ListMemoryImages();
    if (!images) {
      spdlog::error("start: listing the {} engine's memory images: {}", engine->name(),
                    images.error().message());
      continue;
    }
    for (const std::string& image : *images) {
      if (template_images.contains(image)) continue;
      spdlog::info("start: removing memory image {}, which no template names", image);
      if (auto st = engine->RemoveMemoryImage(image); !st) {
        spdlog::error("start: {}", st.error().message());
      }
    }
  }
  for (const SandboxRecord& rec : *records) {
    auto build = rec.metadata.find(kBuildMetadataKey);
    if (build == rec.metadata.end() || !unfinished_builds.contains(build->second)) continue;
    if (!sandboxes_.Find(rec.id)) continue;
    spdlog::info("start: destroying {}, the sandbox of an unfinished build", rec.id);
    if (auto st = lifecycle_.destroy(rec.id); !st) spdlog::error("start: {}", st.error().message());
  }
  spdlog::info(
      "start: {} adopted, {} not recoverable, {} destroys finished, {} orphans removed, {} left "
      "for an unavailable engine",
      report.adopted, report.failed, report.finished, report.orphans_removed, report.unavailable);
  if (auto collected = layers_.Collect(); !collected) {
    spdlog::error("start: collecting layers: {}", collected.error().message());
  }
  if (networks_) {
    if (int removed = networks_->RemoveUnclaimed(); removed > 0) {
      spdlog::info("start: removed {} network namespace(s) no sandbox holds", removed);
    }
  }
  return report;
}

void Recovery::One(const SandboxRecord& rec, RecoveryReport& report) {
  const std::string& id = rec.id;
  // Destroys what the engine holds for `id` and records why the sandbox is gone.
  // Its engine: one that is unavailable now leaves the sandbox as it is, record and all (the
  // next start that has the engine takes it back), rather than destroying user data.
  auto held_by = engines_.Get(rec.engine);
  if (!held_by) {
    spdlog::warn("start: {} ({}) left as it is: {}", id, store::SandboxStateName(rec.state),
                 held_by.error().message());
    ++report.unavailable;
    return;
  }
  runtime::Engine& engine = **held_by;
  // The record says failed, ended because it was lost (one that was still being created was
  // never anybody's: it just failed).
  auto mark_lost = [&](const std::string& why) {
    const bool lost = rec.state != SandboxState::kCreating;
    sandboxes_.recorder().Record(id, lost ? "sandbox.lost" : "sandbox.failed",
                                 {{"error", why}, {"during", "recovery"}});
    auto marked = store_.Transition(id, {}, SandboxState::kFailed, [&](SandboxRecord& r) {
      r.error = why;
      if (lost) r.resources[kEndReason] = std::string(kLost);
    });
    if (!marked) spdlog::error("start: {}", marked.error().message());
  };
  auto give_up = [&](const std::string& why) {
    spdlog::warn("start: {} ({}{}) not recovered: {}", id, store::SandboxStateName(rec.state),
                 rec.pooled ? ", pooled" : "", why);
    if (auto st = engine.Destroy(id); !st) {
      spdlog::error("start: {}", st.error().message());
      mark_lost(why);
    } else if (rec.pooled) {
      lifecycle_.discard(id);  // nobody asked for it: no failed record to show
    } else {
      mark_lost(why);
    }
    ++report.failed;
  };
  switch (rec.state) {
    case SandboxState::kCreating:
      // Never acknowledged: the 201 goes out only once the record says running.
      give_up("airlockd stopped during the create; what it had made was removed");
      return;
    case SandboxState::kDestroying:
      if (auto st = lifecycle_.finish_destroy(id); !st) {
        spdlog::error("start: {}", st.error().message());
      } else {
        ++report.finished;
      }
      return;
    case SandboxState::kFailed:
      // Keeps the record (and its reason) for the caller; removes anything left behind.
      if (auto st = engine.Destroy(id); !st) spdlog::error("start: {}", st.error().message());
      return;
    case SandboxState::kRunning:
    case SandboxState::kPaused:
    case SandboxState::kHibernated:
      break;
    case SandboxState::kDestroyed:
      return;
  }
  const runtime::SandboxState wanted = rec.state == SandboxState::kPaused
                                           ? runtime::SandboxState::kPaused
                                       : rec.state == SandboxState::kHibernated
                                           ? runtime::SandboxState::kHibernated
                                           : runtime::SandboxState::kRunning;
  // Frozen or saved to disk: its agent cannot answer until it is resumed.
  const bool paused = rec.state != SandboxState::kRunning;
  auto adopted = engine.Adopt(id, rec.engine_state, wanted);
  if (!adopted) {
    give_up("airlockd restarted and " + adopted.error().message());
    return;
  }
  // What the engine keeps may have changed with the adopt (a gVisor sandbox restored from the
  // memory a crash left saved has a new pid): the record keeps what the next adopt needs.
  if (adopted->engine_state != rec.engine_state) {
    if (auto kept = store_.SetEngineState(id, adopted->engine_state); !kept) {
      give_up("airlockd restarted and could not record its engine state: " +
              kept.error().message());
      return;
    }
  }
  std::vector<std::string> network_env;  // an allowlist network's HTTP_PROXY and friends
  if (auto slot = rec.resources.find(kNetSlot); slot != rec.resources.end()) {
    uint32_t number = 0;
    const std::string& text = slot->second;
    auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), number);
    auto adopted_net =
        !networks_ ? Fail(ErrorCode::kUnimplemented, "this airlockd has no sandbox networking")
        : ec != std::errc() || end != text.data() + text.size()
            ? Fail(ErrorCode::kInternal, "its record names network slot '" + text + "'")
            : networks_->Adopt(id, number, NetworkPolicyOf(rec));
    if (!adopted_net) {
      give_up("airlockd restarted and its network could not be taken back: " +
              adopted_net.error().message());
      return;
    }
    network_env = std::move(adopted_net->env);
  }
  auto workdir = rec.resources.find(kWorkdir);
  // A claimed sandbox's commands carry its env, and its network's as a cold create's agent has
  // it (after the request's env); the others' agent has both from its start.
  std::vector<std::string> env;
  if (rec.resources.contains(kEnvPerCommand)) {
    env = rec.env;
    env.insert(env.end(), network_env.begin(), network_env.end());
  }
  std::shared_ptr<HeldSandbox> held = sandboxes_.Hold(
      id, &engine, std::move(env), workdir == rec.resources.end() ? "" : workdir->second);
  held->SetSecretEnv(net::SecretEnv(net::StoredSecretBindings(rec.secrets)));
  held->SetAutoPause(rec.resources);
  if (!paused && !rec.pooled && engine.capabilities().live_limits) {
    // A claim commits the request's limits before it writes them to the engine; a crash in
    // between would leave the pool's defaults in force. Writing the recorded ones again closes
    // that gap (and changes nothing for every other sandbox).
    runtime::Limits limits;
    limits.cpus = rec.limits.cpus;
    limits.memory_mb = static_cast<uint64_t>(rec.limits.memory_mb);
    limits.pids_max = static_cast<uint64_t>(rec.limits.pids_max);
    if (auto st = engine.UpdateLimits(id, limits); !st) {
      spdlog::warn("start: {}: re-applying its limits: {}", id, st.error().message());
    }
  }
  if (!paused) {  // a frozen or saved agent cannot answer; its channel is opened after the resume
    auto channel = sandboxes_.Acquire(id, /*allow_pooled=*/true);
    if (!channel) {
      sandboxes_.Release(id);
      give_up("airlockd restarted and its agent does not answer: " + channel.error().message());
      return;
    }
    channel->Keep();
  }
  spdlog::info("start: adopted {} ({}{})", id, store::SandboxStateName(rec.state),
               rec.pooled ? ", pooled" : "");
  if (!rec.pooled) {
    sandboxes_.recorder().Record(id, "sandbox.recovered",
                                 {{"state", store::SandboxStateName(rec.state)}});
  }
  ++report.adopted;
}

}  // namespace airlock::daemon
