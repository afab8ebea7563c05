#include "tools/cli/graph_json.h"

#include <cmath>
#include <set>
#include <string>
#include <utility>

namespace tracecut::cli {
namespace {

using util::Json;

constexpr ir::OpKind kOps[] = {
    ir::OpKind::kPlaceholder,  ir::OpKind::kGetAttr,
    ir::OpKind::kCallFunction, ir::OpKind::kCallMethod,
    ir::OpKind::kCallModule,   ir::OpKind::kOutput,
};

Json Tagged(const char* tag, Json value) {
  return Json::object({{tag, std::move(value)}});
}

Json Strings(const std::vector<std::string>& v) {
  Json out = Json::array();
  for (const std::string& s : v) out.push_back(Json(s));
  return out;
}

Json MetaMap(const std::map<std::string, ir::Argument>& extra) {
  Json out = Json::object();
  for (const auto& [k, v] : extra) out[k] = ArgumentToJson(v);
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
      Json elements = Json::array();
      for (const ir::Argument& e : arg.elements()) {
        elements.push_back(ArgumentToJson(e));
      }
      return arg.kind() == ir::Argument::Kind::kTuple
                 ? Tagged("tuple", std::move(elements))
                 : elements;
    }
  }
  return Json();
}

Json GraphToJson(const ir::Graph& graph) {
  Json nodes = Json::array();
  for (const ir::Node* n : graph.nodes()) {
    Json node = Json::object();
    node["name"] = Json(n->name());
    node["op"] = Json(std::string(ir::OpKindName(n->op())));
    node["target"] = Json(n->target());
    Json args = Json::array();
    for (const ir::Argument& a : n->args()) args.push_back(ArgumentToJson(a));
    node["args"] = std::move(args);
    Json kwargs = Json::object();
    for (const auto& [k, v] : n->kwargs()) kwargs[k] = ArgumentToJson(v);
    node["kwargs"] = std::move(kwargs);
    Json scope = Json::array();
    for (const ir::ScopeEntry& e : n->scope().stack()) {
      scope.push_back(
          Json::object({{"path", Json(e.path)}, {"type", Json(e.type)}}));
    }
    node["scope"] = std::move(scope);
    Json outputs = Json::array();
    for (const ir::TensorMeta& t : n->meta().outputs) {
      Json shape = Json::array();
      for (int64_t d : t.shape) shape.push_back(Json(d));
      outputs.push_back(Json::object({{"shape", std::move(shape)},
                                      {"dtype", Json(t.dtype)},
                                      {"device", Json(t.device)}}));
    }
    node["outputs"] = std::move(outputs);
    if (n->meta().source.has_value()) {
      const ir::SourceLocation& s = *n->meta().source;
      node["source"] = Json::object({{"file", Json(s.file)},
                                     {"line", Json(s.line)},
                                     {"text", Json(s.text)}});
    }
    if (!n->meta().extra.empty()) node["meta"] = MetaMap(n->meta().extra);
    nodes.push_back(std::move(node));
  }
  Json out = Json::object();
  out["nodes"] = std::move(nodes);
  out["assumptions"] = Strings(graph.meta().assumptions);
  out["meta"] = MetaMap(graph.meta().extra);
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
  Json op_counts = Json::object();
  for (ir::OpKind op : kOps) {
    op_counts[std::string(ir::OpKindName(op))] = Json(counts[op]);
  }
  Json out = Json::object();
  out["nodes"] = Json(static_cast<int64_t>(graph.size()));
  out["op_counts"] = std::move(op_counts);
  out["call_module_targets"] = Strings(targets);
  out["assumptions"] = Strings(graph.meta().assumptions);
  out["meta"] = MetaMap(graph.meta().extra);
  return out;
}

}  // namespace tracecut::cli
