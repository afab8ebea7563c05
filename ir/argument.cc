// Argument: a node's operand (graph.h).
#include <cstring>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "ir/graph.h"

namespace tracecut::ir {

Argument Argument::Bool(bool v) {
  Argument a;
  a.kind_ = Kind::kBool;
  a.value_ = v;
  return a;
}
Argument Argument::Int(int64_t v) {
  Argument a;
  a.kind_ = Kind::kInt;
  a.value_ = v;
  return a;
}
Argument Argument::Double(double v) {
  Argument a;
  a.kind_ = Kind::kDouble;
  a.value_ = v;
  return a;
}
Argument Argument::String(std::string v) {
  Argument a;
  a.kind_ = Kind::kString;
  a.value_ = std::move(v);
  return a;
}
Argument Argument::DType(std::string name) {
  Argument a = String(std::move(name));
  a.kind_ = Kind::kDType;
  return a;
}
Argument Argument::Device(std::string name) {
  Argument a = String(std::move(name));
  a.kind_ = Kind::kDevice;
  return a;
}
Argument Argument::Ref(Node* node) {
  Argument a;
  a.kind_ = Kind::kNode;
  a.value_ = node;
  return a;
}
Argument Argument::List(std::vector<Argument> elements) {
  Argument a;
  a.kind_ = Kind::kList;
  a.value_ = std::move(elements);
  return a;
}
Argument Argument::Tuple(std::vector<Argument> elements) {
  Argument a = List(std::move(elements));
  a.kind_ = Kind::kTuple;
  return a;
}

void Argument::ForEachNode(const std::function<void(Node*)>& fn) const {
  if (kind_ == Kind::kNode) {
    fn(node());
  } else if (is_sequence()) {
    for (const Argument& e : elements()) e.ForEachNode(fn);
  }
}

Argument Argument::MapNodes(const std::function<Node*(Node*)>& fn) const {
  if (kind_ == Kind::kNode) return Ref(fn(node()));
  if (!is_sequence()) return *this;
  std::vector<Argument> mapped;
  mapped.reserve(elements().size());
  for (const Argument& e : elements()) mapped.push_back(e.MapNodes(fn));
  Argument out = List(std::move(mapped));
  out.kind_ = kind_;
  return out;
}

bool Argument::IsConstant() const {
  bool constant = true;
  ForEachNode([&](Node*) { constant = false; });
  return constant;
}

bool operator==(const Argument& a, const Argument& b) {
  if (a.kind_ != b.kind_) return false;
  if (a.kind_ == Argument::Kind::kDouble) {
    double x = a.as_double(), y = b.as_double();
    return std::memcmp(&x, &y, sizeof(double)) == 0;
  }
  return a.value_ == b.value_;
}

}  // namespace tracecut::ir
