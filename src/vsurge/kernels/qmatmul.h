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
//
// Two passes (q2 set): the rounding residual x - q * d is quantized too, at the fixed scale d / 256
// (|residual| <= d / 2, so its codes fit int8), and a block's dot products are combined as integers,
// 256 * dot(w, q) + dot(w, q2), before the one float multiply-add: x keeps ~15 bits for twice the
// integer work and none of a second float pass. Then d holds d / 256, s the block's dequantized sum,
// and c the offset times the combined sum 256 * sum(q) + sum(q2).
struct Activations {
  const int8_t* q;   // (M, K)
  const int8_t* q2;  // (M, K) the residual's codes (two passes), or null
  const float* d;    // (M, K / 32) scale of each block (of the combined codes: d / 256 with q2)
  const float* s;    // (M, K / 32) the block's sum of dequantized x: multiplies a weight block's min
  const int32_t* c;  // (M, K / 32, 2) offset * sum of the (combined) codes of the block, or of its two 16-halves (Q6_K)
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
  // Quantizes rows [row_begin, row_end) of x (float32, or bfloat16 bits when bf16) into the buffers
  // (q2: the residual's codes as well, two passes; null: one pass).
  void (*quantize_rows)(const void* x, bool bf16, int64_t row_begin, int64_t row_end, int64_t k,
                        int offset, bool halves, int8_t* q, int8_t* q2, float* d, float* s, int32_t* c);
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
