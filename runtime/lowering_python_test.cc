// Saves lowered GraphModules and checks that Python torch (the
// project's Python, the PyTorch tracecut builds against) loads them and
// computes the same outputs (runtime/python_load_check.py).

#include <sys/wait.h>
#include <torch/script.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "gtest/gtest.h"
#include "ir/graph.h"
#include "runtime/graph_module.h"
#include "runtime/interpreter.h"
#include "runtime/lowering.h"
#include "runtime/op_schema.h"
#include "runtime/test_util.h"
#include "util/testing/runfiles.h"

namespace tracecut::runtime {
namespace {

using ir::Argument;
using ir::Node;
using testing::Det;
using testing::MakeMlp;

// The project's Python (@libtorch//:python, set by the BUILD rule).
std::string Python() {
  const char* python = std::getenv("TRACECUT_PYTHON");
  return python != nullptr ? python : "python3";
}

Argument R(Node* n) { return Argument::Ref(n); }

std::string TensorJson(const at::Tensor& t) {
  at::Tensor c = t.contiguous();
  std::vector<std::string> values;
  if (c.scalar_type() == at::kDouble) {
    const double* p = c.data_ptr<double>();
    for (int64_t i = 0; i < c.numel(); ++i) {
      values.push_back(absl::StrFormat("%.17g", p[i]));
    }
  } else {
    c = c.to(at::kFloat);
    const float* p = c.data_ptr<float>();
    for (int64_t i = 0; i < c.numel(); ++i) {
      values.push_back(absl::StrFormat("%.9g", p[i]));
    }
  }
  return absl::StrCat(R"({"shape": [)", absl::StrJoin(t.sizes(), ", "),
                      R"(], "dtype": ")", DTypeName(t.scalar_type()),
                      R"(", "values": [)", absl::StrJoin(values, ", "), "]}");
}

void Flatten(const c10::IValue& v, std::vector<at::Tensor>& out) {
  if (v.isTuple()) {
    for (const c10::IValue& e : v.toTupleRef().elements()) Flatten(e, out);
  } else {
    out.push_back(v.toTensor());
  }
}

// Runs the Python check; returns its exit status, output in `log`.
int RunPython(const std::string& model, const std::string& spec,
              std::string* log) {
  std::string script = util::testing::Runfile("runtime/python_load_check.py");
  std::string cmd =
      absl::StrCat(Python(), " ", script, " ", model, " ", spec, " 2>&1");
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return -1;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) log->append(buf, n);
  int status = pclose(p);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

void SaveAndCheckInPython(GraphModule& gm,
                          const std::vector<at::Tensor>& inputs,
                          const std::string& name) {
  absl::StatusOr<Interpreter> interp = Interpreter::Create(gm);
  ASSERT_TRUE(interp.ok()) << interp.status();
  std::vector<c10::IValue> in(inputs.begin(), inputs.end());
  absl::StatusOr<c10::IValue> out = interp->Run(in);
  ASSERT_TRUE(out.ok()) << out.status();
  std::vector<at::Tensor> expected;
  Flatten(*out, expected);

  std::string dir = std::getenv("TEST_TMPDIR");
  std::string model = absl::StrCat(dir, "/", name, ".pt");
  std::string spec = absl::StrCat(dir, "/", name, ".json");
  absl::Status saved = SaveTorchScript(gm, model);
  ASSERT_TRUE(saved.ok()) << saved;

  std::vector<std::string> in_json, out_json, extra_json;
  for (const at::Tensor& t : inputs) in_json.push_back(TensorJson(t));
  for (const at::Tensor& t : expected) out_json.push_back(TensorJson(t));
  for (const auto& [file, content] : gm.extra_files()) {
    // Contents here are plain ASCII without quotes or backslashes.
    extra_json.push_back(absl::StrCat("\"", file, "\": \"", content, "\""));
  }
  std::ofstream(spec) << R"({"inputs": [)" << absl::StrJoin(in_json, ", ")
                      << R"(], "expected": [)" << absl::StrJoin(out_json, ", ")
                      << R"(], "extra_files": {)"
                      << absl::StrJoin(extra_json, ", ") << "}}\n";
  std::string log;
  int rc = RunPython(model, spec, &log);
  EXPECT_EQ(rc, 0) << log;
}

TEST(LoweringPythonTest, PythonTorchIsAvailable) {
  std::string cmd = absl::StrCat(Python(), " -c 'import torch' 2>&1");
  ASSERT_EQ(std::system(cmd.c_str()), 0)
      << Python() << " cannot import torch: run tools/bootstrap.sh";
}

TEST(LoweringPythonTest, MlpWithLeafModules) {
  auto g = std::make_unique<ir::Graph>();
  Node* x = *g->Placeholder("x");
  Node* fc1 = *g->CallModule("fc1", {R(x)});
  Node* relu = *g->CallFunction("aten::relu", {R(fc1)});
  Node* fc2 = *g->CallModule("fc2", {R(relu)});
  Node* scale = *g->GetAttr("scale");
  Node* mul = *g->CallFunction("aten::mul.Tensor", {R(fc2), R(scale)});
  Node* add = *g->CallFunction("aten::add.Tensor", {R(mul), R(x)});
  Node* fc3 = *g->CallModule("fc3", {R(add)});
  (void)*g->Output(R(fc3));
  GraphModule gm(MakeMlp(), std::move(g));
  gm.mutable_extra_files()["config.json"] = "{}";
  SaveAndCheckInPython(gm, {Det({3, 4}, 1)}, "mlp");
}

TEST(LoweringPythonTest, ListsTuplesAndMultipleOutputs) {
  auto g = std::make_unique<ir::Graph>();
  Node* x = *g->Placeholder("x");
  Node* w = *g->GetAttr("fc1.weight");
  Node* b = *g->GetAttr("fc1.bias");
  Node* lin = *g->CallFunction("aten::linear", {R(x), R(w), R(b)});
  Node* parts = *g->CallFunction("aten::chunk",
                                 {R(lin), Argument::Int(2), Argument::Int(1)});
  Node* p0 = *g->CallFunction("getitem", {R(parts), Argument::Int(0)});
  Node* p1 = *g->CallFunction("getitem", {R(parts), Argument::Int(1)});
  Node* cat = *g->CallFunction("aten::cat", {Argument::List({R(p1), R(p0)})},
                               {{"dim", Argument::Int(1)}});
  Node* rows = *g->CallFunction("aten::size.int", {R(x), Argument::Int(0)});
  Node* view = *g->CallFunction(
      "aten::view", {R(cat), Argument::List({R(rows), Argument::Int(-1)})});
  Node* sum = *g->CallFunction(
      "aten::sum.dim_IntList",
      {R(view), Argument::List({Argument::Int(1)}), Argument::Bool(true)},
      {{"dtype", Argument::DType("float64")}});
  Node* max = *g->CallFunction("aten::max.dim", {R(view), Argument::Int(0)});
  Node* fc3 = *g->CallModule("fc3", {R(view)});
  (void)*g->Output(Argument::Tuple({R(fc3), R(sum), R(max)}));
  GraphModule gm(MakeMlp(), std::move(g));
  gm.mutable_extra_files()["config.json"] = "{model_type: busy}";
  SaveAndCheckInPython(gm, {Det({3, 4}, 2)}, "busy");
}

}  // namespace
}  // namespace tracecut::runtime
