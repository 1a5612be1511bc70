// 16-bit floats to float32, for the files compiled for AVX2 + F16C (kv_pages.cc, paged_attention.cc).
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstring>

namespace vsurge {

// n bfloat16 (the top half of a float32) or float16 (F16C) values -> float32.
inline void half_to_f32(const uint16_t* src, float* dst, int64_t n, bool bf16) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i w = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
    _mm256_storeu_ps(dst + i, bf16 ? _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(w), 16))
                                   : _mm256_cvtph_ps(w));
  }
  for (; i < n; ++i) {
    if (bf16) {
      const uint32_t bits = static_cast<uint32_t>(src[i]) << 16;
      std::memcpy(dst + i, &bits, 4);
    } else {
      dst[i] = _cvtsh_ss(src[i]);
    }
  }
}

}  // namespace vsurge
