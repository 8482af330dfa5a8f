// tensorflow_ext: the graph passes, a Grappler custom optimizer registered as
// "TfExtGraphPasses" (tf_ext.graph.enable_optimizations lists it in a
// session's RewriterConfig).
//
// Multi-table fusion: recommender graphs hold one lookup (and, when training,
// one sparse update) per feature table, N independent small kernels. The pass
// puts one multi-table op in place of each set of them that may run together:
//   N TfExtEmbeddingLookup              -> TfExtEmbeddingLookupMulti
//   N TfExtEmbeddingLookupSparse        -> TfExtEmbeddingLookupSparseMulti
//   N TfExtEmbeddingLookupSparseGrad    -> TfExtEmbeddingLookupSparseGradMulti
//   N TfExtEmbeddingSparseApply<Opt>    -> TfExtEmbeddingSparseApply<Opt>Multi
// The multi-table kernels do exactly what the N single kernels do (the tables
// are independent), so results do not depend on whether the pass ran.
//
// A set is fused only if
//   * its ops are on the same device and (for updates) share the optimizer
//     flags;
//   * none of them depends on another (directly or through any path), so one
//     op in their place creates no cycle; sets are fused one at a time and the
//     next is checked on the rewritten graph;
//   * none lies downstream of control flow (Switch, Enter, Merge, ...): a
//     dead branch would otherwise kill the whole fused op;
//   * no table appears twice in it (two updates of one table must keep their
//     order).
// Anything else is left as it is; a graph without such ops is returned
// unchanged. Consumers are rewired to the fused op's outputs; an op the caller
// fetches or feeds by name stays as an IdentityN (ops with outputs) or NoOp
// (updates) of the fused op, so every name still resolves.
//
// TF_EXT_GRAPH_PASSES=0 in the environment turns the pass off in every
// session (checked each time a graph is optimized).

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "tensorflow/core/framework/attr_value.pb.h"
#include "tensorflow/core/framework/graph.pb.h"
#include "tensorflow/core/framework/node_def.pb.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_def.pb.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tensorflow/core/grappler/grappler_item.h"
#include "tensorflow/core/grappler/optimizers/custom_graph_optimizer.h"
#include "tensorflow/core/grappler/optimizers/custom_graph_optimizer_registry.h"
#include "tensorflow/core/lib/core/errors.h"
#include "tensorflow/core/platform/logging.h"
#include "tensorflow_ext/embedding/kernels/optimizer_registry.h"

namespace tfext {
namespace graph {
namespace {

using tensorflow::AttrValue;
using tensorflow::GraphDef;
using tensorflow::NodeDef;
using tensorflow::OpDef;
using tensorflow::Status;

// ---------------------------------------------------------------------------
// Counters (process-wide), read by TfExtGraphPassStats.

enum Stat {
  kGraphsSeen,       // graphs the pass was asked to optimize (while on)
  kGraphsRewritten,  // of which it changed
  kLookupsFused,     // TfExtEmbeddingLookup and TfExtEmbeddingLookupSparse ops replaced
  kLookupOps,        // TfExtEmbeddingLookupMulti and TfExtEmbeddingLookupSparseMulti ops created
  kAppliesFused,     // TfExtEmbeddingSparseApply<Opt> ops replaced
  kApplyOps,         // TfExtEmbeddingSparseApply<Opt>Multi ops created
  kGradsFused,       // TfExtEmbeddingLookupSparseGrad ops replaced
  kGradOps,          // TfExtEmbeddingLookupSparseGradMulti ops created
  kNumStats
};

std::atomic<int64_t> g_stats[kNumStats];

bool DisabledByEnvironment() {
  const char* v = std::getenv("TF_EXT_GRAPH_PASSES");
  if (v == nullptr) return false;
  const std::string s(v);
  return s == "0" || s == "false" || s == "False" || s == "off";
}

// ---------------------------------------------------------------------------
// GraphDef helpers.

struct Input {
  std::string node;
  int port = 0;
  bool control = false;
};

Input ParseInput(const std::string& s) {
  Input in;
  if (!s.empty() && s[0] == '^') {
    in.node = s.substr(1);
    in.control = true;
    in.port = -1;
    return in;
  }
  const size_t colon = s.rfind(':');
  if (colon != std::string::npos && colon + 1 < s.size() &&
      s.find_first_not_of("0123456789", colon + 1) == std::string::npos) {
    in.node = s.substr(0, colon);
    in.port = std::atoi(s.c_str() + colon + 1);
  } else {
    in.node = s;
  }
  return in;
}

// "name:0" / "^name" / "name" -> "name".
std::string NodeNameOf(const std::string& s) { return ParseInput(s).node; }

bool IsControlFlow(const std::string& op) {
  static const auto* ops = new std::unordered_set<std::string>{
      "Switch",  "RefSwitch",     "_SwitchN",         "Merge",    "RefMerge",      "Enter", "RefEnter", "Exit",
      "RefExit", "NextIteration", "RefNextIteration", "LoopCond", "ControlTrigger"};
  return ops->count(op) > 0;
}

// A fusion: N ops `single` -> one op `multi`. Each input of `single` becomes an
// N-list of `multi` (in order), and so does each output (output p of member i
// is output p * N + i of `multi`); each attr of `single` becomes a list attr of
// `multi` (named by list_attr_names, else the same name) or, if listed in
// shared_attrs, is copied and must be equal across the fused ops.
struct FusionKind {
  std::string single;
  std::string multi;
  std::map<std::string, std::string> list_attr_names;
  std::unordered_set<std::string> shared_attrs;
  const OpDef* single_def = nullptr;
  Stat members_stat = kLookupsFused;
  Stat ops_stat = kLookupOps;
  int table_input = 0;  // the input naming the table (no two members share one); -1: none
};

std::vector<FusionKind> MakeKinds(bool lookups, bool applies) {
  std::vector<FusionKind> kinds;
  auto add = [&kinds](FusionKind k) {
    const tensorflow::OpRegistrationData* data = nullptr;
    if (!tensorflow::OpRegistry::Global()->LookUp(k.single, &data).ok()) return;
    const tensorflow::OpRegistrationData* multi = nullptr;
    if (!tensorflow::OpRegistry::Global()->LookUp(k.multi, &multi).ok()) return;
    k.single_def = &data->op_def;
    kinds.push_back(std::move(k));
  };
  if (lookups) {
    FusionKind k;
    k.single = "TfExtEmbeddingLookup";
    k.multi = "TfExtEmbeddingLookupMulti";
    k.list_attr_names = {{"dim", "dims"}};
    add(std::move(k));
    FusionKind sparse;
    sparse.single = "TfExtEmbeddingLookupSparse";
    sparse.multi = "TfExtEmbeddingLookupSparseMulti";
    sparse.list_attr_names = {{"dim", "dims"}};
    add(std::move(sparse));
    FusionKind grad;
    grad.single = "TfExtEmbeddingLookupSparseGrad";
    grad.multi = "TfExtEmbeddingLookupSparseGradMulti";
    grad.members_stat = kGradsFused;
    grad.ops_stat = kGradOps;
    grad.table_input = -1;
    add(std::move(grad));
  }
  if (applies) {
#define TFEXT_ADD_APPLY_KIND(Opt)                                           \
  {                                                                         \
    FusionKind k;                                                           \
    k.single = Opt::kOpName;                                                \
    k.multi = MultiApplyOpName<Opt>();                                      \
    k.list_attr_names = {{"dim", "dims"}, {"slot_offset", "slot_offsets"}}; \
    for (int f = 0; f < Opt::kNumFlags; ++f) {                              \
      const std::string spec = Opt::kFlagAttrs[f];                          \
      k.shared_attrs.insert(spec.substr(0, spec.find(':')));                \
    }                                                                       \
    k.members_stat = kAppliesFused;                                         \
    k.ops_stat = kApplyOps;                                                 \
    add(std::move(k));                                                      \
  }
    TFEXT_FOR_EACH_EMBEDDING_OPTIMIZER(TFEXT_ADD_APPLY_KIND)
#undef TFEXT_ADD_APPLY_KIND
  }
  return kinds;
}

// The value of attr `name` of node, or the op's default for it (graphs from a
// SavedModel have default-valued attrs stripped). nullptr if neither.
const AttrValue* AttrOrDefault(const NodeDef& node, const OpDef& def, const std::string& name) {
  auto it = node.attr().find(name);
  if (it != node.attr().end()) return &it->second;
  for (const auto& a : def.attr()) {
    if (a.name() == name && a.has_default_value()) return &a.default_value();
  }
  return nullptr;
}

// Appends a scalar attr value to a list attr value. False for a kind of value
// the multi ops do not take.
bool AppendToList(const AttrValue& v, AttrValue* list) {
  auto* l = list->mutable_list();
  switch (v.value_case()) {
    case AttrValue::kI:
      l->add_i(v.i());
      return true;
    case AttrValue::kF:
      l->add_f(v.f());
      return true;
    case AttrValue::kB:
      l->add_b(v.b());
      return true;
    case AttrValue::kS:
      l->add_s(v.s());
      return true;
    default:
      return false;
  }
}

// The graph, indexed: node index by name, data+control fanins by index.
struct Index {
  explicit Index(const GraphDef& g) : fanins(g.node_size()) {
    by_name.reserve(g.node_size());
    for (int i = 0; i < g.node_size(); ++i) by_name[g.node(i).name()] = i;
    for (int i = 0; i < g.node_size(); ++i) {
      for (const std::string& in : g.node(i).input()) {
        auto it = by_name.find(NodeNameOf(in));
        if (it != by_name.end()) fanins[i].push_back(it->second);
      }
    }
  }
  std::unordered_map<std::string, int> by_name;
  std::vector<std::vector<int>> fanins;
};

// For each of `cands`, which other candidates are its ancestors (bit j of
// anc[c]) and whether control flow or a cycle lies upstream of it (tainted).
// One pass in topological order (Kahn) with bitsets over the candidates.
struct Ancestry {
  std::vector<std::vector<uint64_t>> anc;  // per candidate, over candidates
  std::vector<bool> tainted;               // per candidate
};

Ancestry ComputeAncestry(const GraphDef& g, const Index& index, const std::vector<int>& cands) {
  const int n = g.node_size();
  const int c = static_cast<int>(cands.size());
  const int words = (c + 63) / 64;
  std::vector<int> cand_pos(n, -1);
  for (int j = 0; j < c; ++j) cand_pos[cands[j]] = j;
  std::vector<std::vector<int>> fanouts(n);
  std::vector<int> pending(n, 0);
  for (int i = 0; i < n; ++i) {
    for (int f : index.fanins[i]) {
      fanouts[f].push_back(i);
      ++pending[i];
    }
  }
  std::vector<uint64_t> bits(static_cast<size_t>(n) * words, 0);
  std::vector<bool> taint(n, false), done(n, false);
  std::vector<int> ready;
  for (int i = 0; i < n; ++i) {
    if (pending[i] == 0) ready.push_back(i);
  }
  while (!ready.empty()) {
    const int i = ready.back();
    ready.pop_back();
    done[i] = true;
    // What i passes on: its own ancestors, itself if a candidate, taint.
    uint64_t* mine = &bits[static_cast<size_t>(i) * words];
    const bool t = taint[i] || IsControlFlow(g.node(i).op());
    for (int o : fanouts[i]) {
      uint64_t* theirs = &bits[static_cast<size_t>(o) * words];
      for (int w = 0; w < words; ++w) theirs[w] |= mine[w];
      if (cand_pos[i] >= 0) theirs[cand_pos[i] / 64] |= uint64_t{1} << (cand_pos[i] % 64);
      if (t) taint[o] = true;
      if (--pending[o] == 0) ready.push_back(o);
    }
  }
  Ancestry out;
  out.anc.resize(c);
  out.tainted.resize(c);
  for (int j = 0; j < c; ++j) {
    const int i = cands[j];
    out.anc[j].assign(bits.begin() + static_cast<size_t>(i) * words, bits.begin() + static_cast<size_t>(i + 1) * words);
    // Not reached by Kahn: on or below a cycle (a while loop).
    out.tainted[j] = taint[i] || !done[i];
  }
  return out;
}

bool Bit(const std::vector<uint64_t>& b, int j) { return (b[j / 64] >> (j % 64)) & 1; }

// Which nodes the caller feeds: never fused (a feed replaces the fed node's
// output, and the fused op's consumers would not see it).
std::unordered_set<std::string> FedNodes(const tensorflow::grappler::GrapplerItem& item) {
  std::unordered_set<std::string> fed;
  for (const auto& f : item.feed) fed.insert(NodeNameOf(f.first));
  return fed;
}

// Which nodes the caller names (fetches, feeds, targets): they keep their names.
std::unordered_set<std::string> NodesToKeep(const tensorflow::grappler::GrapplerItem& item,
                                            const std::unordered_set<std::string>& fed) {
  std::unordered_set<std::string> keep = fed;
  for (const auto& f : item.fetch) keep.insert(NodeNameOf(f));
  for (const auto& k : item.keep_ops) keep.insert(NodeNameOf(k));
  for (const auto& k : item.init_ops) keep.insert(NodeNameOf(k));
  for (const std::string* s : {&item.save_op, &item.restore_op, &item.save_restore_loc_tensor}) {
    if (!s->empty()) keep.insert(NodeNameOf(*s));
  }
  return keep;
}

// FNV-1a, 64 bits.
uint64_t Fnv1a(const std::string& s, uint64_t h = 0xcbf29ce484222325ULL) {
  for (unsigned char c : s) {
    h ^= c;
    h *= 0x100000001b3ULL;
  }
  return h;
}

// The fused node's name: fixed by its content (op, inputs, attrs). A session
// shares the kernels of stateful ops between its executors by node name, and
// each fetch set gets its own optimized graph: two fused ops of one name
// must therefore be the same op (the same tables in the same order, with the
// same attrs), or one executor would run the other's kernel.
std::string ContentName(const Index& index, const std::string& base, const NodeDef& node) {
  uint64_t h = Fnv1a(node.op());
  for (const auto& in : node.input()) h = Fnv1a(in + "\n", h);
  std::vector<std::string> keys;
  for (const auto& kv : node.attr()) keys.push_back(kv.first);
  std::sort(keys.begin(), keys.end());
  for (const auto& k : keys) h = Fnv1a(k + "=" + node.attr().at(k).SerializeAsString() + "\n", h);
  char hex[17];
  std::snprintf(hex, sizeof(hex), "%016llx", static_cast<unsigned long long>(h));
  std::string name = base + "_" + hex;
  for (int k = 1; index.by_name.count(name); ++k) name = base + "_" + hex + "_" + std::to_string(k);
  return name;
}

class GraphPasses : public tensorflow::grappler::CustomGraphOptimizer {
 public:
  std::string name() const override { return "TfExtGraphPasses"; }
  bool UsesFunctionLibrary() const override { return false; }

  Status Init(const tensorflow::RewriterConfig_CustomGraphOptimizer* config) override {
    if (config == nullptr) return tensorflow::OkStatus();
    for (const auto& kv : config->parameter_map()) {
      if (kv.first == "fuse_lookups") {
        fuse_lookups_ = kv.second.b();
      } else if (kv.first == "fuse_applies") {
        fuse_applies_ = kv.second.b();
      } else {
        return tensorflow::errors::InvalidArgument("TfExtGraphPasses: unknown parameter '", kv.first,
                                                   "' (known: fuse_lookups, fuse_applies)");
      }
    }
    return tensorflow::OkStatus();
  }

  Status Optimize(tensorflow::grappler::Cluster* /*cluster*/, const tensorflow::grappler::GrapplerItem& item,
                  GraphDef* optimized_graph) override {
    *optimized_graph = item.graph;
    if (DisabledByEnvironment()) return tensorflow::OkStatus();
    g_stats[kGraphsSeen].fetch_add(1);
    const std::unordered_set<std::string> fed = FedNodes(item);
    const std::unordered_set<std::string> keep = NodesToKeep(item, fed);
    bool changed = false;
    for (const FusionKind& kind : MakeKinds(fuse_lookups_, fuse_applies_)) {
      TF_RETURN_IF_ERROR(FuseAll(kind, keep, fed, optimized_graph, &changed));
    }
    if (changed) g_stats[kGraphsRewritten].fetch_add(1);
    return tensorflow::OkStatus();
  }

 private:
  // Fuses sets of `kind.single` ops until no set of two or more is left.
  Status FuseAll(const FusionKind& kind, const std::unordered_set<std::string>& keep,
                 const std::unordered_set<std::string>& fed, GraphDef* g, bool* changed) {
    std::unordered_set<std::string> given_up = fed;  // candidates that found no partner, and fed nodes
    for (;;) {
      const Index index(*g);
      std::vector<int> cands;
      const int num_inputs = kind.single_def->input_arg_size();
      for (int i = 0; i < g->node_size(); ++i) {
        const NodeDef& n = g->node(i);
        if (n.op() != kind.single || given_up.count(n.name())) continue;
        int data_inputs = 0;
        for (const auto& in : n.input()) data_inputs += in.empty() || in[0] != '^';
        if (data_inputs != num_inputs) continue;
        cands.push_back(i);
      }
      if (cands.size() < 2) return tensorflow::OkStatus();
      const Ancestry anc = ComputeAncestry(*g, index, cands);
      // Group key: device + shared attrs (serialized).
      std::map<std::string, std::vector<int>> groups;  // key -> positions in cands
      for (int j = 0; j < static_cast<int>(cands.size()); ++j) {
        const NodeDef& n = g->node(cands[j]);
        if (anc.tainted[j]) {
          given_up.insert(n.name());
          continue;
        }
        std::string key = n.device();
        bool ok = true;
        for (const std::string& a : kind.shared_attrs) {
          const AttrValue* v = AttrOrDefault(n, *kind.single_def, a);
          if (v == nullptr) {
            ok = false;
            break;
          }
          key += "|" + a + "=" + v->SerializeAsString();
        }
        if (!ok) {
          given_up.insert(n.name());
          continue;
        }
        groups[key].push_back(j);
      }
      bool fused = false;
      for (auto& kv : groups) {
        std::vector<int> members;  // positions in cands
        std::unordered_set<std::string> tables;
        for (int j : kv.second) {
          const std::string table =
              kind.table_input < 0 ? g->node(cands[j]).name() : NodeNameOf(g->node(cands[j]).input(kind.table_input));
          if (tables.count(table)) continue;
          bool independent = true;
          for (int m : members) {
            if (Bit(anc.anc[j], m) || Bit(anc.anc[m], j)) {
              independent = false;
              break;
            }
          }
          if (!independent) continue;
          members.push_back(j);
          tables.insert(table);
        }
        if (members.size() < 2) {
          for (int j : kv.second) given_up.insert(g->node(cands[j]).name());
          continue;
        }
        std::vector<int> nodes;
        for (int j : members) nodes.push_back(cands[j]);
        TF_RETURN_IF_ERROR(Fuse(kind, keep, index, nodes, g));
        *changed = true;
        fused = true;
        break;  // the graph changed: re-index before the next set
      }
      if (!fused) return tensorflow::OkStatus();
    }
  }

  // Replaces the ops `nodes` (indices into g, independent, same device) by one
  // multi-table op.
  Status Fuse(const FusionKind& kind, const std::unordered_set<std::string>& keep, const Index& index,
              const std::vector<int>& nodes, GraphDef* g) {
    const int count = static_cast<int>(nodes.size());
    const OpDef& def = *kind.single_def;
    NodeDef fused;
    fused.set_op(kind.multi);
    fused.set_device(g->node(nodes[0]).device());
    for (int a = 0; a < def.input_arg_size(); ++a) {
      for (int m : nodes) fused.add_input(g->node(m).input(a));
    }
    std::unordered_set<std::string> controls;
    for (int m : nodes) {
      for (const auto& in : g->node(m).input()) {
        if (!in.empty() && in[0] == '^' && controls.insert(in).second) fused.add_input(in);
      }
    }
    auto& attrs = *fused.mutable_attr();
    attrs["N"].set_i(count);
    for (const auto& a : def.attr()) {
      const std::string& name = a.name();
      if (kind.shared_attrs.count(name)) {
        const AttrValue* v = AttrOrDefault(g->node(nodes[0]), def, name);
        if (v == nullptr) return tensorflow::errors::Internal("TfExtGraphPasses: ", kind.single, " without ", name);
        attrs[name] = *v;
        continue;
      }
      auto renamed = kind.list_attr_names.find(name);
      const std::string list_name = renamed == kind.list_attr_names.end() ? name : renamed->second;
      AttrValue list;
      list.mutable_list();  // an empty list is still a list
      for (int m : nodes) {
        const AttrValue* v = AttrOrDefault(g->node(m), def, name);
        if (v == nullptr || !AppendToList(*v, &list)) {
          return tensorflow::errors::Internal("TfExtGraphPasses: cannot fuse attr ", name, " of ", g->node(m).name());
        }
      }
      attrs[list_name] = list;
    }

    fused.set_name(ContentName(index, "tf_ext_graph_passes/" + kind.multi, fused));

    // Rewire every consumer: output p of member i -> fused:p*count+i, ^member -> ^fused.
    const int num_outputs = def.output_arg_size();
    std::unordered_map<std::string, int> member_pos;
    for (int i = 0; i < count; ++i) member_pos[g->node(nodes[i]).name()] = i;
    const std::string fused_control = "^" + fused.name();
    for (int i = 0; i < g->node_size(); ++i) {
      NodeDef* n = g->mutable_node(i);
      if (member_pos.count(n->name())) continue;
      bool touched = false;
      for (const auto& in : n->input()) {
        if (member_pos.count(NodeNameOf(in))) {
          touched = true;
          break;
        }
      }
      if (!touched) continue;
      std::vector<std::string> inputs(n->input().begin(), n->input().end());
      n->clear_input();
      std::unordered_set<std::string> seen_controls;
      for (const std::string& s : inputs) {
        const Input in = ParseInput(s);
        auto it = member_pos.find(in.node);
        std::string out = s;
        if (it != member_pos.end()) {
          if (in.control) {
            out = fused_control;
          } else if (in.port >= 0 && in.port < num_outputs) {
            out = fused.name() + ":" + std::to_string(in.port * count + it->second);
          } else {
            return tensorflow::errors::Internal("TfExtGraphPasses: ", n->name(), " reads output ", in.port, " of ",
                                                in.node, " (", kind.single, ")");
          }
        }
        if (!out.empty() && out[0] == '^' && !seen_controls.insert(out).second) continue;
        n->add_input(out);
      }
    }

    // Members the caller names stay as a forwarding node; the others go.
    std::vector<bool> remove(g->node_size(), false);
    for (int i = 0; i < count; ++i) {
      NodeDef* m = g->mutable_node(nodes[i]);
      if (!keep.count(m->name())) {
        remove[nodes[i]] = true;
        continue;
      }
      NodeDef fwd;
      fwd.set_name(m->name());
      fwd.set_device(m->device());
      if (num_outputs > 0) {
        fwd.set_op("IdentityN");
        auto* types = (*fwd.mutable_attr())["T"].mutable_list();
        for (int p = 0; p < num_outputs; ++p) {
          fwd.add_input(fused.name() + ":" + std::to_string(p * count + i));
          types->add_type(def.output_arg(p).type());
        }
      } else {
        fwd.set_op("NoOp");
        fwd.add_input(fused_control);
      }
      *m = std::move(fwd);
    }
    int write = 0;
    for (int i = 0; i < g->node_size(); ++i) {
      if (remove[i]) continue;
      if (write != i) g->mutable_node()->SwapElements(write, i);
      ++write;
    }
    while (g->node_size() > write) g->mutable_node()->RemoveLast();
    *g->add_node() = std::move(fused);
    g_stats[kind.members_stat].fetch_add(count);
    g_stats[kind.ops_stat].fetch_add(1);
    VLOG(1) << "TfExtGraphPasses: " << count << " " << kind.single << " -> " << kind.multi;
    return tensorflow::OkStatus();
  }

  bool fuse_lookups_ = true;
  bool fuse_applies_ = true;
};

REGISTER_GRAPH_OPTIMIZER_AS(GraphPasses, "TfExtGraphPasses");

// ---------------------------------------------------------------------------
// TfExtGraphPassStats() -> int64 [8]: the counters above, for tests and
// debugging (tf_ext.graph.pass_stats()).

class GraphPassStatsOp : public tensorflow::OpKernel {
 public:
  explicit GraphPassStatsOp(tensorflow::OpKernelConstruction* ctx) : OpKernel(ctx) {}
  void Compute(tensorflow::OpKernelContext* ctx) override {
    tensorflow::Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, tensorflow::TensorShape({kNumStats}), &out));
    for (int i = 0; i < kNumStats; ++i) out->flat<int64_t>()(i) = g_stats[i].load();
  }
};

REGISTER_OP("TfExtGraphPassStats")
    .Output("stats: int64")
    .SetIsStateful()
    .SetShapeFn([](tensorflow::shape_inference::InferenceContext* c) {
      c->set_output(0, c->Vector(kNumStats));
      return tensorflow::OkStatus();
    })
    .Doc(R"doc(
Process-wide counters of the graph passes: graphs optimized, graphs rewritten,
lookups fused, multi-table lookup ops created, sparse updates fused,
multi-table update ops created, pooled-lookup gradients fused, multi-table
gradient ops created.
)doc");

REGISTER_KERNEL_BUILDER(Name("TfExtGraphPassStats").Device(tensorflow::DEVICE_CPU), GraphPassStatsOp);

}  // namespace
}  // namespace graph
}  // namespace tfext
