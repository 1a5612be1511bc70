// XLA FFI custom call: decode rows' Gated DeltaNet step (ops/gated_delta.py gated_delta_step), each
// row's state read and written where it lives in the engine's state array (kv/recurrent.py).
//
//   vsurge_gated_delta_decode: states (S, Hv, dk, dv) float32 or bfloat16, aliased to result 1;
//     q, k (R, Hk, dk) f32 (q already scaled by dk^-0.5); v (R, Hv, dv) f32; g, beta (R, Hv) f32
//     (0 and 0 for a token that must leave its state as it was); slot (R,) s32; fresh (R,) s32
//     (nonzero: the row starts its sequence, from a zero state)
//     -> out (R, Hv, dv) f32, states. A row whose slot is out of range is skipped (out 0).
//
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

#include "thread_pool.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace vsurge {
namespace {

inline float widen(uint16_t b) {
  const uint32_t bits = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

inline uint16_t narrow(float f) {  // round to nearest even, as XLA's convert
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  return static_cast<uint16_t>((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16);
}

struct Job {
  void* states;
  bool bf16;
  const float *q, *k, *v, *g, *beta;
  const int32_t *slot, *fresh;
  float* out;
  int64_t S, R, Hk, Hv, dk, dv;
};

// One (row, value head) pair: the state S (dk, dv) of type T.
template <typename T>
void one_head(const Job& j, int64_t r, int64_t h, T* S) {
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
        if constexpr (sizeof(T) == 2) s = widen(row[c]); else s = row[c];
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
        if constexpr (sizeof(T) == 2) s = widen(row[c]); else s = row[c];
      }
      const float updated = s * decay + ki * delta[c];
      if constexpr (sizeof(T) == 2) row[c] = narrow(updated); else row[c] = updated;
    }
  }
}

void items(void* ctx, int64_t begin, int64_t end) {
  const Job& j = *static_cast<const Job*>(ctx);
  const int64_t state = j.Hv * j.dk * j.dv;
  for (int64_t item = begin; item < end; ++item) {
    const int64_t r = item / j.Hv, h = item % j.Hv, slot = j.slot[r];
    if (slot < 0 || slot >= j.S) {
      std::memset(j.out + (r * j.Hv + h) * j.dv, 0, j.dv * sizeof(float));
      continue;
    }
    const int64_t at = slot * state + h * j.dk * j.dv;
    if (j.bf16) one_head(j, r, h, static_cast<uint16_t*>(j.states) + at);
    else one_head(j, r, h, static_cast<float*>(j.states) + at);
  }
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

#pragma GCC visibility pop
