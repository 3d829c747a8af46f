// Paged attention for CPUs (float32 queries, float32 / bf16 / fp16 KV): every row of a batch (decode rows and short extends
// alike) in one call, each reading its context straight from the KV pool by slot.
//
// Why a kernel: torch's SDPA needs a dense [rows, heads, queries, keys] layout, so a batch
// that mixes one-token rows with a few multi-token rows (jump-forward extends) pads every
// row to the longest query, and short prefills pay a call per row. Here the work is one
// item per (row, kv head): cost follows the real number of (query, key) pairs.
//
// rows: [B, 4] int64, per row (table row, first query token, query count E, context length L).
// Query i of a row attends keys 0 .. L - E + i (causal over the new tokens); with window W > 0
// only the last W of them (itself included: sliding-window layers). The row's key slots are
// table[table row, 0 .. L). q and out: [T, H, D]; k_buf, v_buf: [S, KVH, D]. logit_cap c > 0
// soft-caps the scaled scores, s -> c * tanh(s / c) (Gemma 2), before the softmax.
//
// Loops use GCC vector extensions (16 floats), so the compiler emits AVX-512 or AVX2 as the
// machine allows; head_dim is 16, 32, 64, 96, 128 or 256 (checked). A bf16 or fp16 KV pool is
// widened to float32 as it is loaded (the math stays float32): half the bytes read per key.
// The query heads sharing a kv head are done together (each key row is loaded once for them),
// q.k sums are reduced 16 keys at a time, and key / value rows are prefetched a few slots
// ahead (slots are scattered): at 48 decode rows x 100-500 keys (SmolLM2's heads) this runs
// at ~2.3x the one-head, one-sum-at-a-time loop.

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

// r[j] = the sum of a[j]'s 16 lanes: four rounds of pairwise shuffle-and-add (45 operations
// for 16 sums, against ~8 per sum one at a time). GCC 12+ / clang have __builtin_shufflevector;
// older compilers take the one-at-a-time sums.
inline v16 reduce16(const v16* a) {
#if defined(__clang__) || (defined(__GNUC__) && __GNUC__ >= 12)
  typedef float w16 __attribute__((vector_size(64)));
  w16 b[8], c[4], d[2];
  for (int i = 0; i < 8; ++i) {
    const w16 x = a[2 * i], y = a[2 * i + 1];
    b[i] = __builtin_shufflevector(x, y, 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23) +
           __builtin_shufflevector(x, y, 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31);
  }
  for (int i = 0; i < 4; ++i) {
    const w16 x = b[2 * i], y = b[2 * i + 1];
    c[i] = __builtin_shufflevector(x, y, 0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27) +
           __builtin_shufflevector(x, y, 4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31);
  }
  for (int i = 0; i < 2; ++i) {
    const w16 x = c[2 * i], y = c[2 * i + 1];
    d[i] = __builtin_shufflevector(x, y, 0, 1, 4, 5, 8, 9, 12, 13, 16, 17, 20, 21, 24, 25, 28, 29) +
           __builtin_shufflevector(x, y, 2, 3, 6, 7, 10, 11, 14, 15, 18, 19, 22, 23, 26, 27, 30, 31);
  }
  return __builtin_shufflevector(d[0], d[1], 0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30) +
         __builtin_shufflevector(d[0], d[1], 1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
#else
  v16 r;
  for (int j = 0; j < 16; ++j) r[j] = hsum(a[j]);
  return r;
#endif
}

// Slots are scattered through the pool (a request's tokens interleave with others'), so the
// hardware prefetcher cannot follow them: fetch a row this many keys ahead.
constexpr int64_t PREFETCH_AHEAD = 12;
template <typename KV>
inline void prefetch_row(const KV* p, int64_t d) {
  for (int64_t b = 0; b < d * static_cast<int64_t>(sizeof(KV)); b += 64)
    __builtin_prefetch(reinterpret_cast<const char*>(p) + b);
}

struct Shape {
  int64_t H, KVH, G;
};

// One (row, kv head): the row's E query tokens x G query heads over its keys. The G heads
// that share this kv head are taken GC at a time, so each key and value row is loaded (and
// widened) once per chunk, not once per head. scores: scratch of at least GC * L floats.
struct Extras {
  int64_t window;  // 0: every key up to the query
  float cap;       // 0: no soft-capping
};

template <int NV, int GC, typename KV>
void attend_row_head(const float* q, const KV* k_buf, const KV* v_buf, float* out, const int64_t* slots,
                     int64_t first, int64_t E, int64_t L, int64_t h, Shape s, float scale, Extras x,
                     float* scores) {
  constexpr int64_t D = NV * 16;
  const int64_t prefix = L - E;
  const int64_t stride = (s.KVH * D);  // between consecutive slots' rows of this head
  const KV* k_head = k_buf + h * D;
  const KV* v_head = v_buf + h * D;
  for (int64_t i = 0; i < E; ++i) {
    const int64_t n = prefix + i + 1;  // keys up to this query; it sees lo .. n - 1
    const int64_t lo = x.window > 0 ? std::max<int64_t>(0, n - x.window) : 0;
    for (int64_t g0 = 0; g0 < s.G; g0 += GC) {
      const int gc = static_cast<int>(std::min<int64_t>(GC, s.G - g0));
      const int64_t off = ((first + i) * s.H + h * s.G + g0) * D;  // the chunk's first head
      v16 qv[GC][NV];
      for (int g = 0; g < GC; ++g)
        for (int c = 0; c < NV; ++c) qv[g][c] = g < gc ? load16(q + off + g * D + 16 * c) * scale : v16{};
      // scores[g][j] = q_g . k_j, 16 keys at a time: the 16 lane-sums are formed together
      // (reduce16), a few shuffles per key instead of a full horizontal sum per key and head.
      for (int64_t j0 = lo; j0 < n; j0 += 16) {
        const int64_t nb = std::min<int64_t>(16, n - j0);
        v16 acc[GC][16];
        for (int64_t jj = 0; jj < 16; ++jj) {
          if (j0 + jj + PREFETCH_AHEAD < n) prefetch_row(k_head + slots[j0 + jj + PREFETCH_AHEAD] * stride, D);
          v16 kv[NV];
          if (jj < nb) {
            const KV* kr = k_head + slots[j0 + jj] * stride;
            for (int c = 0; c < NV; ++c) kv[c] = load16(kr + 16 * c);
          } else {
            for (int c = 0; c < NV; ++c) kv[c] = v16{};
          }
          for (int g = 0; g < GC; ++g) {
            if (g >= gc) break;
            v16 a = qv[g][0] * kv[0];
            for (int c = 1; c < NV; ++c) a += qv[g][c] * kv[c];
            acc[g][jj] = a;
          }
        }
        for (int g = 0; g < gc; ++g) {
          float sums[16];
          store16(sums, reduce16(acc[g]));
          if (x.cap > 0.f)
            for (int64_t jj = 0; jj < nb; ++jj) sums[jj] = x.cap * std::tanh(sums[jj] / x.cap);
          std::memcpy(scores + g * n + j0, sums, nb * sizeof(float));
        }
      }
      float inv[GC];
      for (int g = 0; g < gc; ++g) {
        float* sg = scores + g * n;
        float m = sg[lo];
        for (int64_t j = lo + 1; j < n; ++j) m = std::max(m, sg[j]);
        float sum = 0.f;
        for (int64_t j = lo; j < n; ++j) {
          const float e = std::exp(sg[j] - m);
          sg[j] = e;
          sum += e;
        }
        inv[g] = 1.f / sum;
      }
      // out_g = softmax_g . V, accumulated in registers
      v16 o[GC][NV];
      for (int g = 0; g < GC; ++g)
        for (int c = 0; c < NV; ++c) o[g][c] = v16{};
      for (int64_t j = lo; j < n; ++j) {
        if (j + PREFETCH_AHEAD < n) prefetch_row(v_head + slots[j + PREFETCH_AHEAD] * stride, D);
        const KV* vr = v_head + slots[j] * stride;
        v16 vv[NV];
        for (int c = 0; c < NV; ++c) vv[c] = load16(vr + 16 * c);
        for (int g = 0; g < GC; ++g) {
          if (g >= gc) break;
          const float p = scores[g * n + j];
          for (int c = 0; c < NV; ++c) o[g][c] += p * vv[c];
        }
      }
      for (int g = 0; g < gc; ++g)
        for (int c = 0; c < NV; ++c) store16(out + off + g * D + 16 * c, o[g][c] * inv[g]);
    }
  }
}

// Heads per chunk: enough to share loads, few enough that GC x NV accumulators stay in registers.
constexpr int chunk_for(int nv) { return nv >= 16 ? 1 : (nv >= 8 ? 2 : 4); }
constexpr int64_t MAX_CHUNK = 4;

template <typename KV>
using RowHeadFn = void (*)(const float*, const KV*, const KV*, float*, const int64_t*, int64_t, int64_t,
                           int64_t, int64_t, Shape, float, Extras, float*);

template <typename KV>
RowHeadFn<KV> pick(int64_t D) {
  switch (D) {
    case 16: return attend_row_head<1, chunk_for(1), KV>;
    case 32: return attend_row_head<2, chunk_for(2), KV>;
    case 64: return attend_row_head<4, chunk_for(4), KV>;
    case 96: return attend_row_head<6, chunk_for(6), KV>;
    case 128: return attend_row_head<8, chunk_for(8), KV>;
    case 256: return attend_row_head<16, chunk_for(16), KV>;
    default: return nullptr;
  }
}

template <typename KV>
void run_rows(const at::Tensor& q, const at::Tensor& k_buf, const at::Tensor& v_buf, at::Tensor& out,
              const int64_t* rp, const int64_t* tp, int64_t B, int64_t C, int64_t max_len, double scale,
              Extras x) {
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
    std::vector<float> scores(MAX_CHUNK * max_len);
    for (int64_t t = t0; t < t1; ++t) {
      for (int64_t w = t; w < items; w += threads) {
        const int64_t* r = rp + 4 * (w / KVH);
        fn(qp, kp, vp, op, tp + r[0] * C, r[1], r[2], r[3], w % KVH, s, sc, x, scores.data());
      }
    }
  });
}

at::Tensor paged_attention(const at::Tensor& q, const at::Tensor& k_buf, const at::Tensor& v_buf,
                           const at::Tensor& table, const at::Tensor& rows, double scale, int64_t window,
                           double logit_cap) {
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
  TORCH_CHECK(window >= 0 && logit_cap >= 0, "window and logit_cap must be >= 0 (0: off)");
  const Extras x{window, static_cast<float>(logit_cap)};
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
    run_rows<float>(q, k_buf, v_buf, out, rp, tp, B, C, max_len, scale, x);
  } else if (kv_type == at::kBFloat16) {
    run_rows<at::BFloat16>(q, k_buf, v_buf, out, rp, tp, B, C, max_len, scale, x);
  } else {
    run_rows<at::Half>(q, k_buf, v_buf, out, rp, tp, B, C, max_len, scale, x);
  }
  return out;
}

}  // namespace

TORCH_LIBRARY(sgl_cpu, m) {
  m.def("paged_attention(Tensor q, Tensor k_buf, Tensor v_buf, Tensor table, Tensor rows, float scale, "
        "int window=0, float logit_cap=0.0) -> Tensor");
}

TORCH_LIBRARY_IMPL(sgl_cpu, CPU, m) { m.impl("paged_attention", &paged_attention); }
