#include "common/wire.h"

#include <gtest/gtest.h>

namespace nvshare::wire {
namespace {

TEST(Wire, IntegersAreLittleEndian) {
  std::vector<std::uint8_t> out;
  ByteWriter w(out);
  w.u16(0x0102);
  w.u32(0x03040506);
  w.u64(0x0708090A0B0C0D0EULL);
  const std::vector<std::uint8_t> expected{0x02, 0x01, 0x06, 0x05, 0x04, 0x03, 0x0E, 0x0D,
                                           0x0C, 0x0B, 0x0A, 0x09, 0x08, 0x07};
  EXPECT_EQ(out, expected);
  ByteReader r(out);
  EXPECT_EQ(r.u16(), 0x0102);
  EXPECT_EQ(r.u32(), 0x03040506u);
  EXPECT_EQ(r.u64(), 0x0708090A0B0C0D0EULL);
  EXPECT_TRUE(r.done());
}

TEST(Wire, ReadPastEndFailsAndStaysFailed) {
  const std::vector<std::uint8_t> in{1, 2, 3};
  ByteReader r(in);
  EXPECT_EQ(r.u32(), 0u);
  EXPECT_FALSE(r.ok());
  EXPECT_EQ(r.u8(), 0u);  // even though a byte is there
  EXPECT_FALSE(r.done());
  EXPECT_EQ(r.remaining(), 0u);
}

TEST(Wire, StringsRespectTheirMaximum) {
  std::vector<std::uint8_t> out;
  ByteWriter w(out);
  w.str("hello", 16);
  {
    ByteReader r(out);
    EXPECT_EQ(r.str(16), "hello");
    EXPECT_TRUE(r.done());
  }
  {
    ByteReader r(out);
    EXPECT_EQ(r.str(4), "");
    EXPECT_FALSE(r.ok());
  }
}

}  // namespace
}  // namespace nvshare::wire
