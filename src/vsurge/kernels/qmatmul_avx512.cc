// AVX-512 kernels: one register holds all 16 rows of a tile. Two variants: with VNNI (vpdpbusd:
// 64 uint8 x int8 products summed into 16 int32 lanes in one instruction) and without (vpmaddubsw +
// vpmaddwd, Skylake-SP). Only the dispatcher calls them, after checking the CPU has the features.
#include <algorithm>
#include <cstdint>
#include <cstring>

#include "qmatmul.h"

#if defined(__x86_64__)
#include <immintrin.h>

namespace vsurge {
namespace {

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,fma,f16c,avx2")

struct Avx512Common {
  static constexpr int R = 16;
  // activation rows per pass over a tile (8 code + 8 accumulator zmm; 16 rows measured no faster)
  static constexpr int kMaxRows = 8;
  using VI = __m512i;
  using VF = __m512;

  static VI load(const uint8_t* p) { return _mm512_loadu_si512(p); }
  static VI nib_lo(VI p) { return _mm512_and_si512(p, _mm512_set1_epi8(0x0F)); }
  static VI nib_hi(VI p) { return _mm512_and_si512(_mm512_srli_epi16(p, 4), _mm512_set1_epi8(0x0F)); }
  static VI orv(VI a, VI b) { return _mm512_or_si512(a, b); }
  static VI flip_sign(VI v) { return _mm512_xor_si512(v, _mm512_set1_epi8(static_cast<char>(0x80))); }
  static VI add_bit4(VI v, const uint8_t* mask) {
    uint64_t bits;
    std::memcpy(&bits, mask, 8);
    return _mm512_mask_add_epi8(v, _cvtu64_mask64(bits), v, _mm512_set1_epi8(16));
  }
  template <int I>
  static VI bits45(VI h) {  // ((h >> 2I) & 3) << 4, per byte
    const VI m = _mm512_set1_epi8(0x30);
    if constexpr (I == 0) return _mm512_and_si512(_mm512_slli_epi16(h, 4), m);
    if constexpr (I == 1) return _mm512_and_si512(_mm512_slli_epi16(h, 2), m);
    if constexpr (I == 2) return _mm512_and_si512(h, m);
    if constexpr (I == 3) return _mm512_and_si512(_mm512_srli_epi16(h, 2), m);
  }
  static VI sub_bcast(VI s, int32_t c) { return _mm512_sub_epi32(s, _mm512_set1_epi32(c)); }
  static VF cvt(VI s) { return _mm512_cvtepi32_ps(s); }
  static VF fma(VF a, VF b, VF c) { return _mm512_fmadd_ps(a, b, c); }
  static VF fnma(VF a, VF b, VF c) { return _mm512_fnmadd_ps(a, b, c); }
  static VF mul(VF a, VF b) { return _mm512_mul_ps(a, b); }
  static VF set1(float v) { return _mm512_set1_ps(v); }
  static VF zero() { return _mm512_setzero_ps(); }
  static VF load_f16(const uint8_t* p) { return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))); }
  static VF load_u8(const uint8_t* p) {
    return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
  }
  static VF load_i8(const uint8_t* p) {
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
  }
  static void store(float* y, VF v, int n) {
    if (n == R) _mm512_storeu_ps(y, v);
    else _mm512_mask_storeu_ps(y, static_cast<__mmask16>((1u << n) - 1), v);
  }

  static __m512 load16(const float* x) { return _mm512_loadu_ps(x); }
  static __m512 load16(const uint16_t* x) {  // bfloat16 bits -> float32
    const __m512i wide = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x)));
    return _mm512_castsi512_ps(_mm512_slli_epi32(wide, 16));
  }
  // sums: the codes' sums over the block's two halves, then (q2 set) the residual codes' sums
  template <class T>
  static void quantize_block(const T* x, int8_t* q, int8_t* q2, float* d, int32_t* sums) {
    const __m512 a = load16(x), b = load16(x + 16);
    const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(a), _mm512_abs_ps(b)));
    const float scale = amax / 127.0f;
    const float inv = amax > 0.0f ? 1.0f / scale : 0.0f;
    const __m512i qa = _mm512_cvtps_epi32(_mm512_mul_ps(a, _mm512_set1_ps(inv)));
    const __m512i qb = _mm512_cvtps_epi32(_mm512_mul_ps(b, _mm512_set1_ps(inv)));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q), _mm512_cvtsepi32_epi8(qa));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q + 16), _mm512_cvtsepi32_epi8(qb));
    sums[0] = _mm512_reduce_add_epi32(qa);
    sums[1] = _mm512_reduce_add_epi32(qb);
    *d = scale;
    if (q2 == nullptr) return;
    // the residual at d / 256: |x - q d| <= d / 2 gives codes up to 128, held to 127
    const __m512 up = _mm512_set1_ps(256.0f * inv), vs = _mm512_set1_ps(scale);
    const __m512i hi = _mm512_set1_epi32(127), lo = _mm512_set1_epi32(-127);
    const __m512i ra = _mm512_max_epi32(_mm512_min_epi32(
        _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_fnmadd_ps(_mm512_cvtepi32_ps(qa), vs, a), up)), hi), lo);
    const __m512i rb = _mm512_max_epi32(_mm512_min_epi32(
        _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_fnmadd_ps(_mm512_cvtepi32_ps(qb), vs, b), up)), hi), lo);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q2), _mm512_cvtsepi32_epi8(ra));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q2 + 16), _mm512_cvtsepi32_epi8(rb));
    sums[2] = _mm512_reduce_add_epi32(ra);
    sums[3] = _mm512_reduce_add_epi32(rb);
  }
  static VI shl8_add(VI hi, VI lo) { return _mm512_add_epi32(_mm512_slli_epi32(hi, 8), lo); }
};

// Without VNNI: pairs of uint8 x int8 products in int16 (vpmaddubsw), as many summed in int16 as
// cannot overflow for codes up to QMAX, then widened to int32 (vpmaddwd with ones).
struct Avx512Plain : Avx512Common {
  static constexpr bool kVnni = false;
  template <int QMAX, int N>
  static VI dot(const VI* w, const int8_t* x) {
    const VI ones = _mm512_set1_epi16(1);
    VI acc = _mm512_setzero_si512();
    if constexpr (QMAX < 0) {  // signed int8 codes: |w| x (x with w's sign)
      for (int i = 0; i < N; ++i) {
        const VI xb = _mm512_set1_epi32(group4(x + 4 * i));
        const VI xs = _mm512_mask_sub_epi8(xb, _mm512_movepi8_mask(w[i]), _mm512_setzero_si512(), xb);
        acc = _mm512_add_epi32(acc, _mm512_madd_epi16(_mm512_maddubs_epi16(_mm512_abs_epi8(w[i]), xs), ones));
      }
    } else {
      constexpr int G = std::max(1, 32767 / (2 * QMAX * 127));
      for (int i = 0; i < N; i += G) {
        VI p = _mm512_maddubs_epi16(w[i], _mm512_set1_epi32(group4(x + 4 * i)));
        for (int j = 1; j < G && i + j < N; ++j)
          p = _mm512_add_epi16(p, _mm512_maddubs_epi16(w[i + j], _mm512_set1_epi32(group4(x + 4 * (i + j)))));
        acc = _mm512_add_epi32(acc, _mm512_madd_epi16(p, ones));
      }
    }
    return acc;
  }
};

namespace plain {
using Isa = Avx512Plain;
#include "qmatmul_body.h"
}  // namespace plain

#pragma GCC pop_options
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,fma,f16c,avx2")

struct Avx512Vnni : Avx512Common {
  static constexpr bool kVnni = true;
  template <int QMAX, int N>
  static VI dot(const VI* w, const int8_t* x) {  // two chains: vpdpbusd's latency, not its throughput
    VI s0 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w[0], _mm512_set1_epi32(group4(x)));
    VI s1 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w[1], _mm512_set1_epi32(group4(x + 4)));
    for (int i = 2; i < N; i += 2) {
      s0 = _mm512_dpbusd_epi32(s0, w[i], _mm512_set1_epi32(group4(x + 4 * i)));
      s1 = _mm512_dpbusd_epi32(s1, w[i + 1], _mm512_set1_epi32(group4(x + 4 * i + 4)));
    }
    return _mm512_add_epi32(s0, s1);
  }
};

namespace vnni {
using Isa = Avx512Vnni;
#include "qmatmul_body.h"
}  // namespace vnni

#pragma GCC pop_options

const IsaKernels kPlain = {"avx512", false, plain::quantize_rows, plain::matmul_tiles};
const IsaKernels kVnni = {"avx512_vnni", true, vnni::quantize_rows, vnni::matmul_tiles};

}  // namespace

const IsaKernels* const kAvx512Kernels = &kPlain;
const IsaKernels* const kAvx512VnniKernels = &kVnni;

}  // namespace vsurge

#else  // not x86-64

namespace vsurge {
const IsaKernels* const kAvx512Kernels = nullptr;
const IsaKernels* const kAvx512VnniKernels = nullptr;
}  // namespace vsurge

#endif
