// Run-time ISA choice shared by the kernels that compile their loops twice (AVX2 + FMA, AVX-512).
#pragma once

#include <cstdlib>
#include <string>

namespace vsurge {

// AVX-512 (F, BW, VL) where the CPU has it, unless VSURGE_CPU_ISA=avx2 (an AVX2-only CPU reproduced).
inline bool avx512_usable() {
  static const bool yes = [] {
    const char* cap = std::getenv("VSURGE_CPU_ISA");
    return !(cap != nullptr && std::string(cap) == "avx2") && __builtin_cpu_supports("avx512f") &&
           __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl");
  }();
  return yes;
}

}  // namespace vsurge

// A function compiled for AVX-512 (its loops vectorized 16 floats wide).
#define VSURGE_WIDE __attribute__((target("avx512f,avx512bw,avx512vl,fma,prefer-vector-width=512")))
