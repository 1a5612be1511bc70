// The quantized matmul written once over an ISA's traits `S` (rows per register, loads, the 4-byte
// dot product). Each ISA translation unit defines its traits and includes this file inside an
// anonymous namespace under its `#pragma GCC target`, so every function here is compiled for that
// ISA only and none is shared between them.
//
// Traits: R (rows per register: 16 for AVX-512, 8 for AVX2), VI / VF (integer / float registers),
// load (R * 4 bytes), nib_lo / nib_hi, add_bit4 (a 5th-bit mask), bits45<i>, flip_sign,
// dot<QMAX, N> (N code vectors with N broadcast 4-byte activation groups; QMAX < 0: signed codes),
// sub_bcast, cvt, fma, fnma, mul, set1, zero, load_f16 / load_u8 / load_i8 (R scales),
// store (the first n of R floats), quantize_block<T> (32 activations, and their residual's codes),
// shl8_add (256 * a + b, int32 lanes).
//
// A tile of 16 rows is processed as 16 / R register rows ("halves"); a field of a group holds its
// 16 rows in order, so half h of a field with B bytes per row starts at h * R * B.

// Loads the 8 code vectors of one 32-weight block from a 4-bit plane (and a 5th-bit mask plane).
template <class S>
inline void unpack4(const uint8_t* plane, int hr, typename S::VI* w) {
  for (int h = 0; h < 4; ++h) {
    typename S::VI p = S::load(plane + 64 * h + 4 * hr);
    w[h] = S::nib_lo(p);
    w[h + 4] = S::nib_hi(p);
  }
}

template <class S>
inline void add_bits4(const uint8_t* masks, int hr, typename S::VI* w) {
  for (int g = 0; g < 8; ++g) w[g] = S::add_bit4(w[g], masks + 8 * g + hr / 2);
}

// N code vectors' dot products with one activation row's codes from element `at` on; with two
// passes the row's residual codes too, combined as 256 * dot(q) + dot(q2) (qmatmul.h, Activations).
template <class S, int QMAX, int N, bool TWO>
inline typename S::VI dot_row(const typename S::VI* w, const Activations& a, int64_t at) {
  typename S::VI s = S::template dot<QMAX, N>(w, a.q + at);
  if constexpr (TWO) s = S::shl8_add(s, S::template dot<QMAX, N>(w, a.q2 + at));
  return s;
}

// Per activation row: the block's int32 dot products, corrected by the code offset, scaled by
// d_w * d_x, plus min * d_x * sum(q) where the format has a min.
template <class S, int QMAX, bool OFFSET, bool MIN, int MR, bool TWO>
inline void rows_block(const typename S::VI* w, typename S::VF dw, typename S::VF mw, const Activations& a,
                       int64_t m0, int64_t b, int64_t blocks, typename S::VF* acc) {
  for (int r = 0; r < MR; ++r) {
    const int64_t idx = (m0 + r) * blocks + b;
    typename S::VI s = dot_row<S, QMAX, 8, TWO>(w, a, (m0 + r) * a.k + 32 * b);
    if (OFFSET) s = S::sub_bcast(s, a.c[2 * idx]);
    acc[r] = S::fma(S::cvt(s), S::mul(dw, S::set1(a.d[idx])), acc[r]);
    if (MIN) acc[r] = S::fma(mw, S::set1(a.s[idx]), acc[r]);
  }
}

template <class S, int F, int MR, bool TWO>
inline void legacy_group(const uint8_t* g, int hr, const Activations& a, int64_t m0, int64_t b, int64_t blocks,
                         typename S::VF* acc) {
  using VI = typename S::VI;
  using VF = typename S::VF;
  VI w[8];
  VF mw = S::zero();
  if constexpr (F == kQ8_0) {
    for (int i = 0; i < 8; ++i) {
      w[i] = S::load(g + q8_0::V + 64 * i + 4 * hr);
      if constexpr (S::kVnni) w[i] = S::flip_sign(w[i]);  // int8 -> uint8 code + 128 for vpdpbusd
    }
    VF dw = S::load_f16(g + q8_0::D + 2 * hr);
    if constexpr (S::kVnni) rows_block<S, 255, true, false, MR, TWO>(w, dw, mw, a, m0, b, blocks, acc);
    else rows_block<S, -1, false, false, MR, TWO>(w, dw, mw, a, m0, b, blocks, acc);
  } else if constexpr (F == kQ4_0) {
    unpack4<S>(g + q4_0::P, hr, w);
    rows_block<S, 15, true, false, MR, TWO>(w, S::load_f16(g + q4_0::D + 2 * hr), mw, a, m0, b, blocks, acc);
  } else if constexpr (F == kQ4_1) {
    unpack4<S>(g + q4_1::P, hr, w);
    mw = S::load_f16(g + q4_1::M + 2 * hr);
    rows_block<S, 15, false, true, MR, TWO>(w, S::load_f16(g + q4_1::D + 2 * hr), mw, a, m0, b, blocks, acc);
  } else if constexpr (F == kQ5_0) {
    unpack4<S>(g + q5_0::P, hr, w);
    add_bits4<S>(g + q5_0::H, hr, w);
    rows_block<S, 31, true, false, MR, TWO>(w, S::load_f16(g + q5_0::D + 2 * hr), mw, a, m0, b, blocks, acc);
  } else if constexpr (F == kQ5_1) {
    unpack4<S>(g + q5_1::P, hr, w);
    add_bits4<S>(g + q5_1::H, hr, w);
    mw = S::load_f16(g + q5_1::M + 2 * hr);
    rows_block<S, 31, false, true, MR, TWO>(w, S::load_f16(g + q5_1::D + 2 * hr), mw, a, m0, b, blocks, acc);
  }
}

// How far ahead of the group being multiplied the kernel asks for weights (8 KiB: 2-16 KiB measured
// alike on Zen 5 at 1-16 rows; none read a 16-row two-pass call at half the speed).
constexpr int64_t kPrefetchAhead = 8192;

// The prefetch for part j of 8 of a group: a K-quant super-block (2-3 KiB) asked for in one burst
// of ~40 lines outran the core's miss buffers (one core read Q4_K at 12 GB/s, Q4_0 at 20).
template <int F>
inline void prefetch_part(const uint8_t* g, int j) {
  constexpr int64_t part = (kGroupBytes[F] / 8 + 63) / 64 * 64;
  const uint8_t* p = g + kPrefetchAhead + j * part;
  for (int64_t o = 0; o < part; o += 64) __builtin_prefetch(p + o);
}

// Q4_K / Q5_K: eight 32-weight blocks, each with its own uint8 scale and min under the super-block's
// float16 d and dmin: w = d * sc * code - dmin * mn.
template <class S, int F, int MR, bool TWO>
inline void k45_group(const uint8_t* g, int hr, const Activations& a, int64_t m0, int64_t b0, int64_t blocks,
                      typename S::VF* acc) {
  using VI = typename S::VI;
  using VF = typename S::VF;
  constexpr bool five = F == kQ5_K;
  constexpr int sub_bytes = five ? q5_k::SUB_BYTES : q4_k::SUB_BYTES;
  const VF d = S::load_f16(g + q4_k::D + 2 * hr);
  const VF dmin = S::load_f16(g + q4_k::DMIN + 2 * hr);
  for (int j = 0; j < 8; ++j) {
    prefetch_part<F>(g, j);
    VI w[8];
    const uint8_t* sub = g + q4_k::SUB + j * sub_bytes;
    unpack4<S>(sub, hr, w);
    if (five) add_bits4<S>(sub + q5_k::H, hr, w);
    const VF dw = S::mul(d, S::load_u8(g + q4_k::SC + 16 * j + hr));
    const VF mw = S::mul(dmin, S::load_u8(g + q4_k::MN + 16 * j + hr));
    const int64_t b = b0 + j;
    for (int r = 0; r < MR; ++r) {
      const int64_t idx = (m0 + r) * blocks + b;
      typename S::VI s = dot_row<S, five ? 31 : 15, 8, TWO>(w, a, (m0 + r) * a.k + 32 * b);
      acc[r] = S::fma(S::cvt(s), S::mul(dw, S::set1(a.d[idx])), acc[r]);
      acc[r] = S::fnma(mw, S::set1(a.s[idx]), acc[r]);
    }
  }
}

// Q6_K: sixteen 16-weight sub-blocks with int8 scales under a float16 d: w = d * sc * (code - 32).
template <class S, int MR, bool TWO>
inline void q6k_group(const uint8_t* g, int hr, const Activations& a, int64_t m0, int64_t b0, int64_t blocks,
                      typename S::VF* acc) {
  using VI = typename S::VI;
  using VF = typename S::VF;
  const VF d = S::load_f16(g + q6_k::D + 2 * hr);
  for (int j = 0; j < 8; ++j) {
    prefetch_part<kQ6_K>(g, j);
    VI w[8];
    const uint8_t* sub = g + q6_k::SUB + j * q6_k::SUB_BYTES;
    unpack4<S>(sub, hr, w);
    const VI h0 = S::load(sub + q6_k::H6 + 4 * hr);
    const VI h1 = S::load(sub + q6_k::H6 + 64 + 4 * hr);
    w[0] = S::orv(w[0], S::template bits45<0>(h0));
    w[1] = S::orv(w[1], S::template bits45<1>(h0));
    w[2] = S::orv(w[2], S::template bits45<2>(h0));
    w[3] = S::orv(w[3], S::template bits45<3>(h0));
    w[4] = S::orv(w[4], S::template bits45<0>(h1));
    w[5] = S::orv(w[5], S::template bits45<1>(h1));
    w[6] = S::orv(w[6], S::template bits45<2>(h1));
    w[7] = S::orv(w[7], S::template bits45<3>(h1));
    const VF dlo = S::mul(d, S::load_i8(g + q6_k::SC + 16 * (2 * j) + hr));
    const VF dhi = S::mul(d, S::load_i8(g + q6_k::SC + 16 * (2 * j + 1) + hr));
    const int64_t b = b0 + j;
    for (int r = 0; r < MR; ++r) {
      const int64_t idx = (m0 + r) * blocks + b;
      const int64_t at = (m0 + r) * a.k + 32 * b;
      VI slo = S::sub_bcast(dot_row<S, 63, 4, TWO>(w, a, at), a.c[2 * idx]);
      VI shi = S::sub_bcast(dot_row<S, 63, 4, TWO>(w + 4, a, at + 16), a.c[2 * idx + 1]);
      const VF dx = S::set1(a.d[idx]);
      acc[r] = S::fma(S::cvt(slo), S::mul(dlo, dx), acc[r]);
      acc[r] = S::fma(S::cvt(shi), S::mul(dhi, dx), acc[r]);
    }
  }
}

// MR activation rows [m0, m0 + MR) against H register row-halves of one tile (from row hr0), over all
// of K. H = 2 (AVX2's two halves of a tile at once) reads each group once where H = 1 reads the tile
// twice, the second time from cache while memory idles: the few-row calls that memory bounds.
template <class S, int F, int MR, bool TWO, int H>
void tile_rows(const uint8_t* tile, int hr0, const Activations& a, int64_t m0, float* y, int64_t ldy,
               const int* nvalid, const int32_t* out_rows) {
  typename S::VF acc[H][MR];
  for (int h = 0; h < H; ++h)
    for (int r = 0; r < MR; ++r) acc[h][r] = S::zero();
  const int64_t blocks = a.k / kBlock;
  constexpr int64_t gw = kGroupWeights[F];
  constexpr int64_t gb = kGroupBytes[F];
  const int64_t groups = a.k / gw;
  for (int64_t i = 0; i < groups; ++i) {
    const uint8_t* g = tile + i * gb;
    // with a few rows' work per byte the hardware prefetcher falls behind (a 16-row call read its
    // weights at 8 GB/s): ask for the bytes kPrefetchAhead on, which past the tile's end are the next
    // tile's (stored right after it; a prefetch past the matrix's end is harmless)
    if constexpr (kGroupWeights[F] == kBlock)
      for (int64_t o = 0; o < gb; o += 64) __builtin_prefetch(g + kPrefetchAhead + o);
    for (int h = 0; h < H; ++h) {
      const int hr = hr0 + h * S::R;
      if constexpr (F == kQ4_K || F == kQ5_K) k45_group<S, F, MR, TWO>(g, hr, a, m0, 8 * i, blocks, acc[h]);
      else if constexpr (F == kQ6_K) q6k_group<S, MR, TWO>(g, hr, a, m0, 8 * i, blocks, acc[h]);
      else legacy_group<S, F, MR, TWO>(g, hr, a, m0, i, blocks, acc[h]);
    }
  }
  for (int h = 0; h < H; ++h) {
    if (nvalid[h] <= 0) continue;
    for (int r = 0; r < MR; ++r)
      S::store(y + h * S::R + (out_rows != nullptr ? out_rows[m0 + r] : m0 + r) * ldy, acc[h][r], nvalid[h]);
  }
}

template <class S, int F, bool TWO>
void matmul_tiles_fmt(const MatmulArgs& args, int64_t t0, int64_t t1, int64_t m0, int64_t m1) {
  constexpr int halves = kTileRows / S::R;
  for (int64_t t = t0; t < t1; ++t) {
    const uint8_t* tile = args.w + t * args.tile_bytes;
    int nvalid[halves];
    for (int h = 0; h < halves; ++h)
      nvalid[h] = static_cast<int>(std::clamp<int64_t>(args.n - t * kTileRows - h * S::R, 0, S::R));
    float* y = args.y + t * kTileRows;
    // (K-quant groups are prefetched in parts as they are read, and measured no faster this way)
    if constexpr (halves == 2 && kGroupWeights[F] == kBlock) {
      if (m1 - m0 <= 2) {  // both halves in one pass over the tile (tile_rows)
        if (m1 - m0 == 2) tile_rows<S, F, 2, TWO, 2>(tile, 0, args.a, m0, y, args.n, nvalid, args.out_rows);
        else tile_rows<S, F, 1, TWO, 2>(tile, 0, args.a, m0, y, args.n, nvalid, args.out_rows);
        continue;
      }
    }
    for (int h = 0; h < halves; ++h) {
      if (nvalid[h] <= 0) break;
      const int hr = h * S::R;
      float* yh = y + hr;
      const int* nv = nvalid + h;
      int64_t m = m0;
      constexpr int mr = S::kMaxRows;  // a power of two
      static_assert(mr >= 1 && mr <= 16 && (mr & (mr - 1)) == 0);
      for (; m + mr <= m1; m += mr) tile_rows<S, F, mr, TWO, 1>(tile, hr, args.a, m, yh, args.n, nv, args.out_rows);
      // the remainder (< mr) in powers of two: each pass re-reads the (cached) tile
      if constexpr (mr > 8) if (m + 8 <= m1) { tile_rows<S, F, 8, TWO, 1>(tile, hr, args.a, m, yh, args.n, nv, args.out_rows); m += 8; }
      if constexpr (mr > 4) if (m + 4 <= m1) { tile_rows<S, F, 4, TWO, 1>(tile, hr, args.a, m, yh, args.n, nv, args.out_rows); m += 4; }
      if constexpr (mr > 2) if (m + 2 <= m1) { tile_rows<S, F, 2, TWO, 1>(tile, hr, args.a, m, yh, args.n, nv, args.out_rows); m += 2; }
      if constexpr (mr > 1) if (m < m1) tile_rows<S, F, 1, TWO, 1>(tile, hr, args.a, m, yh, args.n, nv, args.out_rows);
    }
  }
}

template <bool TWO>
void matmul_tiles_two(const MatmulArgs& args, int64_t t0, int64_t t1, int64_t m0, int64_t m1) {
  switch (args.format) {
    case kQ8_0: return matmul_tiles_fmt<Isa, kQ8_0, TWO>(args, t0, t1, m0, m1);
    case kQ4_0: return matmul_tiles_fmt<Isa, kQ4_0, TWO>(args, t0, t1, m0, m1);
    case kQ4_1: return matmul_tiles_fmt<Isa, kQ4_1, TWO>(args, t0, t1, m0, m1);
    case kQ5_0: return matmul_tiles_fmt<Isa, kQ5_0, TWO>(args, t0, t1, m0, m1);
    case kQ5_1: return matmul_tiles_fmt<Isa, kQ5_1, TWO>(args, t0, t1, m0, m1);
    case kQ4_K: return matmul_tiles_fmt<Isa, kQ4_K, TWO>(args, t0, t1, m0, m1);
    case kQ5_K: return matmul_tiles_fmt<Isa, kQ5_K, TWO>(args, t0, t1, m0, m1);
    case kQ6_K: return matmul_tiles_fmt<Isa, kQ6_K, TWO>(args, t0, t1, m0, m1);
    default: return;
  }
}

void matmul_tiles(const MatmulArgs& args, int64_t t0, int64_t t1, int64_t m0, int64_t m1) {
  if (args.a.q2 != nullptr) matmul_tiles_two<true>(args, t0, t1, m0, m1);
  else matmul_tiles_two<false>(args, t0, t1, m0, m1);
}

template <class T>
void quantize_rows_t(const T* x, int64_t r0, int64_t r1, int64_t k, int offset, bool halves, int8_t* q, int8_t* q2,
                     float* d, float* s, int32_t* c) {
  const int64_t blocks = k / kBlock;
  for (int64_t r = r0; r < r1; ++r) {
    for (int64_t b = 0; b < blocks; ++b) {
      const int64_t idx = r * blocks + b, at = r * k + 32 * b;
      int32_t sums[4];
      Isa::quantize_block(x + at, q + at, q2 != nullptr ? q2 + at : nullptr, &d[idx], sums);
      if (q2 != nullptr) {  // the combined codes 256 q + q2 at d / 256 (qmatmul.h, Activations)
        sums[0] = 256 * sums[0] + sums[2];
        sums[1] = 256 * sums[1] + sums[3];
        d[idx] *= 1.0f / 256.0f;
      }
      s[idx] = d[idx] * static_cast<float>(sums[0] + sums[1]);
      c[2 * idx] = halves ? offset * sums[0] : offset * (sums[0] + sums[1]);
      c[2 * idx + 1] = halves ? offset * sums[1] : 0;
    }
  }
}

void quantize_rows(const void* x, bool bf16, int64_t r0, int64_t r1, int64_t k, int offset, bool halves, int8_t* q,
                   int8_t* q2, float* d, float* s, int32_t* c) {
  if (bf16) quantize_rows_t(static_cast<const uint16_t*>(x), r0, r1, k, offset, halves, q, q2, d, s, c);
  else quantize_rows_t(static_cast<const float*>(x), r0, r1, k, offset, halves, q, q2, d, s, c);
}
