#include "common/ids.h"

#include <gtest/gtest.h>

#include <string>
#include <string_view>
#include <unordered_set>

namespace airlock {
namespace {

bool IsBase32Lower(char c) { return (c >= 'a' && c <= 'z') || (c >= '2' && c <= '7'); }

TEST(NewSandboxIdTest, Shape) {
  for (int i = 0; i < 100; ++i) {
    std::string id = NewSandboxId();
    ASSERT_EQ(id.size(), 20u) << id;
    EXPECT_EQ(id.substr(0, 4), "sbx-") << id;
    for (char c : id.substr(4)) EXPECT_TRUE(IsBase32Lower(c)) << "'" << c << "' in " << id;
    EXPECT_TRUE(ValidateSandboxId(id).has_value()) << id;
  }
}

TEST(NewSandboxIdTest, ThousandIdsAreUnique) {
  std::unordered_set<std::string> seen;
  for (int i = 0; i < 1000; ++i) {
    std::string id = NewSandboxId();
    EXPECT_TRUE(seen.insert(id).second) << "duplicate " << id;
  }
  EXPECT_EQ(seen.size(), 1000u);
}

TEST(NewSandboxIdTest, UsesTheWholeAlphabet) {
  // 32 symbols, 16 per id: 200 ids (3200 symbols) miss one symbol with probability ~1e-42.
  std::unordered_set<char> symbols;
  for (int i = 0; i < 200; ++i) {
    for (char c : NewSandboxId().substr(4)) symbols.insert(c);
  }
  EXPECT_EQ(symbols.size(), 32u);
}

struct IdCase {
  std::string name;
  std::string id;
  bool valid;
};

TEST(ValidateSandboxIdTest, Table) {
  const IdCase kCases[] = {
      {"generated shape", "sbx-abcdefgh23456777", true},
      {"single char", "a", true},
      {"digits", "0123456789", true},
      {"uppercase", "SBX-ABC", true},
      {"mixed case", "Sbx-aB1-", true},
      {"inner dashes", "a--b", true},
      {"64 chars", std::string(64, 'a'), true},
      {"empty", "", false},
      {"65 chars", std::string(65, 'a'), false},
      {"leading dash", "-abc", false},
      {"only dash", "-", false},
      {"slash", "sbx/abc", false},
      {"leading slash", "/etc", false},
      {"dotdot", "..", false},
      {"dotdot in the middle", "a..b", false},
      {"dot", "sbx.1", false},
      {"space", "sbx abc", false},
      {"trailing newline", "sbx-abc\n", false},
      {"NUL byte", std::string("sbx\0abc", 7), false},
      {"trailing NUL", std::string("sbx-abc\0", 8), false},
      {"unicode", "sbx-\xc3\xa9t\xc3\xa9", false},
      {"underscore", "sbx_abc", false},
      {"percent", "sbx%2e", false},
  };
  for (const auto& c : kCases) {
    SCOPED_TRACE(c.name);
    Status st = ValidateSandboxId(c.id);
    EXPECT_EQ(st.has_value(), c.valid);
    if (!st) {
      EXPECT_EQ(st.error().code(), ErrorCode::kInvalidArgument);
      EXPECT_NE(st.error().message().find("sandbox id"), std::string::npos) << st.error().message();
    }
  }
}

}  // namespace
}  // namespace airlock
