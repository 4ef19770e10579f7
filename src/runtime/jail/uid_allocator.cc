#include "runtime/jail/uid_allocator.h"

namespace airlock::jail {

UidAllocator::UidAllocator(uid_t first, uint32_t slots) : first_(first), used_(slots, false) {
  AIRLOCK_CHECK(slots > 0);
  AIRLOCK_CHECK(static_cast<uint64_t>(first) + static_cast<uint64_t>(slots) * kIdsPerSandbox <
                0xffffffffull);
}

Result<uid_t> UidAllocator::Acquire() {
  std::lock_guard lock(mu_);
  for (size_t i = 0; i < used_.size(); ++i) {
    uint32_t slot = static_cast<uint32_t>((next_ + i) % used_.size());
    if (!used_[slot]) {
      used_[slot] = true;
      next_ = static_cast<uint32_t>((slot + 1) % used_.size());
      return first_ + slot * kIdsPerSandbox;
    }
  }
  return Fail(ErrorCode::kResourceExhausted,
              "all " + std::to_string(used_.size()) + " sandbox uid ranges are in use");
}

std::optional<uint32_t> UidAllocator::SlotOf(uid_t base) const {
  if (base < first_ || (base - first_) % kIdsPerSandbox != 0) return std::nullopt;
  uint32_t slot = (base - first_) / kIdsPerSandbox;
  if (slot >= used_.size()) return std::nullopt;
  return slot;
}

void UidAllocator::Release(uid_t base) {
  std::lock_guard lock(mu_);
  if (auto slot = SlotOf(base)) used_[*slot] = false;
}

bool UidAllocator::MarkUsed(uid_t base) {
  std::lock_guard lock(mu_);
  auto slot = SlotOf(base);
  if (!slot) return false;
  used_[*slot] = true;
  return true;
}

size_t UidAllocator::in_use() const {
  std::lock_guard lock(mu_);
  size_t n = 0;
  for (bool u : used_) n += u;
  return n;
}

}  // namespace airlock::jail
