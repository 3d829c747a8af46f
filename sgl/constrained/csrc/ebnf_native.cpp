// The EBNF recognizer in C++: the GLR step, its interned stacks and parse states, the lazy
// DFA table, and the token-mask walks over the vocabulary's byte trie.
//
// The same algorithm as ebnf_python.Tables (Python, the reference and the numpy route's
// tables; see its docstrings for the model): a configuration is a network state that
// reads bytes plus a stack of return states, packed as stack * M + state; a parse state
// ("dstate") is a sorted set of configurations, interned; table[dstate, byte_class] is
// computed on first use. Why native: in Python one transition cost 20-40 us (closures,
// set hashing, numpy per call), and a cold mask needs dozens of them; here ~1 us.
//
// Masks (Glr::route_mask, see ebnf_native.NativeTables.native_mask): a parse state's mask
// is the union of its kernels' masks. Each kernel is walked once, cached, in "kernel
// tables" (a second Glr on the same network whose stacks start empty, so ACCEPT there means
// "the rule on top returned"); only the trie subtrees below such returns are walked from
// real states, the kernel state there lifted onto the real stacks. Exact up to max_configs:
// where a real state could exceed it, the caller falls back to one plain walk.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <list>
#include <memory>
#include <optional>
#include <stdexcept>
#include <tuple>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

namespace py = pybind11;

using I32 = py::array_t<int32_t, py::array::c_style | py::array::forcecast>;
using I64 = py::array_t<int64_t, py::array::c_style | py::array::forcecast>;

namespace {

constexpr int32_t DEAD = 0;
constexpr int64_t kShortcutMin = 16;  // subtrees smaller than this are walked, not tested whole
using Bits256 = std::array<uint64_t, 4>;

inline bool has_bit(const Bits256& b, int i) { return (b[i >> 6] >> (i & 63)) & 1; }

template <typename T>
std::vector<T> to_vector(const py::array_t<T, py::array::c_style | py::array::forcecast>& a) {
  return std::vector<T>(a.data(), a.data() + a.size());
}

// Configurations reachable without reading a byte, relative to the caller's stack: kernel
// states (with byte edges) with the frames pushed above the caller (outermost first), and
// whether the rule can finish (hand control back to the caller).
struct Closure {
  std::vector<int32_t> state;
  std::vector<std::vector<int32_t>> frames;
  bool pops = false;
};

// The network (ebnf_automaton.Network) in flat arrays, with its closures and steps memoized;
// shared by a grammar's real and kernel tables.
struct Net {
  int32_t n = 0, n_classes = 0, root = 0;
  std::vector<int32_t> edge_start, edge_lo, edge_hi, edge_tgt;
  std::vector<int32_t> eps_start, eps;
  std::vector<int32_t> call_start, call_rule, call_ret;
  std::vector<int32_t> rule_of, rule_start, rule_final;
  std::vector<uint8_t> pure;
  std::vector<Bits256> byte_bits, class_bits;  // per state: bytes / byte classes it reads
  std::vector<int32_t> byte_class, class_rep;
  // per state: the state whose kernel walk is its own for tokens of up to share_horizon
  // bytes (copies of a counted repetition; ebnf_automaton._share_copies)
  std::vector<int32_t> share;
  int32_t share_horizon = 0;
  std::vector<std::unique_ptr<Closure>> closures;
  std::unordered_map<int64_t, std::unique_ptr<Closure>> steps;
  std::vector<std::vector<uint16_t>> signatures;

  Net(const I32& es, const I32& lo, const I32& hi, const I32& tgt, const I32& eps_s, const I32& eps_t,
      const I32& cs, const I32& cr, const I32& cret, const I32& rule_of_, const I32& rule_start_,
      const I32& rule_final_, const py::array_t<uint8_t>& pure_, const py::array_t<uint64_t>& bits,
      const I32& byte_class_, const I32& class_rep_, int32_t root_, const I32& share_, int32_t share_horizon_)
      : root(root_), edge_start(to_vector(es)), edge_lo(to_vector(lo)), edge_hi(to_vector(hi)),
        edge_tgt(to_vector(tgt)), eps_start(to_vector(eps_s)), eps(to_vector(eps_t)), call_start(to_vector(cs)),
        call_rule(to_vector(cr)), call_ret(to_vector(cret)), rule_of(to_vector(rule_of_)),
        rule_start(to_vector(rule_start_)), rule_final(to_vector(rule_final_)),
        pure(pure_.data(), pure_.data() + pure_.size()), byte_class(to_vector(byte_class_)),
        class_rep(to_vector(class_rep_)), share(to_vector(share_)), share_horizon(share_horizon_) {
    n = static_cast<int32_t>(rule_of.size());
    if (static_cast<int32_t>(share.size()) != n) throw std::invalid_argument("share: one entry per state");
    n_classes = static_cast<int32_t>(class_rep.size());
    byte_bits.resize(n);
    class_bits.assign(n, Bits256{0, 0, 0, 0});
    const uint64_t* b = bits.data();
    for (int32_t s = 0; s < n; ++s) {
      for (int w = 0; w < 4; ++w) byte_bits[s][w] = b[4 * s + w];
      for (int32_t c = 0; c < n_classes; ++c)
        if (has_bit(byte_bits[s], class_rep[c])) class_bits[s][c >> 6] |= 1ull << (c & 63);
    }
    closures.resize(n);
    signatures.resize(n);
  }

  const Closure& closure(int32_t state) {
    if (closures[state]) return *closures[state];
    auto out = std::make_unique<Closure>();
    // frame stacks as ids in a local table (0: none; (return state, below) -> id), so an item
    // (state, frames) is one 64-bit key and nothing is copied while the closure is searched
    std::vector<int32_t> f_ret{-1}, f_below{-1};
    std::unordered_map<uint64_t, int32_t> f_ids;
    auto push = [&](int32_t below, int32_t ret) {
      const uint64_t key = (static_cast<uint64_t>(static_cast<uint32_t>(ret)) << 32) | static_cast<uint32_t>(below);
      auto [it, fresh] = f_ids.emplace(key, static_cast<int32_t>(f_ret.size()));
      if (fresh) {
        f_ret.push_back(ret);
        f_below.push_back(below);
      }
      return it->second;
    };
    auto item = [](int32_t s, int32_t f) {
      return (static_cast<uint64_t>(static_cast<uint32_t>(s)) << 32) | static_cast<uint32_t>(f);
    };
    std::unordered_set<uint64_t> seen;
    std::vector<std::pair<int32_t, int32_t>> todo{{state, 0}}, kernels;
    while (!todo.empty()) {
      const auto [s, f] = todo.back();
      todo.pop_back();
      if (!seen.insert(item(s, f)).second) continue;
      if (edge_start[s + 1] > edge_start[s]) kernels.emplace_back(s, f);
      for (int32_t i = eps_start[s]; i < eps_start[s + 1]; ++i) todo.emplace_back(eps[i], f);
      for (int32_t i = call_start[s]; i < call_start[s + 1]; ++i)
        todo.emplace_back(rule_start[call_rule[i]], pure[call_ret[i]] ? f : push(f, call_ret[i]));
      if (s == rule_final[rule_of[s]]) {
        if (f) {
          todo.emplace_back(f_ret[f], f_below[f]);  // return into the innermost frame
        } else {
          out->pops = true;
        }
      }
    }
    for (const auto& [k, f] : kernels) {
      std::vector<int32_t> frames;  // outermost first
      for (int32_t g = f; g; g = f_below[g]) frames.push_back(f_ret[g]);
      std::reverse(frames.begin(), frames.end());
      out->state.push_back(k);
      out->frames.push_back(std::move(frames));
    }
    closures[state] = std::move(out);
    return *closures[state];
  }

  // Per byte class, an id of the set of edge targets `state` reaches on it (0: none):
  // classes with the same id lead the state to the same configurations.
  const std::vector<uint16_t>& signature(int32_t state) {
    std::vector<uint16_t>& sig = signatures[state];
    if (!sig.empty() || n_classes == 0) return sig;
    sig.assign(n_classes, 0);
    std::vector<std::vector<int32_t>> sets;  // distinct target sets, id = index + 1
    std::vector<int32_t> targets;
    for (int32_t c = 0; c < n_classes; ++c) {
      targets.clear();
      const int32_t byte = class_rep[c];
      for (int32_t e = edge_start[state]; e < edge_start[state + 1]; ++e)
        if (edge_lo[e] <= byte && byte <= edge_hi[e]) targets.push_back(edge_tgt[e]);
      if (targets.empty()) continue;
      std::sort(targets.begin(), targets.end());
      auto at = std::find(sets.begin(), sets.end(), targets);
      if (at == sets.end()) at = sets.insert(sets.end(), targets);
      sig[c] = static_cast<uint16_t>(at - sets.begin() + 1);
    }
    return sig;
  }

  // The configurations after `state` reads a byte of class `cls` (relative to the caller).
  const Closure& step(int32_t state, int32_t cls) {
    const int64_t key = static_cast<int64_t>(state) * n_classes + cls;
    auto hit = steps.find(key);
    if (hit != steps.end()) return *hit->second;
    const int32_t byte = class_rep[cls];
    std::vector<std::pair<int32_t, std::vector<int32_t>>> kernels;
    auto out = std::make_unique<Closure>();
    for (int32_t e = edge_start[state]; e < edge_start[state + 1]; ++e) {
      if (edge_lo[e] <= byte && byte <= edge_hi[e]) {
        const Closure& c = closure(edge_tgt[e]);
        for (size_t i = 0; i < c.state.size(); ++i) kernels.emplace_back(c.state[i], c.frames[i]);
        out->pops = out->pops || c.pops;
      }
    }
    std::sort(kernels.begin(), kernels.end());
    kernels.erase(std::unique(kernels.begin(), kernels.end()), kernels.end());
    for (auto& [k, f] : kernels) {
      out->state.push_back(k);
      out->frames.push_back(std::move(f));
    }
    return *(steps[key] = std::move(out));
  }
};

// The vocabulary trie (ebnf_trie.VocabTrie, numbered level by level) laid out in
// preorder for the walks: a subtree is the range [p, end[p]), so a dead subtree is skipped
// in one step and a walk reads the arrays front to back (~10 bytes a node: a full walk of a
// 100k-node trie stays in L2; the level-by-level walk read 3x the bytes, from scattered
// parents, at ~5 ns a node). Made once per vocabulary (TrieShape), with one grammar's byte
// classes on top (Trie).
struct TrieShape {
  std::vector<int32_t> end;      // preorder: one past the subtree
  std::vector<uint8_t> depth;    // preorder: bytes from the root
  std::vector<uint8_t> height;   // preorder: the most bytes below the node
  std::vector<int32_t> parent;   // preorder: the parent's preorder index (-1: the root)
  std::vector<int32_t> tok_start, toks;  // preorder: the tokens ending at p: toks[tok_start[p]:tok_start[p+1]]
  std::vector<int32_t> level_of;  // preorder -> the VocabTrie's node number
  std::vector<int32_t> dense_of;  // preorder -> index of the bitmap of the tokens below it, or -1
  std::vector<uint32_t> dense_bits;  // those bitmaps, n_words each
  int64_t n_nodes, n_words, max_depth = 0;

  TrieShape(const I64& child_start, const I64& child_count, const I64& tok_start_, const I64& toks_, int64_t n_words_)
      : n_nodes(child_count.shape(0)), n_words(n_words_) {
    const int64_t *cs = child_start.data(), *cc = child_count.data(), *ts = tok_start_.data(), *tk = toks_.data();
    end.resize(n_nodes);
    depth.resize(n_nodes);
    level_of.resize(n_nodes);
    parent.assign(n_nodes, -1);
    tok_start.assign(n_nodes + 1, 0);
    toks.reserve(static_cast<size_t>(ts[n_nodes]));
    // iterative preorder: (node, depth, parent's preorder index)
    std::vector<std::tuple<int64_t, int32_t, int32_t>> todo{{0, 0, -1}};
    std::vector<int32_t> open;  // preorder indices of the ancestors of the next node
    int32_t p = 0;
    while (!todo.empty()) {
      const auto [u, d, up] = todo.back();
      todo.pop_back();
      while (!open.empty() && depth[open.back()] >= d) {
        end[open.back()] = p;
        open.pop_back();
      }
      if (d > 255) throw std::invalid_argument("a token longer than 255 bytes");
      level_of[p] = static_cast<int32_t>(u);
      depth[p] = static_cast<uint8_t>(d);
      parent[p] = up;
      max_depth = std::max<int64_t>(max_depth, d);
      for (int64_t i = ts[u]; i < ts[u + 1]; ++i) toks.push_back(static_cast<int32_t>(tk[i]));
      tok_start[p + 1] = static_cast<int32_t>(toks.size());
      open.push_back(p);
      for (int64_t c = cs[u] + cc[u] - 1; c >= cs[u] && cc[u] > 0; --c) todo.emplace_back(c, d + 1, p);
      ++p;
    }
    while (!open.empty()) {
      end[open.back()] = p;
      open.pop_back();
    }
    height.assign(n_nodes, 0);
    for (int64_t q = n_nodes - 1; q > 0; --q)
      height[parent[q]] = std::max<uint8_t>(height[parent[q]], height[q] + 1);
    // Subtrees with more tokens below than the mask has words get a bitmap of them: marking
    // one is then one pass over the words (vectorized), not a scattered write per token (the
    // inside of a free string is most of the vocabulary). Few nodes qualify: subtrees of one
    // depth are disjoint, so at most one in n_words of them per depth.
    dense_of.assign(n_nodes, -1);
    int64_t n_dense = 0;
    for (int64_t q = 0; q < n_nodes && n_dense < kMaxDense; ++q) {
      const int32_t a = tok_start[q + 1], b = tok_start[end[q]];
      if (b - a < std::max<int64_t>(n_words, 64)) continue;
      dense_of[q] = static_cast<int32_t>(n_dense++);
      dense_bits.resize(n_dense * n_words, 0);
      uint32_t* w = dense_bits.data() + (n_dense - 1) * n_words;
      for (int32_t i = a; i < b; ++i) w[toks[i] >> 5] |= 1u << (toks[i] & 31);
    }
  }
  static constexpr int64_t kMaxDense = 1024;

  // The bitmap of the tokens below q, or nullptr.
  const uint32_t* dense_below(int64_t q) const {
    return dense_of[q] < 0 ? nullptr : dense_bits.data() + static_cast<int64_t>(dense_of[q]) * n_words;
  }
};

struct Bits256Hash {
  size_t operator()(const Bits256& b) const {
    uint64_t h = b[0] * 0x9e3779b97f4a7c15ull;
    for (int w = 1; w < 4; ++w) h = (h ^ (h >> 31) ^ b[w]) * 0x9e3779b97f4a7c15ull;
    return static_cast<size_t>(h ^ (h >> 29));
  }
};

// The set of classes read below each node of a trie in preorder (`cls`: a node's last byte's
// class; `parent`: -1 at the root), interned: `below` holds ids into `class_sets`, or -1 for
// a subtree of kShortcutMin nodes or fewer (never tested whole, see Glr::walk).
void intern_classes_below(const std::vector<uint8_t>& cls, const std::vector<int32_t>& parent,
                          const std::vector<int32_t>& end, std::vector<int32_t>& below,
                          std::vector<Bits256>& class_sets) {
  const int64_t n = static_cast<int64_t>(cls.size());
  std::vector<Bits256> sets(n, Bits256{0, 0, 0, 0});
  for (int64_t q = n - 1; q > 0; --q) {  // children before parents
    Bits256& up = sets[parent[q]];
    for (int w = 0; w < 4; ++w) up[w] |= sets[q][w];
    up[cls[q] >> 6] |= 1ull << (cls[q] & 63);
  }
  std::unordered_map<Bits256, int32_t, Bits256Hash> ids;
  below.assign(n, -1);
  for (int64_t q = 0; q < n; ++q) {
    if (end[q] - q <= kShortcutMin) continue;
    auto [it, fresh] = ids.emplace(sets[q], static_cast<int32_t>(class_sets.size()));
    if (fresh) class_sets.push_back(sets[q]);
    below[q] = it->second;
  }
}

struct Trie {
  std::shared_ptr<const TrieShape> shape;
  const std::vector<int32_t>& end;
  const std::vector<uint8_t>& depth;
  const std::vector<uint8_t>& height;
  const std::vector<int32_t>& level_of;
  std::vector<uint8_t> cls;       // preorder: the byte class of the node's last byte
  std::vector<int32_t> below;     // preorder: the id of the set of classes read below the node (-1: a
                                  // subtree of kShortcutMin nodes or fewer, never tested whole) ...
  std::vector<Bits256> class_sets;  // ... (distinct sets: subtrees share a few)
  std::vector<std::vector<int64_t>> root_children;  // by byte class: the root's children of it
  std::vector<int32_t> root_classes;  // the classes of some root child
  int64_t n_nodes, n_words, max_depth;

  Trie(std::shared_ptr<const TrieShape> shape_, const I32& node_class)
      : shape(std::move(shape_)), end(shape->end), depth(shape->depth), height(shape->height),
        level_of(shape->level_of), n_nodes(shape->n_nodes), n_words(shape->n_words), max_depth(shape->max_depth) {
    const int32_t* nc = node_class.data();
    cls.resize(n_nodes);
    for (int64_t p = 0; p < n_nodes; ++p) cls[p] = static_cast<uint8_t>(p ? nc[level_of[p]] : 0);
    intern_classes_below(cls, shape->parent, end, below, class_sets);
    root_children.resize(256);
    for (int64_t p = 1; p < n_nodes; p = end[p]) root_children[cls[p]].push_back(p);
    for (int32_t c = 0; c < 256; ++c)
      if (!root_children[c].empty()) root_classes.push_back(c);
  }

  // Marks the tokens ending at p / in the strict subtree of p (contiguous in preorder).
  void mark(uint32_t* words, int64_t p) const {
    const int32_t* ts = shape->tok_start.data();
    const int32_t* tk = shape->toks.data();
    for (int32_t i = ts[p], e = ts[p + 1]; i < e; ++i) words[tk[i] >> 5] |= 1u << (tk[i] & 31);
  }
  void mark_below(uint32_t* __restrict words, int64_t p) const {
    if (const uint32_t* __restrict bits = shape->dense_below(p)) {
      for (int64_t w = 0; w < n_words; ++w) words[w] |= bits[w];
      return;
    }
    const int32_t* ts = shape->tok_start.data();
    const int32_t* tk = shape->toks.data();
    for (int32_t i = ts[p + 1], e = ts[end[p]]; i < e; ++i) words[tk[i] >> 5] |= 1u << (tk[i] & 31);
  }
};

struct VecHash {
  size_t operator()(const std::vector<int64_t>& v) const {
    uint64_t h = 0x9e3779b97f4a7c15ull ^ v.size();
    for (int64_t x : v) h = (h ^ static_cast<uint64_t>(x)) * 0x100000001b3ull + (h >> 29);
    return static_cast<size_t>(h);
  }
};

// What follows a rule's returns in one kernel walk, for one kernel-tables state there: the
// trie subtrees below every node where the walk returned into that state, merged by the
// byte classes read after the return (a trie of those, in preorder like Trie), each node
// with the tokens that end there. A free string returns at every token with a closing quote
// and more bytes after it (`",`, `"}`, `": `, ...): hundreds of subtrees of a few nodes,
// whose remainders are a few dozen distinct class strings. The real state after the return
// reads each of those once per mask, not each subtree's every node.
struct Tail {
  // Large subtrees (a block of a long bounded string ends inside most tokens) are not merged:
  // `entries` holds them, walked on the trie itself (its uniform shortcut and bitmaps), since
  // a merged copy would cost more to build than the walks it saves.
  static constexpr int64_t kMergeNodes = 4096;
  std::vector<int64_t> entries;  // unmerged: the trie nodes; the arrays below are then empty
  std::vector<uint8_t> cls, depth, height;  // preorder; node 0 is the return itself (depth 0)
  std::vector<int32_t> end;         // one past the subtree
  std::vector<int32_t> tok_start, toks;  // the tokens ending at each node
  std::vector<int32_t> below;       // the id of the set of classes read below each node ...
  std::vector<Bits256> class_sets;  // ... (as in Trie: the uniform shortcut of walk_tail)
  size_t bytes() const {
    return 8 * entries.size() + 3 * cls.size() + 4 * (end.size() + tok_start.size() + toks.size() + below.size()) +
           32 * class_sets.size() + 64;
  }

  // `entries` (preorder trie nodes), their subtrees merged. Children are found by a scan of
  // their siblings (few: a hash map here cost as much as the kernel walk), tokens gathered as
  // (node, token) pairs and sorted into place once.
  Tail(const Trie& trie, const std::vector<int64_t>& returns) {
    int64_t nodes = 0;
    for (int64_t e : returns) nodes += trie.end[e] - e;
    if (nodes > kMergeNodes) {
      entries = returns;
      return;
    }
    const TrieShape& sh = *trie.shape;
    std::vector<uint8_t> node_cls{0};
    std::vector<int32_t> first_child{-1}, next_sibling{-1};
    std::vector<std::pair<int32_t, int32_t>> marks;  // (built node, token)
    std::vector<int32_t> path(trie.max_depth + 1);
    auto add_toks = [&](int32_t to, int64_t p) {
      for (int32_t i = sh.tok_start[p]; i < sh.tok_start[p + 1]; ++i) marks.emplace_back(to, sh.toks[i]);
    };
    for (int64_t e : returns) {
      add_toks(0, e);
      path[0] = 0;
      for (int64_t p = e + 1; p < trie.end[e]; ++p) {
        const int32_t d = trie.depth[p] - trie.depth[e];
        const int32_t up = path[d - 1];
        int32_t v = first_child[up];
        while (v >= 0 && node_cls[v] != trie.cls[p]) v = next_sibling[v];
        if (v < 0) {
          v = static_cast<int32_t>(node_cls.size());
          node_cls.push_back(trie.cls[p]);
          first_child.push_back(-1);
          next_sibling.push_back(first_child[up]);
          first_child[up] = v;
        }
        path[d] = v;
        add_toks(v, p);
      }
    }
    // preorder numbering
    const int32_t n = static_cast<int32_t>(node_cls.size());
    std::vector<int32_t> order(n);  // built node -> preorder index
    cls.resize(n);
    depth.resize(n);
    end.resize(n);
    std::vector<int32_t> parent(n, -1);
    std::vector<std::pair<int32_t, int32_t>> todo{{0, 0}};  // (built node, depth)
    std::vector<int32_t> open;  // preorder indices of the open ancestors
    int32_t at = 0;
    while (!todo.empty()) {
      const auto [u, d] = todo.back();
      todo.pop_back();
      while (!open.empty() && depth[open.back()] >= d) {
        end[open.back()] = at;
        open.pop_back();
      }
      if (!open.empty()) parent[at] = open.back();
      order[u] = at;
      cls[at] = node_cls[u];
      depth[at] = static_cast<uint8_t>(d);
      open.push_back(at++);
      for (int32_t c = first_child[u]; c >= 0; c = next_sibling[c]) todo.emplace_back(c, d + 1);
    }
    for (int32_t q : open) end[q] = n;
    // tokens by preorder node (a counting sort)
    tok_start.assign(n + 1, 0);
    for (const auto& [u, t] : marks) ++tok_start[order[u] + 1];
    for (int32_t q = 0; q < n; ++q) tok_start[q + 1] += tok_start[q];
    toks.resize(marks.size());
    std::vector<int32_t> fill(tok_start.begin(), tok_start.end() - 1);
    for (const auto& [u, t] : marks) toks[fill[order[u]]++] = t;
    height.assign(n, 0);  // children before parents
    for (int32_t q = n - 1; q > 0; --q) height[parent[q]] = std::max<uint8_t>(height[parent[q]], height[q] + 1);
    intern_classes_below(cls, parent, end, below, class_sets);
  }
};

// A set of tokens being marked: a list of ids while it is small, mask words once it is
// large (a list costs per token; words cost the vocabulary's width on every use).
struct TokenSet {
  std::vector<int32_t> ids;
  std::vector<uint32_t> words;  // non-empty once dense
  void add(const int32_t* a, const int32_t* b, int64_t n_words) {
    if (words.empty()) {
      ids.insert(ids.end(), a, b);
      if (static_cast<int64_t>(ids.size()) > n_words) densify(n_words);
      return;
    }
    for (; a < b; ++a) words[*a >> 5] |= 1u << (*a & 31);
  }
  void add_bits(const uint32_t* __restrict bits, int64_t n_words) {
    if (words.empty()) densify(n_words);
    uint32_t* __restrict w = words.data();
    for (int64_t i = 0; i < n_words; ++i) w[i] |= bits[i];
  }
  void densify(int64_t n_words) {
    words.assign(n_words, 0);
    for (int32_t t : ids) words[t >> 5] |= 1u << (t & 31);
    ids.clear();
    ids.shrink_to_fit();
  }
  void mark(uint32_t* __restrict out) const {
    if (!words.empty()) {
      const uint32_t* __restrict w = words.data();
      for (size_t i = 0; i < words.size(); ++i) out[i] |= w[i];
    } else {
      for (int32_t t : ids) out[t >> 5] |= 1u << (t & 31);
    }
  }
  size_t bytes() const { return 4 * (ids.size() + words.size()); }
};

// The kernel walk of the root's children of one byte class, entered in one state (see
// Glr::root_walk): the tokens allowed, where the rule returned, and the most configurations
// on the way.
struct RootWalk {
  TokenSet tokens;
  std::vector<int64_t> entries;  // nodes where the rule returned ...
  std::vector<int32_t> entry_states;  // ... into these kernel-tables states
  int32_t max_size = 0;
  size_t bytes() const { return tokens.bytes() + 12 * entries.size() + 96; }
};
constexpr size_t kRootWalkBytes = 64 << 20;  // root walks kept per kernel tables (all dropped past it)

// `words` as its nonzero words (`at`, `out`), or all of them (`dense`) when over half are
// nonzero; found a block at a time (a walk marks a few hundred tokens: a word-by-word scan
// of the whole vocabulary was most of a small walk). `words` is moved from when dense.
inline void pack_words(std::vector<uint32_t>& words, int64_t n_words, std::vector<int32_t>& at,
                       std::vector<uint32_t>& out, bool& dense) {
  constexpr int64_t kBlock = 16;
  for (int64_t b = 0; b < n_words; b += kBlock) {
    const int64_t e = std::min(b + kBlock, n_words);
    uint32_t any = 0;
    for (int64_t w = b; w < e; ++w) any |= words[w];
    if (!any) continue;
    for (int64_t w = b; w < e; ++w)
      if (words[w]) {
        at.push_back(static_cast<int32_t>(w));
        out.push_back(words[w]);
      }
  }
  dense = 2 * static_cast<int64_t>(at.size()) > n_words;
  if (dense) {
    at.clear();
    out = words;
  }
}

// One kernel's walk (see Glr::kernel_walk).
struct KernelWalk {
  std::vector<int32_t> at;       // indices of the nonzero words (empty with `dense`)
  std::vector<uint32_t> words;   // those words (all of them with `dense`)
  bool dense = false;
  std::vector<int32_t> states;   // the distinct kernel-tables states where the rule returned
  std::vector<std::shared_ptr<const Tail>> tails;  // what follows those returns, per state
  int32_t max_size = 0;
  size_t bytes() const {
    size_t b = 4 * (at.size() + words.size() + states.size()) + 64;
    for (const auto& t : tails) b += t->bytes();
    return b;
  }
};

class Glr {
 public:
  Glr(std::shared_ptr<Net> net, int32_t max_configs) : net_(std::move(net)), max_configs_(max_configs) {
    M_ = net_->n + 1;
    ACCEPT_ = net_->n;
    C_ = net_->n_classes;
    sret_.push_back(-1);
    spar_.push_back(-1);
    intern({});  // DEAD
  }

  // -- stacks ----------------------------------------------------------------------------

  int32_t push(int32_t stack, const std::vector<int32_t>& frames) {
    for (int32_t ret : frames) {
      const uint64_t key = (static_cast<uint64_t>(static_cast<uint32_t>(ret)) << 32) | static_cast<uint32_t>(stack);
      auto it = sids_.find(key);
      if (it == sids_.end()) {
        const int32_t sid = static_cast<int32_t>(sret_.size());
        sids_.emplace(key, sid);
        sret_.push_back(ret);
        spar_.push_back(stack);
        stack = sid;
      } else {
        stack = it->second;
      }
    }
    return stack;
  }

  // Configurations after the rule on top of `stack` returns (to the frame on top).
  const std::vector<int64_t>& pop_into(int32_t stack) {
    auto hit = popinto_.find(stack);
    if (hit != popinto_.end()) return hit->second;
    std::vector<int64_t> out;
    int32_t s = stack;
    while (true) {
      if (s == 0) {
        out.push_back(ACCEPT_);
        break;
      }
      const int32_t ret = sret_[s], parent = spar_[s];
      const Closure& c = net_->closure(ret);
      for (size_t i = 0; i < c.state.size(); ++i)
        out.push_back(static_cast<int64_t>(c.frames[i].empty() ? parent : push(parent, c.frames[i])) * M_ +
                      c.state[i]);
      if (!c.pops) break;
      s = parent;
    }
    canonical(out);
    return popinto_.emplace(stack, std::move(out)).first->second;
  }

  // -- parse states ----------------------------------------------------------------------

  int32_t intern(const std::vector<int64_t>& configs) {  // configs: sorted, unique; copied if new
    const size_t h = VecHash{}(configs);
    auto range = ds_ids_.equal_range(h);
    for (auto it = range.first; it != range.second; ++it)
      if (ds_[it->second] == configs) return it->second;
    const int32_t did = static_cast<int32_t>(ds_.size());
    Bits256 readable{0, 0, 0, 0};
    bool accepts = false;
    for (int64_t cfg : configs) {
      const int32_t k = static_cast<int32_t>(cfg % M_);
      if (k == ACCEPT_) {
        accepts = true;
        continue;
      }
      for (int w = 0; w < 4; ++w) readable[w] |= net_->class_bits[k][w];
    }
    table_.resize(table_.size() + C_);
    int32_t* row = table_.data() + static_cast<int64_t>(did) * C_;
    // classes no configuration reads lead to DEAD: known now, never computed
    for (int32_t c = 0; c < C_; ++c) row[c] = (did != DEAD && has_bit(readable, c)) ? -1 : DEAD;
    accepts_.push_back(accepts);
    readable_.push_back(readable);
    sizes_.push_back(static_cast<int32_t>(configs.size()));
    ds_.push_back(configs);
    ds_ids_.emplace(h, did);
    return did;
  }

  int32_t initial() {
    const Closure& c = net_->closure(net_->rule_start[net_->root]);
    std::vector<int64_t> out;
    for (size_t i = 0; i < c.state.size(); ++i) out.push_back(static_cast<int64_t>(push(0, c.frames[i])) * M_ + c.state[i]);
    if (c.pops) out.push_back(ACCEPT_);
    canonical(out);
    return intern(std::move(out));
  }

  int32_t next(int32_t did, int32_t cls) {
    const int32_t v = table_[static_cast<int64_t>(did) * C_ + cls];
    return v >= 0 ? v : transition(did, cls);
  }

  int32_t transition(int32_t did, int32_t cls) {
    const int32_t known = table_[static_cast<int64_t>(did) * C_ + cls];
    if (known >= 0) return known;
    const int32_t byte = net_->class_rep[cls];
    std::vector<int64_t>& out = scratch_;  // reused: most transitions lead to a known state
    out.clear();
    for (size_t i = 0; i < ds_[did].size(); ++i) {  // by index: push() does not touch ds_, intern() below does
      const int64_t cfg = ds_[did][i];
      const int32_t k = static_cast<int32_t>(cfg % M_);
      if (k == ACCEPT_ || !has_bit(net_->byte_bits[k], byte)) continue;
      const int32_t stack = static_cast<int32_t>(cfg / M_);
      const Closure& st = net_->step(k, cls);
      for (size_t j = 0; j < st.state.size(); ++j)
        out.push_back(static_cast<int64_t>(st.frames[j].empty() ? stack : push(stack, st.frames[j])) * M_ +
                      st.state[j]);
      if (st.pops) {
        const auto& p = pop_into(stack);
        out.insert(out.end(), p.begin(), p.end());
      }
    }
    canonical(out);
    if (static_cast<int64_t>(out.size()) > max_configs_) {
      overflow_size_ = std::max<int64_t>(overflow_size_, out.size());
      out.clear();
    }
    const int32_t nxt = intern(out);
    // every class this state reads alike (same edge targets in each kernel) leads there too:
    // one step fills its group (inside a string, ~50 classes of ordinary characters)
    const std::vector<uint16_t>& group = groups(did);
    int32_t* row = table_.data() + static_cast<int64_t>(did) * C_;
    for (int32_t c = 0; c < C_; ++c)
      if (group[c] == group[cls]) row[c] = nxt;
    return nxt;
  }

  // A group id per byte class: equal iff every kernel of `did` has the same signature there.
  // One kernel (most states): its signature. More: refined kernel by kernel through a flat
  // table of (group so far, signature) pairs, stamped per pass so it is never cleared (a
  // hash map here was ~2 us a state: most of a cold kernel walk).
  const std::vector<uint16_t>& groups(int32_t did) {
    if (static_cast<int64_t>(groups_.size()) <= did) groups_.resize(ds_.size());
    std::vector<uint16_t>& g = groups_[did];
    if (!g.empty()) return g;
    std::vector<int32_t> kernels;
    for (int64_t cfg : ds_[did]) {
      const int32_t k = static_cast<int32_t>(cfg % M_);
      if (k != ACCEPT_) kernels.push_back(k);
    }
    std::sort(kernels.begin(), kernels.end());
    kernels.erase(std::unique(kernels.begin(), kernels.end()), kernels.end());
    if (kernels.empty()) {
      g.assign(C_, 0);
      return g;
    }
    g = net_->signature(kernels[0]);  // ids <= C_ <= 256
    constexpr size_t kKeys = 257 * 257;
    thread_local std::vector<uint32_t> stamp(kKeys, 0);
    thread_local std::vector<uint16_t> ids(kKeys);
    thread_local uint32_t pass = 0;
    for (size_t i = 1; i < kernels.size(); ++i) {
      const std::vector<uint16_t>& sig = net_->signature(kernels[i]);
      if (++pass == 0) {  // wrapped: stamps of 2^32 passes ago would look current
        std::fill(stamp.begin(), stamp.end(), 0);
        pass = 1;
      }
      uint16_t fresh = 0;
      for (int32_t c = 0; c < C_; ++c) {
        const size_t key = static_cast<size_t>(g[c]) * 257 + sig[c];
        if (stamp[key] != pass) {
          stamp[key] = pass;
          ids[key] = fresh++;
        }
        g[c] = ids[key];
      }
    }
    return g;
  }

  int32_t advance(int32_t did, const py::bytes& data) {
    char* buf;
    py::ssize_t len;
    PyBytes_AsStringAndSize(data.ptr(), &buf, &len);
    for (py::ssize_t i = 0; i < len; ++i) {
      did = next(did, net_->byte_class[static_cast<unsigned char>(buf[i])]);
      if (did == DEAD) return DEAD;
    }
    return did;
  }

  bool accepting(int32_t did) const { return accepts_[did] != 0; }
  int32_t size(int32_t did) const { return sizes_[did]; }

  py::bytes allowed_bytes(int32_t did) const {
    Bits256 bits{0, 0, 0, 0};
    for (int64_t cfg : ds_[did]) {
      const int32_t k = static_cast<int32_t>(cfg % M_);
      if (k != ACCEPT_)
        for (int w = 0; w < 4; ++w) bits[w] |= net_->byte_bits[k][w];
    }
    return py::bytes(reinterpret_cast<const char*>(bits.data()), 32);  // little-endian words
  }

  // The configurations of `did` as (state, frames outermost first): portable between tables.
  std::vector<std::pair<int32_t, std::vector<int32_t>>> export_(int32_t did) const {
    std::vector<std::pair<int32_t, std::vector<int32_t>>> out;
    for (int64_t cfg : ds_[did]) out.emplace_back(static_cast<int32_t>(cfg % M_), frames_of(static_cast<int32_t>(cfg / M_)));
    return out;
  }

  int32_t import_(const std::vector<std::pair<int32_t, std::vector<int32_t>>>& portable) {
    std::vector<int64_t> out;
    for (const auto& [k, frames] : portable) out.push_back(static_cast<int64_t>(push(0, frames)) * M_ + k);
    canonical(out);
    return intern(std::move(out));
  }

  I64 configs(int32_t did) const {
    I64 out(static_cast<py::ssize_t>(ds_[did].size()));
    std::copy(ds_[did].begin(), ds_[did].end(), out.mutable_data());
    return out;
  }
  py::tuple stack_frame(int32_t sid) const { return py::make_tuple(sret_[sid], spar_[sid]); }
  int64_t n_dstates() const { return static_cast<int64_t>(ds_.size()); }
  int64_t n_stacks() const { return static_cast<int64_t>(sret_.size()); }
  int64_t overflow_size() const { return overflow_size_; }

  // -- walks -----------------------------------------------------------------------------

  // Visits every node of the subtree at preorder index `p0` (its own bytes read: state `s0`)
  // reachable from it, below it, depth first: `visit(p, state)` returns whether to descend.
  // The state at each depth is on a stack: a node's parent is the last node seen one level up.
  //
  // With `shortcut`, a subtree allowed the same way at each depth (uniform_below: the inside
  // of a string, bounded or not, is most of the vocabulary) goes to `whole(p)` (all of it
  // below p is allowed), not walked; `visit` is not called below it, which is right for the callers here: they mark tokens, note
  // sizes (`max_size` takes those of the states skipped) and stop at accepting states (none
  // is skipped). The walk is latency-bound (each node's step waits on its parent's), so
  // skipping nodes is what makes a walk of a string's inside cheap: ~40 us, not ~500.
  template <typename Visit, typename Whole>
  void walk(const Trie& trie, int64_t p0, int32_t s0, bool shortcut, int32_t* max_size, Visit&& visit,
            Whole&& whole) {
    thread_local std::vector<int32_t> stack;
    stack.resize(trie.max_depth + 1);
    int32_t* at_depth = stack.data();  // a local pointer: each thread_local access costs a call
    const int32_t* end = trie.end.data();
    const uint8_t* cls = trie.cls.data();
    const uint8_t* depth = trie.depth.data();
    at_depth[depth[p0]] = s0;
    for (int64_t p = p0 + 1, stop = end[p0]; p < stop;) {
      const int32_t d = depth[p];
      const int32_t from = at_depth[d - 1];
      int32_t nxt = table_[static_cast<int64_t>(from) * C_ + cls[p]];
      if (nxt < 0) nxt = transition(from, cls[p]);
      if (nxt == DEAD || !visit(p, nxt)) {
        p = end[p];
        continue;
      }
      if (shortcut && end[p] - p > kShortcutMin && uniform_below(trie, p, nxt, max_size)) {
        whole(p);
        p = end[p];
        continue;
      }
      at_depth[d] = nxt;
      ++p;
    }
  }

  // Whether everything below node p, entered in state `did`, is allowed the same way at
  // each depth: every class read below p leads from the state at one depth to one state at
  // the next (the same state: inside a string; the next count: inside a bounded one), none
  // of them accepting (a kernel walk stops there). Then the subtree is marked whole, and
  // `max_size` takes the sizes of those states. Followed step by step (each step is one
  // table read, see uniform_step), not memoized: a memo per (state, class set) missed on
  // most subtrees and cost more in hashing than the chain it saved.
  bool uniform_below(const Trie& trie, int64_t p, int32_t did, int32_t* max_size) {
    return uniform_chain(did, trie.class_sets[trie.below[p]], trie.height[p], max_size);
  }

  // Whether `did` reads `height` bytes of the classes in `need` uniformly (see uniform_below).
  bool uniform_chain(int32_t did, const Bits256& need, int32_t height, int32_t* max_size) {
    const Bits256& can = readable_[did];
    if ((need[0] & ~can[0]) | (need[1] & ~can[1]) | (need[2] & ~can[2]) | (need[3] & ~can[3]))
      return false;  // a class below is not read at all (most states, most subtrees): no lookup
    int32_t most = 0;  // the chain of states below, one per depth
    for (int32_t depth = 0; depth < height; ++depth) {
      const int32_t to = uniform_step(did, need);
      if (to < 0 || accepts_[to]) return false;
      most = std::max(most, sizes_[to]);
      if (to == did) break;  // a loop (the inside of a string): every further step is this one
      did = to;
    }
    if (max_size) *max_size = std::max(*max_size, most);
    return true;
  }

  // The one state every class of `need` leads to from `did`, or -1. One next() for the lot:
  // the classes of `need` lead to one state iff they are all in one group of `did` (see
  // groups); checked class by class, a step cost ~100 table reads.
  int32_t uniform_step(int32_t did, const Bits256& need) {
    int32_t first = -1;
    for (int w = 0; w < 4 && first < 0; ++w)
      if (need[w]) first = 64 * w + __builtin_ctzll(need[w]);
    if (first < 0) return -1;
    const std::vector<Bits256>& masks = group_masks(did);
    const Bits256& same = masks[groups(did)[first]];
    for (int w = 0; w < 4; ++w)
      if (need[w] & ~same[w]) return -1;
    const int32_t v = next(did, first);
    return v == DEAD ? -1 : v;
  }

  // The classes of each group of `did` (indexed by group id), made on first use.
  const std::vector<Bits256>& group_masks(int32_t did) {
    if (static_cast<int64_t>(group_masks_.size()) <= did) group_masks_.resize(ds_.size());
    std::vector<Bits256>& m = group_masks_[did];
    if (!m.empty()) return m;
    const std::vector<uint16_t>& g = groups(did);
    m.assign(static_cast<size_t>(*std::max_element(g.begin(), g.end())) + 1, Bits256{0, 0, 0, 0});
    for (int32_t c = 0; c < C_; ++c) m[g[c]][c >> 6] |= 1ull << (c & 63);
    return m;
  }

  // Mask words of the tokens reachable from `did` (one walk of the real state).
  I32 mask_words(const Trie& trie, int32_t did) {
    I32 out(trie.n_words);
    uint32_t* words = reinterpret_cast<uint32_t*>(out.mutable_data());
    std::memset(words, 0, sizeof(uint32_t) * trie.n_words);
    walk(
        trie, 0, did, true, nullptr,
        [&](int64_t node, int32_t) {
          trie.mark(words, node);
          return true;
        },
        [&](int64_t node) { trie.mark_below(words, node); });
    return out;
  }

  // The parse state after each trie node's bytes (DEAD where not allowed; the root: `did`;
  // index n_nodes, the sentinel of tokens without bytes: DEAD).
  I32 node_states(const Trie& trie, int32_t did) {
    I32 out(trie.n_nodes + 1);
    int32_t* s = out.mutable_data();
    std::fill(s, s + trie.n_nodes + 1, DEAD);
    s[0] = did;
    walk(
        trie, 0, did, false, nullptr,
        [&](int64_t node, int32_t state) {
          s[trie.level_of[node]] = state;
          return true;
        },
        [](int64_t) {});
    return out;
  }

  // The mask by the kernel route, or nullopt where a real state could pass max_configs
  // (the plain walk then decides, as accept() does).
  std::optional<I32> route_mask(const Trie& trie, int32_t did) {
    std::vector<std::pair<int32_t, int32_t>> by_kernel;  // (kernel, stack)
    bool shared = false;  // some kernel walked as another (exact up to the share horizon)
    for (int64_t cfg : ds_[did]) {
      const int32_t k = static_cast<int32_t>(cfg % M_);
      if (k == ACCEPT_) continue;
      const int32_t walked = net_->share[k];
      shared |= walked != k;
      by_kernel.emplace_back(walked, static_cast<int32_t>(cfg / M_));
    }
    std::sort(by_kernel.begin(), by_kernel.end());
    I32 out(trie.n_words);
    uint32_t* words = reinterpret_cast<uint32_t*>(out.mutable_data());
    std::memset(words, 0, sizeof(uint32_t) * trie.n_words);
    int64_t bound = 0, with_entries = 0;
    tails_.clear();
    tail_states_.clear();
    std::vector<int32_t> stacks;
    for (size_t i = 0; i < by_kernel.size();) {
      const int32_t k = by_kernel[i].first;
      stacks.clear();
      for (; i < by_kernel.size() && by_kernel[i].first == k; ++i) stacks.push_back(by_kernel[i].second);
      const KernelWalk& kw = kernel_walk(trie, k);  // may replace the kernel tables
      bound += static_cast<int64_t>(stacks.size()) * kw.max_size;
      if (kw.dense) {
        for (int64_t w = 0; w < trie.n_words; ++w) words[w] |= kw.words[w];
      } else {
        for (size_t j = 0; j < kw.at.size(); ++j) words[kw.at[j]] |= kw.words[j];
      }
      if (kw.states.empty()) continue;
      ++with_entries;
      for (size_t j = 0; j < kw.states.size(); ++j) {
        const int32_t real = lift(kw.states[j], stacks);
        if (real < 0) return std::nullopt;
        if (real == DEAD) continue;
        tails_.push_back(kw.tails[j]);  // shared: a later kernel_walk may evict kw
        tail_states_.push_back(real);
      }
    }
    if (bound > max_configs_) return std::nullopt;
    if (!tails_.empty()) {
      // below the returns, from the real states
      int32_t max_size = 0;
      for (size_t i = 0; i < tails_.size(); ++i) walk_tail(trie, *tails_[i], tail_states_[i], words, max_size);
      if (bound + with_entries * max_size > max_configs_) return std::nullopt;
    }
    if (shared) mark_long(trie, did, words);
    return out;
  }

  // Replaces the marks of the tokens over the share horizon with a walk of them from the
  // real state `did` (a shared kernel walk is exact only below it). The walk passes only
  // the nodes on the way to such tokens (~1000 of a 49k vocabulary) and no transition
  // off that way, so it makes few new states.
  void mark_long(const Trie& trie, int32_t did, uint32_t* words) {
    const int32_t horizon = net_->share_horizon;
    if (long_shape_ != trie.shape) {  // the tokens over it, per vocabulary
      long_shape_ = trie.shape;
      long_words_.assign(trie.n_words, 0);
      for (int64_t p = 0; p < trie.n_nodes; ++p)
        if (trie.depth[p] > horizon) trie.mark(long_words_.data(), p);
    }
    for (int64_t w = 0; w < trie.n_words; ++w) words[w] &= ~long_words_[w];
    thread_local std::vector<int32_t> stack;
    stack.resize(trie.max_depth + 1);
    int32_t* at_depth = stack.data();
    const int32_t* end = trie.end.data();
    const uint8_t* depth = trie.depth.data();
    const uint8_t* height = trie.height.data();
    const uint8_t* cls = trie.cls.data();
    at_depth[0] = did;
    for (int64_t p = 1; p < trie.n_nodes;) {
      const int32_t d = depth[p];
      if (d + height[p] <= horizon) {  // no token over the horizon below
        p = end[p];
        continue;
      }
      const int32_t from = at_depth[d - 1];
      int32_t nxt = table_[static_cast<int64_t>(from) * C_ + cls[p]];
      if (nxt < 0) nxt = transition(from, cls[p]);
      if (nxt == DEAD) {
        p = end[p];
        continue;
      }
      if (d > horizon) trie.mark(words, p);
      at_depth[d] = nxt;
      ++p;
    }
  }

  // Makes the kernel walks of `kernels` now (at compile time: see EbnfGrammar); walks of
  // the same kernel come from the cache later. Stops after `budget_us` microseconds;
  // returns how many it made.
  int64_t warm(const Trie& trie, const I32& kernels, int64_t budget_us) {
    const auto start = std::chrono::steady_clock::now();
    const int32_t* k = kernels.data();
    int64_t made = 0;
    for (py::ssize_t i = 0; i < kernels.size() && budget_us > 0; ++i) {
      if (std::chrono::steady_clock::now() - start > std::chrono::microseconds(budget_us)) break;
      kernel_walk(trie, net_->share[k[i]]);
      ++made;
    }
    return made;
  }

  // Marks the tokens of `tail` that `s0` reads (`max_size`: the most configurations met).
  void walk_tail(const Trie& trie, const Tail& tail, int32_t s0, uint32_t* words, int32_t& max_size) {
    max_size = std::max(max_size, sizes_[s0]);
    if (!tail.entries.empty()) {  // unmerged: each subtree on the trie
      for (int64_t e : tail.entries) {
        trie.mark(words, e);
        if (trie.end[e] - e > kShortcutMin && uniform_below(trie, e, s0, &max_size)) {
          trie.mark_below(words, e);
          continue;
        }
        walk(
            trie, e, s0, true, &max_size,
            [&](int64_t node, int32_t state) {
              trie.mark(words, node);
              max_size = std::max(max_size, sizes_[state]);
              return true;
            },
            [&](int64_t node) { trie.mark_below(words, node); });
      }
      return;
    }
    thread_local std::vector<int32_t> stack;
    stack.resize(256);
    int32_t* at_depth = stack.data();
    const int32_t* ts = tail.tok_start.data();
    const int32_t* tk = tail.toks.data();
    auto mark = [&](int32_t p) {
      for (int32_t i = ts[p], e = ts[p + 1]; i < e; ++i) words[tk[i] >> 5] |= 1u << (tk[i] & 31);
    };
    at_depth[0] = s0;
    mark(0);
    max_size = std::max(max_size, sizes_[s0]);
    const int32_t n = static_cast<int32_t>(tail.cls.size());
    if (n > kShortcutMin && uniform_chain(s0, tail.class_sets[tail.below[0]], tail.height[0], &max_size)) {
      for (int32_t i = ts[1], e = ts[n]; i < e; ++i) words[tk[i] >> 5] |= 1u << (tk[i] & 31);
      return;
    }
    for (int32_t p = 1; p < n;) {
      const int32_t d = tail.depth[p];
      const int32_t from = at_depth[d - 1];
      int32_t nxt = table_[static_cast<int64_t>(from) * C_ + tail.cls[p]];
      if (nxt < 0) nxt = transition(from, tail.cls[p]);
      if (nxt == DEAD) {
        p = tail.end[p];
        continue;
      }
      mark(p);
      max_size = std::max(max_size, sizes_[nxt]);
      if (tail.end[p] - p > kShortcutMin &&
          uniform_chain(nxt, tail.class_sets[tail.below[p]], tail.height[p], &max_size)) {
        for (int32_t i = ts[p + 1], e = ts[tail.end[p]]; i < e; ++i) words[tk[i] >> 5] |= 1u << (tk[i] & 31);
        p = tail.end[p];
        continue;
      }
      at_depth[d] = nxt;
      ++p;
    }
  }

  // The kernel walk of the root's children of byte class `c` entered in kernel-tables state
  // `s` (their own tokens included), memoized per (s, c). A kernel walk is the union of these
  // over the classes it reads: kernels that differ only in how they read the first byte (the
  // branches of a name trie, the keys of an open object, the positions of a literal) reach
  // the same state after it and share the walk below, stored as mask words, so a hit costs
  // an OR of words, not a walk and a write per token.
  const RootWalk& root_walk(const Trie& trie, int32_t s, int32_t c) {
    const uint64_t key = (static_cast<uint64_t>(static_cast<uint32_t>(s)) << 8) | static_cast<uint32_t>(c);
    auto hit = root_walks_.find(key);
    if (hit != root_walks_.end()) return *hit->second;
    if (root_walk_bytes_ > kRootWalkBytes) {
      root_walks_.clear();
      root_walk_bytes_ = 0;
    }
    auto rw = std::make_unique<RootWalk>();
    const TrieShape& sh = *trie.shape;
    const int32_t* ts = sh.tok_start.data();
    const int32_t* tk = sh.toks.data();
    TokenSet& set = rw->tokens;
    auto mark = [&](int64_t q) { set.add(tk + ts[q], tk + ts[q + 1], trie.n_words); };
    auto mark_below = [&](int64_t q) {
      if (const uint32_t* bits = sh.dense_below(q)) {
        set.add_bits(bits, trie.n_words);
      } else {
        set.add(tk + ts[q + 1], tk + ts[trie.end[q]], trie.n_words);
      }
    };
    rw->max_size = size(s);
    for (int64_t p : trie.root_children[c]) {
      if (accepting(s)) {
        rw->entries.push_back(p);
        rw->entry_states.push_back(s);
        continue;
      }
      mark(p);
      if (trie.end[p] - p > kShortcutMin && uniform_below(trie, p, s, &rw->max_size)) {
        mark_below(p);  // the inside of a string
        continue;
      }
      walk(
          trie, p, s, true, &rw->max_size,
          [&](int64_t node, int32_t state) {
            if (accepting(state)) {
              rw->entries.push_back(node);
              rw->entry_states.push_back(state);
              return false;
            }
            rw->max_size = std::max(rw->max_size, size(state));
            mark(node);
            return true;
          },
          mark_below);
    }
    root_walk_bytes_ += rw->bytes();
    return *(root_walks_[key] = std::move(rw));
  }

  int64_t kernel_walks() const { return static_cast<int64_t>(kernel_cache_.size()); }
  int64_t kernel_walks_done() const { return kernel_walks_done_; }
  int64_t lifts() const { return static_cast<int64_t>(lifted_.size()); }

  void set_limits(int64_t max_dstates, int64_t max_stacks, int64_t kernel_cache_bytes) {
    max_dstates_ = max_dstates;
    max_stacks_ = max_stacks;
    kernel_cache_bytes_ = kernel_cache_bytes;
  }

 private:
  void canonical(std::vector<int64_t>& v) const {
    std::sort(v.begin(), v.end());
    v.erase(std::unique(v.begin(), v.end()), v.end());
  }

  std::vector<int32_t> frames_of(int32_t s) const {
    std::vector<int32_t> frames;
    for (; s; s = spar_[s]) frames.push_back(sret_[s]);
    std::reverse(frames.begin(), frames.end());
    return frames;
  }

  bool too_big() const {
    return static_cast<int64_t>(ds_.size()) > max_dstates_ || static_cast<int64_t>(sret_.size()) > max_stacks_;
  }

  // One kernel's walk in the kernel tables, cached (LRU by bytes): the tokens that never
  // leave the rule on top, the nodes where it returns (ACCEPT there: the walk stops) with
  // their states, and the most configurations a state on the way held. Exact because a
  // configuration's steps depend on its stack only when a rule returns into it.
  const KernelWalk& kernel_walk(const Trie& trie, int32_t kernel) {
    auto hit = kernel_cache_.find(kernel);
    if (hit != kernel_cache_.end()) {
      lru_.splice(lru_.begin(), lru_, hit->second.second);
      return hit->second.first;
    }
    if (!kt_ || kt_->too_big()) {  // cached entry states are its ids: dropped with it
      kt_ = std::make_unique<Glr>(net_, max_configs_);
      kt_->set_limits(max_dstates_, max_stacks_, 0);
      kernel_cache_.clear();
      lru_.clear();
      kernel_bytes_ = 0;
      lifted_.clear();
    }
    Glr& kt = *kt_;
    const int32_t start = kt.intern({kernel});
    KernelWalk kw;
    std::vector<uint32_t> words(trie.n_words, 0);
    std::vector<int64_t> entries;  // trie nodes where the rule returned ...
    std::vector<int32_t> entry_states;  // ... into these states
    kw.max_size = kt.size(start);
    for (int32_t c : trie.root_classes) {
      const int32_t s = kt.next(start, c);
      if (s == DEAD) continue;
      const RootWalk& rw = kt.root_walk(trie, s, c);
      rw.tokens.mark(words.data());
      entries.insert(entries.end(), rw.entries.begin(), rw.entries.end());
      entry_states.insert(entry_states.end(), rw.entry_states.begin(), rw.entry_states.end());
      kw.max_size = std::max(kw.max_size, rw.max_size);
    }
    std::vector<std::vector<int64_t>> by_state;  // entries share a few states
    for (size_t j = 0; j < entries.size(); ++j) {
      const size_t at = std::find(kw.states.begin(), kw.states.end(), entry_states[j]) - kw.states.begin();
      if (at == kw.states.size()) {
        kw.states.push_back(entry_states[j]);
        by_state.emplace_back();
      }
      by_state[at].push_back(entries[j]);
    }
    for (const auto& group : by_state) kw.tails.push_back(std::make_shared<const Tail>(trie, group));
    pack_words(words, trie.n_words, kw.at, kw.words, kw.dense);
    ++kernel_walks_done_;
    kernel_bytes_ += kw.bytes();
    lru_.push_front(kernel);
    auto& slot = kernel_cache_[kernel];
    slot = {std::move(kw), lru_.begin()};
    while (kernel_bytes_ > kernel_cache_bytes_ && kernel_cache_.size() > 1) {
      const int32_t old = lru_.back();
      lru_.pop_back();
      auto it = kernel_cache_.find(old);
      kernel_bytes_ -= it->second.first.bytes();
      kernel_cache_.erase(it);
    }
    return slot.first;
  }

  // The real parse state of kernel-tables state `ks` reached from a kernel whose real stacks
  // are `stacks` (sorted): each configuration's frames pushed onto each stack, a return
  // below them (ACCEPT there) popped into each; -1 past max_configs.
  int32_t lift(int32_t ks, const std::vector<int32_t>& stacks) {
    std::vector<int64_t> key;
    key.reserve(stacks.size() + 1);
    key.push_back(ks);
    key.insert(key.end(), stacks.begin(), stacks.end());
    auto hit = lifted_.find(key);
    if (hit != lifted_.end()) return hit->second;
    std::vector<int64_t> out;
    for (int64_t cfg : kt_->ds_[ks]) {
      const int32_t k = static_cast<int32_t>(cfg % M_);
      if (k == ACCEPT_) {
        for (int32_t s : stacks) {
          const auto& p = pop_into(s);
          out.insert(out.end(), p.begin(), p.end());
        }
      } else {
        const std::vector<int32_t> frames = kt_->frames_of(static_cast<int32_t>(cfg / M_));
        for (int32_t s : stacks) out.push_back(static_cast<int64_t>(push(s, frames)) * M_ + k);
      }
    }
    canonical(out);
    const int32_t did = static_cast<int64_t>(out.size()) <= max_configs_ ? intern(std::move(out)) : -1;
    if (static_cast<int64_t>(lifted_.size()) >= max_dstates_) lifted_.clear();
    lifted_.emplace(std::move(key), did);
    return did;
  }

  std::shared_ptr<Net> net_;
  int64_t max_configs_, M_;
  int32_t ACCEPT_, C_;
  int64_t max_dstates_ = 32768, max_stacks_ = 1000000, kernel_cache_bytes_ = 32 << 20;
  std::vector<int32_t> sret_, spar_;
  std::unordered_map<uint64_t, int32_t> sids_;
  std::unordered_map<int32_t, std::vector<int64_t>> popinto_;
  std::vector<std::vector<int64_t>> ds_;
  std::unordered_multimap<size_t, int32_t> ds_ids_;
  std::vector<int32_t> table_;
  std::vector<uint8_t> accepts_;
  std::vector<std::vector<uint16_t>> groups_;  // per dstate, made on its first transition (see groups)
  std::vector<std::vector<Bits256>> group_masks_;  // per dstate: each group's classes (see uniform_step)
  std::vector<Bits256> readable_;  // per dstate: the classes some configuration reads
  std::vector<int32_t> sizes_;
  std::vector<int64_t> scratch_;  // transition's configurations
  int64_t overflow_size_ = 0;
  // the kernel route
  std::unique_ptr<Glr> kt_;
  std::unordered_map<int32_t, std::pair<KernelWalk, std::list<int32_t>::iterator>> kernel_cache_;
  std::list<int32_t> lru_;
  size_t kernel_bytes_ = 0;
  int64_t kernel_walks_done_ = 0;
  std::unordered_map<std::vector<int64_t>, int32_t, VecHash> lifted_;
  std::unordered_map<uint64_t, std::unique_ptr<RootWalk>> root_walks_;  // kernel tables: (state, class) -> walk
  size_t root_walk_bytes_ = 0;
  std::vector<std::shared_ptr<const Tail>> tails_;  // route_mask's walks below returns ...
  std::vector<int32_t> tail_states_;  // ... from these real states
  std::shared_ptr<const TrieShape> long_shape_;  // mark_long's tokens over the share horizon, of this vocabulary
  std::vector<uint32_t> long_words_;
};

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "The EBNF recognizer's GLR tables and token-mask walks (see ebnf_native.py)";
  py::class_<Net, std::shared_ptr<Net>>(m, "Net")
      .def(py::init<const I32&, const I32&, const I32&, const I32&, const I32&, const I32&, const I32&, const I32&,
                    const I32&, const I32&, const I32&, const I32&, const py::array_t<uint8_t>&,
                    const py::array_t<uint64_t>&, const I32&, const I32&, int32_t, const I32&, int32_t>());
  py::class_<TrieShape, std::shared_ptr<TrieShape>>(m, "TrieShape")
      .def(py::init<const I64&, const I64&, const I64&, const I64&, int64_t>());
  py::class_<Trie>(m, "Trie").def(py::init<std::shared_ptr<const TrieShape>, const I32&>());
  py::class_<Glr>(m, "Glr")
      .def(py::init<std::shared_ptr<Net>, int32_t>())
      .def("set_limits", &Glr::set_limits)
      .def("initial", &Glr::initial)
      .def("transition", &Glr::transition)
      .def("advance", &Glr::advance)
      .def("accepting", &Glr::accepting)
      .def("allowed_bytes", &Glr::allowed_bytes)
      .def("export", &Glr::export_)
      .def("import_", &Glr::import_)
      .def("configs", &Glr::configs)
      .def("stack_frame", &Glr::stack_frame)
      .def("n_dstates", &Glr::n_dstates)
      .def("n_stacks", &Glr::n_stacks)
      .def("overflow_size", &Glr::overflow_size)
      .def("mask_words", &Glr::mask_words)
      .def("node_states", &Glr::node_states)
      .def("route_mask", &Glr::route_mask)
      .def("warm", &Glr::warm)
      .def("kernel_walks", &Glr::kernel_walks)
      .def("kernel_walks_done", &Glr::kernel_walks_done)
      .def("lifts", &Glr::lifts);
}
