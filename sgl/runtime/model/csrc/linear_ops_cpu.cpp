// CPU linear-layer ops (library sgl_linear), built on first use like the attention kernel:
//
//   int4_dequant_t   torch's packed int4 weight -> W^T [K, N] (bf16 or float32) in one pass (prefill);
//   int8_linear      x @ W^T for an int8 weight: the layer's dense copy from `dense_from` rows
//   int4_linear      where it keeps one (dense_copy.h), else torch's packed kernel up to
//                    `crossover` rows, else dequantize + a dense matmul in `dense_dtype` (bf16
//                    where the CPU multiplies it natively, AMX / AVX512-BF16; else float32:
//                    oneDNN emulates bf16 there, ~25x slower than float32 on an AVX2 EPYC);
//   packed_linear    x @ W^T (+ b) for a weight prepacked by oneDNN (model/cpu_packed.py).
//
// The last three are what a torch.compile'd graph calls (model/cpu_compile.py): one C++
// dispatch each, where a Python custom op costs ~20 us a call, and the route choice of the
// quantized ones is made on each call's real row count, so a graph compiled with a
// symbolic row count neither guards on it nor recompiles.
//
// int4_dequant_t, why: torch's packed int4 matmul costs in proportion to the rows it multiplies, so for
// more than a few rows a layer is better off dequantizing its weight once and running the
// dense matmul. Doing that in torch ops takes ~8 passes over the weight; here it is one pass
// that reads N*K/2 bytes and writes N*K values.
//
// Layout (from _convert_weight_to_int4pack_for_cpu): blocks of BLOCK_N output rows, one
// after the other; in block b, input k has BLOCK_N / 2 bytes, and byte (b, k, j) holds two
// of the block's rows, one per nibble (low, high):
//   halves: rows j and j + BLOCK_N / 2   (torch on AVX-512: BLOCK_N 64; on AVX2: 32)
//   pairs:  rows 2j and 2j + 1           (torch on neither: BLOCK_N 32)
// Which one torch wrote depends on the CPU kernel it dispatches to at run time, so the caller
// passes it (block_n, pairs: model/quant.py Int4PackLayout, read off torch by a probe); N must
// be whole blocks. scales_zeros: [K / group, N, 2] bf16; w = (q - 8) * scale + zero.
// The output is W^T (row k holds every output's weight for input k): the writes run along n.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <cstdint>
#include <cstring>
#include <optional>
#include <vector>

#include "dense_copy.h"  // packed_linear and the dense-copy route (its dispatcher call)

namespace {

inline float bf16_to_float(uint16_t h) {
  uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// Round to nearest even, as torch's float -> bf16 (finite inputs: weights are).
inline uint16_t float_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return static_cast<uint16_t>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

inline void store(float f, uint16_t* dst) { *dst = float_to_bf16(f); }
inline void store(float f, float* dst) { *dst = f; }

// One block's BLOCK_N weights for one input k, from its BLOCK_N / 2 bytes `src` (layout above);
// s, z: the block's scales and zeros for k's group. Compile-time layout: the loop vectorizes.
template <int BLOCK_N, bool PAIRS, typename Out>
inline void dequant_block(const uint8_t* src, const float* s, const float* z, Out* dst) {
  constexpr int HALF = BLOCK_N / 2;
  for (int j = 0; j < HALF; ++j) {
    const int lo = PAIRS ? 2 * j : j, hi = PAIRS ? 2 * j + 1 : HALF + j;
    store(static_cast<float>(static_cast<int>(src[j] & 15) - 8) * s[lo] + z[lo], dst + lo);
    store(static_cast<float>(static_cast<int>(src[j] >> 4) - 8) * s[hi] + z[hi], dst + hi);
  }
}

// W^T [K, N] of packed bytes p in the layout (BLOCK_N, PAIRS), in parallel over k; Out:
// uint16_t (bf16 bits) or float.
template <int BLOCK_N, bool PAIRS, typename Out>
void dequant_t(const uint8_t* p, const uint16_t* sz, Out* o, int64_t N, int64_t K, int64_t group) {
  const int64_t blocks = N / BLOCK_N;
  at::parallel_for(0, K, 8, [&](int64_t k0, int64_t k1) {
    std::vector<float> scale(N), zero(N);
    int64_t loaded = -1;
    for (int64_t k = k0; k < k1; ++k) {
      const int64_t g = k / group;
      if (g != loaded) {
        for (int64_t n = 0; n < N; ++n) {
          scale[n] = bf16_to_float(sz[(g * N + n) * 2]);
          zero[n] = bf16_to_float(sz[(g * N + n) * 2 + 1]);
        }
        loaded = g;
      }
      Out* row = o + k * N;
      for (int64_t b = 0; b < blocks; ++b) {
        const int64_t n0 = b * BLOCK_N;
        dequant_block<BLOCK_N, PAIRS>(p + (b * K + k) * (BLOCK_N / 2), scale.data() + n0, zero.data() + n0, row + n0);
      }
    }
  });
}

template <typename Out>
void dequant_t_in_layout(const uint8_t* p, const uint16_t* sz, Out* o, int64_t N, int64_t K, int64_t group,
                         int64_t block_n, bool pairs) {
  if (block_n == 64 && !pairs) {
    dequant_t<64, false>(p, sz, o, N, K, group);
  } else if (block_n == 32 && !pairs) {
    dequant_t<32, false>(p, sz, o, N, K, group);
  } else if (block_n == 32 && pairs) {
    dequant_t<32, true>(p, sz, o, N, K, group);
  } else {
    TORCH_CHECK(false, "unknown int4 pack layout: blocks of ", block_n, pairs ? " in pairs" : " in halves");
  }
}

at::Tensor int4_dequant_t(const at::Tensor& packed, const at::Tensor& scales_zeros, int64_t group, int64_t block_n,
                          bool pairs, at::ScalarType dtype) {
  TORCH_CHECK(packed.scalar_type() == at::kByte && packed.dim() == 2 && packed.is_contiguous(),
              "packed must be a contiguous uint8 [N, K/2] tensor");
  const int64_t N = packed.size(0), K = packed.size(1) * 2;
  TORCH_CHECK(block_n > 0 && N % block_n == 0, "N (", N, ") must be whole blocks of ", block_n);
  TORCH_CHECK(group > 0 && K % group == 0, "group ", group, " must divide K (", K, ")");
  TORCH_CHECK(scales_zeros.scalar_type() == at::kBFloat16 && scales_zeros.is_contiguous() && scales_zeros.dim() == 3 &&
                  scales_zeros.size(0) == K / group && scales_zeros.size(1) == N && scales_zeros.size(2) == 2,
              "scales_zeros must be a contiguous bf16 [K/group, N, 2] tensor");
  TORCH_CHECK(dtype == at::kBFloat16 || dtype == at::kFloat, "int4_dequant_t writes bf16 or float32");
  at::Tensor out = at::empty({K, N}, packed.options().dtype(dtype));
  const uint8_t* p = packed.data_ptr<uint8_t>();
  const uint16_t* sz = reinterpret_cast<const uint16_t*>(scales_zeros.data_ptr<at::BFloat16>());
  if (dtype == at::kFloat) {
    dequant_t_in_layout(p, sz, out.data_ptr<float>(), N, K, group, block_n, pairs);
  } else {
    dequant_t_in_layout(p, sz, reinterpret_cast<uint16_t*>(out.data_ptr<at::BFloat16>()), N, K, group, block_n, pairs);
  }
  return out;
}

// The dense route's result in x's dtype.
at::Tensor int8_linear(const at::Tensor& x, const at::Tensor& qweight, const at::Tensor& scales, int64_t crossover,
                       at::ScalarType dense_dtype, const std::optional<at::Tensor>& dense, int64_t dense_from) {
  if (sgl_dense_copy::takes_copy(x, dense, dense_from)) return sgl_dense_copy::linear(x, *dense, qweight.size(0));
  if (x.size(0) > crossover) {
    const at::Tensor w = qweight.to(dense_dtype) * scales.to(dense_dtype).unsqueeze(1);
    return sgl_dense_copy::on_row_slices(x.to(dense_dtype), [&](const at::Tensor& rows) { return at::linear(rows, w); })
        .to(x.scalar_type());
  }
  return at::_weight_int8pack_mm(x, qweight, scales);
}

at::Tensor int4_linear(const at::Tensor& x, const at::Tensor& qweight, const at::Tensor& scales_zeros, int64_t group,
                       int64_t block_n, bool pairs, int64_t crossover, at::ScalarType dense_dtype,
                       const std::optional<at::Tensor>& dense, int64_t dense_from) {
  if (sgl_dense_copy::takes_copy(x, dense, dense_from)) return sgl_dense_copy::linear(x, *dense, qweight.size(0));
  if (x.size(0) > crossover) {
    const at::Tensor w_t = int4_dequant_t(qweight, scales_zeros, group, block_n, pairs, dense_dtype);
    return sgl_dense_copy::on_row_slices(x.to(dense_dtype), [&](const at::Tensor& rows) { return at::mm(rows, w_t); })
        .to(x.scalar_type());
  }
  return at::_weight_int4pack_mm_for_cpu(x, qweight, group, scales_zeros);
}

at::Tensor packed_linear(const at::Tensor& x, const at::Tensor& packed, const std::optional<at::Tensor>& bias) {
  return sgl_dense_copy::packed_linear(x, packed, bias);
}

}  // namespace

TORCH_LIBRARY(sgl_linear, m) {
  m.def("int4_dequant_t(Tensor packed, Tensor scales_zeros, int group, int block_n, bool pairs, ScalarType dtype) "
        "-> Tensor");
  m.def("int8_linear(Tensor x, Tensor qweight, Tensor scales, int crossover, ScalarType dense_dtype, Tensor? dense, "
        "int dense_from) -> Tensor");
  m.def("int4_linear(Tensor x, Tensor qweight, Tensor scales_zeros, int group, int block_n, bool pairs, "
        "int crossover, ScalarType dense_dtype, Tensor? dense, int dense_from) -> Tensor");
  m.def("packed_linear(Tensor x, Tensor packed, Tensor? bias) -> Tensor");

}

TORCH_LIBRARY_IMPL(sgl_linear, CPU, m) {
  m.impl("int4_dequant_t", &int4_dequant_t);
  m.impl("int8_linear", &int8_linear);
  m.impl("int4_linear", &int4_linear);
  m.impl("packed_linear", &packed_linear);
}

// A packed weight (or dense copy) is an mkldnn-layout tensor: calls dispatch on its key.
TORCH_LIBRARY_IMPL(sgl_linear, MkldnnCPU, m) {
  m.impl("packed_linear", &packed_linear);
  m.impl("int8_linear", &int8_linear);
  m.impl("int4_linear", &int4_linear);
}
