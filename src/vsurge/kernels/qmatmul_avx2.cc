// AVX2 + FMA + F16C kernels (any x86-64 CPU since 2013, and AMD VMs with AVX-512 masked): a
// 256-bit register holds 8 rows, so a 16-row tile is processed as two halves. Dot products are
// vpmaddubsw (uint8 x int8 pairs in int16) + vpmaddwd (to int32); int8 codes (Q8_0) take the sign
// trick: |w| times x carrying w's sign.
#include <algorithm>
#include <cstdint>
#include <cstring>

#include "qmatmul.h"

#if defined(__x86_64__)
#include <immintrin.h>

namespace vsurge {
namespace {

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")

struct Avx2 {
  static constexpr int R = 8;
  // activation rows per pass over a tile: 8 accumulators beside the 8 code registers spill some of
  // them, yet read the tile half as often as 4 (kernel_rows.py, 2 threads, 128 rows one pass, 5632 x
  // 2048: Q4_K 10.1-10.4 -> 8.7 ms, Q4_1 9.8 -> 8.6-8.9; 16 rows: no faster)
  static constexpr int kMaxRows = 8;
  static constexpr bool kVnni = false;
  using VI = __m256i;
  using VF = __m256;

  static VI load(const uint8_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }
  static VI nib_lo(VI p) { return _mm256_and_si256(p, _mm256_set1_epi8(0x0F)); }
  static VI nib_hi(VI p) { return _mm256_and_si256(_mm256_srli_epi16(p, 4), _mm256_set1_epi8(0x0F)); }
  static VI orv(VI a, VI b) { return _mm256_or_si256(a, b); }
  static VI flip_sign(VI v) { return _mm256_xor_si256(v, _mm256_set1_epi8(static_cast<char>(0x80))); }
  static VI add_bit4(VI v, const uint8_t* mask) {  // byte j |= 16 where bit j of the 32-bit mask is set
    uint32_t bits;
    std::memcpy(&bits, mask, 4);
    const VI spread = _mm256_shuffle_epi8(
        _mm256_set1_epi32(static_cast<int>(bits)),
        _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3));
    const VI bit = _mm256_set1_epi64x(static_cast<long long>(0x8040201008040201ULL));
    const VI set = _mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit);
    return _mm256_or_si256(v, _mm256_and_si256(set, _mm256_set1_epi8(16)));
  }
  template <int I>
  static VI bits45(VI h) {
    const VI m = _mm256_set1_epi8(0x30);
    if constexpr (I == 0) return _mm256_and_si256(_mm256_slli_epi16(h, 4), m);
    if constexpr (I == 1) return _mm256_and_si256(_mm256_slli_epi16(h, 2), m);
    if constexpr (I == 2) return _mm256_and_si256(h, m);
    if constexpr (I == 3) return _mm256_and_si256(_mm256_srli_epi16(h, 2), m);
  }
  template <int QMAX, int N>
  static VI dot(const VI* w, const int8_t* x) {
    const VI ones = _mm256_set1_epi16(1);
    VI acc = _mm256_setzero_si256();
    if constexpr (QMAX < 0) {
      for (int i = 0; i < N; ++i) {
        const VI xb = _mm256_set1_epi32(group4(x + 4 * i));
        const VI p = _mm256_maddubs_epi16(_mm256_abs_epi8(w[i]), _mm256_sign_epi8(xb, w[i]));
        acc = _mm256_add_epi32(acc, _mm256_madd_epi16(p, ones));
      }
    } else {
      constexpr int G = std::max(1, 32767 / (2 * QMAX * 127));
      for (int i = 0; i < N; i += G) {
        VI p = _mm256_maddubs_epi16(w[i], _mm256_set1_epi32(group4(x + 4 * i)));
        for (int j = 1; j < G && i + j < N; ++j)
          p = _mm256_add_epi16(p, _mm256_maddubs_epi16(w[i + j], _mm256_set1_epi32(group4(x + 4 * (i + j)))));
        acc = _mm256_add_epi32(acc, _mm256_madd_epi16(p, ones));
      }
    }
    return acc;
  }
  static VI sub_bcast(VI s, int32_t c) { return _mm256_sub_epi32(s, _mm256_set1_epi32(c)); }
  static VF cvt(VI s) { return _mm256_cvtepi32_ps(s); }
  static VF fma(VF a, VF b, VF c) { return _mm256_fmadd_ps(a, b, c); }
  static VF fnma(VF a, VF b, VF c) { return _mm256_fnmadd_ps(a, b, c); }
  static VF mul(VF a, VF b) { return _mm256_mul_ps(a, b); }
  static VF set1(float v) { return _mm256_set1_ps(v); }
  static VF zero() { return _mm256_setzero_ps(); }
  static VF load_f16(const uint8_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
  static VF load_u8(const uint8_t* p) {
    return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
  }
  static VF load_i8(const uint8_t* p) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
  }
  static void store(float* y, VF v, int n) {
    if (n == R) {
      _mm256_storeu_ps(y, v);
    } else {
      const VI mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
      _mm256_maskstore_ps(y, mask, v);
    }
  }

  static __m256 load8(const float* x) { return _mm256_loadu_ps(x); }
  static __m256 load8(const uint16_t* x) {  // bfloat16 bits -> float32
    const __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
  }
  static int32_t hsum(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
    return _mm_cvtsi128_si32(s);
  }
  static void store_codes(const __m256i* qi, int8_t* q) {  // 32 int32 (in range) -> 32 int8
    const __m256i packed = _mm256_packs_epi16(_mm256_packs_epi32(qi[0], qi[1]), _mm256_packs_epi32(qi[2], qi[3]));
    const __m256i ordered = _mm256_permutevar8x32_epi32(packed, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(q), ordered);
  }
  // sums: the codes' sums over the block's two halves, then (q2 set) the residual codes' sums
  template <class T>
  static void quantize_block(const T* x, int8_t* q, int8_t* q2, float* d, int32_t* sums) {
    __m256 v[4];
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 m = _mm256_setzero_ps();
    for (int i = 0; i < 4; ++i) {
      v[i] = load8(x + 8 * i);
      m = _mm256_max_ps(m, _mm256_andnot_ps(sign, v[i]));
    }
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    h = _mm_max_ss(h, _mm_shuffle_ps(h, h, 1));
    const float amax = _mm_cvtss_f32(h);
    const float scale = amax / 127.0f;
    const float inv = amax > 0.0f ? 1.0f / scale : 0.0f;
    __m256i qi[4];
    for (int i = 0; i < 4; ++i) qi[i] = _mm256_cvtps_epi32(_mm256_mul_ps(v[i], _mm256_set1_ps(inv)));
    sums[0] = hsum(_mm256_add_epi32(qi[0], qi[1]));
    sums[1] = hsum(_mm256_add_epi32(qi[2], qi[3]));
    store_codes(qi, q);
    *d = scale;
    if (q2 == nullptr) return;
    // the residual at d / 256: |x - q d| <= d / 2 gives codes up to 128, held to 127
    const __m256 up = _mm256_set1_ps(256.0f * inv);
    const __m256i lim = _mm256_set1_epi32(127);
    __m256i ri[4];
    for (int i = 0; i < 4; ++i) {
      const __m256 r = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(qi[i]), _mm256_set1_ps(scale), v[i]);
      ri[i] = _mm256_max_epi32(_mm256_min_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(r, up)), lim),
                               _mm256_sub_epi32(_mm256_setzero_si256(), lim));
    }
    sums[2] = hsum(_mm256_add_epi32(ri[0], ri[1]));
    sums[3] = hsum(_mm256_add_epi32(ri[2], ri[3]));
    store_codes(ri, q2);
  }
  static VI shl8_add(VI hi, VI lo) { return _mm256_add_epi32(_mm256_slli_epi32(hi, 8), lo); }
};

namespace avx2 {
using Isa = Avx2;
#include "qmatmul_body.h"
}  // namespace avx2

#pragma GCC pop_options

const IsaKernels kAvx2 = {"avx2", false, avx2::quantize_rows, avx2::matmul_tiles};

}  // namespace

const IsaKernels* const kAvx2Kernels = &kAvx2;

}  // namespace vsurge

#else  // not x86-64

namespace vsurge {
const IsaKernels* const kAvx2Kernels = nullptr;
}  // namespace vsurge

#endif
