// Paged attention for CPUs (float32 queries, float32 / bf16 / fp16 KV): every row of a batch (decode rows and short extends
// alike) in one call, each reading its context straight from the KV pool by slot.
//
// Why a kernel: torch's SDPA needs a dense [rows, heads, queries, keys] layout, so a batch
// that mixes one-token rows with a few multi-token rows (jump-forward extends) pads every
// row to the longest query, and short prefills pay a call per row. Here the work is one
// item per (row, kv head): cost follows the real number of (query, key) pairs.
//
// rows: [B, 4] int64, per row (table row, first query token, query count E, context length L).
// Query i of a row attends keys 0 .. L - E + i (causal over the new tokens). The row's key
// slots are table[table row, 0 .. L). q and out: [T, H, D]; k_buf, v_buf: [S, KVH, D].
//
// Loops use GCC vector extensions (16 floats), so the compiler emits AVX-512 or AVX2 as the
// machine allows; head_dim is 16, 32, 64, 96, 128 or 256 (checked). A bf16 or fp16 KV pool is
// widened to float32 as it is loaded (the math stays float32): half the bytes read per key.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

namespace {

// aligned(4): loads from any float address; may_alias: they read float buffers.
typedef float v16 __attribute__((vector_size(64), aligned(4), may_alias));
typedef float v8 __attribute__((vector_size(32), aligned(4), may_alias));
typedef float v4 __attribute__((vector_size(16), aligned(4), may_alias));

typedef uint16_t u16x16 __attribute__((vector_size(32), aligned(2), may_alias));
typedef uint32_t u32x16 __attribute__((vector_size(64)));
typedef _Float16 h16 __attribute__((vector_size(32), aligned(2), may_alias));

inline v16 load16(const float* p) { return *reinterpret_cast<const v16*>(p); }
// bf16 is the top half of a float32: widen each lane and shift it up.
inline v16 load16(const at::BFloat16* p) {
  return (v16)(__builtin_convertvector(*reinterpret_cast<const u16x16*>(p), u32x16) << 16);
}
inline v16 load16(const at::Half* p) { return __builtin_convertvector(*reinterpret_cast<const h16*>(p), v16); }
inline void store16(float* p, v16 x) { *reinterpret_cast<v16*>(p) = x; }

// Sum of the 16 lanes as a tree of half-width adds (memcpy of a vector half compiles to a
// register extract; no __builtin_shufflevector, which GCC has only from version 12).
inline float hsum(v16 x) {
  v8 lo, hi;
  std::memcpy(&lo, &x, sizeof lo);
  std::memcpy(&hi, reinterpret_cast<const char*>(&x) + sizeof lo, sizeof hi);
  const v8 a = lo + hi;
  v4 l4, h4;
  std::memcpy(&l4, &a, sizeof l4);
  std::memcpy(&h4, reinterpret_cast<const char*>(&a) + sizeof l4, sizeof h4);
  const v4 b = l4 + h4;
  return (b[0] + b[2]) + (b[1] + b[3]);
}

struct Shape {
  int64_t H, KVH, G;
};

// One (row, kv head): the row's E query tokens x G query heads over its keys.
// scores: scratch of at least L floats.
template <int NV, typename KV>
void attend_row_head(const float* q, const KV* k_buf, const KV* v_buf, float* out, const int64_t* slots,
                     int64_t first, int64_t E, int64_t L, int64_t h, Shape s, float scale, float* scores) {
  constexpr int64_t D = NV * 16;
  const int64_t prefix = L - E;
  for (int64_t i = 0; i < E; ++i) {
    const int64_t n = prefix + i + 1;  // keys this query sees
    for (int64_t g = 0; g < s.G; ++g) {
      const int64_t off = ((first + i) * s.H + h * s.G + g) * D;
      v16 qv[NV];
      for (int c = 0; c < NV; ++c) qv[c] = load16(q + off + 16 * c) * scale;
      // scores = q . k, and their max
      for (int64_t j = 0; j < n; ++j) {
        const KV* kr = k_buf + (slots[j] * s.KVH + h) * D;
        v16 acc = qv[0] * load16(kr);
        for (int c = 1; c < NV; ++c) acc += qv[c] * load16(kr + 16 * c);
        scores[j] = hsum(acc);
      }
      float m = scores[0];
      for (int64_t j = 1; j < n; ++j) m = std::max(m, scores[j]);
      float sum = 0.f;
      for (int64_t j = 0; j < n; ++j) {
        const float e = std::exp(scores[j] - m);
        scores[j] = e;
        sum += e;
      }
      // out = softmax . V, accumulated in registers
      v16 o[NV];
      for (int c = 0; c < NV; ++c) o[c] = v16{};
      for (int64_t j = 0; j < n; ++j) {
        const KV* vr = v_buf + (slots[j] * s.KVH + h) * D;
        const float p = scores[j];
        for (int c = 0; c < NV; ++c) o[c] += p * load16(vr + 16 * c);
      }
      const float inv = 1.f / sum;
      for (int c = 0; c < NV; ++c) store16(out + off + 16 * c, o[c] * inv);
    }
  }
}

template <typename KV>
using RowHeadFn = void (*)(const float*, const KV*, const KV*, float*, const int64_t*, int64_t, int64_t,
                           int64_t, int64_t, Shape, float, float*);

template <typename KV>
RowHeadFn<KV> pick(int64_t D) {
  switch (D) {
    case 16: return attend_row_head<1, KV>;
    case 32: return attend_row_head<2, KV>;
    case 64: return attend_row_head<4, KV>;
    case 96: return attend_row_head<6, KV>;
    case 128: return attend_row_head<8, KV>;
    case 256: return attend_row_head<16, KV>;
    default: return nullptr;
  }
}

template <typename KV>
void run_rows(const at::Tensor& q, const at::Tensor& k_buf, const at::Tensor& v_buf, at::Tensor& out,
              const int64_t* rp, const int64_t* tp, int64_t B, int64_t C, int64_t max_len, double scale) {
  const int64_t H = q.size(1), D = q.size(2), KVH = k_buf.size(1);
  RowHeadFn<KV> fn = pick<KV>(D);
  TORCH_CHECK(fn != nullptr, "head_dim ", D, " is not supported (16, 32, 64, 96, 128 or 256)");
  const float* qp = q.data_ptr<float>();
  const KV* kp = k_buf.data_ptr<KV>();
  const KV* vp = v_buf.data_ptr<KV>();
  float* op = out.data_ptr<float>();
  const Shape s{H, KVH, H / KVH};
  const float sc = static_cast<float>(scale);
  const int64_t items = B * KVH;
  if (items == 0) return;
  // Items are dealt round-robin to threads, so rows of unequal cost spread evenly.
  const int64_t threads = std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), items));
  at::parallel_for(0, threads, 1, [&](int64_t t0, int64_t t1) {
    std::vector<float> scores(max_len);
    for (int64_t t = t0; t < t1; ++t) {
      for (int64_t w = t; w < items; w += threads) {
        const int64_t* r = rp + 4 * (w / KVH);
        fn(qp, kp, vp, op, tp + r[0] * C, r[1], r[2], r[3], w % KVH, s, sc, scores.data());
      }
    }
  });
}

at::Tensor paged_attention(const at::Tensor& q, const at::Tensor& k_buf, const at::Tensor& v_buf,
                           const at::Tensor& table, const at::Tensor& rows, double scale) {
  TORCH_CHECK(q.dim() == 3 && k_buf.dim() == 3 && v_buf.dim() == 3, "q, k_buf, v_buf must be [tokens, heads, dim]");
  const auto kv_type = k_buf.scalar_type();
  TORCH_CHECK(q.scalar_type() == at::kFloat, "paged_attention takes float32 queries");
  TORCH_CHECK(v_buf.scalar_type() == kv_type &&
                  (kv_type == at::kFloat || kv_type == at::kBFloat16 || kv_type == at::kHalf),
              "k_buf and v_buf must both be float32, bfloat16 or float16");
  TORCH_CHECK(table.scalar_type() == at::kLong && rows.scalar_type() == at::kLong, "table and rows must be int64");
  TORCH_CHECK(q.is_contiguous() && k_buf.is_contiguous() && v_buf.is_contiguous() && table.is_contiguous() &&
                  rows.is_contiguous(), "paged_attention takes contiguous tensors");
  TORCH_CHECK(rows.dim() == 2 && rows.size(1) == 4, "rows must be [B, 4]");
  TORCH_CHECK(table.dim() == 2, "table must be [table rows, max context]");
  const int64_t T = q.size(0), H = q.size(1), D = q.size(2), KVH = k_buf.size(1);
  TORCH_CHECK(k_buf.sizes() == v_buf.sizes() && k_buf.size(2) == D, "k_buf and v_buf must be [slots, kv_heads, ", D, "]");
  TORCH_CHECK(KVH > 0 && H % KVH == 0, "query heads (", H, ") must be a multiple of kv heads (", KVH, ")");
  TORCH_CHECK(pick<float>(D) != nullptr, "head_dim ", D, " is not supported (16, 32, 64, 96, 128 or 256)");
  const int64_t B = rows.size(0), R = table.size(0), C = table.size(1), S = k_buf.size(0);
  const int64_t* rp = rows.data_ptr<int64_t>();
  const int64_t* tp = table.data_ptr<int64_t>();
  // Every index is checked before any thread reads through it: a bad row or slot is an
  // error, never a stray read. (Rows must also not share query tokens: the engine's never do.)
  int64_t max_len = 0;
  for (int64_t b = 0; b < B; ++b) {
    const int64_t* r = rp + 4 * b;
    TORCH_CHECK(r[0] >= 0 && r[0] < R && r[2] >= 1 && r[2] <= r[3] && r[3] <= C && r[1] >= 0 && r[1] + r[2] <= T,
                "rows[", b, "] = (", r[0], ", ", r[1], ", ", r[2], ", ", r[3], ") is out of range");
    const int64_t* slots = tp + r[0] * C;
    for (int64_t j = 0; j < r[3]; ++j) {
      TORCH_CHECK(slots[j] >= 0 && slots[j] < S, "rows[", b, "]: slot ", slots[j], " at position ", j,
                  " is outside the KV pool (", S, " slots)");
    }
    max_len = std::max(max_len, r[3]);
  }
  at::Tensor out = at::empty_like(q);
  if (kv_type == at::kFloat) {
    run_rows<float>(q, k_buf, v_buf, out, rp, tp, B, C, max_len, scale);
  } else if (kv_type == at::kBFloat16) {
    run_rows<at::BFloat16>(q, k_buf, v_buf, out, rp, tp, B, C, max_len, scale);
  } else {
    run_rows<at::Half>(q, k_buf, v_buf, out, rp, tp, B, C, max_len, scale);
  }
  return out;
}

}  // namespace

TORCH_LIBRARY(sgl_cpu, m) {
  m.def("paged_attention(Tensor q, Tensor k_buf, Tensor v_buf, Tensor table, Tensor rows, float scale) -> Tensor");
}

TORCH_LIBRARY_IMPL(sgl_cpu, CPU, m) { m.impl("paged_attention", &paged_attention); }
