#include "tools/cli/graph_json.h"

#include <cmath>
#include <set>
#include <string>
#include <utility>

namespace tracecut::cli {
namespace {

using tracer::hf::Json;

constexpr ir::OpKind kOps[] = {
    ir::OpKind::kPlaceholder,  ir::OpKind::kGetAttr,
    ir::OpKind::kCallFunction, ir::OpKind::kCallMethod,
    ir::OpKind::kCallModule,   ir::OpKind::kOutput,
};

Json Tagged(const char* tag, Json value) {
  return Json::MakeObject({{tag, std::move(value)}});
}

Json Strings(const std::vector<std::string>& v) {
  Json out = Json::MakeArray();
  for (const std::string& s : v) out.Append(Json(s));
  return out;
}

Json MetaMap(const std::map<std::string, ir::Argument>& extra) {
  Json out = Json::MakeObject();
  for (const auto& [k, v] : extra) out.Set(k, ArgumentToJson(v));
  return out;
}

}  // namespace

Json ArgumentToJson(const ir::Argument& arg) {
  switch (arg.kind()) {
    case ir::Argument::Kind::kNone:
      return Json();
    case ir::Argument::Kind::kBool:
      return Json(arg.as_bool());
    case ir::Argument::Kind::kInt:
      return Json(arg.as_int());
    case ir::Argument::Kind::kDouble: {
      double d = arg.as_double();
      if (std::isnan(d)) return Tagged("double", Json("nan"));
      if (std::isinf(d)) return Tagged("double", Json(d > 0 ? "inf" : "-inf"));
      return Json(d);
    }
    case ir::Argument::Kind::kString:
      return Json(arg.as_string());
    case ir::Argument::Kind::kDType:
      return Tagged("dtype", Json(arg.as_string()));
    case ir::Argument::Kind::kDevice:
      return Tagged("device", Json(arg.as_string()));
    case ir::Argument::Kind::kNode:
      return Tagged("ref", Json(arg.node()->name()));
    case ir::Argument::Kind::kList:
    case ir::Argument::Kind::kTuple: {
      Json elements = Json::MakeArray();
      for (const ir::Argument& e : arg.elements()) {
        elements.Append(ArgumentToJson(e));
      }
      return arg.kind() == ir::Argument::Kind::kTuple
                 ? Tagged("tuple", std::move(elements))
                 : elements;
    }
  }
  return Json();
}

Json GraphToJson(const ir::Graph& graph) {
  Json nodes = Json::MakeArray();
  for (const ir::Node* n : graph.nodes()) {
    Json node = Json::MakeObject();
    node.Set("name", Json(n->name()));
    node.Set("op", Json(std::string(ir::OpKindName(n->op()))));
    node.Set("target", Json(n->target()));
    Json args = Json::MakeArray();
    for (const ir::Argument& a : n->args()) args.Append(ArgumentToJson(a));
    node.Set("args", std::move(args));
    Json kwargs = Json::MakeObject();
    for (const auto& [k, v] : n->kwargs()) kwargs.Set(k, ArgumentToJson(v));
    node.Set("kwargs", std::move(kwargs));
    Json scope = Json::MakeArray();
    for (const ir::ScopeEntry& e : n->scope().stack()) {
      scope.Append(
          Json::MakeObject({{"path", Json(e.path)}, {"type", Json(e.type)}}));
    }
    node.Set("scope", std::move(scope));
    Json outputs = Json::MakeArray();
    for (const ir::TensorMeta& t : n->meta().outputs) {
      Json shape = Json::MakeArray();
      for (int64_t d : t.shape) shape.Append(Json(d));
      outputs.Append(Json::MakeObject({{"shape", std::move(shape)},
                                       {"dtype", Json(t.dtype)},
                                       {"device", Json(t.device)}}));
    }
    node.Set("outputs", std::move(outputs));
    if (n->meta().source.has_value()) {
      const ir::SourceLocation& s = *n->meta().source;
      node.Set("source", Json::MakeObject({{"file", Json(s.file)},
                                           {"line", Json(s.line)},
                                           {"text", Json(s.text)}}));
    }
    if (!n->meta().extra.empty()) node.Set("meta", MetaMap(n->meta().extra));
    nodes.Append(std::move(node));
  }
  Json out = Json::MakeObject();
  out.Set("nodes", std::move(nodes));
  out.Set("assumptions", Strings(graph.meta().assumptions));
  out.Set("meta", MetaMap(graph.meta().extra));
  return out;
}

Json GraphSummaryJson(const ir::Graph& graph) {
  std::map<ir::OpKind, int64_t> counts;
  std::vector<std::string> targets;
  std::set<std::string> seen;
  for (const ir::Node* n : graph.nodes()) {
    ++counts[n->op()];
    if (n->op() == ir::OpKind::kCallModule && seen.insert(n->target()).second) {
      targets.push_back(n->target());
    }
  }
  Json op_counts = Json::MakeObject();
  for (ir::OpKind op : kOps) {
    op_counts.Set(std::string(ir::OpKindName(op)), Json(counts[op]));
  }
  Json out = Json::MakeObject();
  out.Set("nodes", Json(static_cast<int64_t>(graph.size())));
  out.Set("op_counts", std::move(op_counts));
  out.Set("call_module_targets", Strings(targets));
  out.Set("assumptions", Strings(graph.meta().assumptions));
  out.Set("meta", MetaMap(graph.meta().extra));
  return out;
}

}  // namespace tracecut::cli
