// Quantized-weight matmuls for decoding on AVX-512 VNNI CPUs (library sgl_qmm), built on
// first use like the attention kernel.
//
// Why: a decode step multiplies a few activation rows by every weight, so its cost is
// reading the weights and turning them into products. torch's packed int8 / int4 CPU kernels
// convert each weight to float and FMA it (~3 instructions per 16 weights); here the
// activations are quantized once per call to int16 (one scale per row: relative error 2^-16
// of the row's largest value, below the bf16 rounding the activations already carry) and the
// integer codes are multiplied by `vpdpwssd` (32 products, accumulated in int32, per
// instruction). A weight group's int32 sum is scaled in float once per group.
//
// Layouts (N padded to a multiple of 16 output rows; a tile is 16 rows, the 16 int32 lanes
// of one register, so every lane accumulates one output row):
//   int4  qweight uint8 [N/16, K/4, 32]: byte 2i+j of (tile t, step s) holds
//         q[16t+i, 4s+j] in its low nibble and q[16t+i, 4s+2+j] in its high one;
//         scale_min fp16 [N/16, K/group, 2, 16]: w = q * scale + min   (q in 0..15)
//   int8  qweight int8 [N/16, K/2, 32]: byte 2i+j of (tile t, step s) holds q[16t+i, 2s+j];
//         scales fp16 [N/16, K/group, 16]: w = q * scale   (group = K: per output channel)
// fp16 scales hold GGUF's Q4_0 / Q4_1 / Q8_0 block scales exactly.
//
//   int4_mm / int8_mm       x [M, K] (bf16 or float32) @ W^T -> [M, out_features], x's dtype
//   int4_dequant_t / int8_dequant_t   bf16 W^T [K, N] (all padded rows): prefill
//   int4_linear / int8_linear         the layer's dense copy from `dense_from` rows where it
//                                     keeps one (dense_copy.h), else
//                                     the packed kernel up to `crossover` rows, else
//                                     dequantize + a matmul in `dense_dtype` (bf16 where the
//                                     CPU has AMX / AVX512-BF16, else float32: a VNNI CPU
//                                     without them, Cascade / Ice Lake, emulates bf16)
//   supported()             whether this build has the kernels (AVX-512 VNNI + F16C)

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "dense_copy.h"

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__) && defined(__F16C__)
#define SGL_QMM 1
#else
#define SGL_QMM 0
#endif

namespace {

constexpr int kTile = 16;       // output rows per tile (int32 lanes of a zmm register)
constexpr int kMaxRows = 4;     // activation rows sharing one pass over a tile's weights
constexpr int kInt8Chunk = 128; // int8: inputs summed in int32 before a flush to float (no overflow)
constexpr int kPrefetchBytes = 4096;  // how far ahead of the weight stream to prefetch

bool supported() { return SGL_QMM; }

void check_x(const at::Tensor& x, int64_t K) {
  TORCH_CHECK(x.dim() == 2 && x.size(1) == K, "x must be [M, ", K, "], got ", x.sizes());
  TORCH_CHECK(x.scalar_type() == at::kBFloat16 || x.scalar_type() == at::kFloat, "x must be bf16 or float32");
}

// Per-row int16 activations: xq = round(x / scale), scale = max|x| / 32767; and, for int4,
// each group's float sum of x (the `min` term). Read straight from bf16 or float32 into
// per-thread scratch that lives across calls: a decode step makes ~120 of these calls, and
// a float copy of x plus three fresh tensors per call cost more than the quantizing.
struct QuantizedRows {
  const int16_t* xq;   // [M, K]
  const float* scale;  // [M]
  const float* gsum;   // [M, K / group] (int4 only)
};

template <typename T>
void quantize_row(const T* row, int64_t K, int64_t group, int16_t* dst, float* scale, float* gsum) {
  float amax = 0.f;
  bool finite = true;
  for (int64_t k = 0; k < K; ++k) {
    const float v = static_cast<float>(row[k]);
    amax = std::max(amax, std::fabs(v));
    finite = finite && std::isfinite(v);
  }
  // A non-finite input makes its row's outputs NaN, as a float matmul would.
  const float inv = amax > 0.f && finite ? 32767.f / amax : 0.f;
  *scale = finite ? amax / 32767.f : NAN;
  for (int64_t k = 0; k < K; ++k) dst[k] = static_cast<int16_t>(std::nearbyint(static_cast<float>(row[k]) * inv));
  if (gsum == nullptr) return;
  for (int64_t g = 0; g < K / group; ++g) {
    float s = 0.f;
    for (int64_t k = g * group; k < (g + 1) * group; ++k) s += static_cast<float>(row[k]);
    gsum[g] = s;
  }
}

// The scratch is the calling thread's: valid until its next call, which is after the
// kernel that reads it has returned (parallel_for joins before returning).
QuantizedRows quantize_rows(const at::Tensor& x, int64_t group, bool group_sums) {
  thread_local std::vector<int16_t> xq_buf;
  thread_local std::vector<float> float_buf;
  const at::Tensor xc = x.contiguous();
  const int64_t M = xc.size(0), K = xc.size(1), G = group_sums ? K / group : 0;
  if (static_cast<int64_t>(xq_buf.size()) < M * K) xq_buf.resize(M * K);
  if (static_cast<int64_t>(float_buf.size()) < M * (1 + G)) float_buf.resize(M * (1 + G));
  float* scale = float_buf.data();
  float* gsum = group_sums ? float_buf.data() + M : nullptr;
  for (int64_t m = 0; m < M; ++m) {
    int16_t* dst = xq_buf.data() + m * K;
    float* gs = gsum ? gsum + m * G : nullptr;
    if (xc.scalar_type() == at::kBFloat16)
      quantize_row(xc.data_ptr<at::BFloat16>() + m * K, K, group, dst, scale + m, gs);
    else
      quantize_row(xc.data_ptr<float>() + m * K, K, group, dst, scale + m, gs);
  }
  return {xq_buf.data(), scale, gsum};
}

#if SGL_QMM

inline __m512i broadcast_pair(const int16_t* p) {
  int32_t v;
  std::memcpy(&v, p, sizeof v);
  return _mm512_set1_epi32(v);
}

inline __m512 load_half16(const uint16_t* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}

// One tile (16 output rows) times R activation rows: out[r][16] floats.
template <int R>
void int4_tile(const uint8_t* w, const uint16_t* sm, int64_t K, int64_t group, const int16_t* xq, int64_t M_stride,
               const float* gsum, int64_t G, const float* xscale, float* out) {
  __m512 accq[R], accm[R];
  for (int r = 0; r < R; ++r) accq[r] = accm[r] = _mm512_setzero_ps();
  const __m512i low4 = _mm512_set1_epi16(0x0F);
  for (int64_t g = 0; g < G; ++g) {
    __m512i lo[R], hi[R];
    for (int r = 0; r < R; ++r) lo[r] = hi[r] = _mm512_setzero_si512();
    for (int64_t k = g * group; k < (g + 1) * group; k += 4) {
      if ((k & 7) == 0) _mm_prefetch(reinterpret_cast<const char*>(w + k * 8 + kPrefetchBytes), _MM_HINT_T0);
      const __m512i wv = _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + k * 8)));
      const __m512i wl = _mm512_and_si512(wv, low4);
      const __m512i wh = _mm512_srli_epi16(wv, 4);
      for (int r = 0; r < R; ++r) {
        lo[r] = _mm512_dpwssd_epi32(lo[r], wl, broadcast_pair(xq + r * M_stride + k));
        hi[r] = _mm512_dpwssd_epi32(hi[r], wh, broadcast_pair(xq + r * M_stride + k + 2));
      }
    }
    const __m512 s = load_half16(sm + g * 2 * kTile);
    const __m512 mn = load_half16(sm + g * 2 * kTile + kTile);
    for (int r = 0; r < R; ++r) {
      accq[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(lo[r], hi[r])), s, accq[r]);
      accm[r] = _mm512_fmadd_ps(mn, _mm512_set1_ps(gsum[r * G + g]), accm[r]);
    }
  }
  for (int r = 0; r < R; ++r)
    _mm512_storeu_ps(out + r * kTile, _mm512_fmadd_ps(accq[r], _mm512_set1_ps(xscale[r]), accm[r]));
}

template <int R>
void int8_tile(const int8_t* w, const uint16_t* scales, int64_t K, int64_t group, const int16_t* xq,
               int64_t M_stride, const float* xscale, float* out) {
  __m512 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  const int64_t G = K / group;
  for (int64_t g = 0; g < G; ++g) {
    __m512 accg[R];
    for (int r = 0; r < R; ++r) accg[r] = _mm512_setzero_ps();
    for (int64_t c = g * group; c < (g + 1) * group; c += kInt8Chunk) {
      const int64_t end = std::min(c + kInt8Chunk, (g + 1) * group);
      __m512i a0[R], a1[R];  // two chains per row: the products of even and odd steps
      for (int r = 0; r < R; ++r) a0[r] = a1[r] = _mm512_setzero_si512();
      for (int64_t k = c; k < end; k += 4) {
        _mm_prefetch(reinterpret_cast<const char*>(w + k * 16 + kPrefetchBytes), _MM_HINT_T0);
        const __m512i w0 = _mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + k * 16)));
        const __m512i w1 = _mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + k * 16 + 32)));
        for (int r = 0; r < R; ++r) {
          a0[r] = _mm512_dpwssd_epi32(a0[r], w0, broadcast_pair(xq + r * M_stride + k));
          a1[r] = _mm512_dpwssd_epi32(a1[r], w1, broadcast_pair(xq + r * M_stride + k + 2));
        }
      }
      for (int r = 0; r < R; ++r) accg[r] = _mm512_add_ps(accg[r], _mm512_cvtepi32_ps(_mm512_add_epi32(a0[r], a1[r])));
    }
    const __m512 s = load_half16(scales + g * kTile);
    for (int r = 0; r < R; ++r) acc[r] = _mm512_fmadd_ps(accg[r], s, acc[r]);
  }
  for (int r = 0; r < R; ++r) _mm512_storeu_ps(out + r * kTile, _mm512_mul_ps(acc[r], _mm512_set1_ps(xscale[r])));
}

#endif  // SGL_QMM

// Writes a tile's float results (R rows x 16) into out[M, N] (x's dtype), dropping padded rows.
void store_tile(const float* tile, int R, at::Tensor& out, int64_t m0, int64_t n0) {
  const int64_t N = out.size(1), cols = std::min<int64_t>(kTile, N - n0);
  for (int r = 0; r < R; ++r) {
    const float* src = tile + r * kTile;
    if (out.scalar_type() == at::kFloat) {
      std::memcpy(out.data_ptr<float>() + (m0 + r) * N + n0, src, cols * sizeof(float));
    } else {
      at::BFloat16* dst = out.data_ptr<at::BFloat16>() + (m0 + r) * N + n0;
      for (int64_t j = 0; j < cols; ++j) dst[j] = at::BFloat16(src[j]);
    }
  }
}

// Runs `tile_fn(t, m0, R, float* results)` over every (tile, block of <= 4 rows), tiles split
// among the threads.
template <typename TileFn>
at::Tensor run_tiles(const at::Tensor& x, int64_t tiles, int64_t out_features, TileFn tile_fn) {
  const int64_t M = x.size(0);
  at::Tensor out = at::empty({M, out_features}, x.options());
  at::parallel_for(0, tiles, 1, [&](int64_t t0, int64_t t1) {
    alignas(64) float results[kMaxRows * kTile];
    for (int64_t t = t0; t < t1; ++t) {
      for (int64_t m0 = 0; m0 < M; m0 += kMaxRows) {
        const int R = static_cast<int>(std::min<int64_t>(kMaxRows, M - m0));
        tile_fn(t, m0, R, results);
        store_tile(results, R, out, m0, t * kTile);
      }
    }
  });
  return out;
}

void check_layout(const at::Tensor& qweight, const at::Tensor& scales, int64_t K, int64_t group, int64_t out_features,
                  int64_t per_group) {
  const int64_t tiles = qweight.size(0);
  TORCH_CHECK(group > 0 && K % group == 0, "group ", group, " must divide K (", K, ")");
  TORCH_CHECK(out_features > 0 && out_features <= tiles * kTile && out_features > (tiles - 1) * kTile,
              "out_features ", out_features, " does not match ", tiles, " tiles of 16 rows");
  TORCH_CHECK(scales.scalar_type() == at::kHalf && scales.is_contiguous() && scales.numel() == tiles * (K / group) * per_group,
              "scales must be a contiguous fp16 tensor of ", tiles * (K / group) * per_group, " values");
}

at::Tensor int4_mm(const at::Tensor& x, const at::Tensor& qweight, const at::Tensor& scale_min, int64_t group,
                   int64_t out_features) {
  TORCH_CHECK(SGL_QMM, "sgl_qmm was built without AVX-512 VNNI");
  TORCH_CHECK(qweight.scalar_type() == at::kByte && qweight.dim() == 3 && qweight.size(2) == 32 && qweight.is_contiguous(),
              "qweight must be a contiguous uint8 [N/16, K/4, 32] tensor");
  const int64_t K = qweight.size(1) * 4, G = K / std::max<int64_t>(group, 1);
  check_x(x, K);
  check_layout(qweight, scale_min, K, group, out_features, 2 * kTile);
  TORCH_CHECK(group % 4 == 0, "group must be a multiple of 4");
  const QuantizedRows q = quantize_rows(x, group, true);
#if SGL_QMM
  const uint8_t* w = qweight.data_ptr<uint8_t>();
  const uint16_t* sm = reinterpret_cast<const uint16_t*>(scale_min.data_ptr<at::Half>());
  const int16_t* xq = q.xq;
  const float* gsum = q.gsum;
  const float* xscale = q.scale;
  return run_tiles(x, qweight.size(0), out_features, [&](int64_t t, int64_t m0, int R, float* res) {
    const uint8_t* tw = w + t * K * 8;
    const uint16_t* ts = sm + t * G * 2 * kTile;
    const int16_t* tx = xq + m0 * K;
    const float* tg = gsum + m0 * G;
    switch (R) {
      case 1: int4_tile<1>(tw, ts, K, group, tx, K, tg, G, xscale + m0, res); break;
      case 2: int4_tile<2>(tw, ts, K, group, tx, K, tg, G, xscale + m0, res); break;
      case 3: int4_tile<3>(tw, ts, K, group, tx, K, tg, G, xscale + m0, res); break;
      default: int4_tile<4>(tw, ts, K, group, tx, K, tg, G, xscale + m0, res); break;
    }
  });
#else
  return at::Tensor();
#endif
}

at::Tensor int8_mm(const at::Tensor& x, const at::Tensor& qweight, const at::Tensor& scales, int64_t group,
                   int64_t out_features) {
  TORCH_CHECK(SGL_QMM, "sgl_qmm was built without AVX-512 VNNI");
  TORCH_CHECK(qweight.scalar_type() == at::kChar && qweight.dim() == 3 && qweight.size(2) == 32 && qweight.is_contiguous(),
              "qweight must be a contiguous int8 [N/16, K/2, 32] tensor");
  const int64_t K = qweight.size(1) * 2, G = K / std::max<int64_t>(group, 1);
  check_x(x, K);
  check_layout(qweight, scales, K, group, out_features, kTile);
  TORCH_CHECK(group % 4 == 0, "group must be a multiple of 4");
  const QuantizedRows q = quantize_rows(x, group, false);
#if SGL_QMM
  const int8_t* w = qweight.data_ptr<int8_t>();
  const uint16_t* sc = reinterpret_cast<const uint16_t*>(scales.data_ptr<at::Half>());
  const int16_t* xq = q.xq;
  const float* xscale = q.scale;
  return run_tiles(x, qweight.size(0), out_features, [&](int64_t t, int64_t m0, int R, float* res) {
    const int8_t* tw = w + t * K * 16;
    const uint16_t* ts = sc + t * G * kTile;
    const int16_t* tx = xq + m0 * K;
    switch (R) {
      case 1: int8_tile<1>(tw, ts, K, group, tx, K, xscale + m0, res); break;
      case 2: int8_tile<2>(tw, ts, K, group, tx, K, xscale + m0, res); break;
      case 3: int8_tile<3>(tw, ts, K, group, tx, K, xscale + m0, res); break;
      default: int8_tile<4>(tw, ts, K, group, tx, K, xscale + m0, res); break;
    }
  });
#else
  return at::Tensor();
#endif
}

#if SGL_QMM
// 16 floats -> 16 bf16 (round to nearest even, as torch; weights are finite).
inline __m256i to_bf16(__m512 v) {
  const __m512i u = _mm512_castps_si512(v);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  const __m512i rounded = _mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7FFF)));
  return _mm512_cvtepi32_epi16(_mm512_srli_epi32(rounded, 16));
}

// Words 2i + j of `v` (i = output row, j = which of two inputs) -> [input j = 0 rows | j = 1 rows].
inline __m512i split_pairs(__m512i v) {
  const __m512i idx = _mm512_set_epi16(31, 29, 27, 25, 23, 21, 19, 17, 15, 13, 11, 9, 7, 5, 3, 1,
                                       30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
  return _mm512_permutexvar_epi16(idx, v);
}

// Two inputs' rows of 16 (unsigned or signed 16-bit codes) -> w = q * s + mn as bf16 at dst, dst + N.
template <bool Signed>
inline void store_row(__m256i codes, __m512 s, __m512 mn, uint16_t* dst) {
  const __m512i wide = Signed ? _mm512_cvtepi16_epi32(codes) : _mm512_cvtepu16_epi32(codes);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst), to_bf16(_mm512_fmadd_ps(_mm512_cvtepi32_ps(wide), s, mn)));
}

// Two inputs' rows of 16 (16-bit codes, words 2i + j) -> w = q * s + mn as bf16 at dst, dst + N.
template <bool Signed>
inline void store_pair(__m512i codes, __m512 s, __m512 mn, uint16_t* dst, int64_t N) {
  const __m512i split = split_pairs(codes);
  store_row<Signed>(_mm512_extracti64x4_epi64(split, 0), s, mn, dst);
  store_row<Signed>(_mm512_extracti64x4_epi64(split, 1), s, mn, dst + N);
}
#endif

// bf16 W^T [K, N] (the rows of input k side by side); threads split the tiles, and each
// goes group by group across its tiles so its writes run along the rows.
at::Tensor int4_dequant_t(const at::Tensor& qweight, const at::Tensor& scale_min, int64_t group) {
  TORCH_CHECK(SGL_QMM, "sgl_qmm was built without AVX-512 VNNI");
  const int64_t tiles = qweight.size(0), K = qweight.size(1) * 4, N = tiles * kTile, G = K / group;
  check_layout(qweight, scale_min, K, group, N, 2 * kTile);
  at::Tensor out = at::empty({K, N}, qweight.options().dtype(at::kBFloat16));
#if SGL_QMM
  const uint8_t* w = qweight.data_ptr<uint8_t>();
  const uint16_t* sm = reinterpret_cast<const uint16_t*>(scale_min.data_ptr<at::Half>());
  uint16_t* o = reinterpret_cast<uint16_t*>(out.data_ptr<at::BFloat16>());
  const __m512i low4 = _mm512_set1_epi16(0x0F);
  at::parallel_for(0, tiles, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t g = 0; g < G; ++g) {
      for (int64_t t = t0; t < t1; ++t) {
        const __m512 s = load_half16(sm + (t * G + g) * 2 * kTile), mn = load_half16(sm + (t * G + g) * 2 * kTile + kTile);
        for (int64_t k = g * group; k < (g + 1) * group; k += 4) {
          const __m512i wv = _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + t * K * 8 + k * 8)));
          store_pair<false>(_mm512_and_si512(wv, low4), s, mn, o + k * N + t * kTile, N);
          store_pair<false>(_mm512_srli_epi16(wv, 4), s, mn, o + (k + 2) * N + t * kTile, N);
        }
      }
    }
  });
#endif
  return out;
}

at::Tensor int8_dequant_t(const at::Tensor& qweight, const at::Tensor& scales, int64_t group) {
  TORCH_CHECK(SGL_QMM, "sgl_qmm was built without AVX-512 VNNI");
  const int64_t tiles = qweight.size(0), K = qweight.size(1) * 2, N = tiles * kTile, G = K / group;
  check_layout(qweight, scales, K, group, N, kTile);
  at::Tensor out = at::empty({K, N}, qweight.options().dtype(at::kBFloat16));
#if SGL_QMM
  const int8_t* w = qweight.data_ptr<int8_t>();
  const uint16_t* sc = reinterpret_cast<const uint16_t*>(scales.data_ptr<at::Half>());
  uint16_t* o = reinterpret_cast<uint16_t*>(out.data_ptr<at::BFloat16>());
  const __m512 zero = _mm512_setzero_ps();
  at::parallel_for(0, tiles, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t g = 0; g < G; ++g) {
      for (int64_t t = t0; t < t1; ++t) {
        const __m512 s = load_half16(sc + (t * G + g) * kTile);
        for (int64_t k = g * group; k < (g + 1) * group; k += 2) {
          const __m512i wv = _mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + t * K * 16 + k * 16)));
          store_pair<true>(wv, s, zero, o + k * N + t * kTile, N);
        }
      }
    }
  });
#endif
  return out;
}

// The route per call: the VNNI kernel for a few rows, dequantize + a dense matmul for many.
at::Tensor dense_route(const at::Tensor& x, const at::Tensor& w_t, int64_t out_features, at::ScalarType dense_dtype) {
  const at::Tensor w = w_t.to(dense_dtype);
  at::Tensor y = sgl_dense_copy::on_row_slices(x.to(dense_dtype), [&](const at::Tensor& rows) { return at::mm(rows, w); });
  if (w_t.size(1) != out_features) y = y.narrow(1, 0, out_features);
  return y.to(x.scalar_type()).contiguous();
}

at::Tensor int4_linear(const at::Tensor& x, const at::Tensor& qweight, const at::Tensor& scale_min, int64_t group,
                       int64_t out_features, int64_t crossover, at::ScalarType dense_dtype,
                       const std::optional<at::Tensor>& dense, int64_t dense_from) {
  if (sgl_dense_copy::takes_copy(x, dense, dense_from)) return sgl_dense_copy::linear(x, *dense, out_features);
  if (x.size(0) > crossover) {
    return dense_route(x, int4_dequant_t(qweight, scale_min, group), out_features, dense_dtype);
  }
  return int4_mm(x, qweight, scale_min, group, out_features);
}

at::Tensor int8_linear(const at::Tensor& x, const at::Tensor& qweight, const at::Tensor& scales, int64_t group,
                       int64_t out_features, int64_t crossover, at::ScalarType dense_dtype,
                       const std::optional<at::Tensor>& dense, int64_t dense_from) {
  if (sgl_dense_copy::takes_copy(x, dense, dense_from)) return sgl_dense_copy::linear(x, *dense, out_features);
  if (x.size(0) > crossover) {
    return dense_route(x, int8_dequant_t(qweight, scales, group), out_features, dense_dtype);
  }
  return int8_mm(x, qweight, scales, group, out_features);
}

}  // namespace

TORCH_LIBRARY(sgl_qmm, m) {
  m.def("supported() -> bool", &supported);
  m.def("int4_mm(Tensor x, Tensor qweight, Tensor scale_min, int group, int out_features) -> Tensor");
  m.def("int8_mm(Tensor x, Tensor qweight, Tensor scales, int group, int out_features) -> Tensor");
  m.def("int4_dequant_t(Tensor qweight, Tensor scale_min, int group) -> Tensor");
  m.def("int8_dequant_t(Tensor qweight, Tensor scales, int group) -> Tensor");
  m.def("int4_linear(Tensor x, Tensor qweight, Tensor scale_min, int group, int out_features, int crossover, "
        "ScalarType dense_dtype, Tensor? dense, int dense_from) -> Tensor");
  m.def("int8_linear(Tensor x, Tensor qweight, Tensor scales, int group, int out_features, int crossover, "
        "ScalarType dense_dtype, Tensor? dense, int dense_from) -> Tensor");
}

TORCH_LIBRARY_IMPL(sgl_qmm, CPU, m) {
  m.impl("int4_mm", &int4_mm);
  m.impl("int8_mm", &int8_mm);
  m.impl("int4_dequant_t", &int4_dequant_t);
  m.impl("int8_dequant_t", &int8_dequant_t);
  m.impl("int4_linear", &int4_linear);
  m.impl("int8_linear", &int8_linear);
}

// With a dense copy (an mkldnn-layout tensor) calls dispatch on its key.
TORCH_LIBRARY_IMPL(sgl_qmm, MkldnnCPU, m) {
  m.impl("int4_linear", &int4_linear);
  m.impl("int8_linear", &int8_linear);
}
