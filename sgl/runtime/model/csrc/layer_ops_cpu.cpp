// Fused elementwise ops of a decoder layer on CPU (library sgl_layer), built on first use.
//
//   rms_norm       x / rms(x) * w                 (Gemma: * (offset + w), in float32)
//   add_rms_norm   s = x + a; (s, rms_norm(s))     (the residual add before a norm)
//   rotate         rotate-half RoPE over the first R dims of each head, out contiguous
//   gated_act      act(gate) * up from the fused gate_up output (SiLU or tanh-GELU; torch's kernels)
//
// Why: in eager mode a decode step of a small model is mostly per-op overhead. The torch
// versions of these are ~25 small ops a layer (casts to float32 and back, pow, mean, rsqrt,
// roll, cat, mul, add); here they are 4 calls. Each computes what the torch ops compute, in
// the same order and the same roundings (float32 inside, rounded to the activation dtype
// where torch rounds), so results are those of model/llama.py's torch path: RoPE exactly
// (no FMA contraction: built with -ffp-contract=off), the activations exactly (torch's own
// kernels), the norm up to the order of its sum of squares.

#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <tuple>
#include <vector>

namespace {

template <typename T>
inline float f32(T v) {
  return static_cast<float>(v);
}

template <typename T>
inline T cast(float v) {
  return static_cast<T>(v);  // c10::BFloat16 / Half round to nearest even, as torch does
}

// Row conversions to and from float32 in loops the compiler vectorizes (c10's scalar
// conversions do not: their NaN branch stops it). bf16: round to nearest even, NaN kept NaN.
inline float bf16_bits_to_float(uint16_t h) {
  const uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

inline uint16_t float_to_bf16_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  const uint32_t rounded = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
  return f != f ? static_cast<uint16_t>(0x7FC0) : static_cast<uint16_t>(rounded);
}

template <typename T>
inline void load_row(const T* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = f32(src[i]);
}

template <>
inline void load_row<at::BFloat16>(const at::BFloat16* src, float* dst, int64_t n) {
  const uint16_t* s = reinterpret_cast<const uint16_t*>(src);
  for (int64_t i = 0; i < n; ++i) dst[i] = bf16_bits_to_float(s[i]);
}

template <typename T>
inline void store_row(const float* src, T* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = cast<T>(src[i]);
}

template <>
inline void store_row<at::BFloat16>(const float* src, at::BFloat16* dst, int64_t n) {
  uint16_t* d = reinterpret_cast<uint16_t*>(dst);
  for (int64_t i = 0; i < n; ++i) d[i] = float_to_bf16_bits(src[i]);
}

// x rounded to T's precision, kept as a float (torch rounds every op's result to the dtype).
template <typename T>
inline void round_row(float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] = f32(cast<T>(x[i]));
}

template <>
inline void round_row<float>(float*, int64_t) {}

template <>
inline void round_row<at::BFloat16>(float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] = bf16_bits_to_float(float_to_bf16_bits(x[i]));
}

// Rows of a 2-D or 3-D tensor whose last dim is contiguous: row r's first element.
template <typename T>
struct Rows {
  const T* base;
  int64_t inner, stride0, stride1;  // rows of dim 1 per index of dim 0; strides of dims 0, 1
  explicit Rows(const at::Tensor& x)
      : base(x.data_ptr<T>()),
        inner(x.dim() == 3 ? x.size(1) : 1),
        stride0(x.stride(0)),
        stride1(x.dim() == 3 ? x.stride(1) : 0) {}
  const T* operator[](int64_t r) const { return base + (r / inner) * stride0 + (r % inner) * stride1; }
};

int64_t row_count(const at::Tensor& x) { return x.dim() == 3 ? x.size(0) * x.size(1) : x.size(0); }

void check_rows(const at::Tensor& x, const char* name) {
  TORCH_CHECK(x.device().is_cpu(), name, " must be on the CPU");
  TORCH_CHECK((x.dim() == 2 || x.dim() == 3) && x.stride(-1) == 1, name,
              " must be 2-D or 3-D with a contiguous last dim");
}

// Rows per parallel chunk: about 32k elements, so decode steps (a few rows) run inline.
int64_t grain(int64_t n) { return std::max<int64_t>(1, (1 << 15) / std::max<int64_t>(n, 1)); }

// One row in place: x * r * w (rounded as torch rounds), r = 1 / sqrt(mean(x^2) + eps);
// w as float32. x holds the row in float32 and gets the result, still to be stored.
template <typename T>
inline void norm_row(float* x, const float* w, int64_t n, float eps, float offset) {
  float acc[16] = {0};
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    for (int j = 0; j < 16; ++j) acc[j] += x[i + j] * x[i + j];
  float sum = 0.f;
  for (; i < n; ++i) sum += x[i] * x[i];
  for (int j = 0; j < 16; ++j) sum += acc[j];
  const float r = 1.0f / std::sqrt(sum / static_cast<float>(n) + eps);
  if (offset != 0.f) {
    for (int64_t k = 0; k < n; ++k) x[k] = (x[k] * r) * (offset + w[k]);
  } else {
    for (int64_t k = 0; k < n; ++k) x[k] *= r;
    round_row<T>(x, n);
    for (int64_t k = 0; k < n; ++k) x[k] = w[k] * x[k];
  }
}

void check_weight(const at::Tensor& w, const at::Tensor& x, int64_t n) {
  TORCH_CHECK(w.dim() == 1 && w.size(0) == n && w.is_contiguous() && w.scalar_type() == x.scalar_type(),
              "w must be a contiguous [", n, "] tensor of x's dtype");
}

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& w, double eps, double offset) {
  check_rows(x, "x");
  const int64_t n = x.size(-1), rows = row_count(x);
  check_weight(w, x, n);
  at::Tensor out = at::empty(x.sizes(), x.options().memory_format(at::MemoryFormat::Contiguous));
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "rms_norm", [&] {
    const Rows<scalar_t> in(x);
    std::vector<float> wf(n);
    load_row(w.data_ptr<scalar_t>(), wf.data(), n);
    scalar_t* o = out.data_ptr<scalar_t>();
    at::parallel_for(0, rows, grain(n), [&](int64_t r0, int64_t r1) {
      std::vector<float> buf(n);
      for (int64_t r = r0; r < r1; ++r) {
        load_row(in[r], buf.data(), n);
        norm_row<scalar_t>(buf.data(), wf.data(), n, static_cast<float>(eps), static_cast<float>(offset));
        store_row(buf.data(), o + r * n, n);
      }
    });
  });
  return out;
}

std::tuple<at::Tensor, at::Tensor> add_rms_norm(const at::Tensor& x, const at::Tensor& a, const at::Tensor& w,
                                                double eps, double offset) {
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous() && a.sizes() == x.sizes() && a.is_contiguous() &&
                  a.scalar_type() == x.scalar_type() && x.device().is_cpu() && a.device().is_cpu(),
              "x and a must be contiguous 2-D CPU tensors of one shape and dtype");
  const int64_t rows = x.size(0), n = x.size(1);
  check_weight(w, x, n);
  at::Tensor sum = at::empty_like(x), out = at::empty_like(x);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "add_rms_norm", [&] {
    const scalar_t *xp = x.data_ptr<scalar_t>(), *ap = a.data_ptr<scalar_t>();
    std::vector<float> wf(n);
    load_row(w.data_ptr<scalar_t>(), wf.data(), n);
    scalar_t *sp = sum.data_ptr<scalar_t>(), *o = out.data_ptr<scalar_t>();
    at::parallel_for(0, rows, grain(n), [&](int64_t r0, int64_t r1) {
      std::vector<float> buf(n), other(n);
      for (int64_t r = r0; r < r1; ++r) {
        load_row(xp + r * n, buf.data(), n);
        load_row(ap + r * n, other.data(), n);
        for (int64_t k = 0; k < n; ++k) buf[k] += other[k];
        round_row<scalar_t>(buf.data(), n);
        store_row(buf.data(), sp + r * n, n);
        norm_row<scalar_t>(buf.data(), wf.data(), n, static_cast<float>(eps), static_cast<float>(offset));
        store_row(buf.data(), o + r * n, n);
      }
    });
  });
  return {sum, out};
}

at::Tensor rotate(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  check_rows(x, "x");
  TORCH_CHECK(x.dim() == 3, "x must be [tokens, heads, head_dim]");
  const int64_t tokens = x.size(0), heads = x.size(1), d = x.size(2);
  const int64_t R = cos.size(-1);
  TORCH_CHECK(cos.scalar_type() == at::kFloat && sin.scalar_type() == at::kFloat && cos.is_contiguous() &&
                  sin.is_contiguous() && cos.numel() == tokens * R && sin.numel() == tokens * R,
              "cos and sin must be contiguous float32 tables with one row of R dims per token");
  TORCH_CHECK(R % 2 == 0 && R <= d, "the rotated dims R (", R, ") must be even and at most head_dim (", d, ")");
  at::Tensor out = at::empty({tokens, heads, d}, x.options());
  const int64_t half = R / 2;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "rotate", [&] {
    const Rows<scalar_t> in(x);
    const float *cp = cos.data_ptr<float>(), *sp = sin.data_ptr<float>();
    scalar_t* o = out.data_ptr<scalar_t>();
    at::parallel_for(0, tokens * heads, grain(d), [&](int64_t r0, int64_t r1) {
      std::vector<float> src(d), dst(d);
      for (int64_t r = r0; r < r1; ++r) {
        load_row(in[r], src.data(), d);
        const float *c = cp + (r / heads) * R, *s = sp + (r / heads) * R;
        for (int64_t i = 0; i < half; ++i) {  // torch.roll by R/2: the partner of i is i + R/2, and back
          dst[i] = src[i] * c[i] + src[i + half] * s[i];
          dst[i + half] = src[i + half] * c[i + half] + src[i] * s[i + half];
        }
        for (int64_t i = R; i < d; ++i) dst[i] = src[i];
        store_row(dst.data(), o + r * d, d);
      }
    });
  });
  return out;
}

// torch's own activation kernels (vectorized with its exp) on the two halves, from C++: one
// dispatch from Python instead of four, and the torch route's result bit for bit.
at::Tensor gated_act(const at::Tensor& gate_up, bool gelu) {
  TORCH_CHECK(gate_up.dim() == 2 && gate_up.size(1) % 2 == 0 && gate_up.device().is_cpu(),
              "gate_up must be a 2-D CPU tensor [tokens, 2 * intermediate]");
  const int64_t inter = gate_up.size(1) / 2;
  const at::Tensor gate = gate_up.narrow(1, 0, inter), up = gate_up.narrow(1, inter, inter);
  at::Tensor act = gelu ? at::gelu(gate, "tanh") : at::silu(gate);
  return act.mul_(up);
}

}  // namespace

TORCH_LIBRARY(sgl_layer, m) {
  m.def("rms_norm(Tensor x, Tensor w, float eps, float offset) -> Tensor");
  m.def("add_rms_norm(Tensor x, Tensor a, Tensor w, float eps, float offset) -> (Tensor, Tensor)");
  m.def("rotate(Tensor x, Tensor cos, Tensor sin) -> Tensor");
  m.def("gated_act(Tensor gate_up, bool gelu) -> Tensor");
}

TORCH_LIBRARY_IMPL(sgl_layer, CPU, m) {
  m.impl("rms_norm", &rms_norm);
  m.impl("add_rms_norm", &add_rms_norm);
  m.impl("rotate", &rotate);
  m.impl("gated_act", &gated_act);
}
