// XLA FFI custom call: the routed experts' gated MLPs of a few rows (decode), each expert's weights
// read where they lie in the stack (ops/moe.py `_loop` on CPU).
//
//   vsurge_moe_experts: x (A, D) f32, the assignments' rows sorted by expert; counts (E,) s32, rows of
//     each expert in that order (rows past their sum belong to no expert here: 0); w_gate_up (E, D, 2F)
//     and w_down (E, F, D), both bfloat16 (or its bits as u16) or both f32, gate/up interleaved
//     (column 2j the gate of unit j, 2j + 1 its up) -> y (A, D) f32: down(silu(gate) * up) per row.
//
// XLA sliced each used expert out of the stack (a copy) and multiplied the copy with a one-row dot
// in a while loop: ~26 ms of a 50 ms one-row decode step of a ~0.5B Qwen3-Next whose Q8_0 experts
// load as bfloat16 (benchmarks/profile_step.py). Here each expert's weights are read once, widened a
// row at a time, for all of its rows.
#pragma GCC target("avx2,fma,f16c")
#include <immintrin.h>

#include <algorithm>
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
  const float* x;
  const int32_t *start, *count;  // per active expert (its position among E, its first row, its rows)
  const int32_t* expert;
  const void *gate_up, *down;
  bool bf16;
  float* y;
  int64_t D, F;
};

template <typename T>
inline __attribute__((always_inline)) void row_f32(const T* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    if constexpr (sizeof(T) == 2) dst[i] = bf16_to_f32(src[i]); else dst[i] = src[i];
  }
}

// out (M, N) += in (M, K) w (K, N), w of type T: four weight rows widened at a time, so each pass over
// an output row does four multiply-adds per load and store of it.
template <typename T>
inline __attribute__((always_inline)) void accumulate(const float* in, int64_t m, int64_t K, const T* w, int64_t N,
                                                      float* out, std::vector<float>& rows) {
  rows.resize(4 * N);
  float *w0 = rows.data(), *w1 = w0 + N, *w2 = w1 + N, *w3 = w2 + N;
  int64_t i = 0;
  for (; i + 4 <= K; i += 4) {
    row_f32(w + i * N, w0, 4 * N);
    for (int64_t r = 0; r < m; ++r) {
      const float a0 = in[r * K + i], a1 = in[r * K + i + 1], a2 = in[r * K + i + 2], a3 = in[r * K + i + 3];
      float* o = out + r * N;
      for (int64_t c = 0; c < N; ++c) o[c] += a0 * w0[c] + a1 * w1[c] + a2 * w2[c] + a3 * w3[c];
    }
  }
  for (; i < K; ++i) {
    row_f32(w + i * N, w0, N);
    for (int64_t r = 0; r < m; ++r) {
      const float a = in[r * K + i];
      float* o = out + r * N;
      for (int64_t c = 0; c < N; ++c) o[c] += a * w0[c];
    }
  }
}

// rows x (M, D) through expert weights gu (D, 2F), dn (F, D) -> y (M, D).
template <typename T>
inline __attribute__((always_inline)) void one_expert(const Job& j, const float* x, int64_t m, const T* gu,
                                                      const T* dn, float* y) {
  const int64_t D = j.D, F = j.F;
  thread_local std::vector<float> h, g, rows;
  h.assign(m * 2 * F, 0.0f);
  g.resize(m * F);
  accumulate(x, m, D, gu, 2 * F, h.data(), rows);  // h = x gu: each weight row read once, for every row
  for (int64_t r = 0; r < m * F; ++r) {  // silu(gate) * up
    const float gate = h[2 * r], up = h[2 * r + 1];
    g[r] = gate / (1.0f + std::exp(-gate)) * up;
  }
  std::fill(y, y + m * D, 0.0f);
  accumulate(g.data(), m, F, dn, D, y, rows);  // y = g dn
}

template <typename T>
inline __attribute__((always_inline)) void experts_items(const Job& j, int64_t begin, int64_t end) {
  const int64_t D = j.D, F = j.F;
  for (int64_t a = begin; a < end; ++a) {
    const int64_t e = j.expert[a], first = j.start[a];
    const T* gu = static_cast<const T*>(j.gate_up) + e * D * 2 * F;
    const T* dn = static_cast<const T*>(j.down) + e * F * D;
    one_expert(j, j.x + first * D, j.count[a], gu, dn, j.y + first * D);
  }
}

void items_f32(const Job& j, int64_t b, int64_t e) { experts_items<float>(j, b, e); }
void items_bf16(const Job& j, int64_t b, int64_t e) { experts_items<uint16_t>(j, b, e); }
VSURGE_WIDE void items_f32_wide(const Job& j, int64_t b, int64_t e) { experts_items<float>(j, b, e); }
VSURGE_WIDE void items_bf16_wide(const Job& j, int64_t b, int64_t e) { experts_items<uint16_t>(j, b, e); }

void items(void* ctx, int64_t begin, int64_t end) {
  const Job& j = *static_cast<const Job*>(ctx);
  if (avx512_usable()) (j.bf16 ? items_bf16_wide : items_f32_wide)(j, begin, end);
  else (j.bf16 ? items_bf16 : items_f32)(j, begin, end);
}

bool half_bits(ffi::DataType t) { return t == ffi::DataType::BF16 || t == ffi::DataType::U16; }

ffi::Error moe_experts_impl(ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::S32> counts, ffi::AnyBuffer gate_up,
                            ffi::AnyBuffer down, ffi::ResultBuffer<ffi::F32> y) {
  const auto xd = x.dimensions(), gd = gate_up.dimensions(), dd = down.dimensions();
  const bool bf16 = half_bits(gate_up.element_type()) && half_bits(down.element_type());
  const bool f32 = gate_up.element_type() == ffi::DataType::F32 && down.element_type() == ffi::DataType::F32;
  if (xd.size() != 2 || gd.size() != 3 || dd.size() != 3 || !(bf16 || f32))
    return ffi::Error::InvalidArgument("vsurge_moe_experts: x (A, D), w_gate_up (E, D, 2F) and w_down (E, F, D), "
                                       "both bfloat16 or both float32");
  const int64_t A = xd[0], D = xd[1], E = gd[0], F = dd[1];
  if (gd[1] != D || gd[2] != 2 * F || dd[0] != E || dd[2] != D || static_cast<int64_t>(counts.element_count()) != E)
    return ffi::Error::InvalidArgument("vsurge_moe_experts: shapes do not agree");
  thread_local std::vector<int32_t> expert, start, count;
  expert.clear(), start.clear(), count.clear();
  int64_t row = 0;
  for (int64_t e = 0; e < E && row < A; ++e) {
    const int64_t n = std::min<int64_t>(std::max(counts.typed_data()[e], 0), A - row);
    if (n > 0) expert.push_back(e), start.push_back(row), count.push_back(n);
    row += n;
  }
  float* out = y->typed_data();
  std::memset(out + row * D, 0, (A - row) * D * sizeof(float));  // rows of no expert here
  Job job{x.typed_data(), start.data(), count.data(), expert.data(), gate_up.untyped_data(), down.untyped_data(),
          bf16, out, D, F};
  kernel_pool().parallel_for(static_cast<int64_t>(expert.size()), 1, items, &job);
  return ffi::Error::Success();
}

}  // namespace
}  // namespace vsurge

#pragma GCC visibility push(default)

XLA_FFI_DEFINE_HANDLER_SYMBOL(vsurge_moe_experts_ffi, vsurge::moe_experts_impl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::Buffer<ffi::F32>>());

#pragma GCC visibility pop
