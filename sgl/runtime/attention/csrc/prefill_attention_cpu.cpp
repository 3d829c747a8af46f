// Causal prefill attention for CPUs with AVX512-BF16: a chunk of E new queries over P cached
// keys and their own E (bf16 q / k / v, float32 accumulation), flash-style.
//
// Why a kernel: torch's CPU flash attention runs a prefill chunk of the embedded model
// (head_dim 64) at ~120 GFLOP/s on a 2-core Zen 4, a third of what oneDNN's bf16 matmuls
// reach there, and a 2,048-token chunk spends about half its time in it. Here both products
// are AVX512-BF16 dot products (`vdpbf16ps`: two bf16 products summed into a float32 lane)
// over operands packed once per call: K as (key, pair of dims) and V as (pair of keys, dim),
// so the inner loops are one broadcast of a query (or probability) pair and a few fused
// dot products per 16 keys (or dims). The query heads sharing a kv head are one block of
// rows, so each packed key block is read once for all of them.
//
// q: [E, H, D]; k, v: [P + E, KVH, D] (last dim contiguous, any token / head strides).
// Query i attends keys 0 .. P + i. Scores are float32; the softmax is online (running max
// and sum per row, as FlashAttention); probabilities are rounded to bf16 for the second
// product, as torch's bf16 flash kernel does. head_dim 32, 64 or 128. Built only where the
// compiler targets AVX512-BF16 (-march=native on such a CPU); `available()` says so.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#if defined(__AVX512F__) && defined(__AVX512BF16__)
#include <immintrin.h>
#define SGL_PREFILL_KERNEL 1
#endif

namespace {

#ifdef SGL_PREFILL_KERNEL

constexpr int BQ = 32;  // query tokens per work item (x the heads sharing a kv head = rows)
constexpr int BK = 64;  // keys per block
// A masked score, and the max of a row that has seen nothing: finite, since -ffast-math lets
// the compiler assume there are no infinities.
constexpr float MASKED = -1e30f;

// 2^y e^... : exp(x) for the softmax (x <= 0 after the max is taken; clamped below where
// float32 underflows). 2^n x 2^f with f in [-0.5, 0.5], a degree-7 Taylor polynomial of 2^f
// (relative error ~1e-8).
inline __m512 exp512(__m512 x) {
  const __m512 y = _mm512_mul_ps(_mm512_max_ps(x, _mm512_set1_ps(-87.0f)), _mm512_set1_ps(1.4426950408889634f));
  const __m512 n = _mm512_roundscale_ps(y, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 f = _mm512_sub_ps(y, n);
  __m512 p = _mm512_set1_ps(1.5252733804059840e-5f);
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.5403530393381606e-4f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.3333558146428443e-3f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.6181291076284772e-3f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.5504108664821580e-2f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.4022650695910071e-1f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.9314718055994531e-1f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
  const __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
  return _mm512_mul_ps(p, _mm512_castsi512_ps(e));
}

// Two adjacent bf16 values as one 32-bit word, broadcast to every lane.
inline __m512bh pair_broadcast(const uint16_t* p) {
  int32_t w;
  std::memcpy(&w, p, sizeof w);
  return (__m512bh)_mm512_set1_epi32(w);
}

inline __m512bh load_bh(const uint16_t* p) { return (__m512bh)_mm512_loadu_si512(p); }

struct Strides {
  int64_t token, head;
};

// K of one kv head as [key block][dim pair][key in block][2] and V as [key pair][dim][2]:
// the layouts vdpbf16ps reads 16 lanes of pairs from. Keys past L are zero (masked anyway).
template <int D>
void pack_kv(const uint16_t* k, const uint16_t* v, Strides ks, Strides vs, int64_t h, int64_t L, int64_t Lp,
             uint16_t* kp, uint16_t* vp) {
  for (int64_t key = 0; key < Lp; ++key) {
    const uint16_t* kr = k + key * ks.token + h * ks.head;
    const uint16_t* vr = v + key * vs.token + h * vs.head;
    uint16_t* kb = kp + (key / BK) * (BK * D) + (key % BK) * 2;
    uint16_t* vb = vp + (key / 2) * (2 * D) + (key % 2);
    const bool real = key < L;
    for (int d = 0; d < D; ++d) {
      kb[(d / 2) * (BK * 2) + (d % 2)] = real ? kr[d] : 0;
      vb[d * 2] = real ? vr[d] : 0;
    }
  }
}

// Scratch of one work item: R = BQ x G rows.
struct Scratch {
  std::vector<uint16_t> q;  // [R, D] the rows' queries
  std::vector<float> s;     // [R, BK] scores of one key block
  std::vector<uint16_t> p;  // [R, BK] probabilities, bf16
  std::vector<float> o, m, l, corr;  // [R, D] output so far; per row max, sum, rescale
};

// S[r, :] = Q[r] . K[key0 .. key0 + BK) for rows r0 .. r0 + RT.
template <int D, int RT>
inline void scores_tile(const uint16_t* q, const uint16_t* kblock, float* s) {
  __m512 acc[RT][BK / 16];
  for (int i = 0; i < RT; ++i)
    for (int c = 0; c < BK / 16; ++c) acc[i][c] = _mm512_setzero_ps();
  for (int j = 0; j < D / 2; ++j) {
    __m512bh kv[BK / 16];
    for (int c = 0; c < BK / 16; ++c) kv[c] = load_bh(kblock + j * (BK * 2) + c * 32);
    for (int i = 0; i < RT; ++i) {
      const __m512bh qb = pair_broadcast(q + i * D + 2 * j);
      for (int c = 0; c < BK / 16; ++c) acc[i][c] = _mm512_dpbf16_ps(acc[i][c], qb, kv[c]);
    }
  }
  for (int i = 0; i < RT; ++i)
    for (int c = 0; c < BK / 16; ++c) _mm512_storeu_ps(s + i * BK + c * 16, acc[i][c]);
}

// O[r] = O[r] * corr[r] + P[r] . V[key0 .. key0 + BK) for rows r0 .. r0 + RT.
template <int D, int RT>
inline void values_tile(const uint16_t* p, const uint16_t* vblock, const float* corr, float* o) {
  __m512 acc[RT][D / 16];
  for (int i = 0; i < RT; ++i) {
    const __m512 c = _mm512_set1_ps(corr[i]);
    for (int d = 0; d < D / 16; ++d) acc[i][d] = _mm512_mul_ps(_mm512_loadu_ps(o + i * D + d * 16), c);
  }
  for (int kp = 0; kp < BK / 2; ++kp) {
    __m512bh vv[D / 16];
    for (int d = 0; d < D / 16; ++d) vv[d] = load_bh(vblock + kp * (2 * D) + d * 32);
    for (int i = 0; i < RT; ++i) {
      const __m512bh pb = pair_broadcast(p + i * BK + 2 * kp);
      for (int d = 0; d < D / 16; ++d) acc[i][d] = _mm512_dpbf16_ps(acc[i][d], pb, vv[d]);
    }
  }
  for (int i = 0; i < RT; ++i)
    for (int d = 0; d < D / 16; ++d) _mm512_storeu_ps(o + i * D + d * 16, acc[i][d]);
}

// Online softmax over one block for row r: mask keys past the row's last, update max / sum,
// write bf16 probabilities and the rescale of what the row has accumulated so far.
inline void softmax_block(float* s, uint16_t* p, int64_t valid, float scale, float& m, float& l, float& corr) {
  for (int64_t kk = std::max<int64_t>(valid, 0); kk < BK; ++kk) s[kk] = MASKED;
  __m512 mx = _mm512_loadu_ps(s);
  for (int c = 1; c < BK / 16; ++c) mx = _mm512_max_ps(mx, _mm512_loadu_ps(s + c * 16));
  const float m_new = std::max(m, _mm512_reduce_max_ps(mx));
  corr = m <= MASKED ? 0.f : std::exp(scale * (m - m_new));
  const __m512 base = _mm512_set1_ps(scale * m_new), sc = _mm512_set1_ps(scale);
  __m512 sum = _mm512_setzero_ps();
  for (int c = 0; c < BK / 16; c += 2) {
    const __m512 e0 = exp512(_mm512_fmsub_ps(_mm512_loadu_ps(s + c * 16), sc, base));
    const __m512 e1 = exp512(_mm512_fmsub_ps(_mm512_loadu_ps(s + c * 16 + 16), sc, base));
    // masked keys clamp to exp(-87) ~ 1.6e-38 above; zero them so they add nothing at all
    const __m512 cut = _mm512_set1_ps(MASKED);
    const __mmask16 k0 = _mm512_cmp_ps_mask(_mm512_loadu_ps(s + c * 16), cut, _CMP_GT_OQ);
    const __mmask16 k1 = _mm512_cmp_ps_mask(_mm512_loadu_ps(s + c * 16 + 16), cut, _CMP_GT_OQ);
    const __m512 z0 = _mm512_maskz_mov_ps(k0, e0), z1 = _mm512_maskz_mov_ps(k1, e1);
    sum = _mm512_add_ps(sum, _mm512_add_ps(z0, z1));
    _mm512_storeu_si512(p + c * 16, (__m512i)_mm512_cvtne2ps_pbh(z1, z0));
  }
  l = l * corr + _mm512_reduce_add_ps(sum);
  m = m_new;
}

template <int D>
struct Kernel {
  static constexpr int RT = D <= 64 ? 4 : 2;  // rows per register tile (RT x D/16 accumulators)

  // One work item: query tokens t0 .. t0 + BQ of kv head h (its G query heads).
  static void item(const uint16_t* q, Strides qs, const uint16_t* kp, const uint16_t* vp, uint16_t* out,
                   Strides os, int64_t h, int64_t G, int64_t t0, int64_t E, int64_t P, float scale, Scratch& w) {
    const int64_t tn = std::min<int64_t>(BQ, E - t0);
    const int64_t R = ((tn * G + RT - 1) / RT) * RT;
    std::fill(w.q.begin(), w.q.begin() + R * D, 0);
    for (int64_t t = 0; t < tn; ++t)
      for (int64_t g = 0; g < G; ++g)
        std::memcpy(&w.q[(t * G + g) * D], q + (t0 + t) * qs.token + (h * G + g) * qs.head, D * sizeof(uint16_t));
    std::fill(w.o.begin(), w.o.begin() + R * D, 0.f);
    std::fill(w.m.begin(), w.m.begin() + R, MASKED);
    std::fill(w.l.begin(), w.l.begin() + R, 0.f);
    const int64_t kend = P + t0 + tn;  // keys this item's last query sees
    for (int64_t key0 = 0; key0 < kend; key0 += BK) {
      const uint16_t* kblock = kp + (key0 / BK) * (BK * D);
      const uint16_t* vblock = vp + (key0 / 2) * (2 * D);
      for (int64_t r0 = 0; r0 < R; r0 += RT) scores_tile<D, RT>(&w.q[r0 * D], kblock, &w.s[r0 * BK]);
      for (int64_t r = 0; r < R; ++r) {
        const int64_t last = P + t0 + std::min<int64_t>(r / G, tn - 1);  // padding rows copy a real one
        softmax_block(&w.s[r * BK], &w.p[r * BK], last - key0 + 1, scale, w.m[r], w.l[r], w.corr[r]);
      }
      for (int64_t r0 = 0; r0 < R; r0 += RT) values_tile<D, RT>(&w.p[r0 * BK], vblock, &w.corr[r0], &w.o[r0 * D]);
    }
    for (int64_t t = 0; t < tn; ++t)
      for (int64_t g = 0; g < G; ++g) {
        const int64_t r = t * G + g;
        const __m512 inv = _mm512_set1_ps(1.f / w.l[r]);
        uint16_t* dst = out + (t0 + t) * os.token + (h * G + g) * os.head;
        for (int d = 0; d < D; d += 16)
          _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + d),
                              (__m256i)_mm512_cvtneps_pbh(_mm512_mul_ps(_mm512_loadu_ps(&w.o[r * D + d]), inv)));
      }
  }

  static void run(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, at::Tensor& out, double scale) {
    const int64_t E = q.size(0), H = q.size(1), L = k.size(0), KVH = k.size(1), G = H / KVH, P = L - E;
    const int64_t Lp = ((L + BK - 1) / BK) * BK;
    auto u16 = [](const at::Tensor& t) { return reinterpret_cast<const uint16_t*>(t.data_ptr<at::BFloat16>()); };
    const Strides qs{q.stride(0), q.stride(1)}, ks{k.stride(0), k.stride(1)}, vs{v.stride(0), v.stride(1)};
    const Strides os{out.stride(0), out.stride(1)};
    std::vector<uint16_t> kpack(KVH * Lp * D), vpack(KVH * Lp * D);
    at::parallel_for(0, KVH, 1, [&](int64_t h0, int64_t h1) {
      for (int64_t h = h0; h < h1; ++h)
        pack_kv<D>(u16(k), u16(v), ks, vs, h, L, Lp, &kpack[h * Lp * D], &vpack[h * Lp * D]);
    });
    const int64_t blocks = (E + BQ - 1) / BQ, items = blocks * KVH;
    // Items of unequal cost (causal: later blocks see more keys) are dealt round-robin.
    const int64_t threads = std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), items));
    uint16_t* op = reinterpret_cast<uint16_t*>(out.data_ptr<at::BFloat16>());
    const float sc = static_cast<float>(scale);
    at::parallel_for(0, threads, 1, [&](int64_t a, int64_t b) {
      const int64_t R = BQ * G + RT;
      Scratch w{std::vector<uint16_t>(R * D), std::vector<float>(R * BK), std::vector<uint16_t>(R * BK),
                std::vector<float>(R * D), std::vector<float>(R), std::vector<float>(R), std::vector<float>(R)};
      for (int64_t t = a; t < b; ++t)
        for (int64_t it = t; it < items; it += threads) {
          const int64_t h = it % KVH;
          item(u16(q), qs, &kpack[h * Lp * D], &vpack[h * Lp * D], op, os, h, G, (it / KVH) * BQ, E, P, sc, w);
        }
    });
  }
};

#endif  // SGL_PREFILL_KERNEL

bool available() {
#ifdef SGL_PREFILL_KERNEL
  return true;
#else
  return false;
#endif
}

at::Tensor causal_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double scale) {
  TORCH_CHECK(available(), "the prefill attention kernel needs AVX512-BF16 (not built for this CPU)");
  TORCH_CHECK(q.dim() == 3 && k.dim() == 3 && v.dim() == 3, "q, k, v must be [tokens, heads, dim]");
  TORCH_CHECK(q.scalar_type() == at::kBFloat16 && k.scalar_type() == at::kBFloat16 && v.scalar_type() == at::kBFloat16,
              "q, k and v must be bfloat16");
  TORCH_CHECK(q.stride(2) == 1 && k.stride(2) == 1 && v.stride(2) == 1, "the last dim of q, k, v must be contiguous");
  const int64_t E = q.size(0), H = q.size(1), D = q.size(2), L = k.size(0), KVH = k.size(1);
  TORCH_CHECK(k.sizes() == v.sizes() && k.size(2) == D, "k and v must be [keys, kv_heads, ", D, "]");
  TORCH_CHECK(L >= E && E >= 1, "k holds the cached prefix then the E new keys: need keys (", L, ") >= queries (", E, ") >= 1");
  TORCH_CHECK(KVH > 0 && H % KVH == 0, "query heads (", H, ") must be a multiple of kv heads (", KVH, ")");
  at::Tensor out = at::empty_like(q, at::MemoryFormat::Contiguous);
#ifdef SGL_PREFILL_KERNEL
  switch (D) {
    case 32: Kernel<32>::run(q, k, v, out, scale); break;
    case 64: Kernel<64>::run(q, k, v, out, scale); break;
    case 128: Kernel<128>::run(q, k, v, out, scale); break;
    default: TORCH_CHECK(false, "head_dim ", D, " is not supported (32, 64 or 128)");
  }
#endif
  return out;
}

}  // namespace

TORCH_LIBRARY(sgl_prefill, m) {
  m.def("available() -> bool");
  m.def("causal_attention(Tensor q, Tensor k, Tensor v, float scale) -> Tensor");
}

TORCH_LIBRARY_IMPL(sgl_prefill, CatchAll, m) { m.impl("available", &available); }
TORCH_LIBRARY_IMPL(sgl_prefill, CPU, m) { m.impl("causal_attention", &causal_attention); }
