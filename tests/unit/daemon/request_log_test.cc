// The request log's parts (common/log.h, daemon/server/router.h): a route with its ids made
// placeholders, and JSON text that stays one valid line whatever the bytes. The log itself, as
// a daemon writes it, is checked end to end (tests/integration/request_log_test.cc).

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>

#include "common/log.h"
#include "daemon/server/router.h"

namespace {

using airlock::JsonEscape;
using airlock::daemon::RouteOf;

TEST(RouteOfTest, IdsAndNamesBecomePlaceholders) {
  EXPECT_EQ(RouteOf("/healthz"), "/healthz");
  EXPECT_EQ(RouteOf("/metrics"), "/metrics");
  EXPECT_EQ(RouteOf("/v1/sandboxes"), "/v1/sandboxes");
  EXPECT_EQ(RouteOf("/v1/sandboxes/sbx-abc"), "/v1/sandboxes/{id}");
  EXPECT_EQ(RouteOf("/v1/sandboxes/sbx-abc/exec"), "/v1/sandboxes/{id}/exec");
  EXPECT_EQ(RouteOf("/v1/sandboxes/sbx-abc/processes/42/stdin"),
            "/v1/sandboxes/{id}/processes/{pid}/stdin");
  EXPECT_EQ(RouteOf("/v1/templates/python"), "/v1/templates/{name}");
  EXPECT_EQ(RouteOf("/v1/secrets/GITHUB_TOKEN"), "/v1/secrets/{name}");
  EXPECT_EQ(RouteOf("/v1/keys/7"), "/v1/keys/{id}");
  EXPECT_EQ(RouteOf("/v1/tenants/acme/quota"), "/v1/tenants/{tenant}/quota");
  EXPECT_EQ(RouteOf("/v1/pools/base"), "/v1/pools/{template}");
  EXPECT_EQ(RouteOf("/v1/admin/backup"), "/v1/admin/backup");
  EXPECT_EQ(RouteOf("/nope"), "-");
}

TEST(JsonEscapeTest, AnyBytesMakeOneValidJsonString) {
  const std::string hostile = std::string("a\"b\\c\nd\te\x01\x7f") + "\xc3\xa9" + "\xff" +
                              "\xe2\x82" + "\xf0\x9f\x98\x80" + std::string(1, '\0') + "z";
  const std::string escaped = JsonEscape(hostile);
  EXPECT_EQ(escaped.find('\n'), std::string::npos);
  const auto doc = nlohmann::json::parse("\"" + escaped + "\"");
  EXPECT_EQ(doc.get<std::string>(), std::string("a\"b\\c\nd\te\x01\x7f") + "\xc3\xa9" +
                                        "\xEF\xBF\xBD" + "\xEF\xBF\xBD" + "\xEF\xBF\xBD" +
                                        "\xf0\x9f\x98\x80" + std::string(1, '\0') + "z")
      << "valid UTF-8 kept, each stray byte one U+FFFD";
  EXPECT_EQ(JsonEscape("plain"), "plain");
}

}  // namespace
