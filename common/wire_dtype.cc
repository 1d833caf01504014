#include "common/wire_dtype.h"

#include <cmath>
#include <cstring>

namespace ps {
namespace {

uint32_t Bits(float f) {
  uint32_t x;
  std::memcpy(&x, &f, sizeof(x));
  return x;
}

float FromBits(uint32_t x) {
  float f;
  std::memcpy(&f, &x, sizeof(f));
  return f;
}

}  // namespace

Result<WireDtype> ParseWireDtype(const std::string& name, const std::string& flag) {
  if (name == "fp32") return WireDtype::kFp32;
  if (name == "bf16") return WireDtype::kBf16;
  if (name == "fp16") return WireDtype::kFp16;
  return InvalidArgument("--" + flag + "=" + name + " is not allowed: expected fp32, bf16 or fp16");
}

const char* WireDtypeName(WireDtype dtype) {
  switch (dtype) {
    case WireDtype::kBf16:
      return "bf16";
    case WireDtype::kFp16:
      return "fp16";
    case WireDtype::kFp32:
      break;
  }
  return "fp32";
}

size_t WireDtypeBytes(WireDtype dtype) { return dtype == WireDtype::kFp32 ? 4 : 2; }

Result<WireDtype> WireDtypeFromWire(uint8_t value) {
  if (value > static_cast<uint8_t>(WireDtype::kFp16)) {
    return InvalidArgument("gradient dtype " + std::to_string(value) +
                           " is unknown (0 fp32, 1 bf16, 2 fp16)");
  }
  return static_cast<WireDtype>(value);
}

uint16_t FloatToBf16(float f) {
  const uint32_t x = Bits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40);  // NaN
  // Round to nearest even on the 16 bits dropped (an overflow carries into Inf, as it should).
  return static_cast<uint16_t>((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

float Bf16ToFloat(uint16_t h) { return FromBits(static_cast<uint32_t>(h) << 16); }

uint16_t FloatToFp16(float f) {
  const uint32_t x = Bits(f);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  const uint32_t a = x & 0x7fffffffu;
  if (a > 0x7f800000u) return sign | 0x7e00;   // NaN
  if (a >= 0x477ff000u) return sign | 0x7c00;  // >= 65520 rounds to Inf (and Inf)
  if (a < 0x38800000u) {                       // below 2^-14: fp16 subnormal or zero
    // The value in units of 2^-24, rounded to nearest even (the default rounding mode).
    const float scaled = FromBits(a) * 16777216.0f;
    return sign | static_cast<uint16_t>(std::nearbyint(scaled));
  }
  uint32_t h = ((((a >> 23) - 127 + 15) << 10) | ((a & 0x7fffffu) >> 13));
  const uint32_t rest = a & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;  // a carry moves the exponent up
  return sign | static_cast<uint16_t>(h);
}

float Fp16ToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t mant = h & 0x3ffu;
  if (exp == 0) {
    const float v = static_cast<float>(mant) * (1.0f / 16777216.0f);
    return sign ? -v : v;
  }
  if (exp == 31) return FromBits(sign | 0x7f800000u | (mant << 13));
  return FromBits(sign | ((exp - 15 + 127) << 23) | (mant << 13));
}

void EncodeFloats(std::span<const float> in, WireDtype dtype, void* out) {
  if (dtype == WireDtype::kFp32) {
    std::memcpy(out, in.data(), in.size_bytes());
    return;
  }
  char* o = static_cast<char*>(out);
  for (size_t i = 0; i < in.size(); ++i) {
    const uint16_t v = dtype == WireDtype::kBf16 ? FloatToBf16(in[i]) : FloatToFp16(in[i]);
    std::memcpy(o + 2 * i, &v, 2);
  }
}

void DecodeFloats(const void* in, WireDtype dtype, std::span<float> out) {
  if (dtype == WireDtype::kFp32) {
    std::memcpy(out.data(), in, out.size_bytes());
    return;
  }
  const char* p = static_cast<const char*>(in);
  for (size_t i = 0; i < out.size(); ++i) {
    uint16_t v;
    std::memcpy(&v, p + 2 * i, 2);
    out[i] = dtype == WireDtype::kBf16 ? Bf16ToFloat(v) : Fp16ToFloat(v);
  }
}

}  // namespace ps
