// Declarations shared by the quantized matmul's dispatcher (qmatmul_ffi.cc) and its per-ISA
// translation units (qmatmul_avx2.cc, qmatmul_avx512.cc): the quantized activations and the table
// of entry points each ISA provides.
#pragma once
#include <cstdint>
#include <cstring>

#include "qmatmul_layout.h"

namespace vsurge {

// x (M, K) quantized per 32-element block as llama.cpp's Q8 activations are: q = rint(x / d) with
// d = max|x| / 127, plus the per-block terms the weight formats need (the dot of a weight code
// c = w / scale + offset with q is corrected by offset * sum(q), a min by d * sum(q)).
struct Activations {
  const int8_t* q;   // (M, K)
  const float* d;    // (M, K / 32) scale of each block
  const float* s;    // (M, K / 32) d * sum(q): multiplies a weight block's min
  const int32_t* c;  // (M, K / 32, 2) offset * sum(q) of the block, or of its two 16-halves (Q6_K)
  int64_t k;
};

struct MatmulArgs {
  int format;
  const uint8_t* w;    // (tiles, tile_bytes), qmatmul_layout.h
  int64_t n, k;        // logical W (N, K)
  int64_t tile_bytes;
  Activations a;
  float* y;            // (M, N)
  const int32_t* out_rows = nullptr;  // activation row m's products go to y's row out_rows[m] (null: row m)
};

// The weight-code offset an ISA's dot product subtracts through Activations::c.
int code_offset(int format, bool vnni);

struct IsaKernels {
  const char* name;
  bool vnni;
  // Quantizes rows [row_begin, row_end) of x (float32, or bfloat16 bits when bf16) into the buffers.
  void (*quantize_rows)(const void* x, bool bf16, int64_t row_begin, int64_t row_end, int64_t k,
                        int offset, bool halves, int8_t* q, float* d, float* s, int32_t* c);
  // y[m_begin:m_end, rows of tiles [tile_begin, tile_end)] = x @ W^T.
  void (*matmul_tiles)(const MatmulArgs& args, int64_t tile_begin, int64_t tile_end, int64_t m_begin,
                       int64_t m_end);
};

// 4 activation bytes (one dot-product group) as one int32, from any address.
inline int32_t group4(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// Defined only when the compiler targets x86-64 (nullptr elsewhere: the Python fallback is used).
extern const IsaKernels* const kAvx2Kernels;
extern const IsaKernels* const kAvx512Kernels;
extern const IsaKernels* const kAvx512VnniKernels;

}  // namespace vsurge
