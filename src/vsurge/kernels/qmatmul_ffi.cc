// The XLA FFI custom call `vsurge_qmatmul`: y (M, N) float32 = x (M, K) @ W^T, W in a repacked GGUF
// block format (qmatmul_layout.h). Quantizes x per 32-block to int8 (as llama.cpp does), then runs
// the kernel variant chosen for this CPU over tiles of 16 output rows on the kernel's thread pool.
//
// The variant is picked once from cpuid, capped by VSURGE_CPU_ISA (avx2 | avx512: reproduces an
// AVX2-only CPU on an AVX-512 one) or named exactly by VSURGE_KERNEL (avx2 | avx512 | avx512_vnni);
// vsurge_qmatmul_set_variant changes it at run time (tests run every variant in one process).
#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "qmatmul.h"
#include "thread_pool.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace vsurge {

int code_offset(int format, bool vnni) {
  switch (format) {
    case kQ8_0: return vnni ? 128 : 0;  // VNNI reads int8 codes as uint8 code + 128
    case kQ4_0: return 8;
    case kQ5_0: return 16;
    case kQ6_K: return 32;
    default: return 0;  // formats with a min
  }
}

namespace {

constexpr int64_t kRowChunk = 64;  // activation rows per task: their int8 copy stays in L2

bool supported(const IsaKernels* k) {
  if (k == nullptr) return false;
#if defined(__x86_64__)
  __builtin_cpu_init();  // the checks include the OS saving the AVX / AVX-512 registers (XCR0)
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
  const bool avx512 = avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
  if (k == kAvx2Kernels) return avx2;
  if (k == kAvx512Kernels) return avx512;
  if (k == kAvx512VnniKernels) return avx512 && __builtin_cpu_supports("avx512vnni");
#endif
  return false;
}

const IsaKernels* by_name(const std::string& name) {
  for (const IsaKernels* k : {kAvx2Kernels, kAvx512Kernels, kAvx512VnniKernels})
    if (k != nullptr && name == k->name) return k;
  return nullptr;
}

// The fastest supported variant at or below the cap ("" = no cap).
const IsaKernels* best(const std::string& cap) {
  const bool only_avx2 = cap == "avx2";
  for (const IsaKernels* k : {kAvx512VnniKernels, kAvx512Kernels, kAvx2Kernels}) {
    if (only_avx2 && k != kAvx2Kernels) continue;
    if (supported(k)) return k;
  }
  return nullptr;
}

const IsaKernels* initial_variant() {
  const char* exact = std::getenv("VSURGE_KERNEL");
  if (exact != nullptr && *exact != '\0') {
    const IsaKernels* k = by_name(exact);
    if (supported(k)) return k;
  }
  const char* cap = std::getenv("VSURGE_CPU_ISA");
  return best(cap != nullptr ? cap : "");
}

std::atomic<const IsaKernels*>& variant() {
  static std::atomic<const IsaKernels*> v{initial_variant()};
  return v;
}

struct Scratch {
  std::vector<int8_t> q, q2;  // (q2: the residual's codes, two passes)
  std::vector<float> d, s;
  std::vector<int32_t> c;
};

struct QuantizeJob {
  const IsaKernels* isa;
  const void* x;  // rows [0, M) of this input
  bool bf16;
  int64_t k;
  int offset;
  bool halves;
  bool two;  // two passes: the residual's codes too
  Scratch* scratch;
  const int32_t* src = nullptr;  // scratch row r holds x's row src[r] (the real rows only); null: row r
};

// x shifted by `rows` rows (negative: back), as the ISA's quantize_rows expects
const void* shifted(const void* x, bool bf16, int64_t rows, int64_t k) {
  return bf16 ? static_cast<const void*>(static_cast<const uint16_t*>(x) + rows * k)
              : static_cast<const void*>(static_cast<const float*>(x) + rows * k);
}

void quantize_items(void* ctx, int64_t r0, int64_t r1) {
  auto* j = static_cast<QuantizeJob*>(ctx);
  Scratch* s = j->scratch;
  int8_t* q2 = j->two ? s->q2.data() : nullptr;
  if (j->src == nullptr) {
    j->isa->quantize_rows(j->x, j->bf16, r0, r1, j->k, j->offset, j->halves, s->q.data(), q2, s->d.data(),
                          s->s.data(), s->c.data());
    return;
  }
  // one row at a time: x's row src[r] into the scratch's row r (the ISA's quantize_rows indexes rows
  // from the start of x and of the scratch alike: x is shifted)
  for (int64_t r = r0; r < r1; ++r)
    j->isa->quantize_rows(shifted(j->x, j->bf16, j->src[r] - r, j->k), j->bf16, r, r + 1, j->k, j->offset,
                          j->halves, s->q.data(), q2, s->d.data(), s->s.data(), s->c.data());
}

struct MatmulJob {
  const IsaKernels* isa;
  MatmulArgs args;
  int64_t m, row_chunks;
};

void matmul_items(void* ctx, int64_t i0, int64_t i1) {  // item = (tile, row chunk), row chunks inner
  auto* j = static_cast<MatmulJob*>(ctx);
  for (int64_t i = i0; i < i1; ++i) {
    const int64_t tile = i / j->row_chunks, chunk = i % j->row_chunks;
    j->isa->matmul_tiles(j->args, tile, tile + 1, chunk * kRowChunk, std::min(j->m, (chunk + 1) * kRowChunk));
  }
}

// passes 2: x's rounding residual is quantized too and multiplied in the same pass over the weights,
// the two dot products combined as integers (qmatmul.h, Activations): x keeps ~15 bits, not 8.
// real: null, or (M,) int32, nonzero for the rows to multiply: the others (a step's padding) are not
// computed and come out 0. Every row gets the same passes (a request's arithmetic never depends on
// the rows beside it).
ffi::Error qmatmul_rows(ffi::AnyBuffer x, ffi::Buffer<ffi::U8> w, const int32_t* real, ffi::ResultBuffer<ffi::F32> y,
                        int64_t format, int64_t passes) {
  const IsaKernels* isa = variant().load(std::memory_order_relaxed);
  if (isa == nullptr) return ffi::Error::Internal("vsurge_qmatmul: no kernel variant runs on this CPU");
  if (format < 0 || format >= kFormats) return ffi::Error::InvalidArgument("vsurge_qmatmul: unknown format");
  if (passes != 1 && passes != 2) return ffi::Error::InvalidArgument("vsurge_qmatmul: passes must be 1 or 2");
  const auto xd = x.dimensions();
  const auto yd = y->dimensions();
  if (xd.size() != 2 || yd.size() != 2 || xd[0] != yd[0])
    return ffi::Error::InvalidArgument("vsurge_qmatmul: x must be (M, K) and y (M, N)");
  const bool bf16 = x.element_type() == ffi::DataType::BF16;
  if (!bf16 && x.element_type() != ffi::DataType::F32)
    return ffi::Error::InvalidArgument("vsurge_qmatmul: x must be float32 or bfloat16");
  int64_t m = xd[0];  // (the real rows only, below, when `real` is given)
  const int64_t k = xd[1], n = yd[1];
  if (k % kGroupWeights[format] != 0)
    return ffi::Error::InvalidArgument("vsurge_qmatmul: K is not a multiple of the format's block");
  const int64_t tiles = (n + kTileRows - 1) / kTileRows;
  const int64_t tile_bytes = k / kGroupWeights[format] * kGroupBytes[format];
  if (static_cast<int64_t>(w.element_count()) != tiles * tile_bytes)
    return ffi::Error::InvalidArgument("vsurge_qmatmul: weight bytes do not match (N, K) and the format");
  if (m == 0 || n == 0) return ffi::Error::Success();

  ThreadPool& pool = kernel_pool();
  thread_local Scratch scratch;
  thread_local std::vector<int32_t> src;  // the real rows, in order
  const int32_t* map = nullptr;
  const int64_t m_all = m;
  if (real != nullptr) {
    src.clear();
    for (int64_t r = 0; r < m_all; ++r) {
      if (real[r] != 0) src.push_back(static_cast<int32_t>(r));
      else std::memset(y->typed_data() + r * n, 0, n * sizeof(float));  // padding rows: 0
    }
    if (src.empty()) return ffi::Error::Success();
    if (static_cast<int64_t>(src.size()) < m_all) {
      map = src.data();
      m = static_cast<int64_t>(src.size());
    }
  }
  const int64_t blocks = k / kBlock;
  const bool two = passes == 2;
  scratch.q.resize(m * k);
  if (two) scratch.q2.resize(m * k);
  scratch.d.resize(m * blocks);
  scratch.s.resize(m * blocks);
  scratch.c.resize(2 * m * blocks);
  const int offset = code_offset(format, isa->vnni);
  // rows of x are cheap to quantize: only many rows are worth the pool's hand-off
  const int64_t rows_per_task = m * k >= (1 << 16) ? std::max<int64_t>(1, m / (2 * pool.threads())) : m;
  QuantizeJob qj{isa, x.untyped_data(), bf16, k, offset, format == kQ6_K, two, &scratch, map};
  pool.parallel_for(m, rows_per_task, quantize_items, &qj);
  // each real row's products go straight into its row of y
  MatmulJob mj{isa,
               {static_cast<int>(format), w.typed_data(), n, k, tile_bytes,
                {scratch.q.data(), two ? scratch.q2.data() : nullptr, scratch.d.data(), scratch.s.data(),
                 scratch.c.data(), k},
                y->typed_data(), map},
               m, (m + kRowChunk - 1) / kRowChunk};
  const int64_t items = tiles * mj.row_chunks;
  pool.parallel_for(items, std::max<int64_t>(1, items / (4 * pool.threads())), matmul_items, &mj);
  return ffi::Error::Success();
}

ffi::Error qmatmul_impl(ffi::AnyBuffer x, ffi::Buffer<ffi::U8> w, ffi::ResultBuffer<ffi::F32> y, int64_t format,
                        int64_t passes) {
  return qmatmul_rows(x, w, nullptr, y, format, passes);
}

ffi::Error qmatmul_real_impl(ffi::AnyBuffer x, ffi::Buffer<ffi::U8> w, ffi::Buffer<ffi::S32> real,
                             ffi::ResultBuffer<ffi::F32> y, int64_t format, int64_t passes) {
  if (real.dimensions().size() != 1 || real.dimensions()[0] != x.dimensions()[0])
    return ffi::Error::InvalidArgument("vsurge_qmatmul_real_rows: `real` must be (M,) for x (M, K)");
  return qmatmul_rows(x, w, real.typed_data(), y, format, passes);
}

}  // namespace
}  // namespace vsurge

// The library's exports (it is built with -fvisibility=hidden).
#pragma GCC visibility push(default)

XLA_FFI_DEFINE_HANDLER_SYMBOL(vsurge_qmatmul_ffi, vsurge::qmatmul_impl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::Buffer<ffi::U8>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Attr<int64_t>("format")
                                  .Attr<int64_t>("passes"));

// The same product for the rows where `real` (M,) int32 is nonzero; the other rows of y are 0.
XLA_FFI_DEFINE_HANDLER_SYMBOL(vsurge_qmatmul_real_rows_ffi, vsurge::qmatmul_real_impl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::Buffer<ffi::U8>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Attr<int64_t>("format")
                                  .Attr<int64_t>("passes"));

// For ctypes (src/vsurge/kernels/__init__.py).
extern "C" {

int vsurge_qmatmul_layout_version() { return 9; }  // 2: the `passes` attribute; 3: vsurge_kv_write, vsurge_gather_pages; 4: take/put pages; 5: real rows; 6: vsurge_gated_delta_decode, vsurge_conv_decode, vsurge_moe_experts; 7: vsurge_greedy; 8: real rows' values carry the step's passes; 9: they no longer do (passes are the weight's)

const char* vsurge_qmatmul_variant() {
  const vsurge::IsaKernels* k = vsurge::variant().load();
  return k != nullptr ? k->name : "";
}

// Comma-separated variants this CPU runs, fastest first.
const char* vsurge_qmatmul_supported() {
  static const std::string names = [] {
    std::string out;
    for (const vsurge::IsaKernels* k : {vsurge::kAvx512VnniKernels, vsurge::kAvx512Kernels, vsurge::kAvx2Kernels})
      if (vsurge::supported(k)) out += (out.empty() ? "" : ",") + std::string(k->name);
    return out;
  }();
  return names.c_str();
}

// 0 when `name` (a variant, or "auto") is selected; -1 when this CPU cannot run it (nothing changes).
int vsurge_qmatmul_set_variant(const char* name) {
  const std::string wanted = name != nullptr ? name : "";
  const vsurge::IsaKernels* k = wanted == "auto" ? vsurge::best("") : vsurge::by_name(wanted);
  if (!vsurge::supported(k)) return -1;
  vsurge::variant().store(k);
  return 0;
}

int vsurge_qmatmul_threads() { return vsurge::kernel_pool().threads(); }

}  // extern "C"

#pragma GCC visibility pop
