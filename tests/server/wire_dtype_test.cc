// 16-bit gradients on the wire (common/wire_dtype.h): the conversions round to nearest
// even and keep Inf/NaN, and a server applies a bf16 or fp16 push exactly as the fp32 push
// of the same (rounded) values, and refuses one of the wrong length or an unknown dtype.
#include "common/wire_dtype.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "server/server_core.h"
#include "tests/server/test_messages.h"

namespace ps {
namespace {

using testing::ReplyStatus;

TEST(WireDtypeTest, Bf16RoundsToNearestEvenAndKeepsSpecials) {
  EXPECT_EQ(Bf16ToFloat(FloatToBf16(1.0f)), 1.0f);
  EXPECT_EQ(Bf16ToFloat(FloatToBf16(-3.5f)), -3.5f);
  // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties go to the even mantissa (1).
  EXPECT_EQ(Bf16ToFloat(FloatToBf16(1.0f + std::ldexp(1.0f, -8))), 1.0f);
  // 1 + 3 * 2^-8 is halfway between 1 + 2^-7 and 1 + 2^-6: even is 1 + 2^-6.
  EXPECT_EQ(Bf16ToFloat(FloatToBf16(1.0f + 3 * std::ldexp(1.0f, -8))), 1.0f + std::ldexp(1.0f, -6));
  EXPECT_TRUE(std::isinf(Bf16ToFloat(FloatToBf16(std::numeric_limits<float>::infinity()))));
  EXPECT_TRUE(std::isnan(Bf16ToFloat(FloatToBf16(std::numeric_limits<float>::quiet_NaN()))));
  EXPECT_TRUE(std::isinf(Bf16ToFloat(FloatToBf16(std::numeric_limits<float>::max()))));
}

TEST(WireDtypeTest, Fp16RoundsAndHandlesSubnormalsOverflowAndSpecials) {
  EXPECT_EQ(Fp16ToFloat(FloatToFp16(1.0f)), 1.0f);
  EXPECT_EQ(Fp16ToFloat(FloatToFp16(-0.5f)), -0.5f);
  EXPECT_EQ(Fp16ToFloat(FloatToFp16(65504.0f)), 65504.0f);
  EXPECT_TRUE(std::isinf(Fp16ToFloat(FloatToFp16(65520.0f))));  // rounds up past the max
  EXPECT_EQ(Fp16ToFloat(FloatToFp16(65519.0f)), 65504.0f);
  // 1 + 2^-11 is a tie between 1 and 1 + 2^-10: even is 1.
  EXPECT_EQ(Fp16ToFloat(FloatToFp16(1.0f + std::ldexp(1.0f, -11))), 1.0f);
  EXPECT_EQ(Fp16ToFloat(FloatToFp16(1.0f + 3 * std::ldexp(1.0f, -11))),
            1.0f + std::ldexp(1.0f, -9));
  // Subnormals: the smallest is 2^-24; half of it is a tie that rounds to zero.
  EXPECT_EQ(Fp16ToFloat(FloatToFp16(std::ldexp(1.0f, -24))), std::ldexp(1.0f, -24));
  EXPECT_EQ(Fp16ToFloat(FloatToFp16(std::ldexp(1.0f, -25))), 0.0f);
  EXPECT_EQ(Fp16ToFloat(FloatToFp16(3 * std::ldexp(1.0f, -20))), 3 * std::ldexp(1.0f, -20));
  EXPECT_TRUE(std::isnan(Fp16ToFloat(FloatToFp16(std::numeric_limits<float>::quiet_NaN()))));
  // Every fp16 value survives a round trip through float.
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = Fp16ToFloat(static_cast<uint16_t>(h));
    if (std::isnan(f)) continue;
    ASSERT_EQ(FloatToFp16(f), h) << "fp16 0x" << std::hex << h;
  }
}

TEST(WireDtypeTest, ParsesNamesAndRefusesOthers) {
  EXPECT_EQ(ParseWireDtype("bf16").value(), WireDtype::kBf16);
  EXPECT_EQ(ParseWireDtype("fp16").value(), WireDtype::kFp16);
  EXPECT_EQ(ParseWireDtype("fp32").value(), WireDtype::kFp32);
  Result<WireDtype> bad = ParseWireDtype("int8");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("--wire_dtype=int8"), std::string::npos);
  EXPECT_NE(ParseWireDtype("fp8", "pull_dtype").status().message().find("--pull_dtype=fp8"),
            std::string::npos);
}

// A push of `values` encoded as `dtype` to rows [0, rows) of table 0.
Frames Push16(uint64_t rid, uint64_t rows, const std::vector<float>& values, WireDtype dtype,
              uint8_t wire_value) {
  capnp::MallocMessageBuilder b;
  auto p = NewHeader(b, rid, 0).getBody().initPush();
  p.setTableId(0);
  p.setGradDtype(wire_value);
  p.getKeys().initRange().setBegin(0);
  p.getKeys().getRange().setEnd(rows);
  Frames f;
  f.push_back(EncodeFrame(b));
  zmq::message_t payload(values.size() * WireDtypeBytes(dtype));
  EncodeFloats(values, dtype, payload.data());
  f.push_back(std::move(payload));
  return f;
}

TEST(WireDtypeTest, AServerAppliesA16BitPushAsTheFp32PushOfTheRoundedValues) {
  JobConfig config = JobConfig::FromFlagMap({{"model", "none"},
                                             {"tables", "d:4:3:uniform:1"},
                                             {"num_servers", "1"},
                                             {"base_lr", "0.5"}})
                         .value();
  const std::vector<float> grads = {0.1f,  -0.2f, 0.3f,   1e-3f, 7.0f, -1.5f,
                                    0.33f, 2.5f,  -1e-4f, 0.0f,  1.1f, -0.7f};
  for (WireDtype dtype : {WireDtype::kBf16, WireDtype::kFp16}) {
    auto wide = ServerCore::Create(config, 0).value();
    auto narrow = ServerCore::Create(config, 0).value();
    std::vector<float> rounded(grads.size());
    std::vector<uint16_t> half(grads.size());
    EncodeFloats(grads, dtype, half.data());
    DecodeFloats(half.data(), dtype, rounded);
    Frames a = testing::RangePush(1, 0, 0, 4, rounded);
    ASSERT_TRUE(ReplyStatus(wide->HandleOne(a)).ok());
    Frames b = Push16(1, 4, grads, dtype, static_cast<uint8_t>(dtype));
    ASSERT_TRUE(ReplyStatus(narrow->HandleOne(b)).ok()) << WireDtypeName(dtype);
    for (uint64_t r = 0; r < 4; ++r) {
      EXPECT_EQ(wide->ReadRow(0, r).value(), narrow->ReadRow(0, r).value()) << "row " << r;
    }
    EXPECT_EQ(narrow->stats().bytes_pushed, grads.size() * 2) << "bytes as they travelled";
  }
}

TEST(WireDtypeTest, AServerRefusesAWrongLengthOrAnUnknownDtypeAndChangesNothing) {
  JobConfig config = JobConfig::FromFlagMap(
                         {{"model", "none"}, {"tables", "d:4:3:uniform:1"}, {"num_servers", "1"}})
                         .value();
  auto core = ServerCore::Create(config, 0).value();
  const std::vector<float> before = core->ReadRow(0, 0).value();
  // bf16 values for 3 rows where the header says 4.
  Frames short_push = Push16(1, 4, std::vector<float>(9, 1.0f), WireDtype::kBf16, 1);
  Status s = ReplyStatus(core->HandleOne(short_push));
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
  Frames unknown = Push16(2, 4, std::vector<float>(12, 1.0f), WireDtype::kBf16, 7);
  s = ReplyStatus(core->HandleOne(unknown));
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("dtype 7"), std::string::npos) << s.ToString();
  EXPECT_EQ(core->ReadRow(0, 0).value(), before);
}

// A 16-bit pull (a worker's --pull_dtype): the reply holds the rows rounded to that type,
// in half the bytes, and says its type; the stored rows are untouched. An unknown type is
// refused.
TEST(WireDtypeTest, AServerAnswersA16BitPullWithTheRoundedRows) {
  JobConfig config = JobConfig::FromFlagMap(
                         {{"model", "none"}, {"tables", "d:4:3:uniform:1"}, {"num_servers", "1"}})
                         .value();
  auto core = ServerCore::Create(config, 0).value();
  std::vector<float> stored;
  for (uint64_t r = 0; r < 4; ++r) {
    std::vector<float> row = core->ReadRow(0, r).value();
    stored.insert(stored.end(), row.begin(), row.end());
  }
  for (WireDtype dtype : {WireDtype::kBf16, WireDtype::kFp16}) {
    Frames pull = testing::RangePull(1, 0, 0, 4, 0, 0, static_cast<uint8_t>(dtype));
    Frames reply = core->HandleOne(pull);
    ASSERT_TRUE(ReplyStatus(reply).ok()) << ReplyStatus(reply).ToString();
    ASSERT_EQ(reply.size(), 2u);
    ASSERT_EQ(reply[1].size(), stored.size() * 2) << WireDtypeName(dtype);
    DecodedHeader h = DecodedHeader::Decode(reply[0]).value();
    EXPECT_EQ(h.get().getBody().getPullReply().getValueDtype(), static_cast<uint8_t>(dtype));
    std::vector<float> got(stored.size()), expected(stored.size());
    DecodeFloats(reply[1].data(), dtype, got);
    std::vector<uint16_t> half(stored.size());
    EncodeFloats(stored, dtype, half.data());
    DecodeFloats(half.data(), dtype, expected);
    EXPECT_EQ(got, expected) << WireDtypeName(dtype);
    EXPECT_NE(got, stored) << "uniform rows have bits that 16 bits cannot hold";
  }
  EXPECT_EQ(core->ReadRow(0, 0).value(), std::vector<float>(stored.begin(), stored.begin() + 3));
  Frames unknown = testing::RangePull(2, 0, 0, 4, 0, 0, 9);
  Status s = ReplyStatus(core->HandleOne(unknown));
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
}

}  // namespace
}  // namespace ps
