// The one place that knows which oneDNN seqpack is built against: 2.x (Debian
// 12: 2.6) or 3.x (Debian 13: 3.7). What seqpack uses and 3.0 changed:
// - matmul: 2.x describes an operation (dnnl::matmul::desc) and makes a
//   primitive descriptor from it; 3.x has no op descriptors, the primitive
//   descriptor takes the engine and memory descriptors directly.
// - cpu_isa: 3.0 removed avx512_mic and avx512_mic_4ops (Xeon Phi) and later
//   versions add ISAs (avx512_core_fp16, avx512_core_amx_fp16, avx10_1_512,
//   ...). Both encode an ISA as a bit mask that contains the masks of the ISAs
//   it extends, so "has bf16" is a mask test that holds for ISAs added later.
// Everything else seqpack calls (memory descriptors with strides, tag::any
// weights, the sum post-op, user scratchpads, reorders, dnnl_primitive_execute)
// is the same in both; seqpack uses no scales or zero points (whose attribute
// API 3.0 also changed).
#pragma once

#include <oneapi/dnnl/dnnl.hpp>

#include <cstdint>

namespace seqpack::cpu::onednn {

// matmul dst = src · wei (+ bias): the primitive descriptor, or an exception
// (dnnl::error) where oneDNN has no implementation.
inline dnnl::matmul::primitive_desc matmul_pd(const dnnl::engine& engine,
                                              const dnnl::memory::desc& src,
                                              const dnnl::memory::desc& wei,
                                              const dnnl::memory::desc* bias,
                                              const dnnl::memory::desc& dst,
                                              const dnnl::primitive_attr& attr) {
#if DNNL_VERSION_MAJOR >= 3
  return bias ? dnnl::matmul::primitive_desc(engine, src, wei, *bias, dst, attr)
              : dnnl::matmul::primitive_desc(engine, src, wei, dst, attr);
#else
  const auto desc = bias ? dnnl::matmul::desc(src, wei, *bias, dst) : dnnl::matmul::desc(src, wei, dst);
  return dnnl::matmul::primitive_desc(desc, attr, engine);
#endif
}

// A [rows, cols] matrix with the given row and column strides. oneDNN 3.7's
// brgemm matmul computes a one-row source stored transposed (strides {1, ld})
// wrongly (m = 1, k = 5: every value); a one-row or one-column matrix is the
// same memory whatever its other stride, so 3.x gets the row-major one.
inline dnnl::memory::desc matrix_desc(int64_t rows, int64_t cols, dnnl::memory::data_type type,
                                      int64_t row_stride, int64_t col_stride) {
#if DNNL_VERSION_MAJOR >= 3
  if (rows == 1) row_stride = cols * col_stride;
  if (cols == 1) col_stride = 1;
#endif
  return dnnl::memory::desc({rows, cols}, type, {row_stride, col_stride});
}
// Described so, a one-row operand with strided elements (a transposed one with
// ld > 1) has no optimised kernel: the engine copies it dense first.
constexpr bool kOneRowOperandsRowMajor = DNNL_VERSION_MAJOR >= 3;

// Whether weights stored transposed reach the blocked layout through a
// row-major copy: oneDNN 3.7's reorder from a transposed f32 [k, n] into the
// matmul's blocked layout (BA16a64b) leaves the columns past the last full
// 128 wrong (k = 37, n = 148: columns 128-147); from row-major it is right.
constexpr bool kReorderTransposedThroughRowMajor = DNNL_VERSION_MAJOR >= 3;

// A memory descriptor's blocked layout, as 2.x and 3.x each expose it: its
// padded dimensions, the strides of its outer blocks, its inner blocks
// (outermost first) and the dimension each blocks; blocked false for
// another kind (or an offset into its memory).
struct Blocking {
  bool blocked = false;
  dnnl::memory::dims padded_dims, strides, inner_blks, inner_idxs;
};
inline Blocking blocking_of(const dnnl::memory::desc& d) {
  Blocking b;
#if DNNL_VERSION_MAJOR >= 3
  if (d.get_format_kind() != dnnl::memory::format_kind::blocked || d.get_submemory_offset() != 0)
    return b;
  b.padded_dims = d.get_padded_dims();
  b.strides = d.get_strides();
  b.inner_blks = d.get_inner_blks();
  b.inner_idxs = d.get_inner_idxs();
#else
  const dnnl_memory_desc_t& m = d.data;
  if (m.format_kind != dnnl_blocked || m.offset0 != 0) return b;
  const dnnl_blocking_desc_t& blk = m.format_desc.blocking;
  b.padded_dims.assign(m.padded_dims, m.padded_dims + m.ndims);
  b.strides.assign(blk.strides, blk.strides + m.ndims);
  b.inner_blks.assign(blk.inner_blks, blk.inner_blks + blk.inner_nblks);
  b.inner_idxs.assign(blk.inner_idxs, blk.inner_idxs + blk.inner_nblks);
#endif
  b.blocked = true;
  return b;
}

// Whether `isa` includes every instruction of `base` (bit-mask containment).
inline bool isa_includes(dnnl::cpu_isa isa, dnnl::cpu_isa base) {
  const auto mask = static_cast<unsigned>(base);
  return (static_cast<unsigned>(isa) & mask) == mask;
}

// Native bf16 dot products: AVX512-BF16 and every ISA above it (AMX, ...).
inline bool isa_has_bf16(dnnl::cpu_isa isa) {
  return isa_includes(isa, dnnl::cpu_isa::avx512_core_bf16);
}
inline bool isa_has_vnni(dnnl::cpu_isa isa) {
  return isa_includes(isa, dnnl::cpu_isa::avx512_core_vnni);
}
inline bool isa_has_amx(dnnl::cpu_isa isa) {
  return isa_includes(isa, dnnl::cpu_isa::avx512_core_amx);
}

// oneDNN's name for the ISA (ONEDNN_MAX_CPU_ISA's spelling, lower case).
inline const char* isa_name(dnnl::cpu_isa isa) {
  switch (isa) {
    case dnnl::cpu_isa::sse41: return "sse41";
    case dnnl::cpu_isa::avx: return "avx";
    case dnnl::cpu_isa::avx2: return "avx2";
    case dnnl::cpu_isa::avx2_vnni: return "avx2_vnni";
    case dnnl::cpu_isa::avx512_core: return "avx512_core";
    case dnnl::cpu_isa::avx512_core_vnni: return "avx512_core_vnni";
    case dnnl::cpu_isa::avx512_core_bf16: return "avx512_core_bf16";
    case dnnl::cpu_isa::avx512_core_amx: return "avx512_core_amx";
#if DNNL_VERSION_MAJOR >= 3
    case dnnl::cpu_isa::avx2_vnni_2: return "avx2_vnni_2";
    case dnnl::cpu_isa::avx512_core_fp16: return "avx512_core_fp16";
    case dnnl::cpu_isa::avx512_core_amx_fp16: return "avx512_core_amx_fp16";
#else
    case dnnl::cpu_isa::avx512_mic: return "avx512_mic";
    case dnnl::cpu_isa::avx512_mic_4ops: return "avx512_mic_4ops";
#endif
    default: return "unknown";
  }
}

}  // namespace seqpack::cpu::onednn
