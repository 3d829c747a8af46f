// The dense-copy route of the quantized ops (model/dense_copy.py), shared by sgl_linear and
// sgl_qmm: from `dense_from` rows, x @ W^T on the layer's bf16 copy of its weight, prepacked by
// oneDNN, instead of the quantized kernel. The choice is made here, on each call's real row
// count, so a graph compiled with a symbolic row count neither guards on it nor recompiles.
//
// Every oneDNN matmul here runs on fixed row slices (`on_row_slices`). Why: oneDNN plans a
// call for the threads it may use, and for some shapes the plan splits the sum over K between
// them (measured on SmolLM2's layers at 256-1024 rows, and K = 8192 from 33 rows), so the same
// rows gave other bits with 1 thread than with 2; the scheduler's thread team shrinks when
// other processes take CPUs (runtime/cpu_share.py), so a greedy output changed with the load
// of the machine. A slice is planned for one thread and the slices depend only on the row count
// and the CPUs this process may use, so a row's result no longer depends on the team's size.
#pragma once

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/InferenceMode.h>
#include <omp.h>
#include <torch/library.h>

#include <algorithm>
#include <optional>
#include <string>
#include <vector>

namespace sgl_dense_copy {

// Rows of a slice at the least: a call of fewer than 2x this is not split. Decode steps stay
// under it: at 32-64 rows a split costs 30-90% of the call (two threads each read the whole
// weight), and there the plans measured split K only for K = 8192 (at 33 and 46 rows).
constexpr int64_t kMinSliceRows = 64;

// How many slices a call of `rows` rows takes: one per CPU this process may use (fixed for
// the process, whatever the team's size now), fewer where slices would get too small.
inline int64_t row_slices(int64_t rows) {
  static const int64_t cpus = std::max(1, omp_get_num_procs());
  return std::min(cpus, rows / kMinSliceRows);
}

// While alive, what oneDNN plans for on this thread is this thread alone (restored after, also
// when the call throws: on a team of one the slices run on the caller's own thread).
struct OneThreadPlans {
  const int team = omp_get_max_threads();
  OneThreadPlans() { omp_set_num_threads(1); }
  ~OneThreadPlans() { omp_set_num_threads(team); }
};

// f(x) computed slice by slice, each slice on one thread with oneDNN planning for one thread
// (the slices run in parallel over the current team). f: [m, K] -> [m, N].
template <class F>
at::Tensor on_row_slices(const at::Tensor& x, F f) {
  const int64_t rows = x.size(0), slices = row_slices(rows);
  if (slices < 2) return f(x);
  std::vector<at::Tensor> parts(slices), in(slices);
  for (int64_t s = 0; s < slices; ++s) in[s] = x.narrow(0, rows * s / slices, rows * (s + 1) / slices - rows * s / slices);
  const bool inference = c10::InferenceMode::is_enabled();
  at::parallel_for(0, slices, 1, [&](int64_t begin, int64_t end) {
    c10::InferenceMode mode(inference);  // the caller's mode on a worker thread too
    OneThreadPlans alone;
    for (int64_t s = begin; s < end; ++s) parts[s] = f(in[s]);
  });
  return at::cat(parts);
}

// x @ W^T (+ b) for a weight prepacked by oneDNN (torch's mkldnn::_linear_pointwise), on row
// slices.
inline at::Tensor packed_linear(const at::Tensor& x, const at::Tensor& packed, const std::optional<at::Tensor>& bias) {
  static const c10::OperatorHandle op =
      c10::Dispatcher::singleton().findSchemaOrThrow("mkldnn::_linear_pointwise", "");
  return on_row_slices(x, [&](const at::Tensor& rows) {
    torch::jit::Stack stack{rows, packed, bias, std::string("none"), c10::List<std::optional<at::Scalar>>(),
                            std::optional<std::string>()};
    op.callBoxed(&stack);
    return stack[0].toTensor();
  });
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
