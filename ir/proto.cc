#include "ir/proto.h"

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"
#include "ir/names.h"
#include "ir/verifier.h"
#include "util/status_macros.h"

namespace tracecut::ir {
namespace {

// Arguments nest at most this deep, as in the text form
// (kMaxTextNesting), so what one format holds the other can too.
constexpr int kMaxNesting = 256;
// Protobuf's parser counts message levels: two per argument level (the
// argument and its list) plus the graph, node, meta and entry around them.
constexpr int kRecursionLimit = 2 * kMaxNesting + 16;

OpKindProto ToProtoOp(OpKind op) {
  switch (op) {
    case OpKind::kPlaceholder:
      return PLACEHOLDER;
    case OpKind::kGetAttr:
      return GET_ATTR;
    case OpKind::kCallFunction:
      return CALL_FUNCTION;
    case OpKind::kCallMethod:
      return CALL_METHOD;
    case OpKind::kCallModule:
      return CALL_MODULE;
    case OpKind::kOutput:
      return OUTPUT;
  }
  return OP_KIND_UNSPECIFIED;
}

std::optional<OpKind> FromProtoOp(int op) {
  switch (op) {
    case PLACEHOLDER:
      return OpKind::kPlaceholder;
    case GET_ATTR:
      return OpKind::kGetAttr;
    case CALL_FUNCTION:
      return OpKind::kCallFunction;
    case CALL_METHOD:
      return OpKind::kCallMethod;
    case CALL_MODULE:
      return OpKind::kCallModule;
    case OUTPUT:
      return OpKind::kOutput;
    default:
      return std::nullopt;
  }
}

void ArgumentToProto(const Argument& arg, ArgumentProto* out) {
  switch (arg.kind()) {
    case Argument::Kind::kNone:
      out->mutable_none();
      return;
    case Argument::Kind::kBool:
      out->set_bool_value(arg.as_bool());
      return;
    case Argument::Kind::kInt:
      out->set_int_value(arg.as_int());
      return;
    case Argument::Kind::kDouble:
      out->set_double_value(arg.as_double());
      return;
    case Argument::Kind::kString:
      out->set_string_value(arg.as_string());
      return;
    case Argument::Kind::kDType:
      out->set_dtype(arg.as_string());
      return;
    case Argument::Kind::kDevice:
      out->set_device(arg.as_string());
      return;
    case Argument::Kind::kNode:
      // Null only in a corrupted graph; FromProto rejects the empty name.
      out->set_node(arg.node() == nullptr ? "" : arg.node()->name());
      return;
    case Argument::Kind::kList:
    case Argument::Kind::kTuple: {
      ArgumentListProto* list = arg.kind() == Argument::Kind::kList
                                    ? out->mutable_list()
                                    : out->mutable_tuple();
      for (const Argument& e : arg.elements()) {
        ArgumentToProto(e, list->add_elements());
      }
      return;
    }
  }
}

void MetaEntryToProto(const std::string& key, const Argument& value,
                      MetaEntryProto* out) {
  out->set_key(key);
  ArgumentToProto(value, out->mutable_value());
}

void NodeToProto(const Node& node, NodeProto* out) {
  out->set_name(node.name());
  out->set_op(ToProtoOp(node.op()));
  out->set_target(node.target());
  for (const Argument& a : node.args()) ArgumentToProto(a, out->add_args());
  for (const auto& [key, value] : node.kwargs()) {
    KwargProto* kw = out->add_kwargs();
    kw->set_name(key);
    ArgumentToProto(value, kw->mutable_value());
  }
  for (const ScopeEntry& e : node.scope().stack()) {
    ScopeEntryProto* s = out->add_scope();
    s->set_path(e.path);
    s->set_type(e.type);
  }
  const NodeMeta& meta = node.meta();
  NodeMetaProto* m = out->mutable_meta();
  for (const TensorMeta& t : meta.outputs) {
    TensorMetaProto* tp = m->add_outputs();
    for (int64_t d : t.shape) tp->add_shape(d);
    tp->set_dtype(t.dtype);
    tp->set_device(t.device);
  }
  if (meta.source.has_value()) {
    SourceLocationProto* s = m->mutable_source();
    s->set_file(meta.source->file);
    s->set_line(meta.source->line);
    s->set_text(meta.source->text);
  }
  for (const TransformMark& t : meta.transforms) {
    TransformMarkProto* tp = m->add_transforms();
    tp->set_pass(t.pass);
    for (const auto& [k, v] : t.data) {
      BytesPairProto* p = tp->add_data();
      p->set_key(k);
      p->set_value(v);
    }
  }
  for (const auto& [key, value] : meta.extra) {
    MetaEntryToProto(key, value, m->add_extra());
  }
  // An empty meta message is left out of the bytes.
  if (m->ByteSizeLong() == 0) out->clear_meta();
}

// Reads one GraphProto into a Graph, naming the node at fault in errors.
class Reader {
 public:
  explicit Reader(const GraphProto& proto) : proto_(proto) {}

  absl::StatusOr<std::unique_ptr<Graph>> Read(const FromProtoOptions& options) {
    for (int i = 0; i < proto_.nodes_size(); ++i) {
      const std::string& name = proto_.nodes(i).name();
      if (!IsIdentifier(name)) {
        return NodeError(i, absl::StrCat("name \"", absl::CEscape(name),
                                         "\" is not an identifier"));
      }
      auto [it, inserted] = index_.emplace(name, i);
      if (!inserted) {
        return NodeError(i, absl::StrCat("duplicate name; node #", it->second,
                                         " has it too"));
      }
    }
    auto graph = std::make_unique<Graph>();
    std::vector<const Node*> built;
    for (int i = 0; i < proto_.nodes_size(); ++i) {
      ASSIGN_OR_RETURN(Node * node, ReadNode(*graph, i));
      built.push_back(node);
    }
    for (const std::string& a : proto_.assumptions()) {
      graph->meta().assumptions.push_back(a);
    }
    for (const MetaEntryProto& e : proto_.extra()) {
      ASSIGN_OR_RETURN(Argument value,
                       ReadArgument(e.value(), -1, /*allow_refs=*/false, 1));
      if (!graph->meta().extra.emplace(e.key(), std::move(value)).second) {
        return absl::InvalidArgumentError(
            absl::StrCat("GraphProto: graph meta key \"",
                         absl::CEscape(e.key()), "\" given twice"));
      }
    }
    if (options.verify) {
      const Node* culprit = nullptr;
      if (absl::Status s = Verify(*graph, &culprit); !s.ok()) {
        for (size_t i = 0; i < built.size(); ++i) {
          if (built[i] == culprit) return NodeError(i, s.message());
        }
        return absl::InvalidArgumentError(
            absl::StrCat("GraphProto: ", s.message()));
      }
    }
    return graph;
  }

 private:
  absl::Status NodeError(int i, absl::string_view what) const {
    // A name that is no identifier may hold any byte: escape it.
    const std::string& name = proto_.nodes(i).name();
    return absl::InvalidArgumentError(absl::StrCat(
        "GraphProto node #", i, " %",
        IsIdentifier(name) ? name
                           : absl::StrCat("\"", absl::CEscape(name), "\""),
        ": ", what));
  }

  absl::Status ArgError(int node, absl::string_view what) const {
    if (node < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("GraphProto graph meta: ", what));
    }
    return NodeError(node, what);
  }

  // `node` is the index of the node being read (-1 for graph meta);
  // references must name a node before it.
  absl::StatusOr<Argument> ReadArgument(const ArgumentProto& a, int node,
                                        bool allow_refs, int depth) {
    if (depth > kMaxNesting) {
      return ArgError(node, absl::StrCat("arguments nest deeper than ",
                                         kMaxNesting, " levels"));
    }
    switch (a.value_case()) {
      case ArgumentProto::kNone:
        return Argument::None();
      case ArgumentProto::kBoolValue:
        return Argument::Bool(a.bool_value());
      case ArgumentProto::kIntValue:
        return Argument::Int(a.int_value());
      case ArgumentProto::kDoubleValue:
        return Argument::Double(a.double_value());
      case ArgumentProto::kStringValue:
        return Argument::String(a.string_value());
      case ArgumentProto::kDtype:
        return Argument::DType(a.dtype());
      case ArgumentProto::kDevice:
        return Argument::Device(a.device());
      case ArgumentProto::kNode: {
        if (!allow_refs) {
          return ArgError(node,
                          absl::StrCat("meta value references %", a.node(),
                                       "; meta values must be "
                                       "constants"));
        }
        auto it = defined_.find(a.node());
        if (it != defined_.end()) return Argument::Ref(it->second);
        auto later = index_.find(a.node());
        if (later == index_.end()) {
          return ArgError(
              node, absl::StrCat("references undefined node %", a.node()));
        }
        return ArgError(node, absl::StrCat("references %", a.node(), " (node #",
                                           later->second,
                                           "), which does not come before it"));
      }
      case ArgumentProto::kList:
      case ArgumentProto::kTuple: {
        const ArgumentListProto& list = a.has_list() ? a.list() : a.tuple();
        std::vector<Argument> elements;
        elements.reserve(list.elements_size());
        for (const ArgumentProto& e : list.elements()) {
          ASSIGN_OR_RETURN(Argument v,
                           ReadArgument(e, node, allow_refs, depth + 1));
          elements.push_back(std::move(v));
        }
        return a.has_list() ? Argument::List(std::move(elements))
                            : Argument::Tuple(std::move(elements));
      }
      case ArgumentProto::VALUE_NOT_SET:
        break;
    }
    return ArgError(node, "an argument has no value (None is `none`)");
  }

  absl::StatusOr<Node*> ReadNode(Graph& graph, int i) {
    const NodeProto& n = proto_.nodes(i);
    std::optional<OpKind> op = FromProtoOp(n.op());
    if (!op.has_value()) {
      return NodeError(i, absl::StrCat("invalid op kind ", n.op()));
    }
    std::vector<Argument> args;
    for (const ArgumentProto& a : n.args()) {
      ASSIGN_OR_RETURN(Argument v, ReadArgument(a, i, true, 1));
      args.push_back(std::move(v));
    }
    Kwargs kwargs;
    for (const KwargProto& kw : n.kwargs()) {
      ASSIGN_OR_RETURN(Argument v, ReadArgument(kw.value(), i, true, 1));
      kwargs.emplace_back(kw.name(), std::move(v));
    }
    absl::StatusOr<Node*> node = graph.AddNode(*op, n.target(), std::move(args),
                                               std::move(kwargs), n.name());
    if (!node.ok()) return NodeError(i, node.status().message());
    if ((*node)->name() != n.name()) {
      // Names are unique identifiers by now, so AddNode keeps them.
      return NodeError(i, "could not keep the node's name");
    }
    std::vector<ScopeEntry> stack;
    for (const ScopeEntryProto& e : n.scope()) {
      stack.push_back({e.path(), e.type()});
    }
    (*node)->set_scope(Scope(std::move(stack)));
    NodeMeta& meta = (*node)->meta();
    const NodeMetaProto& m = n.meta();
    for (const TensorMetaProto& t : m.outputs()) {
      meta.outputs.push_back(
          {{t.shape().begin(), t.shape().end()}, t.dtype(), t.device()});
    }
    if (m.has_source()) {
      meta.source = SourceLocation{m.source().file(), m.source().line(),
                                   m.source().text()};
    }
    for (const TransformMarkProto& t : m.transforms()) {
      TransformMark mark{t.pass(), {}};
      for (const BytesPairProto& p : t.data()) {
        if (!mark.data.emplace(p.key(), p.value()).second) {
          return NodeError(
              i, absl::StrCat("transform mark \"", absl::CEscape(t.pass()),
                              "\" has key \"", absl::CEscape(p.key()),
                              "\" twice"));
        }
      }
      meta.transforms.push_back(std::move(mark));
    }
    for (const MetaEntryProto& e : m.extra()) {
      ASSIGN_OR_RETURN(Argument v, ReadArgument(e.value(), i, false, 1));
      if (!meta.extra.emplace(e.key(), std::move(v)).second) {
        return NodeError(i, absl::StrCat("meta key \"", absl::CEscape(e.key()),
                                         "\" given twice"));
      }
    }
    defined_[n.name()] = *node;
    return *node;
  }

  const GraphProto& proto_;
  absl::flat_hash_map<std::string, int> index_;
  absl::flat_hash_map<std::string, Node*> defined_;
};

}  // namespace

void ToProto(const Graph& graph, GraphProto* proto) {
  proto->Clear();
  for (const Node* n : graph.nodes()) NodeToProto(*n, proto->add_nodes());
  for (const std::string& a : graph.meta().assumptions) {
    proto->add_assumptions(a);
  }
  for (const auto& [key, value] : graph.meta().extra) {
    MetaEntryToProto(key, value, proto->add_extra());
  }
}

absl::StatusOr<std::unique_ptr<Graph>> FromProto(
    const GraphProto& proto, const FromProtoOptions& options) {
  return Reader(proto).Read(options);
}

absl::StatusOr<std::string> SerializeGraph(const Graph& graph) {
  GraphProto proto;
  ToProto(graph, &proto);
  std::string bytes;
  {
    google::protobuf::io::StringOutputStream stream(&bytes);
    google::protobuf::io::CodedOutputStream out(&stream);
    out.SetSerializationDeterministic(true);
    if (!proto.SerializeToCodedStream(&out)) {
      return absl::InvalidArgumentError(
          "cannot serialize the graph (over 2 GiB?)");
    }
  }
  return bytes;
}

absl::StatusOr<std::unique_ptr<Graph>> DeserializeGraph(
    absl::string_view bytes, const FromProtoOptions& options) {
  if (bytes.size() > static_cast<size_t>(INT32_MAX)) {
    return absl::InvalidArgumentError("serialized graph over 2 GiB");
  }
  google::protobuf::io::CodedInputStream in(
      reinterpret_cast<const uint8_t*>(bytes.data()),
      static_cast<int>(bytes.size()));
  in.SetRecursionLimit(kRecursionLimit);
  GraphProto proto;
  if (!proto.ParseFromCodedStream(&in) || !in.ConsumedEntireMessage()) {
    return absl::InvalidArgumentError(
        "not a serialized GraphProto (malformed bytes, truncated, or nested "
        "too deep)");
  }
  return FromProto(proto, options);
}

}  // namespace tracecut::ir
