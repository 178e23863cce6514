#include "common/json.h"

#include <gtest/gtest.h>

#include <string>

namespace nvshare {
namespace {

TEST(Json, ParsesEveryKind) {
  auto parsed = parse_json(R"( {"a": null, "b": true, "c": false, "d": -12, "e": 1.5e3,
                              "f": "x\ty", "g": [1, [2], {}], "h": {"k": []}} )");
  ASSERT_TRUE(parsed.ok()) << parsed.error().message;
  const Json& v = parsed.value();
  ASSERT_TRUE(v.is_object());
  EXPECT_TRUE(v.find("a")->is_null());
  EXPECT_EQ(v.find("b")->as_bool(), true);
  EXPECT_EQ(v.find("c")->as_bool(), false);
  EXPECT_EQ(v.find("d")->as_int64(), -12);
  EXPECT_EQ(v.find("e")->as_double(), 1500.0);
  EXPECT_EQ(v.find("e")->as_int64(), 1500);  // an integral double converts exactly
  EXPECT_EQ(*v.find("f")->as_string(), "x\ty");
  ASSERT_TRUE(v.find("g")->is_array());
  EXPECT_EQ(v.find("g")->as_array()->size(), 3u);
  EXPECT_TRUE(v.find("h")->find("k")->is_array());
  EXPECT_EQ(v.find("missing"), nullptr);
  EXPECT_EQ(v.find("f")->as_int64(), std::nullopt);
  EXPECT_EQ(v.find("d")->as_string(), nullptr);
}

TEST(Json, KeepsLargeIntegersExact) {
  auto parsed = parse_json("[9223372036854775807, -9223372036854775808, 18446744073709551615]");
  ASSERT_TRUE(parsed.ok()) << parsed.error().message;
  const auto& items = *parsed.value().as_array();
  EXPECT_EQ(items[0].as_int64(), INT64_MAX);
  EXPECT_EQ(items[1].as_int64(), INT64_MIN);
  EXPECT_EQ(items[2].as_int64(), std::nullopt);  // beyond int64: a double
  EXPECT_DOUBLE_EQ(*items[2].as_double(), 18446744073709551615.0);
  EXPECT_EQ(parse_json(parsed.value().dump()).value(), parsed.value());
}

TEST(Json, DecodesEscapesAndSurrogatePairs) {
  auto parsed = parse_json(R"("\"\\\/\b\f\n\r\t\u0041\u00e9\u20ac\ud83d\ude00")");
  ASSERT_TRUE(parsed.ok()) << parsed.error().message;
  EXPECT_EQ(*parsed.value().as_string(), "\"\\/\b\f\n\r\tA\xC3\xA9\xE2\x82\xAC\xF0\x9F\x98\x80");
}

TEST(Json, AcceptsRawUtf8) {
  auto parsed = parse_json("\"gr\xC3\xBC\xC3\x9F \xF0\x9F\x98\x80\"");
  ASSERT_TRUE(parsed.ok()) << parsed.error().message;
  EXPECT_EQ(parsed.value().dump(), "\"gr\xC3\xBC\xC3\x9F \xF0\x9F\x98\x80\"");
}

struct Rejected {
  const char* name;
  std::string text;
  const char* message_part;
};

void PrintTo(const Rejected& r, std::ostream* os) { *os << r.name; }

class JsonRejects : public testing::TestWithParam<Rejected> {};

TEST_P(JsonRejects, WithAClearMessage) {
  auto parsed = parse_json(GetParam().text);
  ASSERT_FALSE(parsed.ok()) << GetParam().name << " parsed as " << parsed.value().dump();
  EXPECT_NE(parsed.error().message.find(GetParam().message_part), std::string::npos)
      << GetParam().name << ": " << parsed.error().message;
}

INSTANTIATE_TEST_SUITE_P(
    Strict, JsonRejects,
    testing::Values(
        Rejected{"empty", "", "expected a value, found end of input"},
        Rejected{"blank", "  \n ", "line 2 column 2"},
        Rejected{"trailing_comma_array", "[1,]", "expected a value, found ']'"},
        Rejected{"trailing_comma_object", R"({"a":1,})", "expected a string key"},
        Rejected{"single_quotes", "{'a':1}", "expected a string key in object, found '''"},
        Rejected{"comment", "[1] // x", "after the JSON value"},
        Rejected{"two_values", "{} {}", "after the JSON value"},
        Rejected{"nan", "NaN", "expected a value, found 'N'"},
        Rejected{"infinity", "-Infinity", "expected a digit in number"},
        Rejected{"leading_zero", "012", "leading zero"},
        Rejected{"plus", "+1", "expected a value, found '+'"},
        Rejected{"bare_dot", "1.", "expected a digit after '.'"},
        Rejected{"bare_exponent", "1e", "expected a digit in exponent"},
        Rejected{"huge_number", "1e999", "out of range"},
        Rejected{"unterminated_string", "\"abc", "unterminated string"},
        Rejected{"control_char", "\"a\tb\"", "raw control character"},
        Rejected{"bad_escape", R"("\x")", "unknown escape \\x"},
        Rejected{"short_unicode", R"("\u12")", "truncated \\u escape"},
        Rejected{"bad_unicode", R"("\u12x4")", "hex digit in \\u escape, found 'x'"},
        Rejected{"lone_high_surrogate", R"("\ud83d")", "high surrogate without a low one"},
        Rejected{"lone_low_surrogate", R"("\ude00")", "lone low surrogate"},
        Rejected{"invalid_utf8", "\"\xC3\x28\"", "invalid UTF-8 (byte 0xC3)"},
        Rejected{"overlong_utf8", "\"\xC0\xAF\"", "invalid UTF-8"},
        Rejected{"utf8_surrogate", "\"\xED\xA0\x80\"", "invalid UTF-8"},
        Rejected{"duplicate_key", R"({"core":1,"core":2})", "duplicate key \"core\""},
        Rejected{"missing_colon", R"({"a" 1})", "expected ':' after key"},
        Rejected{"unclosed_array", "[1, 2", "expected ',' or ']' in array, found end of input"},
        Rejected{"unclosed_object", R"({"a":1)", "expected ',' or '}' in object"},
        Rejected{"bad_literal", "tru", "expected 'true'"},
        Rejected{"nul_byte", std::string("[1]\0", 4), "after the JSON value"}),
    [](const testing::TestParamInfo<Rejected>& test) { return std::string(test.param.name); });

TEST(Json, ReportsLineAndColumn) {
  auto parsed = parse_json("{\n  \"a\": 1,\n  \"b\" 2\n}");
  ASSERT_FALSE(parsed.ok());
  EXPECT_NE(parsed.error().message.find("line 3 column 7"), std::string::npos)
      << parsed.error().message;
}

TEST(Json, BoundsNestingDepth) {
  std::string deep(64, '[');
  deep += std::string(64, ']');
  EXPECT_TRUE(parse_json(deep).ok());
  std::string deeper(65, '[');
  deeper += std::string(65, ']');
  auto parsed = parse_json(deeper);
  ASSERT_FALSE(parsed.ok());
  EXPECT_NE(parsed.error().message.find("nesting deeper than 64"), std::string::npos);
  // Very deep input must fail cleanly rather than exhaust the stack.
  EXPECT_FALSE(parse_json(std::string(1'000'000, '[')).ok());
}

TEST(Json, BoundsDocumentSize) {
  const std::string text = "\"" + std::string(100, 'x') + "\"";
  EXPECT_TRUE(parse_json(text, JsonLimits{.max_bytes = 102}).ok());
  auto parsed = parse_json(text, JsonLimits{.max_bytes = 101});
  ASSERT_FALSE(parsed.ok());
  EXPECT_NE(parsed.error().message.find("exceeds the limit of 101"), std::string::npos);
}

TEST(Json, BuildsAndSerializesInInsertionOrder) {
  Json v = Json::object();
  v.set("ok", true);
  v.set("name", "a\"b\\c\n");
  v.set("count", 3);
  v.set("ratio", 0.25);
  v.set("none", nullptr);
  Json list = Json::array();
  list.push_back(1);
  list.push_back("two");
  v.set("list", std::move(list));
  v.set("count", 4);  // replaces in place
  EXPECT_EQ(
      v.dump(),
      R"({"ok":true,"name":"a\"b\\c\n","count":4,"ratio":0.25,"none":null,"list":[1,"two"]})");
  EXPECT_EQ(Json::object().dump(), "{}");
  EXPECT_EQ(Json::array().dump(), "[]");
}

TEST(Json, PrettyPrints) {
  Json v = Json::object();
  v.set("a", Json(Json::Array{1, 2}));
  v.set("b", Json::object());
  EXPECT_EQ(v.dump_pretty(2), "{\n  \"a\": [\n    1,\n    2\n  ],\n  \"b\": {}\n}");
}

TEST(Json, SerializerAlwaysWritesValidJson) {
  Json v = Json::array();
  v.push_back(std::string("bad\xFFutf8\x01"));
  v.push_back(std::numeric_limits<double>::infinity());
  v.push_back(std::numeric_limits<double>::quiet_NaN());
  v.push_back(std::uint64_t{42});
  v.push_back(1e300);
  const std::string text = v.dump();
  EXPECT_EQ(text, "[\"bad\xEF\xBF\xBDutf8\\u0001\",null,null,42,1e+300]");
  EXPECT_TRUE(parse_json(text).ok());
}

TEST(Json, RoundTripsThroughTheParser) {
  const std::string text =
      R"({"cmd":"set-limits","selector":{"pod_uid":"7d3f9a2e-1c4b-4e8f-9a6d-2b5c8e1f0a3d"},)"
      R"("memory":"4Gi","core":30,"list":[0.5,-1,true,null,"\u00e9"]})";
  auto parsed = parse_json(text);
  ASSERT_TRUE(parsed.ok()) << parsed.error().message;
  auto again = parse_json(parsed.value().dump());
  ASSERT_TRUE(again.ok()) << again.error().message;
  EXPECT_EQ(parsed.value(), again.value());
  EXPECT_EQ(parse_json(parsed.value().dump_pretty()).value(), parsed.value());
}

}  // namespace
}  // namespace nvshare
