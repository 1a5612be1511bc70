// XLA FFI custom calls that move K/V vectors in and out of 16-bit float (bfloat16, float16) caches on
// CPU (kv/access.py):
//
//   vsurge_kv_write: cache (P, H, X, Y), aliased to the result; page (T,) s32; offset (T,) s32;
//     values (T, H, D) of the cache's type; token_axis 3: keys, (P, H, D, ps), token t's vector is
//     the column [page[t], h, :, offset[t]]; token_axis 2: values, (P, H, ps, D), the row
//     [page[t], h, offset[t], :]. A token whose page or offset is out of range is dropped (padding).
//   vsurge_gather_pages: cache (P, H, X, Y); ids (R,) s32 -> (R, H, X, Y) f32, page ids[r] converted
//     (an id out of range reads the nearest page, as XLA's gather clamps).
//   vsurge_take_pages: cache (P, ...); ids (R,) s32 -> (R, ...) of the cache's type: whole pages copied
//     as they are (clamped ids), for the host and disk tiers and transfers between engines.
//   vsurge_put_pages: cache (P, ...), aliased to the result; ids (R,) s32; pages (R, ...): page r
//     written at ids[r]; an id out of range is dropped (padding).
//
// XLA:CPU has neither a bfloat16 / float16 scatter nor gather: it converted the whole pool to float32
// around each layer's write (1.7 s of a 32-row decode step of the default model), around the page
// gathers of prompt rows (hoisted out of their loop, ~0.3 s of a 512-token step) and around the tiers'
// page copies; a bitcast to 16-bit integers around them copied the pool instead. These touch only the
// vectors and pages named.
#pragma GCC target("avx2,fma,f16c")
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "half.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace vsurge {
namespace {

bool is_16bit_float(ffi::DataType type) { return type == ffi::DataType::BF16 || type == ffi::DataType::F16; }

ffi::Error kv_write_impl(ffi::AnyBuffer cache, ffi::Buffer<ffi::S32> page, ffi::Buffer<ffi::S32> offset,
                         ffi::AnyBuffer values, ffi::Result<ffi::AnyBuffer> out, int64_t token_axis) {
  const auto cd = cache.dimensions(), vd = values.dimensions();
  if (cd.size() != 4 || vd.size() != 3 || !is_16bit_float(cache.element_type()) ||
      values.element_type() != cache.element_type() || (token_axis != 2 && token_axis != 3))
    return ffi::Error::InvalidArgument("vsurge_kv_write: cache (P, H, X, Y) and values (T, H, D) of one 16-bit "
                                       "float type, token_axis 2 or 3");
  const int64_t P = cd[0], H = cd[1], X = cd[2], Y = cd[3], T = vd[0], D = vd[2];
  const int64_t slots = token_axis == 3 ? Y : X;
  if (vd[1] != H || (token_axis == 3 ? X : Y) != D || static_cast<int64_t>(page.element_count()) != T ||
      static_cast<int64_t>(offset.element_count()) != T)
    return ffi::Error::InvalidArgument("vsurge_kv_write: shapes do not agree");
  auto* dst = static_cast<uint16_t*>(out->untyped_data());
  if (dst != cache.untyped_data())  // XLA did not alias the cache to the result: start from a copy
    std::memcpy(dst, cache.untyped_data(), cache.size_bytes());
  const auto* src = static_cast<const uint16_t*>(values.untyped_data());
  const int32_t* pages = page.typed_data();
  const int32_t* offsets = offset.typed_data();
  for (int64_t t = 0; t < T; ++t) {
    const int64_t p = pages[t], o = offsets[t];
    if (p < 0 || p >= P || o < 0 || o >= slots) continue;
    for (int64_t h = 0; h < H; ++h) {
      const uint16_t* v = src + (t * H + h) * D;
      uint16_t* block = dst + (p * H + h) * X * Y;
      if (token_axis == 2) {
        std::memcpy(block + o * Y, v, D * sizeof(uint16_t));
      } else {
        for (int64_t i = 0; i < D; ++i) block[i * Y + o] = v[i];
      }
    }
  }
  return ffi::Error::Success();
}

ffi::Error gather_pages_impl(ffi::AnyBuffer cache, ffi::Buffer<ffi::S32> ids, ffi::ResultBuffer<ffi::F32> out) {
  const auto cd = cache.dimensions();
  if (cd.size() != 4 || !is_16bit_float(cache.element_type()))
    return ffi::Error::InvalidArgument("vsurge_gather_pages: cache (P, H, X, Y) of a 16-bit float type");
  const int64_t P = cd[0], page = cd[1] * cd[2] * cd[3], R = ids.element_count();
  if (static_cast<int64_t>(out->element_count()) != R * page)
    return ffi::Error::InvalidArgument("vsurge_gather_pages: the result is not (R, H, X, Y)");
  const auto* src = static_cast<const uint16_t*>(cache.untyped_data());
  const bool bf16 = cache.element_type() == ffi::DataType::BF16;
  for (int64_t r = 0; r < R; ++r) {
    const int64_t p = std::clamp<int64_t>(ids.typed_data()[r], 0, P - 1);
    half_to_f32(src + p * page, out->typed_data() + r * page, page, bf16);
  }
  return ffi::Error::Success();
}

// Bytes of one page of a (P, ...) cache, and the page count.
int64_t page_bytes(const ffi::AnyBuffer& cache) { return cache.size_bytes() / cache.dimensions()[0]; }

ffi::Error take_pages_impl(ffi::AnyBuffer cache, ffi::Buffer<ffi::S32> ids, ffi::Result<ffi::AnyBuffer> out) {
  const int64_t P = cache.dimensions()[0], bytes = page_bytes(cache), R = ids.element_count();
  if (out->element_type() != cache.element_type() || static_cast<int64_t>(out->size_bytes()) != R * bytes)
    return ffi::Error::InvalidArgument("vsurge_take_pages: the result is not (R, ...) of the cache's type");
  const auto* src = static_cast<const uint8_t*>(cache.untyped_data());
  auto* dst = static_cast<uint8_t*>(out->untyped_data());
  for (int64_t r = 0; r < R; ++r)
    std::memcpy(dst + r * bytes, src + std::clamp<int64_t>(ids.typed_data()[r], 0, P - 1) * bytes, bytes);
  return ffi::Error::Success();
}

ffi::Error put_pages_impl(ffi::AnyBuffer cache, ffi::Buffer<ffi::S32> ids, ffi::AnyBuffer pages,
                          ffi::Result<ffi::AnyBuffer> out) {
  const int64_t P = cache.dimensions()[0], bytes = page_bytes(cache), R = ids.element_count();
  if (pages.element_type() != cache.element_type() || static_cast<int64_t>(pages.size_bytes()) != R * bytes)
    return ffi::Error::InvalidArgument("vsurge_put_pages: pages must be (R, ...) of the cache's type");
  auto* dst = static_cast<uint8_t*>(out->untyped_data());
  if (dst != cache.untyped_data())  // XLA did not alias the cache to the result: start from a copy
    std::memcpy(dst, cache.untyped_data(), cache.size_bytes());
  const auto* src = static_cast<const uint8_t*>(pages.untyped_data());
  for (int64_t r = 0; r < R; ++r) {
    const int64_t p = ids.typed_data()[r];
    if (p >= 0 && p < P) std::memcpy(dst + p * bytes, src + r * bytes, bytes);
  }
  return ffi::Error::Success();
}

}  // namespace
}  // namespace vsurge

#pragma GCC visibility push(default)
XLA_FFI_DEFINE_HANDLER_SYMBOL(vsurge_kv_write_ffi, vsurge::kv_write_impl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Attr<int64_t>("token_axis"));
XLA_FFI_DEFINE_HANDLER_SYMBOL(vsurge_take_pages_ffi, vsurge::take_pages_impl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Ret<ffi::AnyBuffer>());
XLA_FFI_DEFINE_HANDLER_SYMBOL(vsurge_put_pages_ffi, vsurge::put_pages_impl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>());
XLA_FFI_DEFINE_HANDLER_SYMBOL(vsurge_gather_pages_ffi, vsurge::gather_pages_impl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());
#pragma GCC visibility pop
