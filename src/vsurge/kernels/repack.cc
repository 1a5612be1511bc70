// GGUF blocks -> the kernel's tiles (qmatmul_layout.h), the same bytes ops/quant_layout.py's numpy
// repacker writes (tests compare them), at memory speed on the kernel's threads: loading a model
// repacks every weight once.
#include <algorithm>
#include <cstdint>
#include <cstring>

#include "qmatmul_layout.h"
#include "thread_pool.h"

namespace vsurge {
namespace {

struct BlockCodes {  // one row's block (32 weights) or super-block (256) of a GGUF tensor, decoded
  uint16_t d = 0, m = 0;  // float16 bits: scale, and min (legacy) or dmin (Q4_K / Q5_K)
  uint8_t sc[16] = {}, mn[8] = {};  // K-quant block scales and mins (Q6_K: 16 int8 scales)
  uint8_t codes[256] = {};
};

uint16_t f16_at(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}

void decode_k_scales(const uint8_t* s, uint8_t* sc, uint8_t* mn) {  // Q4_K / Q5_K: 12 bytes -> 8 + 8 6-bit values
  for (int j = 0; j < 4; ++j) {
    sc[j] = s[j] & 63;
    mn[j] = s[j + 4] & 63;
    sc[j + 4] = (s[j + 8] & 0x0F) | ((s[j] >> 6) << 4);
    mn[j + 4] = (s[j + 8] >> 4) | ((s[j + 4] >> 6) << 4);
  }
}

// GGUF block bytes (llama.cpp's block_q* structs) -> codes and scales.
void decode(int format, const uint8_t* b, BlockCodes& out) {
  switch (format) {
    case kQ8_0:
      out.d = f16_at(b);
      std::memcpy(out.codes, b + 2, 32);
      return;
    case kQ4_0:
    case kQ4_1: {
      out.d = f16_at(b);
      const int pos = format == kQ4_1 ? 4 : 2;
      if (format == kQ4_1) out.m = f16_at(b + 2);
      for (int j = 0; j < 16; ++j) {
        out.codes[j] = b[pos + j] & 0x0F;
        out.codes[j + 16] = b[pos + j] >> 4;
      }
      return;
    }
    case kQ5_0:
    case kQ5_1: {
      out.d = f16_at(b);
      const int pos = format == kQ5_1 ? 4 : 2;
      if (format == kQ5_1) out.m = f16_at(b + 2);
      uint32_t high;
      std::memcpy(&high, b + pos, 4);
      for (int j = 0; j < 16; ++j) {
        out.codes[j] = (b[pos + 4 + j] & 0x0F) | (((high >> j) & 1) << 4);
        out.codes[j + 16] = (b[pos + 4 + j] >> 4) | (((high >> (j + 16)) & 1) << 4);
      }
      return;
    }
    case kQ4_K:
    case kQ5_K: {
      out.d = f16_at(b);
      out.m = f16_at(b + 2);
      decode_k_scales(b + 4, out.sc, out.mn);
      const uint8_t* qh = b + 16;
      const uint8_t* qs = format == kQ4_K ? b + 16 : b + 48;
      for (int c = 0; c < 4; ++c) {  // 32 bytes per 64 weights: block 2c low nibbles, block 2c + 1 high
        for (int l = 0; l < 32; ++l) {
          uint8_t lo = qs[32 * c + l] & 0x0F, hi = qs[32 * c + l] >> 4;
          if (format == kQ5_K) {
            lo |= ((qh[l] >> (2 * c)) & 1) << 4;
            hi |= ((qh[l] >> (2 * c + 1)) & 1) << 4;
          }
          out.codes[64 * c + l] = lo;
          out.codes[64 * c + 32 + l] = hi;
        }
      }
      return;
    }
    case kQ6_K: {
      const uint8_t* ql = b;
      const uint8_t* qh = b + 128;
      std::memcpy(out.sc, b + 192, 16);
      out.d = f16_at(b + 208);
      for (int h = 0; h < 2; ++h) {  // two halves of 128 weights
        for (int l = 0; l < 32; ++l) {
          const uint8_t high = qh[32 * h + l];
          const uint8_t a = ql[64 * h + l], c = ql[64 * h + 32 + l];
          out.codes[128 * h + l] = (a & 0x0F) | ((high & 3) << 4);
          out.codes[128 * h + 32 + l] = (c & 0x0F) | (((high >> 2) & 3) << 4);
          out.codes[128 * h + 64 + l] = (a >> 4) | (((high >> 4) & 3) << 4);
          out.codes[128 * h + 96 + l] = (c >> 4) | (((high >> 6) & 3) << 4);
        }
      }
      return;
    }
    default:
      return;
  }
}

// The 16 rows' codes of one 32-weight block -> its code area: Q8_0's 8 vectors, or the 4-bit plane
// followed (at `h5` / `h6` bytes from the area) by the 5th-bit masks / bits 4-5.
void place_block(int format, const uint8_t (*codes)[32], uint8_t* area, int h5, int h6) {
  uint8_t v[8][64];  // code vector g: byte 4 r + i = row r, column 4 g + i
  for (int r = 0; r < kTileRows; ++r)
    for (int g = 0; g < 8; ++g) std::memcpy(&v[g][4 * r], &codes[r][4 * g], 4);
  if (format == kQ8_0) {
    std::memcpy(area, v, sizeof(v));
    return;
  }
  for (int h = 0; h < 4; ++h)
    for (int j = 0; j < 64; ++j) area[64 * h + j] = static_cast<uint8_t>((v[h][j] & 0x0F) | ((v[h + 4][j] & 0x0F) << 4));
  if (h5 >= 0) {
    for (int g = 0; g < 8; ++g) {
      for (int q = 0; q < 8; ++q) {  // bit 4 of bytes 8q .. 8q + 7 -> bits 0 .. 7 of mask byte q
        uint64_t x;
        std::memcpy(&x, &v[g][8 * q], 8);
        const uint64_t bits = (x >> 4) & 0x0101010101010101ULL;
        area[h5 + 8 * g + q] = static_cast<uint8_t>((bits * 0x0102040810204080ULL) >> 56);
      }
    }
  }
  if (h6 >= 0) {
    for (int a = 0; a < 2; ++a)
      for (int j = 0; j < 64; ++j) {
        uint8_t bits = 0;
        for (int i = 0; i < 4; ++i) bits |= static_cast<uint8_t>(((v[4 * a + i][j] >> 4) & 3) << (2 * i));
        area[h6 + 64 * a + j] = bits;
      }
  }
}

void put16(uint8_t* p, uint16_t v) { std::memcpy(p, &v, 2); }

struct RepackJob {
  int format;
  const uint8_t* raw;
  int64_t n, k, row_bytes, block_bytes, tile_bytes;
  uint8_t* out;
};

void repack_tiles(void* ctx, int64_t t0, int64_t t1) {
  const auto* j = static_cast<const RepackJob*>(ctx);
  const int f = j->format;
  const int64_t gw = kGroupWeights[f], gb = kGroupBytes[f], groups = j->k / gw;
  BlockCodes rows[kTileRows];  // one group of the tile's 16 rows (zero rows pad N)
  uint8_t codes[kTileRows][32];
  for (int64_t t = t0; t < t1; ++t) {
    uint8_t* tile = j->out + t * j->tile_bytes;
    const int valid = static_cast<int>(std::min<int64_t>(kTileRows, j->n - t * kTileRows));
    for (int64_t i = 0; i < groups; ++i) {
      uint8_t* g = tile + i * gb;
      std::memset(g, 0, gb);
      for (int r = 0; r < kTileRows; ++r) {
        rows[r] = BlockCodes();
        if (r < valid) decode(f, j->raw + (t * kTileRows + r) * j->row_bytes + i * j->block_bytes, rows[r]);
      }
      auto block_codes = [&](int b) {  // codes of 32-weight block b of the group, all rows
        for (int r = 0; r < kTileRows; ++r) std::memcpy(codes[r], rows[r].codes + 32 * b, 32);
        return codes;
      };
      for (int r = 0; r < kTileRows; ++r) put16(g + r * 2, rows[r].d);  // D is at 0 in every format
      switch (f) {
        case kQ8_0: place_block(f, block_codes(0), g + q8_0::V, -1, -1); break;
        case kQ4_0: place_block(f, block_codes(0), g + q4_0::P, -1, -1); break;
        case kQ5_0: place_block(f, block_codes(0), g + q5_0::P, q5_0::H - q5_0::P, -1); break;
        case kQ4_1:
        case kQ5_1:
          for (int r = 0; r < kTileRows; ++r) put16(g + q4_1::M + 2 * r, rows[r].m);
          if (f == kQ4_1) place_block(f, block_codes(0), g + q4_1::P, -1, -1);
          else place_block(f, block_codes(0), g + q5_1::P, q5_1::H - q5_1::P, -1);
          break;
        case kQ4_K:
        case kQ5_K: {
          const bool five = f == kQ5_K;
          for (int r = 0; r < kTileRows; ++r) {
            put16(g + q4_k::DMIN + 2 * r, rows[r].m);
            for (int s = 0; s < 8; ++s) {
              g[q4_k::SC + 16 * s + r] = rows[r].sc[s];
              g[q4_k::MN + 16 * s + r] = rows[r].mn[s];
            }
          }
          for (int s = 0; s < 8; ++s)
            place_block(f, block_codes(s), g + q4_k::SUB + s * (five ? q5_k::SUB_BYTES : q4_k::SUB_BYTES),
                        five ? q5_k::H : -1, -1);
          break;
        }
        case kQ6_K:
          for (int r = 0; r < kTileRows; ++r)
            for (int s = 0; s < 16; ++s) g[q6_k::SC + 16 * s + r] = rows[r].sc[s];
          for (int s = 0; s < 8; ++s) place_block(f, block_codes(s), g + q6_k::SUB + s * q6_k::SUB_BYTES, -1, q6_k::H6);
          break;
        default:
          break;
      }
    }
  }
}

constexpr int kGgufBlockBytes[kFormats] = {34, 18, 20, 22, 24, 144, 176, 210};

}  // namespace
}  // namespace vsurge

#pragma GCC visibility push(default)
extern "C" {

// raw: (n, k / block * block bytes) GGUF blocks; out: (ceil(n / 16), tile bytes). 0 on success.
int vsurge_repack(int format, const uint8_t* raw, int64_t n, int64_t k, uint8_t* out) {
  using namespace vsurge;
  if (format < 0 || format >= kFormats || n < 0 || k <= 0 || k % kGroupWeights[format] != 0) return -1;
  const int64_t gw = kGroupWeights[format];
  RepackJob job{format, raw, n, k, k / gw * kGgufBlockBytes[format], kGgufBlockBytes[format],
                k / gw * kGroupBytes[format], out};
  const int64_t tiles = (n + kTileRows - 1) / kTileRows;
  ThreadPool& pool = kernel_pool();
  pool.parallel_for(tiles, std::max<int64_t>(1, tiles / (8 * pool.threads())), repack_tiles, &job);
  return 0;
}

}  // extern "C"
#pragma GCC visibility pop
