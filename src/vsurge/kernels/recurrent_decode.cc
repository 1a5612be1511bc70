// XLA FFI custom calls for decode rows of recurrent layers, each row's state read and written where it
// lives in the paged engine's state array (kv/recurrent.py), at the row's slot:
//
//   vsurge_gated_delta_decode: states (S, Hv, dk, dv) float32 or bfloat16, aliased to result 1;
//     q, k (R, Hk, dk) f32 (q already scaled by dk^-0.5); v (R, Hv, dv) f32; g, beta (R, Hv) f32
//     (0 and 0 for a token that must leave its state as it was); slot (R,) s32; fresh (R,) s32
//     (nonzero: the row starts its sequence, from a zero state)
//     -> out (R, Hv, dv) f32, states. A row whose slot is out of range is skipped (out 0).
//   vsurge_conv_decode (ops/short_conv.py causal_conv_step): windows (S, K-1, C) float32 or bfloat16,
//     aliased to result 1; x (R, C) f32; taps (K, C) f32 (the weight transposed); bias (C,) f32;
//     slot, fresh, valid (R,) s32 -> y (R, C) f32, windows: y = sum_j taps[j] * [window; x][j] + bias,
//     and a valid row's window shifts x in (a fresh row's from zeros). XLA updated the windows row by
//     row with a copy of each, or gathered and scattered them all (a copy of the whole array).
//
// Gated DeltaNet:
// Per row and value head: read = [k; q]^T S in one pass over S, delta = (v - a k^T S) beta with
// a = exp(g), out = a q^T S + (q . k) delta, S' = a S + k delta^T in a second pass over the same
// 64 KiB (still in cache). XLA:CPU made four passes over each state (and with bfloat16 states it
// converted them element by element, slower than the float32 bytes they saved); here the state's
// bytes cross memory once each way, which is what a 32-row decode step of a Qwen3.5-shaped model
// is bound by (benchmarks/hybrid_decode.py).
#pragma GCC target("avx2,fma,f16c")
#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "bf16.h"
#include "isa.h"
#include "thread_pool.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace vsurge {
namespace {

struct Job {
  void* states;
  bool bf16;
  const float *q, *k, *v, *g, *beta;
  const int32_t *slot, *fresh;
  float* out;
  int64_t S, R, Hk, Hv, dk, dv;
};

// One (row, value head) pair: the state S (dk, dv) of type T. Plain loops the compiler vectorizes,
// compiled twice (below): for AVX2 + FMA (the file's target) and for AVX-512.
template <typename T>
inline __attribute__((always_inline)) void one_head(const Job& j, int64_t r, int64_t h, T* S) {
  const int64_t dk = j.dk, dv = j.dv, kh = h / (j.Hv / j.Hk);
  const float* q = j.q + (r * j.Hk + kh) * dk;
  const float* k = j.k + (r * j.Hk + kh) * dk;
  const float* v = j.v + (r * j.Hv + h) * dv;
  float* out = j.out + (r * j.Hv + h) * dv;
  const float decay = std::exp(j.g[r * j.Hv + h]), beta = j.beta[r * j.Hv + h];
  const bool fresh = j.fresh[r] != 0;
  thread_local std::vector<float> buffer;
  buffer.assign(3 * dv, 0.0f);
  float *read_k = buffer.data(), *read_q = read_k + dv, *delta = read_q + dv;
  float qk = 0.0f;
  for (int64_t i = 0; i < dk; ++i) qk += q[i] * k[i];
  if (!fresh) {
    for (int64_t i = 0; i < dk; ++i) {
      const T* row = S + i * dv;
      const float ki = k[i], qi = q[i];
      for (int64_t c = 0; c < dv; ++c) {
        float s;
        if constexpr (sizeof(T) == 2) s = bf16_to_f32(row[c]); else s = row[c];
        read_k[c] += ki * s;
        read_q[c] += qi * s;
      }
    }
  }
  for (int64_t c = 0; c < dv; ++c) {
    delta[c] = (v[c] - decay * read_k[c]) * beta;
    out[c] = decay * read_q[c] + qk * delta[c];
  }
  for (int64_t i = 0; i < dk; ++i) {
    T* row = S + i * dv;
    const float ki = k[i];
    for (int64_t c = 0; c < dv; ++c) {
      float s = 0.0f;
      if (!fresh) {
        if constexpr (sizeof(T) == 2) s = bf16_to_f32(row[c]); else s = row[c];
      }
      const float updated = s * decay + ki * delta[c];
      if constexpr (sizeof(T) == 2) row[c] = f32_to_bf16(updated); else row[c] = updated;
    }
  }
}

template <typename T>
inline __attribute__((always_inline)) void delta_items(const Job& j, int64_t begin, int64_t end) {
  const int64_t state = j.Hv * j.dk * j.dv;
  for (int64_t item = begin; item < end; ++item) {
    const int64_t r = item / j.Hv, h = item % j.Hv, slot = j.slot[r];
    if (slot < 0 || slot >= j.S) {
      std::memset(j.out + (r * j.Hv + h) * j.dv, 0, j.dv * sizeof(float));
      continue;
    }
    one_head(j, r, h, static_cast<T*>(j.states) + slot * state + h * j.dk * j.dv);
  }
}

void delta_f32(const Job& j, int64_t b, int64_t e) { delta_items<float>(j, b, e); }
void delta_bf16(const Job& j, int64_t b, int64_t e) { delta_items<uint16_t>(j, b, e); }
// (AVX-512: ~13% less time for bfloat16 states than the AVX2 loops in an ad hoc timing, 38 -> 33 ms for
// 18 layers at 32 rows: the widening and rounding keep the loops busy)
VSURGE_WIDE void delta_f32_wide(const Job& j, int64_t b, int64_t e) { delta_items<float>(j, b, e); }
VSURGE_WIDE void delta_bf16_wide(const Job& j, int64_t b, int64_t e) { delta_items<uint16_t>(j, b, e); }

void items(void* ctx, int64_t begin, int64_t end) {
  const Job& j = *static_cast<const Job*>(ctx);
  if (avx512_usable()) (j.bf16 ? delta_bf16_wide : delta_f32_wide)(j, begin, end);
  else (j.bf16 ? delta_bf16 : delta_f32)(j, begin, end);
}

ffi::Error gated_delta_decode_impl(ffi::AnyBuffer states, ffi::Buffer<ffi::F32> q, ffi::Buffer<ffi::F32> k,
                                   ffi::Buffer<ffi::F32> v, ffi::Buffer<ffi::F32> g, ffi::Buffer<ffi::F32> beta,
                                   ffi::Buffer<ffi::S32> slot, ffi::Buffer<ffi::S32> fresh,
                                   ffi::ResultBuffer<ffi::F32> out, ffi::Result<ffi::AnyBuffer> new_states) {
  const auto sd = states.dimensions(), qd = q.dimensions(), vd = v.dimensions();
  const bool bf16 = states.element_type() == ffi::DataType::BF16;
  if (sd.size() != 4 || qd.size() != 3 || vd.size() != 3 || (!bf16 && states.element_type() != ffi::DataType::F32))
    return ffi::Error::InvalidArgument("vsurge_gated_delta_decode: states (S, Hv, dk, dv) float32 or bfloat16, "
                                       "q, k (R, Hk, dk), v (R, Hv, dv)");
  const int64_t S = sd[0], Hv = sd[1], dk = sd[2], dv = sd[3], R = qd[0], Hk = qd[1];
  if (qd[2] != dk || vd[0] != R || vd[1] != Hv || vd[2] != dv || Hk == 0 || Hv % Hk != 0 ||
      k.element_count() != q.element_count() || static_cast<int64_t>(g.element_count()) != R * Hv ||
      static_cast<int64_t>(beta.element_count()) != R * Hv || static_cast<int64_t>(slot.element_count()) != R ||
      static_cast<int64_t>(fresh.element_count()) != R)
    return ffi::Error::InvalidArgument("vsurge_gated_delta_decode: shapes do not agree");
  if (new_states->untyped_data() != states.untyped_data())  // not aliased: start from a copy
    std::memcpy(new_states->untyped_data(), states.untyped_data(), states.size_bytes());
  Job job{new_states->untyped_data(), bf16, q.typed_data(), k.typed_data(), v.typed_data(), g.typed_data(),
          beta.typed_data(), slot.typed_data(), fresh.typed_data(), out->typed_data(), S, R, Hk, Hv, dk, dv};
  kernel_pool().parallel_for(R * Hv, 1, items, &job);
  return ffi::Error::Success();
}

struct ConvJob {
  void* windows;
  bool bf16;
  const float *x, *taps, *bias;
  const int32_t *slot, *fresh, *valid;
  float* y;
  int64_t S, K, C;
};

template <typename T>
inline __attribute__((always_inline)) void conv_row(const ConvJob& j, int64_t r, T* w) {  // w: the row's window (K-1, C)
  const int64_t K = j.K, C = j.C;
  const float* x = j.x + r * C;
  float* y = j.y + r * C;
  const bool fresh = j.fresh[r] != 0;
  for (int64_t c = 0; c < C; ++c) y[c] = j.bias[c] + j.taps[(K - 1) * C + c] * x[c];
  if (!fresh) {
    for (int64_t t = 0; t < K - 1; ++t) {
      const T* row = w + t * C;
      const float* tap = j.taps + t * C;
      for (int64_t c = 0; c < C; ++c) {
        float s;
        if constexpr (sizeof(T) == 2) s = bf16_to_f32(row[c]); else s = row[c];
        y[c] += tap[c] * s;
      }
    }
  }
  if (j.valid[r] == 0) return;  // (its window stays)
  for (int64_t t = 0; t < K - 1; ++t) {
    T* row = w + t * C;
    if (t + 1 < K - 1) {
      if (fresh) std::memset(row, 0, C * sizeof(T));
      else std::memcpy(row, w + (t + 1) * C, C * sizeof(T));
    } else {
      for (int64_t c = 0; c < C; ++c) {
        if constexpr (sizeof(T) == 2) row[c] = f32_to_bf16(x[c]); else row[c] = x[c];
      }
    }
  }
}

void conv_items(void* ctx, int64_t begin, int64_t end) {
  const ConvJob& j = *static_cast<const ConvJob*>(ctx);
  for (int64_t r = begin; r < end; ++r) {
    const int64_t slot = j.slot[r];
    if (slot < 0 || slot >= j.S) {
      std::memset(j.y + r * j.C, 0, j.C * sizeof(float));
      continue;
    }
    const int64_t at = slot * (j.K - 1) * j.C;
    if (j.bf16) conv_row(j, r, static_cast<uint16_t*>(j.windows) + at);
    else conv_row(j, r, static_cast<float*>(j.windows) + at);
  }
}

ffi::Error conv_decode_impl(ffi::AnyBuffer windows, ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::F32> taps,
                            ffi::Buffer<ffi::F32> bias, ffi::Buffer<ffi::S32> slot, ffi::Buffer<ffi::S32> fresh,
                            ffi::Buffer<ffi::S32> valid, ffi::ResultBuffer<ffi::F32> y,
                            ffi::Result<ffi::AnyBuffer> new_windows) {
  const auto wd = windows.dimensions(), xd = x.dimensions(), td = taps.dimensions();
  const bool bf16 = windows.element_type() == ffi::DataType::BF16;
  if (wd.size() != 3 || xd.size() != 2 || td.size() != 2 || (!bf16 && windows.element_type() != ffi::DataType::F32))
    return ffi::Error::InvalidArgument("vsurge_conv_decode: windows (S, K-1, C) float32 or bfloat16, x (R, C), "
                                       "taps (K, C)");
  const int64_t S = wd[0], C = wd[2], R = xd[0], K = td[0];
  if (wd[1] != K - 1 || K < 2 || xd[1] != C || td[1] != C || static_cast<int64_t>(bias.element_count()) != C ||
      static_cast<int64_t>(slot.element_count()) != R || static_cast<int64_t>(fresh.element_count()) != R ||
      static_cast<int64_t>(valid.element_count()) != R)
    return ffi::Error::InvalidArgument("vsurge_conv_decode: shapes do not agree");
  if (new_windows->untyped_data() != windows.untyped_data())  // not aliased: start from a copy
    std::memcpy(new_windows->untyped_data(), windows.untyped_data(), windows.size_bytes());
  ConvJob job{new_windows->untyped_data(), bf16, x.typed_data(), taps.typed_data(), bias.typed_data(),
              slot.typed_data(), fresh.typed_data(), valid.typed_data(), y->typed_data(), S, K, C};
  kernel_pool().parallel_for(R, 1, conv_items, &job);
  return ffi::Error::Success();
}

}  // namespace
}  // namespace vsurge

#pragma GCC visibility push(default)

XLA_FFI_DEFINE_HANDLER_SYMBOL(vsurge_gated_delta_decode_ffi, vsurge::gated_delta_decode_impl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::AnyBuffer>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(vsurge_conv_decode_ffi, vsurge::conv_decode_impl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::AnyBuffer>());

#pragma GCC visibility pop
