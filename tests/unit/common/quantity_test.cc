#include "common/quantity.h"

#include <gtest/gtest.h>

namespace nvshare {
namespace {

constexpr std::uint64_t Ki = 1024ULL, Mi = Ki * 1024, Gi = Mi * 1024, Ti = Gi * 1024;

struct Accepted {
  const char* text;
  std::uint64_t bytes;
};
void PrintTo(const Accepted& a, std::ostream* os) { *os << '"' << a.text << '"'; }

class AcceptedQuantity : public testing::TestWithParam<Accepted> {};

TEST_P(AcceptedQuantity, ParsesToExactBytes) {
  auto parsed = parse_memory_quantity(GetParam().text);
  ASSERT_TRUE(parsed.ok()) << GetParam().text << ": " << parsed.error().message;
  EXPECT_EQ(parsed.value(), GetParam().bytes) << GetParam().text;
}

INSTANTIATE_TEST_SUITE_P(
    KubernetesForms, AcceptedQuantity,
    testing::Values(
        Accepted{"4Gi", 4 * Gi}, Accepted{"512Mi", 512 * Mi}, Accepted{"4G", 4'000'000'000},
        Accepted{"1.5Gi", 3 * Gi / 2}, Accepted{"4096", 4096}, Accepted{"4096Mi", 4 * Gi},
        Accepted{"0", 0}, Accepted{"1Ki", Ki}, Accepted{"2Ti", 2 * Ti}, Accepted{"1Pi", 1024 * Ti},
        Accepted{"1Ei", 1024 * 1024 * Ti}, Accepted{"15Ei", 15 * 1024 * 1024 * Ti},
        Accepted{"1k", 1000}, Accepted{"3M", 3'000'000}, Accepted{"2T", 2'000'000'000'000},
        Accepted{"1P", 1'000'000'000'000'000}, Accepted{"18E", 18'000'000'000'000'000'000ULL},
        Accepted{"+4Gi", 4 * Gi}, Accepted{"0.5Ki", 512}, Accepted{".5Mi", Mi / 2},
        Accepted{"1.Gi", Gi}, Accepted{"1.50Gi", 3 * Gi / 2}, Accepted{"1e3", 1000},
        Accepted{"129e6", 129'000'000}, Accepted{"1E9", 1'000'000'000},
        Accepted{"2.5e-1", 1},  // fractional bytes round up
        Accepted{"0.1", 1}, Accepted{"1.000000001G", 1'000'000'001},
        Accepted{"18446744073709551615", 18446744073709551615ULL}, Accepted{"00012Mi", 12 * Mi}));

struct Rejected {
  const char* text;
  const char* message_part;
};
void PrintTo(const Rejected& r, std::ostream* os) { *os << '"' << r.text << '"'; }

class RejectedQuantity : public testing::TestWithParam<Rejected> {};

TEST_P(RejectedQuantity, FailsWithAClearMessage) {
  auto parsed = parse_memory_quantity(GetParam().text);
  ASSERT_FALSE(parsed.ok()) << GetParam().text << " parsed as " << parsed.value();
  EXPECT_NE(parsed.error().message.find(GetParam().message_part), std::string::npos)
      << parsed.error().message;
}

INSTANTIATE_TEST_SUITE_P(
    Invalid, RejectedQuantity,
    testing::Values(Rejected{"4GB", "unknown suffix \"GB\""}, Rejected{"-1", "negative"},
                    Rejected{"0x10", "hexadecimal"}, Rejected{"", "empty"},
                    Rejected{"18446744073709551616", "64 bits"}, Rejected{"16Ei", "64 bits"},
                    Rejected{"99999999999999999999999", "64 bits"}, Rejected{"20E", "64 bits"},
                    Rejected{"20e18", "64 bits"}, Rejected{"4gi", "unknown suffix"},
                    Rejected{"4 Gi", "whitespace"}, Rejected{" 4Gi", "whitespace"},
                    Rejected{"Gi", "number"}, Rejected{".", "number"}, Rejected{"+", "number"},
                    Rejected{"1.2.3", "unknown suffix"}, Rejected{"512m", "milli"},
                    Rejected{"1e", "unknown suffix"}, Rejected{"1e-", "exponent"},
                    Rejected{"1e99", "exponent is out of range"},
                    Rejected{"1.0000000001Gi", "fractional digits"}, Rejected{"--1", "negative"},
                    Rejected{"4Gii", "unknown suffix"}, Rejected{"1e3Gi", "exponent"}));

TEST(Quantity, MessageNamesTheInput) {
  auto parsed = parse_memory_quantity("4GB");
  ASSERT_FALSE(parsed.ok());
  EXPECT_NE(parsed.error().message.find("\"4GB\""), std::string::npos);
}

TEST(Percent, AcceptsOneToHundred) {
  EXPECT_EQ(parse_percent("1").value(), 1);
  EXPECT_EQ(parse_percent("30").value(), 30);
  EXPECT_EQ(parse_percent("30%").value(), 30);
  EXPECT_EQ(parse_percent("100").value(), 100);
  EXPECT_EQ(parse_percent("007").value(), 7);
}

TEST(Percent, RejectsEverythingElse) {
  for (const char* text :
       {"0", "101", "-1", "", "%", "30.5", "abc", "1000", " 30", "30 %", "0x1e"}) {
    auto parsed = parse_percent(text);
    ASSERT_FALSE(parsed.ok()) << text;
    EXPECT_NE(parsed.error().message.find("percentage"), std::string::npos) << text;
  }
}

TEST(FormatBytes, ShowsExactBinaryUnits) {
  EXPECT_EQ(format_bytes(0), "0");
  EXPECT_EQ(format_bytes(1023), "1023");
  EXPECT_EQ(format_bytes(Ki), "1Ki");
  EXPECT_EQ(format_bytes(512 * Mi), "512Mi");
  EXPECT_EQ(format_bytes(4 * Gi), "4Gi");
  EXPECT_EQ(format_bytes(3 * Gi / 2), "1.5Gi");
  EXPECT_EQ(format_bytes(18446744073709551615ULL), "15.9Ei");
  EXPECT_EQ(format_bytes(2 * Gi - 1), "1.9Gi");
}

TEST(FormatBytes, RoundTripsThroughTheParser) {
  for (std::uint64_t v : {Ki, 3 * Mi, 7 * Gi, 3 * Gi / 2, 5 * Ti}) {
    EXPECT_EQ(parse_memory_quantity(format_bytes(v)).value(), v) << format_bytes(v);
  }
}

}  // namespace
}  // namespace nvshare
