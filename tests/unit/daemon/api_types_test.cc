// The API's edge: every request type refuses malformed and hostile input with kInvalidArgument
// and a message naming the problem; valid input round-trips with defaults applied; responses
// render with the documented shapes.

#include <gtest/gtest.h>

#include <chrono>
#include <nlohmann/json.hpp>
#include <ostream>
#include <string>
#include <string_view>
#include <vector>

#include "common/error.h"
#include "daemon/api/base64.h"
#include "daemon/api/json.h"
#include "daemon/api/query.h"
#include "daemon/api/render.h"
#include "daemon/api/types.h"
#include "daemon/api/utf8.h"

namespace airlock::api {
namespace {

using nlohmann::json;
using namespace std::string_literals;

// ---------------------------------------------------------------------------------------------
// Malformed and hostile requests.

enum class Kind { kCreate, kPatch, kExec, kFileRead, kFileWrite, kFileDelete, kMkdir, kList };

struct BadCase {
  const char* name;
  Kind kind;
  std::string input;     // a JSON body, or a raw query string for the query kinds
  std::string expected;  // a substring of the message
};

// Runs `input` through the parser for `kind`; returns the error, or nullopt if it was accepted.
std::optional<Error> RunParser(Kind kind, const std::string& input) {
  auto error_of = [](auto result) -> std::optional<Error> {
    if (result) return std::nullopt;
    return result.error();
  };
  auto query = [&](auto parse) -> std::optional<Error> {
    auto params = ParseQueryString(input);
    if (!params) return params.error();
    return parse(*params);
  };
  switch (kind) {
    case Kind::kCreate:
      return error_of(CreateSandboxRequest::FromJson(input));
    case Kind::kPatch:
      return error_of(PatchSandboxRequest::FromJson(input));
    case Kind::kExec:
      return error_of(ExecRequest::FromJson(input));
    case Kind::kFileRead:
      return query(
          [&](const QueryParams& p) { return error_of(FileQuery::FromQuery(p, FileOp::kRead)); });
    case Kind::kFileWrite:
      return query(
          [&](const QueryParams& p) { return error_of(FileQuery::FromQuery(p, FileOp::kWrite)); });
    case Kind::kFileDelete:
      return query(
          [&](const QueryParams& p) { return error_of(FileQuery::FromQuery(p, FileOp::kDelete)); });
    case Kind::kMkdir:
      return query(
          [&](const QueryParams& p) { return error_of(FileQuery::FromQuery(p, FileOp::kMkdir)); });
    case Kind::kList:
      return query([&](const QueryParams& p) { return error_of(ListFilter::FromQuery(p)); });
  }
  return std::nullopt;
}

const std::string kLongKey(65, 'k');

std::vector<BadCase> BadCases() {
  std::string many_env = "{";
  for (int i = 0; i < 257; ++i) many_env += (i ? ",\"K" : "\"K") + std::to_string(i) + "\":\"v\"";
  many_env += "}";
  std::string many_filters;
  for (int i = 0; i < 65; ++i) many_filters += "&metadata.k" + std::to_string(i) + "=v";
  std::string many_meta = "{";
  for (int i = 0; i < 65; ++i) many_meta += (i ? ",\"k" : "\"k") + std::to_string(i) + "\":\"v\"";
  many_meta += "}";
  return {
      // Bodies that are not a JSON object.
      {"EmptyBody", Kind::kCreate, "", "request body is empty"},
      {"InvalidJson", Kind::kCreate, "{\"cpus\": }", "not valid JSON"},
      {"TrailingGarbage", Kind::kCreate, "{} x", "not valid JSON"},
      {"ArrayBody", Kind::kCreate, "[]", "must be a JSON object, got array"},
      {"StringBody", Kind::kExec, "\"ls\"", "must be a JSON object, got string"},
      {"NullBody", Kind::kPatch, "null", "must be a JSON object, got null"},
      {"Comments", Kind::kCreate, "{/* hi */}", "not valid JSON"},
      {"InvalidUtf8InString", Kind::kCreate, "{\"template\": \"\xC0\x80\"}", "not valid JSON"},
      {"LoneSurrogateEscape", Kind::kExec, R"({"cmd": "\ud800"})", "not valid JSON"},
      {"DuplicateKey", Kind::kCreate, R"({"cpus": 1, "cpus": 64})", "duplicate key \"cpus\""},
      {"NestedDuplicateKey", Kind::kCreate, R"({"env": {"A": "1", "A": "2"}})",
       "duplicate key \"A\""},
      {"HugeNumber", Kind::kCreate, R"({"cpus": 1e400})", "number overflow"},
      // Unknown fields.
      {"UnknownField", Kind::kCreate, R"({"cpu": 2})", "unknown field \"cpu\""},
      {"UnknownExecField", Kind::kExec, R"({"cmd": "ls", "shell": true})",
       "unknown field \"shell\""},
      {"UnknownPatchField", Kind::kPatch, R"({"template": "x"})", "unknown field \"template\""},
      // Create: wrong types and out of range.
      {"CpusNegative", Kind::kCreate, R"({"cpus": -1})",
       "cpus must be a number in (0, 64], got -1"},
      {"CpusZero", Kind::kCreate, R"({"cpus": 0})", "cpus must be a number in (0, 64], got 0"},
      {"CpusTooMany", Kind::kCreate, R"({"cpus": 64.5})", "got 64.5"},
      {"CpusString", Kind::kCreate, R"({"cpus": "2"})",
       "cpus must be a number in (0, 64], got \"2\""},
      {"MemoryFloat", Kind::kCreate, R"({"memory_mb": 512.5})",
       "memory_mb must be an integer in [16, 262144], got 512.5"},
      {"MemoryTooSmall", Kind::kCreate, R"({"memory_mb": 15})", "got 15"},
      {"MemoryTooBig", Kind::kCreate, R"({"memory_mb": 262145})", "got 262145"},
      {"MemoryBeyond64Bits", Kind::kCreate, R"({"memory_mb": 184467440737095516160})",
       "memory_mb must be an integer"},
      {"MemoryBool", Kind::kCreate, R"({"memory_mb": true})", "got true"},
      {"PidsTooFew", Kind::kCreate, R"({"pids_max": 7})",
       "pids_max must be an integer in [8, 65536]"},
      {"PidsNull", Kind::kCreate, R"({"pids_max": null})", "got null"},
      {"DiskTooBig", Kind::kCreate, R"({"disk_mb": 1048577})",
       "disk_mb must be an integer in [16, 1048576]"},
      {"TtlZero", Kind::kCreate, R"({"ttl_seconds": 0})",
       "ttl_seconds must be an integer in [1, 2592000], got 0"},
      {"TtlNegative", Kind::kCreate, R"({"ttl_seconds": -5})", "got -5"},
      {"TtlMinInt64", Kind::kCreate, R"({"ttl_seconds": -9223372036854775808})", "ttl_seconds"},
      {"TemplateUpper", Kind::kCreate, R"({"template": "Base"})", "template must be 1-64"},
      {"TemplateSlash", Kind::kCreate, R"({"template": "../etc"})", "got \"../etc\""},
      {"TemplateEmpty", Kind::kCreate, R"({"template": ""})", "template must be 1-64"},
      {"TemplateTooLong", Kind::kCreate, "{\"template\": \"" + std::string(65, 'a') + "\"}",
       "template must be at most 64 bytes"},
      {"TemplateNumber", Kind::kCreate, R"({"template": 7})", "template must be a string, got 7"},
      {"EnvNotObject", Kind::kCreate, R"({"env": ["A=1"]})", "env must be an object of strings"},
      {"EnvKeyDigit", Kind::kCreate, R"({"env": {"1A": "x"}})", "env key \"1A\" must match"},
      {"EnvKeyEquals", Kind::kCreate, R"({"env": {"A=B": "x"}})", "env key \"A=B\""},
      {"EnvKeyEmpty", Kind::kCreate, R"({"env": {"": "x"}})", "env key \"\""},
      {"EnvValueNul", Kind::kCreate, R"({"env": {"A": "x\u0000y"}})",
       "env[\"A\"] must not contain NUL"},
      {"EnvValueNumber", Kind::kCreate, R"({"env": {"A": 1}})",
       "env[\"A\"] must be a string, got 1"},
      {"EnvTooMany", Kind::kCreate, "{\"env\": " + many_env + "}", "at most 256 entries, got 257"},
      {"MetadataKeyTooLong", Kind::kCreate, "{\"metadata\": {\"" + kLongKey + "\": \"v\"}}",
       "must be 1-64 characters of [A-Za-z0-9_.-]"},
      {"MetadataKeySpace", Kind::kCreate, R"({"metadata": {"a b": "v"}})", "metadata key \"a b\""},
      {"MetadataValueTooLong", Kind::kCreate,
       "{\"metadata\": {\"k\": \"" + std::string(1025, 'v') + "\"}}",
       "metadata[\"k\"] must be at most 1024 bytes, got 1025"},
      {"MetadataValueObject", Kind::kCreate, R"({"metadata": {"k": {}}})",
       "metadata[\"k\"] must be a string"},
      {"MetadataTooMany", Kind::kCreate, "{\"metadata\": " + many_meta + "}", "at most 64 entries"},
      // Patch.
      {"PatchEmpty", Kind::kPatch, "{}", "at least one of ttl_seconds, metadata"},
      {"PatchTtlString", Kind::kPatch, R"({"ttl_seconds": "60"})",
       "ttl_seconds must be an integer"},
      {"PatchMetadataArray", Kind::kPatch, R"({"metadata": []})", "metadata must be an object"},
      {"PatchMetadataNumber", Kind::kPatch, R"({"metadata": {"k": 1}})",
       "metadata[\"k\"] must be a string"},
      // Exec.
      {"ExecNoCommand", Kind::kExec, R"({"cwd": "/"})", "missing command"},
      {"ExecBoth", Kind::kExec, R"({"cmd": "ls", "argv": ["ls"]})", "either cmd or argv, not both"},
      {"ExecEmptyCmd", Kind::kExec, R"({"cmd": ""})", "cmd must not be empty"},
      {"ExecCmdNul", Kind::kExec, R"({"cmd": "ls\u0000rm"})", "cmd must not contain NUL"},
      {"ExecArgvString", Kind::kExec, R"({"argv": "ls -l"})", "argv must be an array of strings"},
      {"ExecArgvEmpty", Kind::kExec, R"({"argv": []})", "argv must hold 1-4096 strings, got 0"},
      {"ExecArgvElementNumber", Kind::kExec, R"({"argv": ["ls", "-l", "/", 3]})",
       "argv[3] must be a string, got 3"},
      {"ExecArgvElementNul", Kind::kExec, R"({"argv": ["ls", "a\u0000b"]})",
       "argv[1] must not contain NUL"},
      {"ExecArgv0Empty", Kind::kExec, R"({"argv": [""]})", "argv[0] must not be empty"},
      {"ExecTimeoutZero", Kind::kExec, R"({"cmd": "ls", "timeout_seconds": 0})",
       "timeout_seconds must be a number in (0, 86400], got 0"},
      {"ExecTimeoutHuge", Kind::kExec, R"({"cmd": "ls", "timeout_seconds": 1e300})",
       "timeout_seconds"},
      {"ExecCwdEmpty", Kind::kExec, R"({"cmd": "ls", "cwd": ""})", "cwd must not be empty"},
      {"ExecCwdTooLong", Kind::kExec,
       "{\"cmd\": \"ls\", \"cwd\": \"/" + std::string(4096, 'a') + "\"}",
       "cwd must be at most 4096 bytes"},
      {"ExecCwdNul", Kind::kExec, R"({"cmd": "ls", "cwd": "/tmp\u0000/x"})",
       "cwd must not contain NUL"},
      {"ExecEnvKey", Kind::kExec, R"({"cmd": "ls", "env": {"A-B": "1"}})", "env key \"A-B\""},
      {"ExecUserSpace", Kind::kExec, R"({"cmd": "ls", "user": "root root"})",
       "user must be a user name"},
      {"ExecUserUidTooBig", Kind::kExec, R"({"cmd": "ls", "user": "4294967295"})", "numeric uid"},
      {"ExecUserNumber", Kind::kExec, R"({"cmd": "ls", "user": 0})",
       "user must be a string, got 0"},
      {"ExecStdinEncodingBad", Kind::kExec,
       R"({"cmd": "cat", "stdin": "x", "stdin_encoding": "hex"})",
       "stdin_encoding must be \"utf-8\" or \"base64\""},
      {"ExecStdinBadBase64", Kind::kExec,
       R"({"cmd": "cat", "stdin": "a$==", "stdin_encoding": "base64"})", "stdin: invalid base64"},
      {"ExecStdinEncodingAlone", Kind::kExec, R"({"cmd": "cat", "stdin_encoding": "base64"})",
       "stdin is missing"},
      {"ExecStdinNumber", Kind::kExec, R"({"cmd": "cat", "stdin": 5})", "stdin must be a string"},
      // Files (query strings).
      {"FileNoPath", Kind::kFileRead, "", "missing query parameter \"path\""},
      {"FileEmptyPath", Kind::kFileRead, "path=", "path must not be empty"},
      {"FilePathNul", Kind::kFileRead, "path=%2Ftmp%00x", "path must not contain NUL"},
      {"FilePathTooLong", Kind::kFileRead, "path=" + std::string(4097, 'a'),
       "path must be at most 4096 bytes"},
      {"FileBadEscape", Kind::kFileRead, "path=%zz", "bad percent escape"},
      {"FileTruncatedEscape", Kind::kFileRead, "path=%2", "bad percent escape"},
      {"FilePathTwice", Kind::kFileRead, "path=a&path=b", "\"path\" given more than once"},
      {"FileUnknownParam", Kind::kFileRead, "path=a&mode=0644", "unknown query parameter \"mode\""},
      {"FileNamelessParam", Kind::kFileRead, "=a", "parameter with no name"},
      {"FileWriteModeNotOctal", Kind::kFileWrite, "path=a&mode=0999", "mode must be octal"},
      {"FileWriteModeTooBig", Kind::kFileWrite, "path=a&mode=17777", "mode must be octal"},
      {"FileWriteParentsBad", Kind::kFileWrite, "path=a&parents=yes",
       "parents must be true, false, 1 or 0, got \"yes\""},
      {"FileDeleteRecursiveEmpty", Kind::kFileDelete, "path=a&recursive", "recursive must be"},
      {"MkdirUnknownRecursive", Kind::kMkdir, "path=a&recursive=true",
       "unknown query parameter \"recursive\""},
      // List filters.
      {"ListBadState", Kind::kList, "state=zombie", "state must be one of creating, running"},
      {"ListStateTwice", Kind::kList, "state=running&state=paused", "given more than once"},
      {"ListUnknown", Kind::kList, "limit=5", "unknown query parameter \"limit\""},
      {"ListMetadataBadKey", Kind::kList, "metadata.a%20b=1", "metadata filter key \"a b\""},
      {"ListTooManyMetadataFilters", Kind::kList, many_filters, "at most 64 metadata filters"},
      {"ListMetadataEmptyKey", Kind::kList, "metadata.=1", "metadata filter key \"\""},
  };
}

// gtest prints the case's name instead of its bytes.
void PrintTo(const BadCase& c, std::ostream* os) { *os << c.name; }

class BadRequestTest : public ::testing::TestWithParam<BadCase> {};

TEST_P(BadRequestTest, RefusedWithAMessageNamingTheProblem) {
  const BadCase& c = GetParam();
  std::optional<Error> error = RunParser(c.kind, c.input);
  ASSERT_TRUE(error.has_value()) << "accepted: " << c.input.substr(0, 200);
  EXPECT_EQ(error->code(), ErrorCode::kInvalidArgument) << error->message();
  EXPECT_NE(error->message().find(c.expected), std::string::npos)
      << "message: " << error->message() << "\nexpected to contain: " << c.expected;
  EXPECT_EQ(HttpStatus(error->code()), 400);
}

INSTANTIATE_TEST_SUITE_P(Table, BadRequestTest, ::testing::ValuesIn(BadCases()),
                         [](const ::testing::TestParamInfo<BadCase>& param_info) {
                           return std::string(param_info.param.name);
                         });

TEST(BadRequestTableTest, HasAtLeastFortyCases) { EXPECT_GE(BadCases().size(), 40u); }

// ---------------------------------------------------------------------------------------------
// Hostile JSON shapes.

TEST(ParseJsonObjectTest, TenThousandNestedArraysAreRefusedWithoutCrashing) {
  std::string deep = "{\"cpus\": " + std::string(10000, '[') + std::string(10000, ']') + "}";
  auto r = CreateSandboxRequest::FromJson(deep);
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error().code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(r.error().message().find("nests deeper than 32"), std::string::npos)
      << r.error().message();
}

TEST(ParseJsonObjectTest, MillionNestedObjectsUnclosedAreRefused) {
  std::string deep;
  for (int i = 0; i < 1000000; ++i) deep += "{\"a\":";
  auto r = ParseJsonObject(deep);
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error().code(), ErrorCode::kInvalidArgument);
}

TEST(ParseJsonObjectTest, DepthLimitIsExact) {
  auto nested = [](int levels) {  // an object holding levels-1 nested arrays
    return "{\"x\":" + std::string(levels - 1, '[') + std::string(levels - 1, ']') + "}";
  };
  EXPECT_TRUE(ParseJsonObject(nested(kMaxJsonDepth)).has_value());
  EXPECT_FALSE(ParseJsonObject(nested(kMaxJsonDepth + 1)).has_value());
}

TEST(ParseJsonObjectTest, OversizedBodyIsTooLarge) {
  std::string body = "{\"cmd\": \"" + std::string(kMaxJsonBodyBytes, 'a') + "\"}";
  auto r = ExecRequest::FromJson(body);
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error().code(), ErrorCode::kTooLarge);
  EXPECT_EQ(HttpStatus(r.error().code()), 413);
}

TEST(ParseJsonObjectTest, DuplicateKeysInSiblingObjectsAreFine) {
  EXPECT_TRUE(
      ParseJsonObject(R"({"a": {"k": 1}, "b": {"k": 2}, "c": [{"k": 1}, {"k": 2}]})").has_value());
}

TEST(ParseJsonObjectTest, HugeIntegerBecomesARefusalNotAWrap) {
  auto r = CreateSandboxRequest::FromJson(R"({"pids_max": 18446744073709551616})");
  ASSERT_FALSE(r.has_value());
  EXPECT_NE(r.error().message().find("pids_max must be an integer"), std::string::npos);
  auto r2 = CreateSandboxRequest::FromJson(R"({"pids_max": 18446744073709551615})");
  ASSERT_FALSE(r2.has_value());
  EXPECT_NE(r2.error().message().find("got 18446744073709551615"), std::string::npos);
}

TEST(ParseJsonObjectTest, MessagesQuoteHostileValuesSafely) {
  // A long, escape-laden unknown key: the message stays short and is pure ASCII.
  std::string key = std::string(500, 'x') + "\n\x01\"";
  auto r = CreateSandboxRequest::FromJson(json{{key, 1}}.dump());
  ASSERT_FALSE(r.has_value());
  EXPECT_LT(r.error().message().size(), 400u);
  for (char c : r.error().message()) EXPECT_TRUE(c >= 0x20 && c < 0x7f) << int(c);
}

// ---------------------------------------------------------------------------------------------
// Valid requests.

TEST(CreateSandboxRequestTest, EmptyObjectGetsTheEngineDefaults) {
  auto r = CreateSandboxRequest::FromJson("{}");
  ASSERT_TRUE(r.has_value()) << r.error().message();
  EXPECT_EQ(r->template_name, "base");
  EXPECT_EQ(r->ttl_seconds, 3600);
  EXPECT_EQ(r->limits.cpus, 1.0);
  EXPECT_EQ(r->limits.memory_mb, 512u);
  EXPECT_EQ(r->limits.pids_max, 256u);
  EXPECT_EQ(r->limits.disk_mb, 1024u);
  EXPECT_TRUE(r->env.empty());
  EXPECT_TRUE(r->metadata.empty());
}

TEST(CreateSandboxRequestTest, EveryFieldAtItsLimits) {
  json body = {
      {"template", "py3.12-slim_v2"},
      {"ttl_seconds", 30 * 24 * 3600},
      {"cpus", 0.25},
      {"memory_mb", 262144},
      {"pids_max", 8},
      {"disk_mb", 16},
      {"env", {{"_PATH2", "/bin"}, {"EMPTY", ""}, {"UTF", "h\xC3\xA9"}}},
      {"metadata", {{"team.name-1_x", std::string(1024, 'v')}, {"k", ""}}},
  };
  auto r = CreateSandboxRequest::FromJson(body.dump());
  ASSERT_TRUE(r.has_value()) << r.error().message();
  EXPECT_EQ(r->template_name, "py3.12-slim_v2");
  EXPECT_EQ(r->ttl_seconds, 2592000);
  EXPECT_EQ(r->limits.cpus, 0.25);
  EXPECT_EQ(r->limits.memory_mb, 262144u);
  EXPECT_EQ(r->limits.pids_max, 8u);
  EXPECT_EQ(r->limits.disk_mb, 16u);
  EXPECT_EQ(r->limits.tmp_mb, runtime::Limits{}.tmp_mb);
  EXPECT_EQ(r->env.at("_PATH2"), "/bin");
  EXPECT_EQ(r->env.at("UTF"), "h\xC3\xA9");
  EXPECT_EQ(EnvList(r->env), (std::vector<std::string>{"EMPTY=", "UTF=h\xC3\xA9", "_PATH2=/bin"}));
  EXPECT_EQ(r->metadata.at("team.name-1_x").size(), 1024u);
  EXPECT_EQ(r->metadata.at("k"), "");
}

TEST(CreateSandboxRequestTest, IntegralCpusAndExactMaximaAreAccepted) {
  auto r = CreateSandboxRequest::FromJson(R"({"cpus": 64, "pids_max": 65536, "disk_mb": 1048576,
                                              "memory_mb": 16, "ttl_seconds": 1})");
  ASSERT_TRUE(r.has_value()) << r.error().message();
  EXPECT_EQ(r->limits.cpus, 64.0);
  EXPECT_EQ(r->limits.pids_max, 65536u);
}

TEST(TemplateBaseTest, DebianSuitesImagePathsAndTemplatesAreBases) {
  EXPECT_EQ(DebianSuite("debian:bookworm"), "bookworm");
  EXPECT_EQ(DebianSuite("debian:trixie-backports"), "trixie-backports");
  for (const char* bad : {"debian:", "debian:Bookworm", "debian:1x", "debian:a/b", "ubuntu:noble",
                          "debian"}) {
    EXPECT_EQ(DebianSuite(bad), "") << bad;
  }
  EXPECT_TRUE(CheckTemplateName("debian:bookworm"));
  EXPECT_TRUE(CheckTemplateName("app"));
  EXPECT_FALSE(CheckTemplateName("debian:"));
  for (const char* base : {"base", "app", "debian:bookworm", "/srv/images/python.tar"}) {
    auto req = CreateTemplateRequest::FromJson(json{{"name", "t"}, {"base", base}}.dump());
    ASSERT_TRUE(req) << base << ": " << req.error().message();
    EXPECT_EQ(req->base, base);
  }
  for (const char* base : {"images/python.tar", "debian:", "Bad", ""}) {
    auto req = CreateTemplateRequest::FromJson(json{{"name", "t"}, {"base", base}}.dump());
    ASSERT_FALSE(req) << base;
    EXPECT_EQ(req.error().code(), ErrorCode::kInvalidArgument);
  }
  // A template's own name is never a Debian suite's.
  EXPECT_FALSE(CreateTemplateRequest::FromJson(R"({"name": "debian:sid"})"));
}

TEST(TemplateBaseTest, AnImagesEnvKeepsOnlyWhatARequestCouldHold) {
  EnvMap env = EnvFromImage({"PATH=/usr/local/bin:/usr/bin", "LANG=C.UTF-8", "EMPTY=", "NOEQUALS",
                             "1BAD=x", "has-dash=x", "A=b=c"});
  EXPECT_EQ(env, (EnvMap{{"PATH", "/usr/local/bin:/usr/bin"},
                         {"LANG", "C.UTF-8"},
                         {"EMPTY", ""},
                         {"A", "b=c"}}));
}

TEST(TemplateSettingsTest, TheRootAndEngineRoundTripAndAnUnknownRootIsRefused) {
  TemplateSettings s;
  s.root = kRootOwn;
  s.engine = "gvisor";
  auto back = TemplateSettings::FromJson(s.ToJson({}));
  ASSERT_TRUE(back);
  EXPECT_EQ(back->root, kRootOwn);
  EXPECT_EQ(back->engine, "gvisor");
  auto old = TemplateSettings::FromJson(R"({"base": "base"})");  // stored before roots existed
  ASSERT_TRUE(old);
  EXPECT_EQ(old->root, kRootHostUsr);
  EXPECT_EQ(old->engine, "") << "stored before engines: the daemon's default";
  EXPECT_FALSE(TemplateSettings::FromJson(R"({"root": "host"})"));
}

TEST(TemplateSettingsTest, AMemorySnapshotRoundTripsAndOnlyWhenThereIsOne) {
  auto req = CreateTemplateRequest::FromJson(
      R"({"name": "t", "start_cmd": "python3 -i", "snapshot_after": "import numpy"})");
  ASSERT_TRUE(req) << req.error().message();
  TemplateSettings s = TemplateSettings::From(*req);
  EXPECT_EQ(s.snapshot_after, "import numpy");
  EXPECT_EQ(s.ToJson({}).find("memory_snapshot"), std::string::npos) << "no image yet";
  s.memory_image = "mem-abcdefghijklmnop";
  s.memory_image_bytes = 123456789012;
  auto back = TemplateSettings::FromJson(s.ToJson({}));
  ASSERT_TRUE(back) << back.error().message();
  EXPECT_EQ(back->snapshot_after, "import numpy");
  EXPECT_EQ(back->memory_image, "mem-abcdefghijklmnop");
  EXPECT_EQ(back->memory_image_bytes, 123456789012u);
  auto plain = TemplateSettings::FromJson(R"({"base": "base"})");  // stored before snapshots
  ASSERT_TRUE(plain);
  EXPECT_EQ(plain->memory_image, "");
  EXPECT_EQ(plain->snapshot_after, "");
  EXPECT_FALSE(TemplateSettings::FromJson(R"({"memory_snapshot": {"image": 1, "bytes": 2}})"));
  EXPECT_FALSE(TemplateSettings::FromJson(R"({"memory_snapshot": {"bytes": 2}})"));
  for (const char* bad : {R"({"name": "t", "snapshot_after": ""})",
                          R"({"name": "t", "snapshot_after": 1})",
                          R"({"name": "t", "snapshot_after": null})",
                          R"({"name": "t", "snapshot_after": ["true"]})"}) {
    auto refused = CreateTemplateRequest::FromJson(bad);
    ASSERT_FALSE(refused) << bad;
    EXPECT_EQ(refused.error().code(), ErrorCode::kInvalidArgument) << bad;
    EXPECT_NE(refused.error().message().find("snapshot_after"), std::string::npos)
        << refused.error().message();
  }
}

TEST(CreateSandboxRequestTest, EngineIsANameAndNothingElse) {
  auto named = CreateSandboxRequest::FromJson(R"({"engine": "jail"})");
  ASSERT_TRUE(named) << named.error().message();
  EXPECT_EQ(named->engine, "jail");
  EXPECT_EQ(CreateSandboxRequest::FromJson("{}")->engine, "") << "none named: chosen later";
  for (const char* bad : {R"({"engine": ""})", R"({"engine": "Jail"})", R"({"engine": 1})",
                          R"({"engine": "../x"})", R"({"engine": "a b"})",
                          R"({"engine": "abcdefghijklmnopqrstuvwxyz0123456"})"}) {
    auto refused = CreateSandboxRequest::FromJson(bad);
    ASSERT_FALSE(refused) << bad;
    EXPECT_EQ(refused.error().code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(refused.error().message().find("engine must be"), std::string::npos)
        << refused.error().message();
  }
  auto build = CreateTemplateRequest::FromJson(R"({"name": "t", "engine": "jail"})");
  ASSERT_TRUE(build) << build.error().message();
  EXPECT_EQ(build->engine, "jail");
  EXPECT_EQ(TemplateSettings::From(*build).engine, "jail");
}

TEST(CreateSandboxRequestTest, NetworkIsParsedAndBadRulesNameTheirPlace) {
  auto none = CreateSandboxRequest::FromJson("{}");
  ASSERT_TRUE(none);
  EXPECT_EQ(none->network.mode(), net::NetworkMode::kNone);
  auto allow = CreateSandboxRequest::FromJson(
      R"({"network": {"mode": "allowlist", "allow": ["PyPI.org", "*.github.com:443"]}})");
  ASSERT_TRUE(allow) << allow.error().message();
  EXPECT_EQ(allow->network.mode(), net::NetworkMode::kAllowlist);
  EXPECT_EQ(allow->network.ToJson()["allow"], json::array({"pypi.org", "*.github.com:443"}));
  auto bad = CreateSandboxRequest::FromJson(
      R"({"network": {"mode": "allowlist", "allow": ["ok.org", "bad..org"]}})");
  ASSERT_FALSE(bad);
  EXPECT_EQ(bad.error().code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(bad.error().message().find("network.allow[1]"), std::string::npos)
      << bad.error().message();
  EXPECT_FALSE(CreateSandboxRequest::FromJson(R"({"network": {"mode": "wide"}})"));
  auto patch = PatchSandboxRequest::FromJson(R"({"network": {"mode": "open"}})");
  ASSERT_TRUE(patch) << patch.error().message();
  ASSERT_TRUE(patch->network.has_value());
  EXPECT_EQ(patch->network->mode(), net::NetworkMode::kOpen);
}

TEST(CreateTemplateRequestTest, NetworkIsACreatesAndNotATemplateSetting) {
  auto none = CreateTemplateRequest::FromJson(R"({"name": "t"})");
  ASSERT_TRUE(none) << none.error().message();
  EXPECT_EQ(none->network.mode(), net::NetworkMode::kNone);
  auto allow = CreateTemplateRequest::FromJson(
      R"({"name": "t", "network": {"mode": "allowlist", "allow": ["PyPI.org"]}})");
  ASSERT_TRUE(allow) << allow.error().message();
  EXPECT_EQ(allow->network.mode(), net::NetworkMode::kAllowlist);
  EXPECT_EQ(allow->network.ToJson()["allow"], json::array({"pypi.org"}));
  // The template's stored settings have no network.
  const json stored = json::parse(TemplateSettings::From(*allow).ToJson({}));
  EXPECT_FALSE(stored.contains("network")) << stored;
  // A bad policy is refused with a create's words.
  const std::string policy = R"({"mode": "allowlist", "allow": ["ok.org", "bad..org"]})";
  auto bad = CreateTemplateRequest::FromJson(R"({"name": "t", "network": )" + policy + "}");
  auto bad_create = CreateSandboxRequest::FromJson(R"({"network": )" + policy + "}");
  ASSERT_FALSE(bad);
  ASSERT_FALSE(bad_create);
  EXPECT_EQ(bad.error().code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(bad.error().message(), bad_create.error().message());
  EXPECT_FALSE(CreateTemplateRequest::FromJson(R"({"name": "t", "network": "open"})"));
}

TEST(PatchSandboxRequestTest, MetadataIsAMergePatch) {
  auto r = PatchSandboxRequest::FromJson(R"({"metadata": {"add": "1", "drop": null}})");
  ASSERT_TRUE(r.has_value()) << r.error().message();
  EXPECT_FALSE(r->ttl_seconds.has_value());
  Metadata current = {{"drop", "x"}, {"keep", "y"}};
  ASSERT_TRUE(r->ApplyMetadata(current).has_value());
  EXPECT_EQ(current, (Metadata{{"add", "1"}, {"keep", "y"}}));
}

TEST(PatchSandboxRequestTest, TtlAlone) {
  auto r = PatchSandboxRequest::FromJson(R"({"ttl_seconds": 120})");
  ASSERT_TRUE(r.has_value()) << r.error().message();
  EXPECT_EQ(r->ttl_seconds, 120);
  EXPECT_TRUE(r->metadata.empty());
}

TEST(PatchSandboxRequestTest, ApplyRefusesGrowingPastTheCapAndChangesNothing) {
  Metadata current;
  for (int i = 0; i < 64; ++i) current["k" + std::to_string(i)] = "v";
  auto r = PatchSandboxRequest::FromJson(R"({"metadata": {"one_more": "v"}})");
  ASSERT_TRUE(r.has_value());
  auto status = r->ApplyMetadata(current);
  ASSERT_FALSE(status.has_value());
  EXPECT_EQ(status.error().code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(status.error().message().find("65 keys"), std::string::npos);
  EXPECT_EQ(current.size(), 64u);
  EXPECT_FALSE(current.contains("one_more"));
}

TEST(ExecRequestTest, ShellCommandWithDefaults) {
  auto r = ExecRequest::FromJson(R"({"cmd": "echo hi | wc -c"})");
  ASSERT_TRUE(r.has_value()) << r.error().message();
  EXPECT_TRUE(r->is_shell());
  EXPECT_EQ(r->cmd, "echo hi | wc -c");
  EXPECT_TRUE(r->argv.empty());
  EXPECT_EQ(r->timeout_seconds, 300.0);
  EXPECT_EQ(r->cwd, "");
  EXPECT_EQ(r->user, "");
  EXPECT_EQ(r->stdin_data, "");
}

TEST(ExecRequestTest, ArgvWithEverything) {
  auto r = ExecRequest::FromJson(R"j({"argv": ["python3", "-c", "print(1)", ""], "cwd": "work/dir",
      "env": {"PYTHONUNBUFFERED": "1"}, "stdin": "h\u00e9\u0000", "timeout_seconds": 0.5,
      "user": "1000"})j");
  ASSERT_TRUE(r.has_value()) << r.error().message();
  EXPECT_FALSE(r->is_shell());
  EXPECT_EQ(r->argv, (std::vector<std::string>{"python3", "-c", "print(1)", ""}));
  EXPECT_EQ(r->cwd, "work/dir");
  EXPECT_EQ(r->env.at("PYTHONUNBUFFERED"), "1");
  EXPECT_EQ(r->stdin_data, "h\xC3\xA9"s + '\0');
  EXPECT_EQ(r->timeout_seconds, 0.5);
  EXPECT_EQ(r->user, "1000");
}

TEST(ExecRequestTest, Base64StdinIsDecoded) {
  auto r = ExecRequest::FromJson(R"({"cmd": "cat", "stdin": "AP+AwQ==", "stdin_encoding": "base64",
                                     "user": "www-data"})");
  ASSERT_TRUE(r.has_value()) << r.error().message();
  EXPECT_EQ(r->stdin_data, "\x00\xFF\x80\xC1"s);
  EXPECT_EQ(r->user, "www-data");
}

TEST(ExecRequestTest, Base64StdinIsCappedAfterDecoding) {
  // Unpadded base64 of the largest text length allowed decodes to two bytes over the cap.
  std::string text((kMaxStdinBytes + 2) / 3 * 4, 'A');
  auto r = ExecRequest::FromJson(R"({"argv": ["cat"], "stdin_encoding": "base64", "stdin": ")" +
                                 text + R"("})");
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error().code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(r.error().message().find("after base64 decoding"), std::string::npos)
      << r.error().message();
  // Exactly the cap is fine.
  std::string ok(kMaxStdinBytes / 3 * 4, 'A');
  auto fine = ExecRequest::FromJson(R"({"argv": ["cat"], "stdin_encoding": "base64", "stdin": ")" +
                                    ok + R"("})");
  ASSERT_TRUE(fine.has_value()) << fine.error().message();
  EXPECT_LE(fine->stdin_data.size(), kMaxStdinBytes);
}

TEST(FileQueryTest, ParsesEveryParameter) {
  auto params = ParseQueryString("path=%2Fhome%2Fuser%2Fa+b.txt&mode=0640&parents=1");
  ASSERT_TRUE(params.has_value());
  auto q = FileQuery::FromQuery(*params, FileOp::kWrite);
  ASSERT_TRUE(q.has_value()) << q.error().message();
  EXPECT_EQ(q->path, "/home/user/a b.txt");
  EXPECT_EQ(q->mode, 0640u);
  EXPECT_TRUE(q->parents);
  EXPECT_FALSE(q->recursive);

  auto del = FileQuery::FromQuery({{"path", "../x"}, {"recursive", "true"}}, FileOp::kDelete);
  ASSERT_TRUE(del.has_value()) << del.error().message();
  EXPECT_EQ(del->path, "../x");
  EXPECT_TRUE(del->recursive);
  EXPECT_FALSE(del->mode.has_value());
}

TEST(FileQueryTest, PathAtTheLimitIsAccepted) {
  auto q = FileQuery::FromQuery({{"path", std::string(4096, 'a')}}, FileOp::kTarGet);
  ASSERT_TRUE(q.has_value()) << q.error().message();
}

TEST(NetworkEventsQueryTest, AfterAndLimitAreBoundedDecimals) {
  auto none = NetworkEventsQuery::FromQuery({});
  ASSERT_TRUE(none.has_value());
  EXPECT_EQ(none->after, 0);
  EXPECT_EQ(none->limit, NetworkEventsQuery::kMaxLimit);
  auto both = NetworkEventsQuery::FromQuery({{"after", "9223372036854775807"}, {"limit", "1"}});
  ASSERT_TRUE(both.has_value()) << both.error().message();
  EXPECT_EQ(both->after, INT64_MAX);
  EXPECT_EQ(both->limit, 1);
  const std::pair<const char*, const char*> bad[] = {
      {"after", "-1"}, {"after", "9223372036854775808"}, {"after", ""},  {"after", "1x"},
      {"after", "+1"}, {"limit", "0"},                   {"limit", "1001"}, {"limit", " 5"},
      {"page", "2"}};
  for (const auto& [name, value] : bad) {
    auto q = NetworkEventsQuery::FromQuery({{name, value}});
    ASSERT_FALSE(q.has_value()) << name << "=" << value;
    EXPECT_EQ(q.error().code(), ErrorCode::kInvalidArgument);
  }
  EXPECT_FALSE(NetworkEventsQuery::FromQuery({{"after", "1"}, {"after", "2"}}).has_value());
}

TEST(EventsQueryTest, TypesFollowAndFormat) {
  auto none = EventsQuery::FromQuery({});
  ASSERT_TRUE(none.has_value());
  EXPECT_EQ(none->after, 0);
  EXPECT_EQ(none->limit, EventsQuery::kMaxLimit);
  EXPECT_TRUE(none->types.empty());
  EXPECT_FALSE(none->follow);
  EXPECT_EQ(none->format, EventsQuery::Format::kPage);
  auto all = EventsQuery::FromQuery(
      {{"after", "5"}, {"limit", "2"}, {"type", "exec,net.dns,sandbox"}, {"follow", "1"}});
  ASSERT_TRUE(all.has_value()) << all.error().message();
  EXPECT_EQ(all->after, 5);
  EXPECT_EQ(all->limit, 2);
  EXPECT_EQ(all->types, (std::vector<std::string>{"exec", "net.dns", "sandbox"}));
  EXPECT_TRUE(all->follow);
  EXPECT_EQ(all->format, EventsQuery::Format::kServerSentEvents) << "follow's default";
  auto lines = EventsQuery::FromQuery({{"format", "jsonl"}});
  ASSERT_TRUE(lines.has_value());
  EXPECT_EQ(lines->format, EventsQuery::Format::kJsonLines);
  const std::pair<const char*, std::string> bad[] = {
      {"type", ""},          {"type", "exec,"},      {"type", "Exec"},  {"type", "net-dns"},
      {"type", "a%"},        {"type", std::string(33, 'a')},           {"format", "xml"},
      {"follow", "maybe"},   {"after", "-1"},         {"limit", "0"},    {"since", "1"}};
  for (const auto& [name, value] : bad) {
    auto q = EventsQuery::FromQuery({{name, value}});
    ASSERT_FALSE(q.has_value()) << name << "=" << value;
    EXPECT_EQ(q.error().code(), ErrorCode::kInvalidArgument);
  }
  std::string seventeen;
  for (int i = 0; i < 17; ++i) seventeen += std::string(i ? "," : "") + "exec";
  EXPECT_FALSE(EventsQuery::FromQuery({{"type", seventeen}}).has_value());
  EXPECT_FALSE(EventsQuery::FromQuery({{"follow", "1"}, {"format", "json"}}).has_value())
      << "a page cannot be followed";
}

TEST(ListFilterTest, StateAndMetadata) {
  auto params = ParseQueryString("state=running&metadata.team=ml&metadata.run=7&&");
  ASSERT_TRUE(params.has_value());
  auto f = ListFilter::FromQuery(*params);
  ASSERT_TRUE(f.has_value()) << f.error().message();
  EXPECT_EQ(f->state, "running");
  EXPECT_EQ(f->metadata, (Metadata{{"run", "7"}, {"team", "ml"}}));
  EXPECT_TRUE(f->Matches("running", {{"team", "ml"}, {"run", "7"}, {"other", "x"}}));
  EXPECT_FALSE(f->Matches("paused", {{"team", "ml"}, {"run", "7"}}));
  EXPECT_FALSE(f->Matches("running", {{"team", "ml"}}));
  EXPECT_FALSE(f->Matches("running", {{"team", "ml"}, {"run", "8"}}));
}

TEST(ListFilterTest, EmptyMatchesEverything) {
  auto f = ListFilter::FromQuery({});
  ASSERT_TRUE(f.has_value());
  EXPECT_TRUE(f->Matches("destroyed", {}));
}

// ---------------------------------------------------------------------------------------------
// UTF-8.

TEST(Utf8Test, Valid) {
  EXPECT_TRUE(IsValidUtf8(""));
  EXPECT_TRUE(IsValidUtf8("plain ascii\n"));
  EXPECT_TRUE(IsValidUtf8("nul \0 inside"s));
  EXPECT_TRUE(IsValidUtf8("\xC2\x80"));          // U+0080, smallest 2-byte
  EXPECT_TRUE(IsValidUtf8("h\xC3\xA9llo"));      // é
  EXPECT_TRUE(IsValidUtf8("\xE0\xA0\x80"));      // U+0800, smallest 3-byte
  EXPECT_TRUE(IsValidUtf8("\xE2\x82\xAC"));      // €
  EXPECT_TRUE(IsValidUtf8("\xED\x9F\xBF"));      // U+D7FF, just below the surrogates
  EXPECT_TRUE(IsValidUtf8("\xEE\x80\x80"));      // U+E000, just above them
  EXPECT_TRUE(IsValidUtf8("\xEF\xBF\xBF"));      // U+FFFF
  EXPECT_TRUE(IsValidUtf8("\xF0\x90\x80\x80"));  // U+10000, smallest 4-byte
  EXPECT_TRUE(IsValidUtf8("\xF0\x9F\x98\x80"));  // 😀
  EXPECT_TRUE(IsValidUtf8("\xF4\x8F\xBF\xBF"));  // U+10FFFF, the largest
}

TEST(Utf8Test, Invalid) {
  EXPECT_FALSE(IsValidUtf8("\xC0\x80"));          // overlong NUL
  EXPECT_FALSE(IsValidUtf8("\xC1\xBF"));          // overlong
  EXPECT_FALSE(IsValidUtf8("\xE0\x80\x80"));      // overlong 3-byte
  EXPECT_FALSE(IsValidUtf8("\xE0\x9F\xBF"));      // overlong U+07FF
  EXPECT_FALSE(IsValidUtf8("\xF0\x8F\xBF\xBF"));  // overlong U+FFFF
  EXPECT_FALSE(IsValidUtf8("\xED\xA0\x80"));      // U+D800 surrogate
  EXPECT_FALSE(IsValidUtf8("\xED\xBF\xBF"));      // U+DFFF surrogate
  EXPECT_FALSE(IsValidUtf8("\xF4\x90\x80\x80"));  // U+110000
  EXPECT_FALSE(IsValidUtf8("\xF5\x80\x80\x80"));  // lead byte beyond F4
  EXPECT_FALSE(IsValidUtf8("\xFF"));
  EXPECT_FALSE(IsValidUtf8("\x80"));              // lone continuation
  EXPECT_FALSE(IsValidUtf8("a\xC3"));             // truncated 2-byte
  EXPECT_FALSE(IsValidUtf8("\xE2\x82"));          // truncated 3-byte
  EXPECT_FALSE(IsValidUtf8("\xF0\x9F\x98"));      // truncated 4-byte
  EXPECT_FALSE(IsValidUtf8("\xE2\x28\xA1"));      // bad continuation
  EXPECT_FALSE(IsValidUtf8("\xF0\x9F\x98\x41"));  // bad last continuation
  EXPECT_FALSE(IsValidUtf8("\xC3\xA9\xC3"));      // valid then truncated
}

// ---------------------------------------------------------------------------------------------
// Base64 (RFC 4648 section 10 vectors).

TEST(Base64Test, Rfc4648Vectors) {
  const std::pair<std::string, std::string> vectors[] = {
      {"", ""},
      {"f", "Zg=="},
      {"fo", "Zm8="},
      {"foo", "Zm9v"},
      {"foob", "Zm9vYg=="},
      {"fooba", "Zm9vYmE="},
      {"foobar", "Zm9vYmFy"},
  };
  for (const auto& [plain, encoded] : vectors) {
    EXPECT_EQ(Base64Encode(plain), encoded);
    auto decoded = Base64Decode(encoded);
    ASSERT_TRUE(decoded.has_value()) << encoded << ": " << decoded.error().message();
    EXPECT_EQ(*decoded, plain);
  }
}

TEST(Base64Test, EveryByteRoundTrips) {
  std::string all;
  for (int i = 0; i < 256; ++i) all += static_cast<char>(i);
  for (size_t len = 0; len <= all.size(); len += 37) {
    const std::string part = all.substr(all.size() - len);
    auto decoded = Base64Decode(Base64Encode(part));
    ASSERT_TRUE(decoded.has_value());
    EXPECT_EQ(*decoded, part);
  }
  EXPECT_EQ(Base64Encode("\xFB\xFF\xBF"), "+/+/");
}

TEST(Base64Test, StrictRejects) {
  const char* bad[] = {
      "Zg",                    // no padding
      "Zg=",                   // short padding
      "Zm9v\n",                // a line break
      "Zm 9v",                 // a space (and a length not a multiple of 4)
      "Zm9v Zg==",             // a space
      "Zm-v",                  // base64url alphabet
      "Zm_v",                  // base64url alphabet
      "Z===",                  // too much padding
      "====",                  // nothing but padding
      "Zg==Zm9v",              // padding in the middle
      "Zm=v",                  // '=' before data
      "Zh==",                  // non-zero padding bits (canonical is Zg==)
      "Zm9=",                  // non-zero padding bits (canonical is Zm8=)
      "Zm9v\x80\x80\x80\x80",  // bytes beyond ASCII
  };
  for (const char* text : bad) {
    auto r = Base64Decode(text);
    EXPECT_FALSE(r.has_value()) << "accepted " << text;
    if (!r) {
      EXPECT_EQ(r.error().code(), ErrorCode::kInvalidArgument);
      EXPECT_NE(r.error().message().find("base64"), std::string::npos) << r.error().message();
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Responses.

TEST(RenderTest, Timestamps) {
  using namespace std::chrono;
  EXPECT_EQ(FormatTimestamp(system_clock::time_point{}), "1970-01-01T00:00:00.000Z");
  // 2024-02-29T23:59:59.999Z, a leap day.
  const auto t = sys_days{year{2024} / 2 / 29} + 23h + 59min + 59s + 999ms + 999us;
  EXPECT_EQ(FormatTimestamp(time_point_cast<system_clock::duration>(t)),
            "2024-02-29T23:59:59.999Z");
  // Before the epoch: truncated toward the past, not toward zero.
  EXPECT_EQ(FormatTimestamp(system_clock::time_point{} - 1ms), "1969-12-31T23:59:59.999Z");
}

TEST(RenderTest, Sandbox) {
  using namespace std::chrono;
  SandboxView view;
  view.id = "sbx-abcdefghijklmnop";
  view.state = "running";
  view.template_name = "base";
  view.engine = "jail";
  view.created_at = system_clock::time_point{} + 1714566896789ms;
  view.expires_at = view.created_at + 3600s;
  view.limits.cpus = 0.5;
  view.metadata = {{"team", "ml"}};
  const json doc = json::parse(RenderSandbox(view));
  EXPECT_EQ(doc["id"], "sbx-abcdefghijklmnop");
  EXPECT_EQ(doc["state"], "running");
  EXPECT_EQ(doc["template"], "base");
  EXPECT_EQ(doc["engine"], "jail");
  EXPECT_EQ(doc["created_at"], "2024-05-01T12:34:56.789Z");
  EXPECT_EQ(doc["expires_at"], "2024-05-01T13:34:56.789Z");
  EXPECT_EQ(doc["limits"],
            json({{"cpus", 0.5}, {"memory_mb", 512}, {"pids_max", 256}, {"disk_mb", 1024}}));
  EXPECT_EQ(doc["metadata"], json({{"team", "ml"}}));
  EXPECT_FALSE(doc.contains("env"));

  const json list = json::parse(RenderSandboxList(std::vector<SandboxView>{view, view}));
  ASSERT_EQ(list["sandboxes"].size(), 2u);
  EXPECT_EQ(list["sandboxes"][1], doc);
  EXPECT_EQ(json::parse(RenderSandboxList({}))["sandboxes"], json::array());
  EXPECT_EQ(json::parse(RenderSandbox(SandboxView{}))["metadata"], json::object());
}

TEST(RenderTest, ExecResultTextAndBinary) {
  ExecResultView r;
  r.exit_code = 3;
  r.stdout_bytes = "h\xC3\xA9llo\n";
  r.stderr_bytes = "\xFF\xFE\x00"s;
  r.duration_ms = 42;
  r.truncated = true;
  const json doc = json::parse(RenderExecResult(r));
  EXPECT_EQ(doc["exit_code"], 3);
  EXPECT_TRUE(doc["signal"].is_null());
  EXPECT_EQ(doc["stdout"], "h\xC3\xA9llo\n");
  EXPECT_EQ(doc["stdout_encoding"], "utf-8");
  EXPECT_EQ(doc["stderr"], "//4A");
  EXPECT_EQ(doc["stderr_encoding"], "base64");
  EXPECT_EQ(doc["duration_ms"], 42);
  EXPECT_EQ(doc["timed_out"], false);
  EXPECT_EQ(doc["oom_killed"], false);
  EXPECT_EQ(doc["truncated"], true);
}

TEST(RenderTest, ExecResultKilledBySignal) {
  ExecResultView r;
  r.exit_code = -1;
  r.signal = 9;
  r.timed_out = true;
  r.oom_killed = true;
  r.stdout_bytes = "\xED\xA0\x80";  // a surrogate: not UTF-8, so base64
  const json doc = json::parse(RenderExecResult(r));
  EXPECT_TRUE(doc["exit_code"].is_null());
  EXPECT_EQ(doc["signal"], 9);
  EXPECT_EQ(doc["timed_out"], true);
  EXPECT_EQ(doc["oom_killed"], true);
  EXPECT_EQ(doc["stdout_encoding"], "base64");
  EXPECT_EQ(*Base64Decode(doc["stdout"].get<std::string>()), "\xED\xA0\x80");
  EXPECT_EQ(doc["stderr"], "");
  EXPECT_EQ(doc["stderr_encoding"], "utf-8");
}

TEST(RenderTest, FileList) {
  std::vector<FileEntryView> entries(2);
  entries[0] = {"a.txt", "file", 0644, 10, {}, ""};
  entries[1] = {"\xFF", "symlink", 0777, 1, {}, "a.txt"};
  const json doc = json::parse(RenderFileList("/home/user", entries));
  EXPECT_EQ(doc["path"], "/home/user");
  ASSERT_EQ(doc["entries"].size(), 2u);
  EXPECT_EQ(doc["entries"][0]["name"], "a.txt");
  EXPECT_EQ(doc["entries"][0]["mode"], "0644");
  EXPECT_EQ(doc["entries"][0]["mtime"], "1970-01-01T00:00:00.000Z");
  EXPECT_FALSE(doc["entries"][0].contains("link_target"));
  EXPECT_EQ(doc["entries"][1]["name"], "/w==");
  EXPECT_EQ(doc["entries"][1]["name_encoding"], "base64");
  EXPECT_EQ(doc["entries"][1]["link_target"], "a.txt");
}

TEST(ErrorBodyTest, EveryCodeHasItsStatusAndName) {
  const std::pair<ErrorCode, int> expected[] = {
      {ErrorCode::kInvalidArgument, 400},    {ErrorCode::kNotFound, 404},
      {ErrorCode::kAlreadyExists, 409},      {ErrorCode::kPermissionDenied, 403},
      {ErrorCode::kFailedPrecondition, 409}, {ErrorCode::kResourceExhausted, 429},
      {ErrorCode::kTooLarge, 413},           {ErrorCode::kUnauthenticated, 401},
      {ErrorCode::kUnimplemented, 501},      {ErrorCode::kUnavailable, 503},
      {ErrorCode::kDeadlineExceeded, 504},   {ErrorCode::kProtocol, 502},
      {ErrorCode::kInternal, 500},
  };
  size_t covered = 0;
  for (uint16_t v = 0; v < 64; ++v) covered += IsValidErrorCode(v);
  ASSERT_EQ(covered, std::size(expected)) << "a new ErrorCode needs a row here";
  for (const auto& [code, status] : expected) {
    const HttpError e = ErrorBody(Error(code, "what happened"));
    EXPECT_EQ(e.status, status) << ErrorCodeName(code);
    const json doc = json::parse(e.body);
    EXPECT_EQ(doc,
              json({{"error",
                     {{"code", std::string(ErrorCodeName(code))}, {"message", "what happened"}}}}));
  }
}

TEST(ErrorBodyTest, NonUtf8MessageIsStillValidJson) {
  const HttpError e = ErrorBody(Error(ErrorCode::kNotFound, "no file \xFF\xFE here"));
  EXPECT_EQ(e.status, 404);
  const json doc = json::parse(e.body);  // throws (and fails the test) if invalid
  EXPECT_EQ(doc["error"]["message"], "no file \xEF\xBF\xBD\xEF\xBF\xBD here");
}

TEST(ErrorBodyTest, UnauthenticatedIsOneFixedAnswer) {
  const HttpError e = UnauthenticatedBody();
  EXPECT_EQ(e.status, 401);
  EXPECT_EQ(
      json::parse(e.body),
      json({{"error", {{"code", "unauthenticated"}, {"message", "missing or invalid API key"}}}}));
}

TEST(ValidatePathTest, Rules) {
  EXPECT_TRUE(ValidatePath("/", "path").has_value());
  EXPECT_TRUE(ValidatePath("relative/../x", "path").has_value());
  EXPECT_FALSE(ValidatePath("", "path").has_value());
  EXPECT_FALSE(ValidatePath("a\0b"s, "path").has_value());
  EXPECT_FALSE(ValidatePath(std::string(4097, 'a'), "path").has_value());
}

// ---------------------------------------------------------------------------------------------
// Signals and WebSocket client messages.

TEST(ParseSignalTest, NamesWithOrWithoutSigInAnyCaseAndNumbers) {
  EXPECT_EQ(ParseSignal(json("TERM")), 15);
  EXPECT_EQ(ParseSignal(json("SIGTERM")), 15);
  EXPECT_EQ(ParseSignal(json("int")), 2);
  EXPECT_EQ(ParseSignal(json("SigKill")), 9);
  EXPECT_EQ(ParseSignal(json("HUP")), 1);
  EXPECT_EQ(ParseSignal(json("WINCH")), 28);
  EXPECT_EQ(ParseSignal(json("SIGVTALRM")), 26);
  EXPECT_EQ(ParseSignal(json("USR2")), 12);
  EXPECT_EQ(ParseSignal(json(1)), 1);
  EXPECT_EQ(ParseSignal(json(9)), 9);
  EXPECT_EQ(ParseSignal(json(64)), 64);
}

TEST(ParseSignalTest, RefusesWhatIsNotASignal) {
  const json bad[] = {json(0),          json(65),        json(-9),         json(1.5),
                      json(9.0),        json("9"),       json(""),         json("SIG"),
                      json("TERMX"),    json("SIGSIGTERM"), json(" TERM"), json("KILL\0"s),
                      json(std::string(100, 'A')), json(nullptr), json(true), json::array({9}),
                      json::object(),   json(18446744073709551615ull)};
  for (const json& value : bad) {
    auto r = ParseSignal(value);
    ASSERT_FALSE(r.has_value()) << value.dump() << " -> " << *r;
    EXPECT_EQ(r.error().code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(r.error().message().find("signal"), std::string::npos) << r.error().message();
  }
}

TEST(WsClientMessageTest, ParsesEveryType) {
  auto stdin_text = WsClientMessage::FromJson(R"({"type": "stdin", "data": "ls\n"})");
  ASSERT_TRUE(stdin_text.has_value()) << stdin_text.error().message();
  EXPECT_EQ(stdin_text->type, WsClientMessage::Type::kStdin);
  EXPECT_EQ(stdin_text->data, "ls\n");

  auto stdin_binary = WsClientMessage::FromJson(
      R"({"type": "stdin", "data": "AP8K", "encoding": "base64"})");
  ASSERT_TRUE(stdin_binary.has_value()) << stdin_binary.error().message();
  EXPECT_EQ(stdin_binary->data, "\x00\xff\n"s);

  auto nul = WsClientMessage::FromJson(R"({"type": "stdin", "data": "a\u0000b", "encoding": "utf-8"})");
  ASSERT_TRUE(nul.has_value()) << nul.error().message();
  EXPECT_EQ(nul->data, "a\0b"s);

  auto close = WsClientMessage::FromJson(R"({"type": "stdin_close"})");
  ASSERT_TRUE(close.has_value());
  EXPECT_EQ(close->type, WsClientMessage::Type::kStdinClose);

  auto signal = WsClientMessage::FromJson(R"({"type": "signal", "signal": "SIGINT"})");
  ASSERT_TRUE(signal.has_value());
  EXPECT_EQ(signal->type, WsClientMessage::Type::kSignal);
  EXPECT_EQ(signal->signal, 2);

  auto resize = WsClientMessage::FromJson(R"({"type": "resize", "cols": 1000, "rows": 1})");
  ASSERT_TRUE(resize.has_value());
  EXPECT_EQ(resize->type, WsClientMessage::Type::kResize);
  EXPECT_EQ(resize->cols, 1000);
  EXPECT_EQ(resize->rows, 1);
}

TEST(WsClientMessageTest, RefusesBadMessagesNamingTheProblem) {
  const std::pair<std::string, std::string> cases[] = {
      {"", "empty"},
      {"not json", "not valid JSON"},
      {"[]", "must be a JSON object"},
      {"{}", "no type"},
      {R"({"type": 1})", "type must be a string"},
      {R"({"type": "exec"})", "unknown message type \"exec\""},
      {R"({"type": "stdin"})", "no data"},
      {R"({"type": "stdin", "data": 5})", "data must be a string"},
      {R"({"type": "stdin", "data": "x", "encoding": "hex"})", "encoding must be"},
      {R"({"type": "stdin", "data": "a$==", "encoding": "base64"})", "data: invalid base64"},
      {R"({"type": "stdin", "data": "x", "close": true})", "unknown field \"close\""},
      {R"({"type": "stdin_close", "data": "x"})", "unknown field \"data\""},
      {R"({"type": "signal"})", "no signal"},
      {R"({"type": "signal", "signal": "BOGUS"})", "signal must be a name"},
      {R"({"type": "signal", "signal": 0})", "signal must be an integer in [1, 64]"},
      {R"({"type": "resize", "cols": 80})", "no rows"},
      {R"({"type": "resize", "cols": 0, "rows": 24})", "cols must be an integer in [1, 1000]"},
      {R"({"type": "resize", "cols": 80, "rows": 1001})", "rows must be an integer in [1, 1000]"},
      {R"({"type": "resize", "cols": 80.5, "rows": 24})", "cols must be an integer"},
      {R"({"type": "resize", "cols": 80, "rows": 24, "x": 0})", "unknown field \"x\""},
      {R"({"type": "stdin", "type": "stdin", "data": ""})", "duplicate key"},
  };
  for (const auto& [text, expected] : cases) {
    auto r = WsClientMessage::FromJson(text);
    ASSERT_FALSE(r.has_value()) << text;
    EXPECT_EQ(r.error().code(), ErrorCode::kInvalidArgument) << text;
    EXPECT_NE(r.error().message().find(expected), std::string::npos)
        << text << " -> " << r.error().message();
  }
  auto huge = WsClientMessage::FromJson(R"({"type": "stdin", "data": ")" +
                                        std::string(kMaxWsMessageBytes, 'a') + "\"}");
  ASSERT_FALSE(huge.has_value());
  EXPECT_EQ(huge.error().code(), ErrorCode::kTooLarge);
}

// --- Tenancy (docs/design/tenancy.md) --------------------------------------------------------

TEST(TenancyTypesTest, TenantNamesFollowTheRule) {
  for (std::string_view good : {"a", "team-a", "A.b_c-9", "admin"}) {
    EXPECT_TRUE(CheckTenantName(good, "tenant").has_value()) << good;
  }
  EXPECT_TRUE(CheckTenantName(std::string(64, 't'), "tenant").has_value());
  for (std::string_view bad : {"", "a b", "a/b", "a:b", "caf\xc3\xa9", "x\ny"}) {
    auto st = CheckTenantName(bad, "tenant");
    ASSERT_FALSE(st.has_value()) << bad;
    EXPECT_EQ(st.error().code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(st.error().message().find("tenant"), std::string::npos);
  }
  EXPECT_FALSE(CheckTenantName(std::string(65, 't'), "tenant").has_value());
}

TEST(TenancyTypesTest, CreateKeyRequestIsStrict) {
  auto ok = CreateKeyRequest::FromJson(R"({"name": "ci bot", "tenant": "team-a"})");
  ASSERT_TRUE(ok.has_value()) << ok.error().message();
  EXPECT_EQ(ok->name, "ci bot");
  EXPECT_EQ(ok->tenant, "team-a");
  EXPECT_FALSE(ok->admin);
  auto admin = CreateKeyRequest::FromJson(R"({"name": "root", "tenant": "ops", "admin": true})");
  ASSERT_TRUE(admin.has_value());
  EXPECT_TRUE(admin->admin);
  for (const char* bad : {
           R"({"tenant": "a"})",
           R"({"name": "x"})",
           R"({"name": "", "tenant": "a"})",
           R"({"name": "x", "tenant": "a b"})",
           R"({"name": "x", "tenant": "a", "admin": "yes"})",
           R"({"name": "x", "tenant": "a", "hash": "00"})",
           R"({"name": "tab\there", "tenant": "a"})",
       }) {
    auto r = CreateKeyRequest::FromJson(bad);
    EXPECT_FALSE(r.has_value()) << bad;
    if (!r) {
      EXPECT_EQ(r.error().code(), ErrorCode::kInvalidArgument) << bad;
    }
  }
  EXPECT_FALSE(CreateKeyRequest::FromJson(R"({"name": ")" + std::string(65, 'n') +
                                          R"(", "tenant": "a"})")
                   .has_value());
}

TEST(TenancyTypesTest, ListFilterTakesATenant) {
  auto params = ParseQueryString("tenant=team-a&state=running");
  ASSERT_TRUE(params.has_value());
  auto f = ListFilter::FromQuery(*params);
  ASSERT_TRUE(f.has_value()) << f.error().message();
  EXPECT_EQ(f->tenant, "team-a");
  auto none = ListFilter::FromQuery({});
  ASSERT_TRUE(none.has_value());
  EXPECT_FALSE(none->tenant.has_value());
  auto bad = ParseQueryString("tenant=a%2Fb");
  ASSERT_TRUE(bad.has_value());
  EXPECT_FALSE(ListFilter::FromQuery(*bad).has_value());
}

TEST(TenancyTypesTest, KeysRenderWithoutAKeyUnlessItWasJustMade) {
  KeyView k{.id = 2, .name = "ci", .tenant = "team-a", .admin = false, .revoked = true};
  json listed = json::parse(RenderKeyList(std::vector<KeyView>{k}));
  ASSERT_EQ(listed["keys"].size(), 1u);
  EXPECT_EQ(listed["keys"][0]["tenant"], "team-a");
  EXPECT_EQ(listed["keys"][0]["revoked"], true);
  EXPECT_FALSE(listed["keys"][0].contains("key"));
  k.key = "al_" + std::string(64, 'a');
  EXPECT_EQ(json::parse(RenderKey(k))["key"], k.key);
}

TEST(TenancyTypesTest, SandboxAndTemplateJsonShowTheTenant) {
  SandboxView s;
  s.id = "sbx-a";
  s.tenant = "team-a";
  EXPECT_EQ(json::parse(RenderSandbox(s))["tenant"], "team-a");
  TemplateView shared{.name = "t", .state = "ready", .settings = "{}"};
  EXPECT_FALSE(json::parse(RenderTemplate(shared)).contains("tenant"));
  TemplateView own = shared;
  own.tenant = "team-a";
  EXPECT_EQ(json::parse(RenderTemplate(own))["tenant"], "team-a");
}

// --- Secrets (docs/secrets.md) ---------------------------------------------------------------

TEST(SecretTypesTest, RequestsTakeANameAndAValue) {
  auto made = CreateSecretRequest::FromJson(R"({"name": "GITHUB_TOKEN", "value": "ghp_x y\tz"})");
  ASSERT_TRUE(made.has_value()) << made.error().message();
  EXPECT_EQ(made->name, "GITHUB_TOKEN");
  EXPECT_EQ(made->value, "ghp_x y\tz");
  auto rotated = UpdateSecretRequest::FromJson(R"({"value": "\u00e9t\u00e9"})");
  ASSERT_TRUE(rotated.has_value()) << rotated.error().message();
  EXPECT_EQ(rotated->value, "\xc3\xa9t\xc3\xa9");
  EXPECT_TRUE(CreateSecretRequest::FromJson(
                  json{{"name", std::string(128, 'N')}, {"value", std::string(65536, 'v')}}.dump())
                  .has_value());
}

// Every refusal of a body that carries a value says what is wrong and holds none of the value:
// not through the JSON parser's "last read", a type's description or a quoted name.
TEST(SecretTypesTest, RefusalsNeverShowTheValue) {
  const std::string v = "s3cr3t-ghp_0123456789abcdef";
  struct Case {
    std::string body;
    std::string expected;
  };
  const std::vector<Case> cases = {
      {R"({"name": "T", "value": ")" + v + "\n" + R"("})", "control character U+000A"},
      {R"({"name": "T", "value": ")" + v + R"(\n"})", "must not contain CR, LF or NUL"},
      {R"({"name": "T", "value": ")" + v + R"(\r"})", "must not contain CR, LF or NUL"},
      {R"({"name": "T", "value": ")" + v + R"(\u0000"})", "must not contain CR, LF or NUL"},
      {R"({"name": "T", "value": ")" + v + "\xff" + R"("})", "ill-formed UTF-8"},
      {R"({"name": "T", "value": ")" + v + R"(\ud800"})", "surrogate"},
      {R"({"name": "T", "value": )" + v + "}", "invalid literal"},
      {R"({"name": "T", "value": ")" + v, "not valid JSON"},
      {R"({"name": "T", "value": [")" + v + R"("]})", "value must be a string, got array"},
      {R"({"name": "T", "value": {"v": ")" + v + R"("}})", "value must be a string, got object"},
      {R"({"name": ")" + v + R"(", "value": "GITHUB_TOKEN"})", "a secret name must match"},
      {R"({"name": [")" + v + R"("], "value": "x"})", "name must be a string, got array"},
      {R"({"name": "T", "value": ")" + v + R"(", "valu": 1})", "unknown field \"valu\""},
      {R"({"name": "T", "value": ")" + v + R"(", "value": "x"})", "duplicate key \"value\""},
      {R"({"name": "T", "value": ""})", "value must be 1-65536 bytes, got 0"},
      {json{{"name", "T"}, {"value", v + std::string(65536, 'x')}}.dump(),
       "value must be 1-65536 bytes, got 65563"},
      {R"({"value": ")" + v + R"("})", "name is required"},
      {R"({"name": "T"})", "value is required"},
      {R"({"name": "1T", "value": ")" + v + R"("})", "a secret name must match"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.body.substr(0, 120));
    auto made = CreateSecretRequest::FromJson(c.body);
    ASSERT_FALSE(made.has_value());
    EXPECT_EQ(made.error().code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(made.error().message().find(c.expected), std::string::npos) << made.error().message();
    EXPECT_EQ(made.error().message().find("s3cr3t"), std::string::npos) << made.error().message();
    EXPECT_EQ(made.error().message().find("0123456789"), std::string::npos);
  }
  // The same parser for updates; an update names no secret in its body.
  auto update = UpdateSecretRequest::FromJson(R"({"value": ")" + v + "\n" + R"("})");
  ASSERT_FALSE(update.has_value());
  EXPECT_EQ(update.error().message().find("s3cr3t"), std::string::npos);
  auto named = UpdateSecretRequest::FromJson(R"({"name": "T", "value": ")" + v + R"("})");
  ASSERT_FALSE(named.has_value());
  EXPECT_NE(named.error().message().find("unknown field \"name\""), std::string::npos);
  // The control: ParseJsonObject itself does show what it read (which is why secrets have
  // their own parse).
  auto plain = ParseJsonObject(R"({"value": ")" + v + "\n" + R"("})");
  ASSERT_FALSE(plain.has_value());
  EXPECT_NE(plain.error().message().find("s3cr3t"), std::string::npos);
}

TEST(SecretTypesTest, ASecretRendersItsMetadataOnly) {
  using namespace std::chrono;
  const auto t = system_clock::time_point{} + 1'700'000'000'123ms;
  const json one = json::parse(
      RenderSecret({.name = "GITHUB_TOKEN", .version = 3, .created_at = t, .updated_at = t + 1s}));
  EXPECT_EQ(one, json({{"name", "GITHUB_TOKEN"},
                       {"version", 3},
                       {"created_at", "2023-11-14T22:13:20.123Z"},
                       {"updated_at", "2023-11-14T22:13:21.123Z"}}));
  const SecretView views[] = {{.name = "A", .version = 1}, {.name = "B", .version = 2}};
  const json list = json::parse(RenderSecretList(views));
  ASSERT_EQ(list["secrets"].size(), 2u);
  EXPECT_EQ(list["secrets"][1]["name"], "B");
  EXPECT_EQ(json::parse(RenderSecretList({})), json({{"secrets", json::array()}}));
}

TEST(SecretTypesTest, TheQueryNamesATenantAtMostOnce) {
  auto none = SecretsQuery::FromQuery({});
  ASSERT_TRUE(none.has_value());
  EXPECT_FALSE(none->tenant.has_value());
  auto one = SecretsQuery::FromQuery({{"tenant", "team-a"}});
  ASSERT_TRUE(one.has_value());
  EXPECT_EQ(one->tenant, "team-a");
  EXPECT_FALSE(SecretsQuery::FromQuery({{"tenant", "a"}, {"tenant", "b"}}).has_value());
  EXPECT_FALSE(SecretsQuery::FromQuery({{"tenant", "not one"}}).has_value());
  EXPECT_FALSE(SecretsQuery::FromQuery({{"state", "running"}}).has_value());
}

TEST(SecretTypesTest, NamesAreEnvironmentVariableNames) {
  for (std::string_view good : {"A", "_", "_9", "GITHUB_TOKEN", "lower_case"}) {
    EXPECT_TRUE(CheckSecretName(good).has_value()) << good;
  }
  EXPECT_TRUE(CheckSecretName(std::string(128, 'A')).has_value());
  for (std::string_view bad : {"", "9A", "A-B", "A.B", "A B", "A=B", "caf\xc3\xa9", "A\nB"}) {
    EXPECT_FALSE(CheckSecretName(bad).has_value()) << bad;
  }
  EXPECT_FALSE(CheckSecretName(std::string(129, 'A')).has_value());
}

}  // namespace
}  // namespace airlock::api
