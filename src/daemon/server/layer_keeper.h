#pragma once
// LayerKeeper: when layers of the shared layer store (runtime/layer_store.h) may go. A layer is
// removed once no template record and no live sandbox record names it (Collect), but never
// between its making and the first record that names it: a snapshot or fork holds the keeper's
// lock (Hold) from the copy until its records are written, and an import that makes a layer
// before any record exists holds a Pin, which defers collections until it goes.
//
// Owns the recursive mutex (recursive: a destroy under a fork's lock, undoing the fork,
// collects too), the count of pins and whether a collection was deferred. Thread-safe.

#include <mutex>

#include "common/error.h"
#include "daemon/store/store.h"
#include "runtime/layer_store.h"

namespace airlock::daemon {

class LayerKeeper {
 public:
  // Both outlive the keeper.
  LayerKeeper(store::Store& store, const runtime::LayerStore& layers)
      : store_(store), layers_(layers) {}

  // Removes every layer that no template and no live sandbox refers to; how many went (0 while
  // a pin defers it).
  Result<int> Collect();
  // No collection while the lock is held.
  [[nodiscard]] std::unique_lock<std::recursive_mutex> Hold() {
    return std::unique_lock<std::recursive_mutex>(mu_);
  }

  // Defers collections while alive (the one deferred runs when the last pin goes).
  class Pin {
   public:
    explicit Pin(LayerKeeper& keeper);
    ~Pin();
    Pin(const Pin&) = delete;
    Pin& operator=(const Pin&) = delete;

   private:
    LayerKeeper& keeper_;
  };

 private:
  store::Store& store_;
  const runtime::LayerStore& layers_;
  std::recursive_mutex mu_;
  int pins_ = 0;           // guarded by mu_
  bool deferred_ = false;  // a Collect a pin held off; guarded by mu_
};

}  // namespace airlock::daemon
