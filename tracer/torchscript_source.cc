#include "tracer/torchscript_source.h"

#include <torch/csrc/jit/frontend/parser.h>
#include <torch/csrc/jit/frontend/resolver.h>
#include <torch/csrc/jit/frontend/sugared_value.h>

#include <cmath>
#include <cstdio>
#include <utility>
#include <vector>

namespace tracecut::tracer {

std::string FloatLiteral(double v) {
  if (std::isnan(v)) return "float(\"nan\")";
  if (std::isinf(v)) return v > 0 ? "float(\"inf\")" : "-float(\"inf\")";
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.17g", v);
  std::string s = buf;
  if (s.find_first_of(".eE") == std::string::npos) s += ".0";
  return s;
}

std::string DTypeLiteral(c10::ScalarType t) {
  return std::to_string(static_cast<int>(t));
}

void DefineMethods(torch::jit::CompilationUnit& cu,
                   const c10::ClassTypePtr& type,
                   std::shared_ptr<torch::jit::Source> source) {
  torch::jit::Parser parser(std::move(source));
  std::vector<torch::jit::Def> defs;
  std::vector<torch::jit::ResolverPtr> resolvers;
  while (parser.lexer().cur().kind != torch::jit::TK_EOF) {
    defs.emplace_back(parser.parseFunction(/*is_method=*/true));
    resolvers.push_back(torch::jit::nativeResolver());
  }
  const torch::jit::SimpleSelf self(type);
  cu.define(type->name(), {}, {}, defs, resolvers, &self);
}

}  // namespace tracecut::tracer
