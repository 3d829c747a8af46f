// The dense-copy route of the quantized ops (model/dense_copy.py), shared by sgl_linear and
// sgl_qmm: from `dense_from` rows, x @ W^T on the layer's bf16 copy of its weight, prepacked by
// oneDNN, instead of the quantized kernel. The choice is made here, on each call's real row
// count, so a graph compiled with a symbolic row count neither guards on it nor recompiles.
#pragma once

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include <optional>
#include <string>

namespace sgl_dense_copy {

// x @ W^T (+ b) for a weight prepacked by oneDNN (torch's mkldnn::_linear_pointwise).
inline at::Tensor packed_linear(const at::Tensor& x, const at::Tensor& packed, const std::optional<at::Tensor>& bias) {
  static const c10::OperatorHandle op =
      c10::Dispatcher::singleton().findSchemaOrThrow("mkldnn::_linear_pointwise", "");
  torch::jit::Stack stack{x, packed, bias, std::string("none"), c10::List<std::optional<at::Scalar>>(),
                          std::optional<std::string>()};
  op.callBoxed(&stack);
  return stack[0].toTensor();
}

inline bool takes_copy(const at::Tensor& x, const std::optional<at::Tensor>& dense, int64_t dense_from) {
  return dense.has_value() && x.size(0) >= dense_from;
}

// The copy's result in x's dtype, `columns` wide (no bias: the caller adds it, as on the
// quantized route). A quantized op whose weight is padded to whole blocks returns the padded
// width, which its caller cuts; the copy holds only the real rows, so its result is padded too.
inline at::Tensor linear(const at::Tensor& x, const at::Tensor& dense, int64_t columns) {
  at::Tensor y = packed_linear(x.to(at::kBFloat16).contiguous(), dense, std::nullopt).to(x.scalar_type());
  return y.size(1) < columns ? at::constant_pad_nd(y, {0, columns - y.size(1)}) : y;
}

}  // namespace sgl_dense_copy
