// Secret bindings: parsing, and the proxy's pure work on an intercepted request (inject, refuse,
// scrub). Each refusal beside the request it differs from that goes through.
#include "net/credentials.h"

#include <gtest/gtest.h>

#include <map>
#include <random>

namespace airlock::net {
namespace {

using json = nlohmann::json;
using Fields = std::vector<std::pair<std::string, std::string>>;

int placeholders_made = 0;
std::string Next() { return "airlock-secret-p" + std::to_string(++placeholders_made); }

std::vector<SecretBinding> Parse(const json& j, const std::vector<SecretBinding>& existing = {}) {
  auto parsed = ParseSecretBindings(j, existing, Next);
  EXPECT_TRUE(parsed) << parsed.error().message();
  return parsed ? *parsed : std::vector<SecretBinding>{};
}

std::string ParseError(const json& j) {
  auto parsed = ParseSecretBindings(j, {}, Next);
  return parsed ? "" : parsed.error().message();
}

TEST(SecretBindingsTest, ParseNormalisesAndRoundTrips) {
  auto b = Parse(json::parse(R"([{"name": "GH", "hosts": ["API.GitHub.com.", "api.github.com"],
      "env": "GITHUB_TOKEN", "inject": {"header": "Authorization", "format": "Bearer {value}"}},
      {"name": "OTHER", "hosts": ["x.example"]}])"));
  ASSERT_EQ(b.size(), 2u);
  EXPECT_EQ(b[0].hosts, std::vector<std::string>{"api.github.com"});
  EXPECT_EQ(b[0].env, "GITHUB_TOKEN");
  EXPECT_EQ(b[0].header, "Authorization");
  EXPECT_EQ(b[0].format, "Bearer {value}");
  EXPECT_TRUE(b[0].placeholder.starts_with(kPlaceholderPrefix));
  EXPECT_NE(b[0].placeholder, b[1].placeholder);
  EXPECT_TRUE(b[1].env.empty());
  // Stored and read back: the same bindings, placeholders kept.
  auto again = Parse(SecretBindingsToJson(b), b);
  EXPECT_EQ(again, b);
  // A PATCH that keeps a secret keeps its placeholder; a new secret gets a new one.
  auto patched = Parse(json::parse(R"([{"name": "GH", "hosts": ["api.github.com"]},
                                       {"name": "NEW", "hosts": ["y.example"]}])"),
                       b);
  EXPECT_EQ(patched[0].placeholder, b[0].placeholder);
  EXPECT_NE(patched[1].placeholder, b[1].placeholder);
}

TEST(SecretBindingsTest, PlaceholdersAreFreshAndRandom) {
  const std::string a = NewPlaceholder(), b = NewPlaceholder();
  EXPECT_NE(a, b);
  EXPECT_EQ(a.size(), kPlaceholderPrefix.size() + 32);
  EXPECT_TRUE(a.starts_with(kPlaceholderPrefix));
}

TEST(SecretBindingsTest, BadBindingsAreRefusedNamingTheField) {
  const std::map<std::string, std::string> cases = {
      {R"({})", "must be an array"},
      {R"([{"hosts": ["a.example"]}])", "secrets[0].name"},
      {R"([{"name": "9X", "hosts": ["a.example"]}])", "secrets[0].name"},
      {R"([{"name": "A", "hosts": []}])", "secrets[0].hosts"},
      {R"([{"name": "A", "hosts": ["10.0.0.1"]}])", "is an address"},
      {R"([{"name": "A", "hosts": ["[::1]"]}])", "secrets[0].hosts[0]"},
      {R"([{"name": "A", "hosts": ["2852039166"]}])", "is an address"},
      {R"([{"name": "A", "hosts": ["*.example.com"]}])", "no wildcards"},
      {R"([{"name": "A", "hosts": ["a.example:443"]}])", "secrets[0].hosts[0]"},
      {R"([{"name": "A", "hosts": ["a.example"], "env": "X-Y"}])", "secrets[0].env"},
      {R"([{"name": "A", "hosts": ["a.example"], "inject": {"header": "Bad Name"}}])",
       "secrets[0].inject"},
      {R"([{"name": "A", "hosts": ["a.example"], "inject": {"header": "Host"}}])",
       "set by the proxy"},
      {R"([{"name": "A", "hosts": ["a.example"], "inject": {"header": "Connection"}}])",
       "set by the proxy"},
      {R"([{"name": "A", "hosts": ["a.example"], "inject": {"header": "X", "format": "no mark"}}])",
       "{value} exactly once"},
      {R"([{"name": "A", "hosts": ["a.example"],
            "inject": {"header": "X", "format": "{value}{value}"}}])",
       "{value} exactly once"},
      {R"([{"name": "A", "hosts": ["a.example"],
            "inject": {"header": "X", "format": "a\r\nEvil: {value}"}}])",
       "{value} exactly once"},
      {R"([{"name": "A", "hosts": ["a.example"], "surprise": 1}])", "unknown field"},
      {R"([{"name": "A", "hosts": ["a.example"]}, {"name": "A", "hosts": ["b.example"]}])",
       "bound twice"},
      {R"([{"name": "A", "hosts": ["a.example"], "env": "E"},
           {"name": "B", "hosts": ["b.example"], "env": "E"}])",
       "two secrets"},
  };
  for (const auto& [text, want] : cases) {
    EXPECT_NE(ParseError(json::parse(text)).find(want), std::string::npos)
        << text << " -> " << ParseError(json::parse(text));
  }
  // The positive control: the same shapes, well formed.
  EXPECT_EQ(ParseError(json::parse(
                R"([{"name": "A", "hosts": ["a.example"], "env": "E",
                     "inject": {"header": "X-Key", "format": "{value}"}}])")),
            "");
  // A placeholder in the request is not taken: the daemon makes its own.
  auto b = Parse(json::parse(R"([{"name": "A", "hosts": ["a.example"], "placeholder": "mine"}])"));
  ASSERT_EQ(b.size(), 1u);
  EXPECT_NE(b[0].placeholder, "mine");
}

class InjectTest : public ::testing::Test {
 protected:
  void SetUp() override {
    bindings_ = Parse(json::parse(R"([
        {"name": "GH", "hosts": ["api.github.com"], "env": "GITHUB_TOKEN"},
        {"name": "OAI", "hosts": ["api.openai.com"],
         "inject": {"header": "Authorization", "format": "Bearer {value}"}}])"));
    gh_ = bindings_[0].placeholder;
    oai_ = bindings_[1].placeholder;
  }
  Result<Injected> Inject(const Fields& fields, std::string_view host,
                          std::string_view target = "/") {
    return InjectSecrets(fields, target, host, bindings_, [&](const std::string& name) {
      return values_.contains(name) ? Result<std::string>(values_[name])
                                    : Fail(ErrorCode::kNotFound, "no secret " + name);
    });
  }
  std::string Field(const Injected& in, std::string_view name) {
    for (const auto& [k, v] : in.fields) {
      if (k == name) return v;
    }
    return "<none>";
  }
  std::vector<SecretBinding> bindings_;
  std::map<std::string, std::string> values_ = {{"GH", "ghp_REALVALUE"}, {"OAI", "sk-REAL"}};
  std::string gh_, oai_;
};

TEST_F(InjectTest, APlaceholderInAnyHeaderBecomesTheValueForItsBoundHost) {
  auto in =
      Inject({{"Authorization", "token " + gh_}, {"X-Custom", "a" + gh_ + "b"}, {"Accept", "*/*"}},
             "api.github.com");
  ASSERT_TRUE(in) << in.error().message();
  EXPECT_EQ(Field(*in, "Authorization"), "token ghp_REALVALUE");
  EXPECT_EQ(Field(*in, "X-Custom"), "aghp_REALVALUEb");
  EXPECT_EQ(Field(*in, "Accept"), "*/*");
  EXPECT_EQ(in->secrets, std::vector<std::string>{"GH"});
  // What came back is scrubbed to the placeholder.
  Scrubber scrub(in->scrub);
  EXPECT_EQ(scrub.All("echo: token ghp_REALVALUE"), "echo: token " + gh_);
}

TEST_F(InjectTest, BasicCredentialsAreDecodedRewrittenAndScrubbedBack) {
  // What curl -u "x-access-token:$GITHUB_TOKEN" sends, encoded here independently.
  auto b64 = [](std::string_view s) {
    static constexpr char k[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    std::string out;
    size_t i = 0;
    for (; i + 2 < s.size(); i += 3) {
      uint32_t n = (uint8_t(s[i]) << 16) | (uint8_t(s[i + 1]) << 8) | uint8_t(s[i + 2]);
      for (int j = 18; j >= 0; j -= 6) out += k[(n >> j) & 63];
    }
    if (i + 1 == s.size()) {
      uint32_t n = uint8_t(s[i]) << 16;
      out += k[(n >> 18) & 63];
      out += k[(n >> 12) & 63];
      out += "==";
    } else if (i + 2 == s.size()) {
      uint32_t n = (uint8_t(s[i]) << 16) | (uint8_t(s[i + 1]) << 8);
      out += k[(n >> 18) & 63];
      out += k[(n >> 12) & 63];
      out += k[(n >> 6) & 63];
      out += '=';
    }
    return out;
  };
  const std::string original = b64("x-access-token:" + gh_);
  auto in = Inject({{"Authorization", "Basic " + original}}, "api.github.com");
  ASSERT_TRUE(in) << in.error().message();
  EXPECT_EQ(Field(*in, "Authorization"), "Basic " + b64("x-access-token:ghp_REALVALUE"));
  Scrubber scrub(in->scrub);
  EXPECT_EQ(scrub.All("you sent Basic " + b64("x-access-token:ghp_REALVALUE")),
            "you sent Basic " + original);
  // The same credentials to a host the secret is not bound to: refused, though only the decoded
  // form names the placeholder.
  auto elsewhere = Inject({{"Authorization", "Basic " + original}}, "evil.example");
  ASSERT_FALSE(elsewhere);
  EXPECT_NE(elsewhere.error().message().find("secret GH"), std::string::npos);
  EXPECT_NE(elsewhere.error().message().find("evil.example"), std::string::npos);
}

TEST_F(InjectTest, TheBindingsOwnHeaderIsSetOnEveryRequestReplacingTheClients) {
  auto in = Inject({{"authorization", "Bearer whatever-the-client-had"}, {"Accept", "*/*"}},
                   "api.openai.com");
  ASSERT_TRUE(in) << in.error().message();
  EXPECT_EQ(Field(*in, "Authorization"), "Bearer sk-REAL");
  EXPECT_EQ(Field(*in, "authorization"), "<none>");
  EXPECT_EQ(in->secrets, std::vector<std::string>{"OAI"});
  // A host that has no binding gets nothing injected.
  auto other = Inject({{"Accept", "*/*"}}, "example.org");
  ASSERT_TRUE(other);
  EXPECT_EQ(Field(*other, "Authorization"), "<none>");
  EXPECT_TRUE(other->secrets.empty());
  EXPECT_TRUE(other->scrub.empty());
}

TEST_F(InjectTest, APlaceholderHeadedForAnotherHostIsRefusedWherever) {
  // In a header, in a header's name, in the target: each refused; the control is the same
  // request without it.
  for (const auto& [fields, target] : std::vector<std::pair<Fields, std::string>>{
           {{{"Authorization", "Bearer " + gh_}}, "/"},
           {{{"X-" + gh_, "1"}}, "/"},
           {{{"Accept", "*/*"}}, "/?token=" + gh_},
           // GH's placeholder to the host of OAI: bound elsewhere is not bound here.
       }) {
    auto in = Inject(fields, "api.openai.com", target);
    ASSERT_FALSE(in) << target;
    EXPECT_EQ(in.error().code(), ErrorCode::kPermissionDenied);
    EXPECT_NE(in.error().message().find("secret GH"), std::string::npos);
    EXPECT_NE(in.error().message().find("api.openai.com"), std::string::npos);
    EXPECT_EQ(in.error().message().find("ghp_REALVALUE"), std::string::npos);
  }
  EXPECT_TRUE(Inject({{"Accept", "*/*"}}, "api.openai.com", "/?token=none"));
}

TEST_F(InjectTest, AValueThatCannotBeHadOrCannotGoInAHeaderRefusesTheRequest) {
  values_.erase("GH");
  auto missing = Inject({{"Authorization", "token " + gh_}}, "api.github.com");
  ASSERT_FALSE(missing);
  EXPECT_NE(missing.error().message().find("secret GH cannot be used"), std::string::npos);
  values_["GH"] = "a\r\nEvil: 1";
  auto split = Inject({{"Authorization", "token " + gh_}}, "api.github.com");
  ASSERT_FALSE(split);
  EXPECT_EQ(split.error().message().find("Evil"), std::string::npos);
  values_["GH"] = "fine";
  EXPECT_TRUE(Inject({{"Authorization", "token " + gh_}}, "api.github.com"));
}

TEST(ScrubberTest, ReplacesAcrossEverySplitOfTheStream) {
  Scrubber proto({{"SECRETVALUE", "PLACEHOLDER-LONGER"}, {"b64==", "orig"}});
  const std::string text = "xxSECRETVALUEyySECRETVALUESECRETVALUEzz b64== SECRETVALU";
  const std::string want = proto.All(text);
  EXPECT_EQ(want, "xxPLACEHOLDER-LONGERyyPLACEHOLDER-LONGERPLACEHOLDER-LONGERzz orig SECRETVALU");
  std::mt19937 rng(7);
  for (int round = 0; round < 500; ++round) {
    Scrubber s({{"SECRETVALUE", "PLACEHOLDER-LONGER"}, {"b64==", "orig"}});
    std::string got;
    for (size_t at = 0; at < text.size();) {
      const size_t n = std::min<size_t>(text.size() - at, rng() % 7);
      got += s.Feed(std::string_view(text).substr(at, n));
      at += n;
    }
    got += s.Finish();
    ASSERT_EQ(got, want) << "round " << round;
  }
  // Nothing held back is lost, and nothing to scrub passes unchanged.
  Scrubber none;
  EXPECT_EQ(none.Feed("abc"), "abc");
}

TEST(FinderTest, FindsANeedleSplitAnywhere) {
  const std::string text = "....airlock-secret-abc....";
  for (size_t split = 0; split <= text.size(); ++split) {
    Finder f({"airlock-secret-abc", "zzz"});
    std::string seen = f.Feed(std::string_view(text).substr(0, split));
    if (seen.empty()) seen = f.Feed(std::string_view(text).substr(split));
    EXPECT_EQ(seen, "airlock-secret-abc") << split;
  }
  Finder f({"airlock-secret-abc"});
  EXPECT_EQ(f.Feed("airlock-secret-ab"), "");
  EXPECT_EQ(f.Feed("d"), "");
}

}  // namespace
}  // namespace airlock::net
