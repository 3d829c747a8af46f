// CPU linear-layer ops (library sgl_linear), built on first use like the attention kernel:
//
//   int4_dequant_t   torch's packed int4 weight -> bf16 W^T [K, N] in one pass (prefill);
//   int8_linear      x @ W^T for an int8 weight: torch's packed kernel up to `crossover`
//   int4_linear      rows, else dequantize + bf16 matmul (AMX / AVX512-BF16);
//   packed_linear    x @ W^T (+ b) for a weight prepacked by oneDNN (model/cpu_packed.py).
//
// The last three are what a torch.compile'd graph calls (model/cpu_compile.py): one C++
// dispatch each, where a Python custom op costs ~20 us a call, and the route choice of the
// quantized ones is made on each call's real row count, so a graph compiled with a
// symbolic row count neither guards on it nor recompiles.
//
// int4_dequant_t, why: torch's packed int4 matmul costs in proportion to the rows it multiplies, so for
// more than a few rows a layer is better off dequantizing its weight once and running the
// bf16 matmul (AMX / AVX512-BF16). Doing that in torch ops takes ~8 passes over the weight;
// here it is one pass that reads N*K/2 bytes and writes N*K bf16 values.
//
// Layout (from _convert_weight_to_int4pack_for_cpu, N a multiple of 64): per block b of 64
// output rows, byte (b, k, j) holds row 64b + j in its low nibble and row 64b + 32 + j in
// its high one. scales_zeros: [K / group, N, 2] bf16; w = (q - 8) * scale + zero.
// The output is W^T (row k holds every output's weight for input k): the writes run along n.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <torch/library.h>

#include <optional>
#include <string>

#include <cstdint>
#include <cstring>
#include <vector>

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

at::Tensor int4_dequant_t(const at::Tensor& packed, const at::Tensor& scales_zeros, int64_t group) {
  TORCH_CHECK(packed.scalar_type() == at::kByte && packed.dim() == 2 && packed.is_contiguous(),
              "packed must be a contiguous uint8 [N, K/2] tensor");
  const int64_t N = packed.size(0), K = packed.size(1) * 2;
  TORCH_CHECK(N % 64 == 0, "N (", N, ") must be a multiple of 64");
  TORCH_CHECK(group > 0 && K % group == 0, "group ", group, " must divide K (", K, ")");
  TORCH_CHECK(scales_zeros.scalar_type() == at::kBFloat16 && scales_zeros.is_contiguous() && scales_zeros.dim() == 3 &&
                  scales_zeros.size(0) == K / group && scales_zeros.size(1) == N && scales_zeros.size(2) == 2,
              "scales_zeros must be a contiguous bf16 [K/group, N, 2] tensor");
  at::Tensor out = at::empty({K, N}, packed.options().dtype(at::kBFloat16));
  const uint8_t* p = packed.data_ptr<uint8_t>();
  const uint16_t* sz = reinterpret_cast<const uint16_t*>(scales_zeros.data_ptr<at::BFloat16>());
  uint16_t* o = reinterpret_cast<uint16_t*>(out.data_ptr<at::BFloat16>());
  const int64_t blocks = N / 64;
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
      uint16_t* row = o + k * N;
      for (int64_t b = 0; b < blocks; ++b) {
        const uint8_t* src = p + (b * K + k) * 32;
        const float* s = scale.data() + b * 64;
        const float* z = zero.data() + b * 64;
        uint16_t* dst = row + b * 64;
        for (int j = 0; j < 32; ++j) {
          dst[j] = float_to_bf16(static_cast<float>(static_cast<int>(src[j] & 15) - 8) * s[j] + z[j]);
          dst[32 + j] = float_to_bf16(static_cast<float>(static_cast<int>(src[j] >> 4) - 8) * s[32 + j] + z[32 + j]);
        }
      }
    }
  });
  return out;
}



at::Tensor int8_linear(const at::Tensor& x, const at::Tensor& qweight, const at::Tensor& scales, int64_t crossover) {
  if (x.size(0) > crossover) {
    return at::linear(x, qweight.to(at::kBFloat16) * scales.unsqueeze(1));
  }
  return at::_weight_int8pack_mm(x, qweight, scales);
}

at::Tensor int4_linear(const at::Tensor& x, const at::Tensor& qweight, const at::Tensor& scales_zeros, int64_t group,
                       int64_t crossover) {
  if (x.size(0) > crossover) {
    return at::mm(x, int4_dequant_t(qweight, scales_zeros, group));
  }
  return at::_weight_int4pack_mm_for_cpu(x, qweight, group, scales_zeros);
}

at::Tensor packed_linear(const at::Tensor& x, const at::Tensor& packed, const std::optional<at::Tensor>& bias) {
  static const c10::OperatorHandle op =
      c10::Dispatcher::singleton().findSchemaOrThrow("mkldnn::_linear_pointwise", "");
  torch::jit::Stack stack{x, packed, bias, std::string("none"), c10::List<std::optional<at::Scalar>>(),
                          std::optional<std::string>()};
  op.callBoxed(&stack);
  return stack[0].toTensor();
}

}  // namespace

TORCH_LIBRARY(sgl_linear, m) {
  m.def("int4_dequant_t(Tensor packed, Tensor scales_zeros, int group) -> Tensor");
  m.def("int8_linear(Tensor x, Tensor qweight, Tensor scales, int crossover) -> Tensor");
  m.def("int4_linear(Tensor x, Tensor qweight, Tensor scales_zeros, int group, int crossover) -> Tensor");
  m.def("packed_linear(Tensor x, Tensor packed, Tensor? bias) -> Tensor");

}

TORCH_LIBRARY_IMPL(sgl_linear, CPU, m) {
  m.impl("int4_dequant_t", &int4_dequant_t);
  m.impl("int8_linear", &int8_linear);
  m.impl("int4_linear", &int4_linear);
  m.impl("packed_linear", &packed_linear);
}

// The packed weight is an mkldnn-layout tensor: calls dispatch on its key.
TORCH_LIBRARY_IMPL(sgl_linear, MkldnnCPU, m) { m.impl("packed_linear", &packed_linear); }
