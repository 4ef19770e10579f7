#pragma once
// Host uid/gid ranges for sandboxes: each sandbox's uids 0..65535 map to a range of its own,
// far above any real user, so that no two sandboxes (and no host user) share an id.

#include <sys/types.h>

#include <cstdint>
#include <mutex>
#include <optional>
#include <vector>

#include "common/error.h"

namespace airlock::jail {

inline constexpr uid_t kIdsPerSandbox = 65536;

class UidAllocator {
 public:
  // Ranges start at `first` (default 2^30) and there are `slots` of them.
  explicit UidAllocator(uid_t first = 1u << 30, uint32_t slots = 16384);

  // The first host id of a free range. kResourceExhausted when every range is taken.
  [[nodiscard]] Result<uid_t> Acquire();
  // Gives a range back; releasing one that is not held does nothing.
  void Release(uid_t base);
  // Marks a range as held (recovery: a sandbox that survived a daemon restart). False if `base`
  // is not the start of a range.
  bool MarkUsed(uid_t base);
  size_t in_use() const;

 private:
  std::optional<uint32_t> SlotOf(uid_t base) const;

  const uid_t first_;
  mutable std::mutex mu_;
  std::vector<bool> used_;
  uint32_t next_ = 0;  // where the search for a free slot starts: ranges are reused last
};

}  // namespace airlock::jail
