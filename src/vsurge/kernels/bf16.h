// bfloat16 <-> float32 one value at a time, for loops the compiler vectorizes for the file's ISA
// (recurrent_decode.cc, moe_experts.cc; half.h converts whole rows with AVX2 + F16C intrinsics).
#pragma once

#include <cstdint>
#include <cstring>

namespace vsurge {

inline float bf16_to_f32(uint16_t b) {
  const uint32_t bits = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

inline uint16_t f32_to_bf16(float f) {  // round to nearest even, as XLA's convert
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  return static_cast<uint16_t>((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16);
}

}  // namespace vsurge
