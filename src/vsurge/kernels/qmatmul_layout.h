// The repacked weight layout the quantized matmul reads; src/vsurge/ops/quant_layout.py writes it.
//
// W (N, K) is cut into tiles of 16 output rows (N padded with zero rows). A tile is one contiguous
// run of groups along K: a group is one 32-weight block (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1) or one
// 256-weight super-block (Q4_K, Q5_K, Q6_K) of all 16 rows. Inside a group every field is stored
// row-major over the 16 rows, so the first half of a field holds rows 0-7 and the second rows 8-15:
// an AVX-512 register reads a whole field, an AVX2 register reads one half.
//
// The weights' integer codes (0..15, 0..31, 0..63, or int8 for Q8_0) are arranged for a 4-byte dot
// product per lane (vpdpbusd / vpmaddubsw + vpmaddwd): code vector g (g = 0..7) of a 32-weight block
// holds, at byte 4 * r + i, the code of row r, column 4 * g + i. So lane r of a dot product with the
// broadcast activations x[4g .. 4g+3] adds four products of row r. Codes are packed:
//   P (4-bit plane): 4 vectors; byte j of vector h holds code vector h in its low nibble and code
//                    vector h + 4 in its high nibble (columns 0-15 low, 16-31 high).
//   H (5th bit):     8 masks of 64 bits; bit j of mask g is bit 4 of code vector g's byte j.
//   H6 (bits 4-5):   2 vectors; byte j of vector a holds bits 4-5 of code vector 4a + i at bits 2i.
// Scales are float16 (D, M: one per row) or uint8 / int8 per row and sub-block (K-quants).
#pragma once
#include <cstdint>

namespace vsurge {

enum Format : int {
  kQ8_0 = 0, kQ4_0 = 1, kQ4_1 = 2, kQ5_0 = 3, kQ5_1 = 4, kQ4_K = 5, kQ5_K = 6, kQ6_K = 7,
};
constexpr int kFormats = 8;
constexpr int kTileRows = 16;
constexpr int kBlock = 32;        // weights per block (and per activation block)
constexpr int kSuperBlock = 256;  // weights per K-quant super-block

// Byte offsets inside one group (16 rows). Legacy formats: one 32-weight block.
namespace q8_0 { constexpr int D = 0, V = 32, BYTES = 544; }
namespace q4_0 { constexpr int D = 0, P = 32, BYTES = 288; }
namespace q4_1 { constexpr int D = 0, M = 32, P = 64, BYTES = 320; }
namespace q5_0 { constexpr int D = 0, P = 32, H = 288, BYTES = 352; }
namespace q5_1 { constexpr int D = 0, M = 32, P = 64, H = 320, BYTES = 384; }
// K-quants: one 256-weight super-block = 8 blocks of 32; per block j its codes at SUB + j * SUB_BYTES.
// SC / MN: uint8 scale and min of block j (16 rows each) at SC + 16 j / MN + 16 j; Q5_K keeps each block's
// 5th-bit masks H = 256 bytes after its 4-bit plane.
namespace q4_k { constexpr int D = 0, DMIN = 32, SC = 64, MN = 192, SUB = 320, SUB_BYTES = 256, BYTES = 2368; }
namespace q5_k { constexpr int D = 0, DMIN = 32, SC = 64, MN = 192, SUB = 320, SUB_BYTES = 320, H = 256, BYTES = 2880; }
// Q6_K: int8 scale of 16-weight sub-block j (16 rows each) at SC + 16 j; codes 0..63, w = d * sc * (code - 32);
// per 32-weight block j: its 4-bit plane at SUB + j * SUB_BYTES, its bits 4-5 (H6) 256 bytes after.
namespace q6_k { constexpr int D = 0, SC = 32, SUB = 288, SUB_BYTES = 384, H6 = 256, BYTES = 3360; }

constexpr int kGroupBytes[kFormats] = {q8_0::BYTES, q4_0::BYTES, q4_1::BYTES, q5_0::BYTES,
                                       q5_1::BYTES, q4_k::BYTES, q5_k::BYTES, q6_k::BYTES};
constexpr int kGroupWeights[kFormats] = {32, 32, 32, 32, 32, 256, 256, 256};

}  // namespace vsurge
