// The XLA FFI custom call `vsurge_paged_decode`: attention of one query token per row over its KV
// pages, read through its page table (kv/paged.py's decode rows on CPU).
//
//   q (R, H, dk) f32; k_pages (P, KVH, dk, ps) and v_pages (P, KVH, ps, dv) f32, bf16 or f16, or int8 /
//   fp8 (e4m3fn) with each token's float16 scale as 2 more bytes along head_dim (kv/quant.py:
//   k_pages (P, KVH, dk + 2, ps), v_pages (P, KVH, ps, dv + 2));
//   tables (R, W) s32 page ids; q_pos (R,) s32 (< 0: a padding row, zeros out); sinks (H,) f32
//   -> out (R, H, dv) f32
//
// Row r attends to keys at positions <= q_pos[r] (and > q_pos - window for sliding-window layers),
// key j of column c at position c * ps + j, so only the columns it sees are read. Query heads
// h = g * G + i share KV head g (G = H / KVH): each key page is read once for its G heads. Per
// page: scores for every key (a broadcast FMA per head dimension, along the page's contiguous keys),
// scaled, soft-capped, masked, then an online-softmax update of the row's running max, sum and
// output (fp16/bf16 pages read as they are, converted in registers). Work items are (row, KV head,
// part) triples on the kernel's thread pool, a part being a run of the row's pages (one long row
// keeps every thread busy; the parts' softmax statistics are merged after). XLA's version of the
// same loop is ~25 small ops per layer, each with a fixed cost that dominates one row's decode.
#pragma GCC target("avx2,fma,f16c")
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "half.h"
#include "thread_pool.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace vsurge {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// e^x, x <= 0 (scores less their max; -inf -> 0): Cephes' expf polynomial after range reduction.
inline __m256 exp_nonpositive(__m256 x) {
  const __m256 zero_mask = _mm256_cmp_ps(x, _mm256_set1_ps(-87.0f), _CMP_LT_OQ);
  x = _mm256_max_ps(x, _mm256_set1_ps(-87.0f));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_andnot_ps(zero_mask, _mm256_mul_ps(p, _mm256_castsi256_ps(e)));
}

enum PageKind { kF32, kBF16, kF16, kQ8 };  // kQ8: one byte per value (int8 or fp8) and a float16 scale per token

// The value of each byte of an int8 or float8_e4m3fn page (before its token's scale).
const float* byte_values(bool fp8) {
  static const std::vector<float> tables[2] = {
      [] {
        std::vector<float> t(256);
        for (int b = 0; b < 256; ++b) t[b] = static_cast<float>(static_cast<int8_t>(b));
        return t;
      }(),
      [] {  // e4m3fn: 1 sign, 4 exponent (bias 7), 3 mantissa bits; no infinities, 0x7f / 0xff are NaN
        std::vector<float> t(256);
        for (int b = 0; b < 256; ++b) {
          const int e = (b >> 3) & 15, mant = b & 7;
          float v = e == 0 ? std::ldexp(mant / 8.0f, -6) : std::ldexp(1.0f + mant / 8.0f, e - 7);
          if ((b & 0x7f) == 0x7f) v = std::numeric_limits<float>::quiet_NaN();
          t[b] = (b & 0x80) ? -v : v;
        }
        return t;
      }()};
  return tables[fp8 ? 1 : 0].data();
}

inline float f16_at(const uint8_t* lo, const uint8_t* hi) {
  return _cvtsh_ss(static_cast<uint16_t>(*lo | (*hi << 8)));
}

struct DecodeJob {
  const float* q;
  const void* k;
  const void* v;
  PageKind kind;
  const float* bytes;  // kQ8: byte_values
  bool fp8;            // kQ8: float8_e4m3fn bytes (else int8)
  const int32_t* tables;
  const int32_t* q_pos;
  const float* sinks;  // nullptr: none
  float* out;
  int64_t rows, heads, kv_heads, dk, dv, pages, ps, width;
  float scale, softcap;  // softcap 0: none
  int64_t window;        // 0: none
};

// n int8 / fp8 bytes -> floats, times scales[i] each (scales) or one *scale (else).
inline void dequantize(const uint8_t* src, const float* scales, const float* scale, float* dst, int64_t n,
                       const DecodeJob& j) {
  int64_t i = 0;
  if (!j.fp8) {  // int8: sign-extend 8 at a time
    for (; i + 8 <= n; i += 8) {
      const __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(src + i));
      const __m256 v = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b));
      _mm256_storeu_ps(dst + i, _mm256_mul_ps(v, scales ? _mm256_loadu_ps(scales + i) : _mm256_set1_ps(*scale)));
    }
  }
  for (; i < n; ++i) dst[i] = j.bytes[src[i]] * (scales ? scales[i] : *scale);
}

struct Scratch {
  std::vector<float> s, kf, vf;
};

// 8 consecutive page values as float32 (kF32, kF16, kBF16 pages; kQ8 pages are dequantized first).
template <PageKind kKind>
inline __m256 load8(const void* base, int64_t i) {
  if constexpr (kKind == kF32) {
    return _mm256_loadu_ps(static_cast<const float*>(base) + i);
  } else {
    const __m128i w = _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(base) + i));
    if constexpr (kKind == kF16) return _mm256_cvtph_ps(w);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(w), 16));
  }
}

// s[i][t] = scale * q_i . k_t for t in [t0, t1) (8-aligned), K (dk, ps): up to 4 heads and 3 blocks
// of 8 keys per pass, so 12 independent FMA chains hide the FMA latency.
// Pages are scattered over the pool, so the hardware prefetcher starts over at each: the next page's
// bytes (`next`, `next_bytes` of them; nullptr: none) are requested before this one is computed.
inline void prefetch(const char* next, int64_t next_bytes) {
  if (next == nullptr) return;
  for (int64_t x = 0; x < next_bytes; x += 64) _mm_prefetch(next + x, _MM_HINT_T0);
}

template <PageKind kKind>
void page_scores(const float* q, const void* K, int64_t G, int64_t dk, int64_t ps, int64_t t0, int64_t t1,
                 float scale, float* s, const char* next = nullptr, int64_t next_bytes = 0) {
  const __m256 sc = _mm256_set1_ps(scale);
  prefetch(next, next_bytes);
  for (int64_t i0 = 0; i0 < G; i0 += 4) {
    const int64_t ni = std::min<int64_t>(4, G - i0);
    int64_t t = t0;
    for (; t + 24 <= t1; t += 24) {
      __m256 a[4][3];
      for (int64_t i = 0; i < 4; ++i)
        for (int b = 0; b < 3; ++b) a[i][b] = _mm256_setzero_ps();
      for (int64_t d = 0; d < dk; ++d) {
        const __m256 k0 = load8<kKind>(K, d * ps + t), k1 = load8<kKind>(K, d * ps + t + 8),
                     k2 = load8<kKind>(K, d * ps + t + 16);
        for (int64_t i = 0; i < ni; ++i) {
          const __m256 qi = _mm256_set1_ps(q[(i0 + i) * dk + d]);
          a[i][0] = _mm256_fmadd_ps(qi, k0, a[i][0]);
          a[i][1] = _mm256_fmadd_ps(qi, k1, a[i][1]);
          a[i][2] = _mm256_fmadd_ps(qi, k2, a[i][2]);
        }
      }
      for (int64_t i = 0; i < ni; ++i)
        for (int b = 0; b < 3; ++b) _mm256_storeu_ps(s + (i0 + i) * ps + t + 8 * b, _mm256_mul_ps(a[i][b], sc));
    }
    for (; t < t1; t += 8) {
      __m256 a[4];
      for (int64_t i = 0; i < 4; ++i) a[i] = _mm256_setzero_ps();
      for (int64_t d = 0; d < dk; ++d) {
        const __m256 k0 = load8<kKind>(K, d * ps + t);
        for (int64_t i = 0; i < ni; ++i) a[i] = _mm256_fmadd_ps(_mm256_set1_ps(q[(i0 + i) * dk + d]), k0, a[i]);
      }
      for (int64_t i = 0; i < ni; ++i) _mm256_storeu_ps(s + (i0 + i) * ps + t, _mm256_mul_ps(a[i], sc));
    }
  }
}

// acc[i] += sum_{t in [j0, j1)} p[i][t] * V[t], V (ps, dv), dv a multiple of 8: two heads and 32
// values per pass held in registers, each value row read once per pass.
template <PageKind kKind>
void page_values(const float* p, const void* V, int64_t G, int64_t dv, int64_t ps, int64_t j0, int64_t j1,
                 float* acc, const char* next = nullptr, int64_t next_bytes = 0) {
  prefetch(next, next_bytes);
  for (int64_t i0 = 0; i0 < G; i0 += 2) {
    const int64_t ni = std::min<int64_t>(2, G - i0);
    for (int64_t e0 = 0; e0 < dv; e0 += 32) {
      const int64_t ne = std::min<int64_t>(4, (dv - e0) / 8);
      __m256 a[2][4];
      for (int64_t i = 0; i < ni; ++i)
        for (int64_t b = 0; b < ne; ++b) a[i][b] = _mm256_loadu_ps(acc + (i0 + i) * dv + e0 + 8 * b);
      for (int64_t t = j0; t < j1; ++t) {
        __m256 v[4];
        for (int64_t b = 0; b < ne; ++b) v[b] = load8<kKind>(V, t * dv + e0 + 8 * b);
        for (int64_t i = 0; i < ni; ++i) {
          const __m256 pi = _mm256_set1_ps(p[(i0 + i) * ps + t]);
          for (int64_t b = 0; b < ne; ++b) a[i][b] = _mm256_fmadd_ps(pi, v[b], a[i][b]);
        }
      }
      for (int64_t i = 0; i < ni; ++i)
        for (int64_t b = 0; b < ne; ++b) _mm256_storeu_ps(acc + (i0 + i) * dv + e0 + 8 * b, a[i][b]);
    }
  }
}

// One (row, KV head) over the page columns [c_lo, c_hi) it sees: its G query heads' running max m,
// sum l and unnormalised output acc (G, dv), for the merge in `finish`.
template <PageKind kKind>
void decode_part(const DecodeJob& j, int64_t row, int64_t g, int64_t c_lo, int64_t c_hi, Scratch& sc, float* m,
                 float* l, float* acc) {
  const int64_t G = j.heads / j.kv_heads, ps = j.ps, dk = j.dk, dv = j.dv;
  const int64_t pos = j.q_pos[row];
  std::fill(acc, acc + G * dv, 0.0f);
  std::fill(m, m + G, kNegInf);
  std::fill(l, l + G, 0.0f);
  sc.s.resize(G * ps);
  if (j.kind == kQ8) {
    sc.kf.resize(dk * ps);
    sc.vf.resize(ps * dv);
  }
  const float* q = j.q + (row * j.heads + g * G) * dk;  // (G, dk)
  const int64_t lo_pos = j.window > 0 ? std::max<int64_t>(0, pos - j.window + 1) : 0;
  const bool wide = dv % 8 == 0;
  for (int64_t c = c_lo; c < c_hi; ++c) {
    const int64_t page = j.tables[row * j.width + c];
    if (page < 0 || page >= j.pages) continue;
    const int64_t extra = j.kind == kQ8 ? 2 : 0;  // the scale's bytes
    const int64_t k_off = (page * j.kv_heads + g) * (dk + extra) * ps, v_off = (page * j.kv_heads + g) * ps * (dv + extra);
    // the keys the row sees in this page, [j0, j1), and the 8-aligned span [t0, t1) that holds them:
    // only those are scored (a sequence's last page is mostly empty)
    const int64_t j0 = std::max<int64_t>(0, lo_pos - c * ps), j1 = std::min<int64_t>(ps, pos - c * ps + 1);
    const int64_t t0 = j0 & ~int64_t{7}, t1 = std::min<int64_t>(ps, (j1 + 7) & ~int64_t{7});
    const void* K;  // (dk, ps)
    const void* V;  // (ps, dv)
    if constexpr (kKind == kQ8) {
      const uint8_t* kq = static_cast<const uint8_t*>(j.k) + k_off;  // (dk + 2, ps): the scales' rows last
      const uint8_t* vq = static_cast<const uint8_t*>(j.v) + v_off;  // (ps, dv + 2): the scales' columns last
      float* kscale = sc.s.data();  // scratch: the scores are written after K is made
      for (int64_t t = t0; t < t1; ++t) kscale[t] = f16_at(kq + dk * ps + t, kq + (dk + 1) * ps + t);
      for (int64_t d = 0; d < dk; ++d) dequantize(kq + d * ps + t0, kscale + t0, nullptr, sc.kf.data() + d * ps + t0,
                                                  t1 - t0, j);
      for (int64_t t = j0; t < j1; ++t) {
        const uint8_t* r = vq + t * (dv + 2);
        const float scale = f16_at(r + dv, r + dv + 1);
        dequantize(r, nullptr, &scale, sc.vf.data() + t * dv, dv, j);
      }
      K = sc.kf.data();
      V = sc.vf.data();
    } else {
      const int64_t size = kKind == kF32 ? 4 : 2;
      K = static_cast<const char*>(j.k) + k_off * size;
      V = static_cast<const char*>(j.v) + v_off * size;
    }
    constexpr PageKind kRead = kKind == kQ8 ? kF32 : kKind;  // what K and V point at now
    // the next page this item reads (its keys while these are scored, its values while these are summed)
    const char *next_k = nullptr, *next_v = nullptr;
    int64_t next_kb = 0, next_vb = 0;
    if (kKind != kF32 && kKind != kQ8 && c + 1 < c_hi) {
      const int64_t np = j.tables[row * j.width + c + 1];
      if (np >= 0 && np < j.pages) {
        next_k = static_cast<const char*>(j.k) + (np * j.kv_heads + g) * dk * ps * 2;
        next_v = static_cast<const char*>(j.v) + (np * j.kv_heads + g) * ps * dv * 2;
        next_kb = dk * ps * 2;
        next_vb = ps * dv * 2;
      }
    }
    page_scores<kRead>(q, K, G, dk, ps, t0, t1, j.scale, sc.s.data(), next_k, next_kb);
    for (int64_t i = 0; i < G; ++i) {
      float* s = sc.s.data() + i * ps;
      if (j.softcap > 0)
        for (int64_t t = j0; t < j1; ++t) s[t] = j.softcap * std::tanh(s[t] / j.softcap);
      for (int64_t t = t0; t < j0; ++t) s[t] = kNegInf;
      for (int64_t t = j1; t < t1; ++t) s[t] = kNegInf;
      float mx = kNegInf;
      for (int64_t t = j0; t < j1; ++t) mx = std::max(mx, s[t]);
      const float m_new = std::max(m[i], mx);
      const float alpha = m[i] == kNegInf ? 0.0f : std::exp(m[i] - m_new);
      m[i] = m_new;
      float* a = acc + i * dv;
      for (int64_t e = 0; e < dv; ++e) a[e] *= alpha;
      __m256 sum = _mm256_setzero_ps();
      const __m256 mv = _mm256_set1_ps(m_new);
      for (int64_t t = t0; t < t1; t += 8) {
        const __m256 p = exp_nonpositive(_mm256_sub_ps(_mm256_loadu_ps(s + t), mv));
        _mm256_storeu_ps(s + t, p);
        sum = _mm256_add_ps(sum, p);
      }
      float lanes[8];
      _mm256_storeu_ps(lanes, sum);
      l[i] = l[i] * alpha + lanes[0] + lanes[1] + lanes[2] + lanes[3] + lanes[4] + lanes[5] + lanes[6] + lanes[7];
    }
    if (wide) {
      page_values<kRead>(sc.s.data(), V, G, dv, ps, j0, j1, acc, next_v, next_vb);
    } else {  // a head size that is not a multiple of 8: one value at a time
      for (int64_t t = j0; t < j1; ++t)
        for (int64_t i = 0; i < G; ++i) {
          const float p = sc.s[i * ps + t];
          float* a = acc + i * dv;
          for (int64_t e = 0; e < dv; ++e) {
            float x;
            if constexpr (kRead == kF32) {
              x = static_cast<const float*>(V)[t * dv + e];
            } else {
              half_to_f32(static_cast<const uint16_t*>(V) + t * dv + e, &x, 1, kRead == kBF16);
            }
            a[e] += p * x;
          }
        }
    }
  }
}

// The work is split into (row, KV head, part) items, each a run of the row's page columns, so that
// one long row still keeps every thread busy; `finish` merges the parts' softmax statistics.
struct Split {
  const DecodeJob* j;
  int64_t parts;
  float* state;  // per item: m (G), l (G), acc (G, dv)
};

int64_t visible_first(const DecodeJob& j, int64_t row) {
  const int64_t pos = j.q_pos[row];
  return (j.window > 0 ? std::max<int64_t>(0, pos - j.window + 1) : 0) / j.ps;
}

void decode_items(void* ctx, int64_t i0, int64_t i1) {
  const auto* sp = static_cast<const Split*>(ctx);
  const DecodeJob& j = *sp->j;
  const int64_t G = j.heads / j.kv_heads, stride = G * (2 + j.dv);
  thread_local Scratch scratch;
  for (int64_t i = i0; i < i1; ++i) {
    const int64_t rg = i / sp->parts, part = i % sp->parts, row = rg / j.kv_heads, g = rg % j.kv_heads;
    float* m = sp->state + i * stride;
    float *l = m + G, *acc = m + 2 * G;
    const int64_t pos = j.q_pos[row];
    int64_t lo = 0, hi = 0;  // a padding row reads nothing
    if (pos >= 0) {
      const int64_t first = visible_first(j, row), n = std::min(j.width - 1, pos / j.ps) - first + 1;
      lo = first + n * part / sp->parts;
      hi = first + n * (part + 1) / sp->parts;
    }
    switch (j.kind) {
      case kF32: decode_part<kF32>(j, row, g, lo, hi, scratch, m, l, acc); break;
      case kF16: decode_part<kF16>(j, row, g, lo, hi, scratch, m, l, acc); break;
      case kBF16: decode_part<kBF16>(j, row, g, lo, hi, scratch, m, l, acc); break;
      case kQ8: decode_part<kQ8>(j, row, g, lo, hi, scratch, m, l, acc); break;
    }
  }
}

// out (G, dv) of one (row, KV head) from its parts: rescaled to their common max and normalised
// (with the sink's logit where the layer has sinks).
void finish(const Split& sp, int64_t rg) {
  const DecodeJob& j = *sp.j;
  const int64_t G = j.heads / j.kv_heads, dv = j.dv, stride = G * (2 + dv), row = rg / j.kv_heads, g = rg % j.kv_heads;
  float* out = j.out + (row * j.heads + g * G) * dv;
  if (j.q_pos[row] < 0) {
    std::fill(out, out + G * dv, 0.0f);
    return;
  }
  for (int64_t i = 0; i < G; ++i) {
    float m = kNegInf;
    for (int64_t p = 0; p < sp.parts; ++p) m = std::max(m, sp.state[(rg * sp.parts + p) * stride + i]);
    float l = 0.0f;
    float* o = out + i * dv;
    std::fill(o, o + dv, 0.0f);
    for (int64_t p = 0; p < sp.parts; ++p) {
      const float* part = sp.state + (rg * sp.parts + p) * stride;
      if (part[i] == kNegInf) continue;
      const float w = std::exp(part[i] - m);
      l += part[G + i] * w;
      const float* acc = part + 2 * G + i * dv;
      for (int64_t e = 0; e < dv; ++e) o[e] += acc[e] * w;
    }
    float keep = 1.0f;
    if (j.sinks != nullptr) {  // one more logit in the softmax, with no value
      const float sink = j.sinks[g * G + i], m2 = std::max(m, sink);
      keep = m == kNegInf ? 0.0f : std::exp(m - m2);
      l = l * keep + std::exp(sink - m2);
    }
    const float inv = l > 0 ? keep / l : 0.0f;
    for (int64_t e = 0; e < dv; ++e) o[e] *= inv;
  }
}

ffi::Error paged_decode_impl(ffi::Buffer<ffi::F32> q, ffi::AnyBuffer k_pages, ffi::AnyBuffer v_pages,
                             ffi::Buffer<ffi::S32> tables, ffi::Buffer<ffi::S32> q_pos, ffi::Buffer<ffi::F32> sinks,
                             ffi::ResultBuffer<ffi::F32> out, float scale, float softcap, int64_t window,
                             int64_t has_sinks) {
  const auto qd = q.dimensions(), kd = k_pages.dimensions(), vd = v_pages.dimensions(), td = tables.dimensions();
  if (qd.size() != 3 || kd.size() != 4 || vd.size() != 4 || td.size() != 2)
    return ffi::Error::InvalidArgument("vsurge_paged_decode: q (R, H, dk), pages (P, KVH, ., .), tables (R, W)");
  const ffi::DataType type = k_pages.element_type();
  const bool q8 = type == ffi::DataType::S8 || type == ffi::DataType::F8E4M3FN;
  if (v_pages.element_type() != type ||
      (!q8 && type != ffi::DataType::F32 && type != ffi::DataType::BF16 && type != ffi::DataType::F16))
    return ffi::Error::InvalidArgument("vsurge_paged_decode: pages must both be float32, bfloat16, float16, int8 or fp8");
  const PageKind kind = q8 ? kQ8 : type == ffi::DataType::BF16 ? kBF16 : type == ffi::DataType::F16 ? kF16 : kF32;
  const int64_t extra = q8 ? 2 : 0;
  DecodeJob j{q.typed_data(), k_pages.untyped_data(), v_pages.untyped_data(), kind,
              q8 ? byte_values(type == ffi::DataType::F8E4M3FN) : nullptr, type == ffi::DataType::F8E4M3FN,
              tables.typed_data(),
              q_pos.typed_data(), has_sinks ? sinks.typed_data() : nullptr, out->typed_data(),
              qd[0], qd[1], kd[1], qd[2], vd[3] - extra, kd[0], kd[3], td[1], scale, softcap, window};
  if (j.heads % j.kv_heads != 0 || kd[2] != j.dk + extra || vd[0] != j.pages || vd[1] != j.kv_heads || vd[2] != j.ps ||
      td[0] != j.rows || j.ps % 8 != 0 || static_cast<int64_t>(q_pos.element_count()) != j.rows)
    return ffi::Error::InvalidArgument("vsurge_paged_decode: shapes do not agree (page size must be a multiple of 8)");
  if (j.rows == 0) return ffi::Error::Success();
  // parts per (row, KV head): enough items for every thread four times over, at least 2 pages each
  const int64_t items = j.rows * j.kv_heads, threads = kernel_pool().threads();
  int64_t parts = std::max<int64_t>(1, (4 * threads + items - 1) / items);
  parts = std::min<int64_t>(parts, std::max<int64_t>(1, j.width / 2));
  thread_local std::vector<float> state;  // reused: this runs once per layer and step
  state.resize(std::max<size_t>(state.size(), items * parts * (j.heads / j.kv_heads) * (2 + j.dv)));
  Split sp{&j, parts, state.data()};
  kernel_pool().parallel_for(items * parts, 1, decode_items, &sp);
  for (int64_t rg = 0; rg < items; ++rg) finish(sp, rg);
  return ffi::Error::Success();
}

}  // namespace
}  // namespace vsurge

#pragma GCC visibility push(default)
XLA_FFI_DEFINE_HANDLER_SYMBOL(vsurge_paged_decode_ffi, vsurge::paged_decode_impl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Attr<float>("scale")
                                  .Attr<float>("softcap")
                                  .Attr<int64_t>("window")
                                  .Attr<int64_t>("has_sinks"));
#pragma GCC visibility pop
