#include "daemon/server/layer_keeper.h"

#include "common/log.h"

namespace airlock::daemon {

LayerKeeper::Pin::Pin(LayerKeeper& keeper) : keeper_(keeper) {
  std::lock_guard<std::recursive_mutex> lock(keeper_.mu_);
  ++keeper_.pins_;
}

LayerKeeper::Pin::~Pin() {
  std::lock_guard<std::recursive_mutex> lock(keeper_.mu_);
  if (--keeper_.pins_ == 0 && keeper_.deferred_) (void)keeper_.Collect();
}

Result<int> LayerKeeper::Collect() {
  std::lock_guard<std::recursive_mutex> lock(mu_);
  deferred_ = pins_ > 0;  // done when the last pin goes
  if (deferred_) return 0;
  auto used = store_.LayersInUse();
  if (!used) return std::unexpected(used.error());
  auto stored = layers_.List();
  if (!stored) return std::unexpected(stored.error());
  int removed = 0;
  for (const std::string& digest : *stored) {
    if (used->contains(digest)) continue;
    if (auto st = layers_.Remove(digest); !st) {
      spdlog::error("removing layer {}: {}", digest, st.error().message());
      continue;
    }
    ++removed;
  }
  if (removed > 0) spdlog::info("removed {} layer(s) nothing uses any more", removed);
  return removed;
}

}  // namespace airlock::daemon
