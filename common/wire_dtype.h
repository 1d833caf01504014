// How pushed gradients travel: fp32 (as computed), or 16-bit (bf16, fp16) to halve the
// bytes on the wire. The worker encodes, the server decodes to fp32 before checking and
// applying, so the optimizer and the stored rows stay fp32 whatever the wire carries.
//
// Rounding is to nearest, ties to even. bf16 keeps fp32's range with 8 bits of mantissa;
// fp16 has 11 bits but overflows past 65504 (such a gradient arrives as Inf and the push
// is refused, as any non-finite gradient is) and flushes magnitudes below 2^-24 to zero.
//
// Thread safety: pure functions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "common/status.h"

namespace ps {

enum class WireDtype : uint8_t { kFp32 = 0, kBf16 = 1, kFp16 = 2 };

// "fp32", "bf16" or "fp16"; InvalidArgument naming the flag and the value otherwise.
Result<WireDtype> ParseWireDtype(const std::string& name, const std::string& flag = "wire_dtype");
const char* WireDtypeName(WireDtype dtype);
// Bytes per value on the wire.
size_t WireDtypeBytes(WireDtype dtype);
// A dtype from its wire value; InvalidArgument for an unknown one.
Result<WireDtype> WireDtypeFromWire(uint8_t value);

uint16_t FloatToBf16(float f);
float Bf16ToFloat(uint16_t h);
uint16_t FloatToFp16(float f);
float Fp16ToFloat(uint16_t h);

// Writes in.size() values of `dtype` to `out` (in.size() * WireDtypeBytes(dtype) bytes,
// any alignment).
void EncodeFloats(std::span<const float> in, WireDtype dtype, void* out);
// Reads out.size() values of `dtype` from `in` (any alignment).
void DecodeFloats(const void* in, WireDtype dtype, std::span<float> out);

}  // namespace ps
