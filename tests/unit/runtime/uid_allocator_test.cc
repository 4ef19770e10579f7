#include "runtime/jail/uid_allocator.h"

#include <gtest/gtest.h>

#include <set>

namespace airlock::jail {
namespace {

TEST(UidAllocatorTest, RangesAreDistinctAlignedAndAboveRealUsers) {
  UidAllocator uids(1u << 30, 64);
  std::set<uid_t> seen;
  for (int i = 0; i < 64; ++i) {
    auto base = uids.Acquire();
    ASSERT_TRUE(base);
    EXPECT_GE(*base, 1u << 30);
    EXPECT_EQ((*base - (1u << 30)) % kIdsPerSandbox, 0u);
    EXPECT_TRUE(seen.insert(*base).second) << "range handed out twice";
  }
  EXPECT_EQ(uids.in_use(), 64u);
  auto none = uids.Acquire();
  ASSERT_FALSE(none);
  EXPECT_EQ(none.error().code(), ErrorCode::kResourceExhausted);
}

TEST(UidAllocatorTest, ReleasedRangesAreReusedLast) {
  UidAllocator uids(1u << 30, 4);
  uid_t a = *uids.Acquire();
  uid_t b = *uids.Acquire();
  uids.Release(a);
  // The next range is a fresh one, not the one just given back.
  uid_t c = *uids.Acquire();
  EXPECT_NE(c, a);
  EXPECT_NE(c, b);
  uids.Release(b);
  uids.Release(b);      // twice is harmless
  uids.Release(12345);  // not a range start: ignored
  EXPECT_EQ(uids.in_use(), 1u);
}

TEST(UidAllocatorTest, MarkUsedForRecovery) {
  UidAllocator uids(1u << 30, 2);
  EXPECT_FALSE(uids.MarkUsed((1u << 30) + 1));                   // not aligned
  EXPECT_FALSE(uids.MarkUsed((1u << 30) + 2 * kIdsPerSandbox));  // beyond the slots
  EXPECT_TRUE(uids.MarkUsed(1u << 30));
  EXPECT_EQ(*uids.Acquire(), (1u << 30) + kIdsPerSandbox);
  EXPECT_FALSE(uids.Acquire());
}

}  // namespace
}  // namespace airlock::jail
