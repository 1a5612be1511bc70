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
// output. Work items are (row, KV head) pairs on the kernel's thread pool. XLA's version of the
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
  std::vector<float> s, acc, m, l, kf, vf;
};

// One (row, KV head): its G query heads over the pages the row sees.
void decode_one(const DecodeJob& j, int64_t row, int64_t g, Scratch& sc) {
  const int64_t G = j.heads / j.kv_heads, ps = j.ps, dk = j.dk, dv = j.dv;
  float* out = j.out + (row * j.heads + g * G) * dv;  // (G, dv)
  const int64_t pos = j.q_pos[row];
  if (pos < 0) {
    std::fill(out, out + G * dv, 0.0f);
    return;
  }
  sc.s.resize(G * ps);
  sc.acc.assign(G * dv, 0.0f);
  sc.m.assign(G, kNegInf);
  sc.l.assign(G, 0.0f);
  if (j.kind != kF32) {
    sc.kf.resize(dk * ps);
    sc.vf.resize(ps * dv);
  }
  const float* q = j.q + (row * j.heads + g * G) * dk;  // (G, dk)
  const int64_t lo_pos = j.window > 0 ? std::max<int64_t>(0, pos - j.window + 1) : 0;
  const int64_t last = std::min(j.width - 1, pos / ps);
  for (int64_t c = lo_pos / ps; c <= last; ++c) {
    const int64_t page = j.tables[row * j.width + c];
    if (page < 0 || page >= j.pages) continue;
    const int64_t extra = j.kind == kQ8 ? 2 : 0;  // the scale's bytes
    const int64_t k_off = (page * j.kv_heads + g) * (dk + extra) * ps, v_off = (page * j.kv_heads + g) * ps * (dv + extra);
    // the keys the row sees in this page, [j0, j1), and the 8-aligned span [t0, t1) that holds them:
    // only those are converted and scored (a sequence's last page is mostly empty)
    const int64_t j0 = std::max<int64_t>(0, lo_pos - c * ps), j1 = std::min<int64_t>(ps, pos - c * ps + 1);
    const int64_t t0 = j0 & ~int64_t{7}, t1 = std::min<int64_t>(ps, (j1 + 7) & ~int64_t{7});
    const float* K;  // (dk, ps)
    const float* V;  // (ps, dv)
    if (j.kind == kBF16 || j.kind == kF16) {
      const auto* kh = static_cast<const uint16_t*>(j.k) + k_off;
      for (int64_t d = 0; d < dk; ++d) half_to_f32(kh + d * ps + t0, sc.kf.data() + d * ps + t0, t1 - t0, j.kind == kBF16);
      half_to_f32(static_cast<const uint16_t*>(j.v) + v_off + j0 * dv, sc.vf.data() + j0 * dv, (j1 - j0) * dv,
                  j.kind == kBF16);
      K = sc.kf.data();
      V = sc.vf.data();
    } else if (j.kind == kQ8) {
      const uint8_t* kq = static_cast<const uint8_t*>(j.k) + k_off;  // (dk + 2, ps): the scales' rows last
      const uint8_t* vq = static_cast<const uint8_t*>(j.v) + v_off;  // (ps, dv + 2): the scales' columns last
      float* kscale = sc.s.data();  // scratch: the scores are written after K is made
      for (int64_t t = t0; t < t1; ++t) kscale[t] = f16_at(kq + dk * ps + t, kq + (dk + 1) * ps + t);
      for (int64_t d = 0; d < dk; ++d) dequantize(kq + d * ps + t0, kscale + t0, nullptr, sc.kf.data() + d * ps + t0,
                                                  t1 - t0, j);
      for (int64_t t = j0; t < j1; ++t) {
        const uint8_t* row = vq + t * (dv + 2);
        const float scale = f16_at(row + dv, row + dv + 1);
        dequantize(row, nullptr, &scale, sc.vf.data() + t * dv, dv, j);
      }
      K = sc.kf.data();
      V = sc.vf.data();
    } else {
      K = static_cast<const float*>(j.k) + k_off;
      V = static_cast<const float*>(j.v) + v_off;
    }
    // scores s[i][t] = scale * q_i . k_t, 8 keys at a time, up to 8 heads per pass over K
    for (int64_t i0 = 0; i0 < G; i0 += 8) {
      const int64_t ni = std::min<int64_t>(8, G - i0);
      for (int64_t t = t0; t < t1; t += 8) {
        __m256 a[8];
        for (int64_t i = 0; i < ni; ++i) a[i] = _mm256_setzero_ps();
        for (int64_t d = 0; d < dk; ++d) {
          const __m256 kv = _mm256_loadu_ps(K + d * ps + t);
          for (int64_t i = 0; i < ni; ++i) a[i] = _mm256_fmadd_ps(_mm256_set1_ps(q[(i0 + i) * dk + d]), kv, a[i]);
        }
        for (int64_t i = 0; i < ni; ++i)
          _mm256_storeu_ps(sc.s.data() + (i0 + i) * ps + t, _mm256_mul_ps(a[i], _mm256_set1_ps(j.scale)));
      }
    }
    for (int64_t i = 0; i < G; ++i) {
      float* s = sc.s.data() + i * ps;
      if (j.softcap > 0)
        for (int64_t t = j0; t < j1; ++t) s[t] = j.softcap * std::tanh(s[t] / j.softcap);
      for (int64_t t = t0; t < j0; ++t) s[t] = kNegInf;
      for (int64_t t = j1; t < t1; ++t) s[t] = kNegInf;
      float mx = kNegInf;
      for (int64_t t = j0; t < j1; ++t) mx = std::max(mx, s[t]);
      const float m_new = std::max(sc.m[i], mx);
      const float alpha = sc.m[i] == kNegInf ? 0.0f : std::exp(sc.m[i] - m_new);
      sc.m[i] = m_new;
      float* acc = sc.acc.data() + i * dv;
      for (int64_t e = 0; e < dv; ++e) acc[e] *= alpha;
      __m256 sum = _mm256_setzero_ps();
      const __m256 mv = _mm256_set1_ps(m_new);
      for (int64_t t = t0; t < t1; t += 8) {
        const __m256 p = exp_nonpositive(_mm256_sub_ps(_mm256_loadu_ps(s + t), mv));
        _mm256_storeu_ps(s + t, p);
        sum = _mm256_add_ps(sum, p);
      }
      float lanes[8];
      _mm256_storeu_ps(lanes, sum);
      sc.l[i] = sc.l[i] * alpha + lanes[0] + lanes[1] + lanes[2] + lanes[3] + lanes[4] + lanes[5] + lanes[6] +
                lanes[7];
    }
    // acc[i] += sum_t p[i][t] * V[t], each value row read once for the G heads
    for (int64_t t = j0; t < j1; ++t) {
      const float* vrow = V + t * dv;
      for (int64_t i = 0; i < G; ++i) {
        const float p = sc.s[i * ps + t];
        float* acc = sc.acc.data() + i * dv;
        for (int64_t e = 0; e < dv; ++e) acc[e] += p * vrow[e];
      }
    }
  }
  for (int64_t i = 0; i < G; ++i) {
    float m = sc.m[i], l = sc.l[i], keep = 1.0f;
    if (j.sinks != nullptr) {  // one more logit in the softmax, with no value
      const float sink = j.sinks[g * G + i], m2 = std::max(m, sink);
      keep = m == kNegInf ? 0.0f : std::exp(m - m2);
      l = l * keep + std::exp(sink - m2);
    }
    const float inv = l > 0 ? keep / l : 0.0f;
    for (int64_t e = 0; e < dv; ++e) out[i * dv + e] = sc.acc[i * dv + e] * inv;
  }
}

void decode_items(void* ctx, int64_t i0, int64_t i1) {
  const auto* j = static_cast<const DecodeJob*>(ctx);
  thread_local Scratch scratch;
  for (int64_t i = i0; i < i1; ++i) decode_one(*j, i / j->kv_heads, i % j->kv_heads, scratch);
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
  kernel_pool().parallel_for(j.rows * j.kv_heads, 1, decode_items, &j);
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
