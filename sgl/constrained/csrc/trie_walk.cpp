// Token masks of the EBNF recognizer: the vocabulary's byte trie walked through the lazy
// DFA table of sgl/constrained/ebnf_runtime.py (Tables).
//
// A parse state's mask is every token whose bytes lead from it to a live state. The walk
// reads table[state, byte_class] for each trie edge; a transition not computed yet (-1) is
// computed by calling Tables.transition (Python: the GLR step), which may grow (replace)
// the table, so the table is fetched again after each call. A subtree is skipped as soon
// as its state is DEAD (0). Why native: the numpy walk (same algorithm) cost ~230 us per
// mask in numpy call overhead alone, and 1.4 ms on a state that allows the whole trie.
//
// Three walks: mask_words (one parse state, the whole trie), kernel_walk (one kernel in the
// stack-free kernel tables, stopping where its rule returns) and subtree_walk (below those
// returns, from real states); Tables.native_mask combines them.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

namespace py = pybind11;

using I32 = py::array_t<int32_t, py::array::c_style | py::array::forcecast>;
using I64 = py::array_t<int64_t, py::array::c_style | py::array::forcecast>;

namespace {

constexpr int32_t DEAD = 0;

struct Table {
  I32 array;
  py::array_t<int8_t, py::array::c_style | py::array::forcecast> accepts_array;
  I32 sizes_array;
  const int32_t* data = nullptr;
  const int8_t* accepts = nullptr;
  const int32_t* sizes = nullptr;
  int64_t rows = 0, cols = 0;

  void fetch(const py::object& tables) {
    array = tables.attr("table").cast<I32>();
    accepts_array = tables.attr("accepts").cast<py::array_t<int8_t, py::array::c_style | py::array::forcecast>>();
    sizes_array = tables.attr("sizes").cast<I32>();
    data = array.data();
    accepts = accepts_array.data();
    sizes = sizes_array.data();
    rows = array.shape(0);
    cols = array.shape(1);
  }
};

// The trie's arrays (see VocabTrie) and the mask words being filled.
struct Trie {
  const int64_t *cs, *cc, *par, *ls, *ts, *tk;
  const int32_t* nc;
  int64_t n_levels;
  uint32_t* words = nullptr;

  void mark(int64_t node) const {
    for (int64_t i = ts[node], e = ts[node + 1]; i < e; ++i) {
      const int64_t t = tk[i];
      words[t >> 5] |= 1u << (t & 31);
    }
  }
};

// table[state, cls], computing (in Python) a transition not known yet.
struct Stepper {
  py::object tables, transition;
  Table table;

  explicit Stepper(const py::object& t) : tables(t), transition(t.attr("transition")) { table.fetch(tables); }

  int32_t operator()(int32_t state, int32_t cls) {
    int32_t next = table.data[static_cast<int64_t>(state) * table.cols + cls];
    if (next < 0) {
      next = transition(state, cls).cast<int32_t>();
      table.fetch(tables);  // the table may have grown
    }
    return next;
  }
  bool accepting(int32_t state) const { return table.accepts[state] != 0; }
  int32_t size(int32_t state) const { return table.sizes[state]; }
};

// Marks every token reachable from `did`. With `entries`, a node whose state is accepting
// is not marked nor descended but recorded there instead (with its state), and `max_size` is the most
// configurations a state of the walk held (see kernel_walk).
//
// Nodes are numbered level by level (see VocabTrie), so the walk goes level by level:
// while few nodes are live it expands only their children; past `dense_switch` it scans
// whole levels, whose nodes, parents and classes are contiguous (cache-friendly: a depth
// first walk of the full trie was 10x slower, bound on cache misses).
void walk(Stepper& step, const Trie& trie, int32_t did, int64_t dense_switch, std::vector<int64_t>* entries,
          std::vector<int32_t>* entry_states, int32_t* max_size) {
  // Sparse phase: the live nodes of one level, with their parse states.
  std::vector<int64_t> live{0}, next_live;
  std::vector<int32_t> live_ds{did}, next_ds;
  int64_t depth = 0;
  while (!live.empty() && static_cast<int64_t>(live.size()) <= dense_switch) {
    next_live.clear();
    next_ds.clear();
    for (size_t i = 0; i < live.size(); ++i) {
      for (int64_t child = trie.cs[live[i]], e = child + trie.cc[live[i]]; child < e; ++child) {
        const int32_t nxt = step(live_ds[i], trie.nc[child]);
        if (nxt == DEAD) continue;
        if (entries) {
          if (step.accepting(nxt)) {
            entries->push_back(child);
            entry_states->push_back(nxt);
            continue;
          }
          *max_size = std::max(*max_size, step.size(nxt));
        }
        trie.mark(child);
        next_live.push_back(child);
        next_ds.push_back(nxt);
      }
    }
    live.swap(next_live);
    live_ds.swap(next_ds);
    ++depth;
  }
  if (live.empty()) return;
  // Dense phase: the parse state of every node of a level (DEAD where not live), from the
  // states of the level above.
  const int64_t* ls = trie.ls;
  std::vector<int32_t> above(ls[depth + 1] - ls[depth], DEAD), here;
  for (size_t i = 0; i < live.size(); ++i) above[live[i] - ls[depth]] = live_ds[i];
  for (int64_t d = depth + 1; d < trie.n_levels; ++d) {
    const int64_t a = ls[d], b = ls[d + 1], up = ls[d - 1];
    here.assign(b - a, DEAD);
    bool any = false;
    for (int64_t u = a; u < b; ++u) {
      const int32_t from = above[trie.par[u] - up];
      if (from == DEAD) continue;
      const int32_t nxt = step(from, trie.nc[u]);
      if (nxt == DEAD) continue;
      if (entries) {
        if (step.accepting(nxt)) {
          entries->push_back(u);
          entry_states->push_back(nxt);
          continue;
        }
        *max_size = std::max(*max_size, step.size(nxt));
      }
      here[u - a] = nxt;
      trie.mark(u);
      any = true;
    }
    if (!any) break;
    above.swap(here);
  }
}

Trie make_trie(const I64& child_start, const I64& child_count, const I64& parent, const I64& level_start,
               const I32& node_class, const I64& tok_start, const I64& toks, I32& out) {
  Trie trie{child_start.data(), child_count.data(), parent.data(), level_start.data(), tok_start.data(),
            toks.data(), node_class.data(), level_start.shape(0) - 1};
  trie.words = reinterpret_cast<uint32_t*>(out.mutable_data());
  std::memset(trie.words, 0, sizeof(uint32_t) * static_cast<size_t>(out.shape(0)));
  return trie;
}

// Packed int32 mask words of the tokens reachable from parse state `did`.
// `tok_start` / `toks`: the ids of the tokens whose bytes end at node u are
// toks[tok_start[u]:tok_start[u+1]].
I32 mask_words(const py::object& tables, int32_t did, const I64& child_start, const I64& child_count,
               const I64& parent, const I64& level_start, const I32& node_class, const I64& tok_start,
               const I64& toks, int64_t n_words, int64_t dense_switch) {
  I32 out(n_words);
  const Trie trie = make_trie(child_start, child_count, parent, level_start, node_class, tok_start, toks, out);
  Stepper step(tables);
  walk(step, trie, did, dense_switch, nullptr, nullptr, nullptr);
  return out;
}

// The walk of one kernel (a parse state of the *kernel tables*, whose stacks are empty, so
// an accepting state there means "the rule on top returned": what follows depends on the
// real stack). Returns the mask of the tokens decided without the stack, the trie nodes
// where the rule returned (none is below another) with their states there, and the most
// configurations a state on the way held.
py::tuple kernel_walk(const py::object& tables, int32_t did, const I64& child_start, const I64& child_count,
                      const I64& parent, const I64& level_start, const I32& node_class, const I64& tok_start,
                      const I64& toks, int64_t n_words, int64_t dense_switch) {
  I32 out(n_words);
  const Trie trie = make_trie(child_start, child_count, parent, level_start, node_class, tok_start, toks, out);
  Stepper step(tables);
  std::vector<int64_t> entries;
  std::vector<int32_t> entry_states;
  int32_t max_size = step.size(did);
  walk(step, trie, did, dense_switch, &entries, &entry_states, &max_size);
  I64 entry_array(static_cast<py::ssize_t>(entries.size()));
  I32 state_array(static_cast<py::ssize_t>(entries.size()));
  if (!entries.empty()) {
    std::memcpy(entry_array.mutable_data(), entries.data(), entries.size() * sizeof(int64_t));
    std::memcpy(state_array.mutable_data(), entry_states.data(), entries.size() * sizeof(int32_t));
  }
  return py::make_tuple(out, entry_array, state_array, max_size);
}

// The tokens of the subtrees at `nodes` reachable from the real parse states `states` (the
// state at each node itself, its bytes read), depth first; and the most configurations a
// state of these walks held.
py::tuple subtree_walk(const py::object& tables, const I64& nodes, const I32& states, const I64& child_start,
                       const I64& child_count, const I32& node_class, const I64& tok_start, const I64& toks,
                       int64_t n_words) {
  I32 out(n_words);
  const I64 unused(1);
  const Trie trie = make_trie(child_start, child_count, unused, unused, node_class, tok_start, toks, out);
  Stepper step(tables);
  int32_t max_size = 0;
  std::vector<std::pair<int64_t, int32_t>> todo;
  const int64_t* ns = nodes.data();
  const int32_t* ss = states.data();
  for (py::ssize_t i = 0; i < nodes.shape(0); ++i) {
    if (ss[i] == DEAD) continue;
    todo.assign(1, {ns[i], ss[i]});
    while (!todo.empty()) {
      const auto [node, s] = todo.back();
      todo.pop_back();
      trie.mark(node);
      max_size = std::max(max_size, step.size(s));
      for (int64_t child = trie.cs[node], e = child + trie.cc[node]; child < e; ++child) {
        const int32_t nxt = step(s, trie.nc[child]);
        if (nxt != DEAD) todo.emplace_back(child, nxt);
      }
    }
  }
  return py::make_tuple(out, max_size);
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "EBNF token masks: the vocabulary trie walked through the lazy DFA table";
  m.def("mask_words", &mask_words, py::arg("tables"), py::arg("did"), py::arg("child_start"),
        py::arg("child_count"), py::arg("parent"),
        py::arg("level_start"), py::arg("node_class"), py::arg("tok_start"), py::arg("toks"), py::arg("n_words"),
        py::arg("dense_switch"));
  m.def("kernel_walk", &kernel_walk, py::arg("tables"), py::arg("did"), py::arg("child_start"),
        py::arg("child_count"), py::arg("parent"), py::arg("level_start"), py::arg("node_class"),
        py::arg("tok_start"), py::arg("toks"), py::arg("n_words"), py::arg("dense_switch"));
  m.def("subtree_walk", &subtree_walk, py::arg("tables"), py::arg("nodes"), py::arg("states"),
        py::arg("child_start"), py::arg("child_count"), py::arg("node_class"), py::arg("tok_start"),
        py::arg("toks"), py::arg("n_words"));
}
