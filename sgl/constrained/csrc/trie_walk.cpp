// Token masks of the EBNF recognizer: the vocabulary's byte trie walked through the lazy
// DFA table of sgl/constrained/ebnf_runtime.py (Tables), depth first.
//
// A parse state's mask is every token whose bytes lead from it to a live state. The walk
// reads table[state, byte_class] for each trie edge; a transition not computed yet (-1) is
// computed by calling Tables.transition (Python: the GLR step), which may grow (replace)
// the table, so the table is fetched again after each call. A subtree is skipped as soon
// as its state is DEAD (0). Why native: the numpy walk (same algorithm) cost ~230 us per
// mask in numpy call overhead alone, and 1.4 ms on a state that allows the whole trie.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cstdint>
#include <cstring>
#include <vector>

namespace py = pybind11;

using I32 = py::array_t<int32_t, py::array::c_style | py::array::forcecast>;
using I64 = py::array_t<int64_t, py::array::c_style | py::array::forcecast>;

namespace {

constexpr int32_t DEAD = 0;

struct Table {
  I32 array;
  const int32_t* data = nullptr;
  int64_t rows = 0, cols = 0;

  void fetch(const py::object& tables) {
    array = tables.attr("table").cast<I32>();
    data = array.data();
    rows = array.shape(0);
    cols = array.shape(1);
  }
};

// Packed int32 mask words of the tokens reachable from parse state `did`.
//
// Nodes are numbered level by level (see VocabTrie), so the walk goes level by level:
// while few nodes are live it expands only their children; past `dense_switch` it scans
// whole levels, whose nodes, parents and classes are contiguous (cache-friendly: a depth
// first walk of the full trie was 10x slower, bound on cache misses).
// `tok_start` / `toks`: the ids of the tokens whose bytes end at node u are
// toks[tok_start[u]:tok_start[u+1]].
I32 mask_words(const py::object& tables, int32_t did, const I64& child_start, const I64& child_count,
               const I64& parent, const I64& level_start, const I32& node_class, const I64& tok_start,
               const I64& toks, int64_t n_words, int64_t dense_switch) {
  const int64_t* cs = child_start.data();
  const int64_t* cc = child_count.data();
  const int64_t* par = parent.data();
  const int64_t* ls = level_start.data();
  const int64_t n_levels = level_start.shape(0) - 1;
  const int32_t* nc = node_class.data();
  const int64_t* ts = tok_start.data();
  const int64_t* tk = toks.data();
  py::object transition = tables.attr("transition");
  Table table;
  table.fetch(tables);
  auto step = [&](int32_t state, int32_t cls) -> int32_t {
    int32_t next = table.data[static_cast<int64_t>(state) * table.cols + cls];
    if (next < 0) {
      next = transition(state, cls).cast<int32_t>();
      table.fetch(tables);
    }
    return next;
  };
  I32 out(n_words);
  uint32_t* words = reinterpret_cast<uint32_t*>(out.mutable_data());
  std::memset(words, 0, sizeof(uint32_t) * static_cast<size_t>(n_words));
  auto mark = [&](int64_t node) {
    for (int64_t i = ts[node], e = ts[node + 1]; i < e; ++i) {
      const int64_t t = tk[i];
      words[t >> 5] |= 1u << (t & 31);
    }
  };
  // Sparse phase: the live nodes of one level, with their parse states.
  std::vector<int64_t> live{0}, next_live;
  std::vector<int32_t> live_ds{did}, next_ds;
  int64_t depth = 0;
  while (!live.empty() && static_cast<int64_t>(live.size()) <= dense_switch) {
    next_live.clear();
    next_ds.clear();
    for (size_t i = 0; i < live.size(); ++i) {
      for (int64_t child = cs[live[i]], e = child + cc[live[i]]; child < e; ++child) {
        const int32_t nxt = step(live_ds[i], nc[child]);
        if (nxt == DEAD) continue;
        mark(child);
        next_live.push_back(child);
        next_ds.push_back(nxt);
      }
    }
    live.swap(next_live);
    live_ds.swap(next_ds);
    ++depth;
  }
  if (live.empty()) return out;
  // Dense phase: the parse state of every node of a level (DEAD where not live), from the
  // states of the level above.
  std::vector<int32_t> above(ls[depth + 1] - ls[depth], DEAD), here;
  for (size_t i = 0; i < live.size(); ++i) above[live[i] - ls[depth]] = live_ds[i];
  for (int64_t d = depth + 1; d < n_levels; ++d) {
    const int64_t a = ls[d], b = ls[d + 1], up = ls[d - 1];
    here.assign(b - a, DEAD);
    bool any = false;
    for (int64_t u = a; u < b; ++u) {
      const int32_t from = above[par[u] - up];
      if (from == DEAD) continue;
      const int32_t nxt = step(from, nc[u]);
      if (nxt == DEAD) continue;
      here[u - a] = nxt;
      mark(u);
      any = true;
    }
    if (!any) break;
    above.swap(here);
  }
  return out;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "EBNF token masks: the vocabulary trie walked through the lazy DFA table";
  m.def("mask_words", &mask_words, py::arg("tables"), py::arg("did"), py::arg("child_start"),
        py::arg("child_count"), py::arg("parent"),
        py::arg("level_start"), py::arg("node_class"), py::arg("tok_start"), py::arg("toks"), py::arg("n_words"),
        py::arg("dense_switch"));
}
