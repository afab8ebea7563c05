// Pipelines and built-in modifiers on the fixture models: the three
// pipelines agree, GPTQ beats round-to-nearest, the sequential pipeline
// stays within its cache budget, bad models fail cleanly.

#include "pipelines/pipeline.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <iostream>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/algorithm/container.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "modifiers/gptq_modifier.h"
#include "modifiers/modifier.h"
#include "modifiers/observer_modifier.h"
#include "modifiers/weight_quant_modifier.h"
#include "partition/partitioner.h"
#include "pipelines/calibrate.h"
#include "pipelines/calibration_data.h"
#include "pipelines/pipeline_internal.h"
#include "quantization/quant_args.h"
#include "util/testing/runfiles.h"
#include "util/testing/status_matchers.h"

namespace tracecut::pipelines {

using ::tracecut::modifiers::CalibrationResults;
using ::tracecut::modifiers::GptqModifier;
using ::tracecut::modifiers::GptqModifierOptions;
using ::tracecut::modifiers::ModuleRecord;
using ::tracecut::modifiers::ModuleSelector;
using ::tracecut::modifiers::ObservedTensor;
using ::tracecut::modifiers::Observer;
using ::tracecut::modifiers::ObserverKind;
using ::tracecut::modifiers::ObserverOptions;
using ::tracecut::modifiers::RtnModifier;
using ::tracecut::modifiers::WeightQuantOptions;
using ::tracecut::quantization::QuantScheme;
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::tracecut::util::testing::Runfile;
using ::tracecut::util::testing::StatusIs;

// A traced fixture, loaded once per test binary.
const LoadedForCalibration& Fixture(const std::string& stem) {
  static auto* cache = new std::map<std::string, LoadedForCalibration>();
  auto it = cache->find(stem);
  if (it == cache->end()) {
    absl::StatusOr<LoadedForCalibration> loaded = LoadForCalibration(
        Runfile(absl::StrCat("tests/fixtures/", stem, ".pt")));
    EXPECT_OK(loaded);
    it = cache->emplace(stem, std::move(*loaded)).first;
  }
  return it->second;
}

runtime::GraphModule CloneOf(const LoadedForCalibration& f) {
  absl::StatusOr<runtime::GraphModule> gm = f.model.Clone();
  EXPECT_OK(gm);
  return std::move(*gm);
}

CalibrationData Data(const LoadedForCalibration& f, int64_t samples,
                     uint64_t seed, int64_t batch_size) {
  absl::StatusOr<at::Tensor> tokens =
      SyntheticTokens(samples, 16, *f.vocab_size, seed);
  EXPECT_OK(tokens);
  absl::StatusOr<CalibrationData> data = MakeCalibrationData(
      *tokens, ModelInputNames(f.model), batch_size, "synthetic");
  EXPECT_OK(data);
  return std::move(*data);
}

QuantScheme W4G128() {
  QuantScheme s;
  s.bits = 4;
  s.group_size = 128;
  return s;
}

ModuleSelector LinearsButLmHead() {
  ModuleSelector s;
  s.targets = {"Linear"};
  s.ignore = {"lm_head"};
  return s;
}

PipelineOptions Options(PipelineKind kind, const LoadedForCalibration& f) {
  PipelineOptions o;
  o.kind = kind;
  o.partition.targets = f.default_targets;
  return o;
}

bool SameTensor(const at::Tensor& a, const at::Tensor& b) {
  if (a.defined() != b.defined()) return false;
  if (!a.defined()) return true;
  return a.sizes() == b.sizes() && a.scalar_type() == b.scalar_type() &&
         at::equal(a, b);
}

// Every parameter and buffer of `a` equals (bitwise) the one of `b`.
void ExpectSameTensors(const runtime::GraphModule& a,
                       const runtime::GraphModule& b) {
  std::map<std::string, at::Tensor> tb;
  for (const auto& p : b.module().named_parameters()) tb[p.name] = p.value;
  int compared = 0;
  for (const auto& p : a.module().named_parameters()) {
    ASSERT_TRUE(tb.count(p.name)) << p.name;
    EXPECT_TRUE(SameTensor(p.value, tb[p.name])) << p.name;
    ++compared;
  }
  EXPECT_GT(compared, 0);
}

TEST(PipelineTest, FixtureHasDefaultTargets) {
  const LoadedForCalibration& llama = Fixture("llama");
  EXPECT_EQ(llama.model_type, "llama");
  EXPECT_EQ(llama.default_targets,
            std::vector<std::string>({"LlamaDecoderLayer"}));
  EXPECT_EQ(llama.vocab_size, 256);
}

// The done-when check: with the same observers (and RTN, compressed per
// subgraph), the three pipelines give bitwise identical scales and weights
// when errors are not propagated.
TEST(PipelineTest, ThreePipelinesGiveIdenticalScalesWithoutPropagation) {
  const LoadedForCalibration& llama = Fixture("llama");
  CalibrationData data = Data(llama, 8, /*seed=*/3, /*batch_size=*/2);
  std::map<PipelineKind, CalibrationResults> results;
  std::map<PipelineKind, std::unique_ptr<runtime::GraphModule>> models;
  for (PipelineKind kind :
       {PipelineKind::kBasic, PipelineKind::kLayerSequential,
        PipelineKind::kSequential}) {
    SCOPED_TRACE(PipelineKindName(kind));
    auto gm = std::make_unique<runtime::GraphModule>(CloneOf(llama));
    ObserverOptions in;
    in.modules = LinearsButLmHead();
    Observer input_observer(in);
    ObserverOptions out;
    out.modules.targets = {"Linear"};
    out.kind = ObserverKind::kMovingAverageMinMax;
    out.observe = ObservedTensor::kOutput;
    out.averaging_constant = 0.1;
    Observer output_observer(out);
    WeightQuantOptions w;
    w.modules = LinearsButLmHead();
    w.scheme = W4G128();
    RtnModifier rtn(w);
    PipelineOptions options = Options(kind, llama);
    options.propagate_error = false;
    absl::StatusOr<PipelineResult> r =
        RunPipeline(*gm, data, {&input_observer, &output_observer, &rtn},
                    results[kind], options);
    ASSERT_OK(r);
    EXPECT_EQ(r->num_subgraphs, kind == PipelineKind::kBasic ? 1 : 3);
    models[kind] = std::move(gm);
  }
  const CalibrationResults& basic = results[PipelineKind::kBasic];
  // 2 layers x 7 Linears, plus lm_head (output observer only).
  ASSERT_EQ(basic.modules.size(), 15u);
  for (PipelineKind kind :
       {PipelineKind::kLayerSequential, PipelineKind::kSequential}) {
    SCOPED_TRACE(PipelineKindName(kind));
    const CalibrationResults& other = results[kind];
    ASSERT_EQ(other.modules.size(), basic.modules.size());
    for (const auto& [path, a] : basic.modules) {
      SCOPED_TRACE(path);
      const ModuleRecord* b = other.FindModule(path);
      ASSERT_NE(b, nullptr);
      EXPECT_EQ(a.input.observer, b->input.observer);
      EXPECT_EQ(a.input.batches, b->input.batches);
      EXPECT_EQ(a.input.min, b->input.min);
      EXPECT_EQ(a.input.max, b->input.max);
      EXPECT_TRUE(SameTensor(a.input.scale, b->input.scale));
      EXPECT_TRUE(SameTensor(a.input.zero_point, b->input.zero_point));
      EXPECT_EQ(a.output.min, b->output.min);
      EXPECT_EQ(a.output.max, b->output.max);
      EXPECT_TRUE(SameTensor(a.output.scale, b->output.scale));
      EXPECT_TRUE(SameTensor(a.weight_scale, b->weight_scale));
      EXPECT_TRUE(SameTensor(a.weight_zero_point, b->weight_zero_point));
      EXPECT_TRUE(a.weight_error == b->weight_error ||
                  (std::isnan(a.weight_error) && std::isnan(b->weight_error)));
    }
    ExpectSameTensors(*models[PipelineKind::kBasic], *models[kind]);
  }
  const ModuleRecord* q = basic.FindModule("model.layers.0.self_attn.q_proj");
  ASSERT_NE(q, nullptr);
  EXPECT_EQ(q->input.batches, 4);
  EXPECT_EQ(q->weight_method, "rtn");
  EXPECT_GT(q->input.scale.item<float>(), 0);
  EXPECT_EQ(basic.FindModule("lm_head")->weight_method, "");
}

// Note [Shared Hessians] in weight_quant_modifier.h: q/k/v (and gate/up) share
// one accumulated Hessian (and, for compressed-tensors schemes, one GPTQ
// solve of their stacked weights); each gets the GPTQ result it gets alone,
// bit for bit here.
class SharedHessianTest : public ::testing::TestWithParam<bool> {};

TEST_P(SharedHessianTest, EachLinearGetsItsOwnResult) {
  const bool typed = GetParam();
  const LoadedForCalibration& llama = Fixture("llama");
  CalibrationData data = Data(llama, 6, /*seed=*/5, /*batch_size=*/2);
  int64_t shared_reads = 0;
  int64_t solved_together = 0;
  auto run = [&](std::vector<std::string> targets,
                 CalibrationResults& results) {
    auto gm = std::make_unique<runtime::GraphModule>(CloneOf(llama));
    GptqModifierOptions o;
    if (typed) {
      absl::StatusOr<quantization::QuantizationScheme> w4a16 =
          quantization::PresetScheme("W4A16", targets);
      EXPECT_OK(w4a16);
      o.weights.typed = *w4a16;
      o.weights.typed->weights->actorder = quantization::ActOrder::kStatic;
    } else {
      o.weights.scheme = W4G128();
    }
    o.weights.modules.targets = std::move(targets);
    GptqModifier gptq(o);
    PipelineOptions options = Options(PipelineKind::kSequential, llama);
    options.propagate_error = false;  // Each Linear's inputs: the original.
    EXPECT_OK(RunPipeline(*gm, data, {&gptq}, results, options));
    shared_reads = gptq.shared_hessian_reads();
    solved_together = gptq.solved_together();
    return gm;
  };
  CalibrationResults all;
  std::unique_ptr<runtime::GraphModule> shared = run({"re:.*_proj$"}, all);
  // 2 layers x 3 batches x (k, v after q; up after gate).
  EXPECT_EQ(shared_reads, 2 * 3 * 3);
  // Compressed-tensors schemes solve each group as one weight: 2 layers x
  // (q, k, v; gate, up).
  EXPECT_EQ(solved_together, typed ? 2 * 5 : 0);
  // The first Linear of each group makes the Hessian, the later ones join
  // it: check one of each, each alone.
  for (const char* name : {"q_proj", "v_proj", "gate_proj", "up_proj"}) {
    SCOPED_TRACE(name);
    CalibrationResults alone;
    std::unique_ptr<runtime::GraphModule> gm =
        run({absl::StrCat("re:.*\\.", name, "$")}, alone);
    EXPECT_EQ(shared_reads, 0);
    int compared = 0;
    for (const auto& [path, a] : alone.modules) {
      SCOPED_TRACE(path);
      const ModuleRecord* b = all.FindModule(path);
      ASSERT_NE(b, nullptr);
      EXPECT_EQ(b->weight_method, "gptq");
      EXPECT_TRUE(SameTensor(a.weight_scale, b->weight_scale));
      EXPECT_EQ(a.weight_error, b->weight_error);
      EXPECT_EQ(a.gptq_loss, b->gptq_loss);
      ASSERT_OK_AND_ASSIGN(at::Tensor wa,
                           gm->GetTensor(absl::StrCat(path, ".weight")));
      ASSERT_OK_AND_ASSIGN(at::Tensor wb,
                           shared->GetTensor(absl::StrCat(path, ".weight")));
      EXPECT_TRUE(SameTensor(wa, wb));
      ++compared;
    }
    EXPECT_EQ(compared, 2);  // One per layer.
  }
}

INSTANTIATE_TEST_SUITE_P(LegacyAndTyped, SharedHessianTest, ::testing::Bool());

// The values the cache must hold between subgraphs i-1 and i (all batches),
// plus subgraph i's kept outputs: the most a sequential run may hold.
int64_t CacheBound(const partition::Partition& p, int64_t batches) {
  int64_t bound = 0;
  absl::flat_hash_set<std::string> live;
  const int n = static_cast<int>(p.subgraphs.size());
  absl::flat_hash_map<std::string, int> last_reader;
  for (int i = 0; i < n; ++i) {
    for (const std::string& name : p.subgraphs[i].input_names) {
      last_reader[name] = i;
    }
  }
  for (const std::string& name : p.model_inputs) {
    if (last_reader.contains(name)) live.insert(name);
  }
  for (int i = 0; i < n; ++i) {
    int64_t kept = 0;
    for (const std::string& name : p.subgraphs[i].output_names) {
      auto it = last_reader.find(name);
      if (it != last_reader.end() && it->second > i) ++kept;
    }
    bound = std::max<int64_t>(bound, static_cast<int64_t>(live.size()) + kept);
    for (const std::string& name : p.subgraphs[i].output_names) {
      auto it = last_reader.find(name);
      if (it != last_reader.end() && it->second > i) live.insert(name);
    }
    for (auto it = live.begin(); it != live.end();) {
      if (last_reader[*it] <= i) {
        live.erase(it++);
      } else {
        ++it;
      }
    }
  }
  return bound * batches;
}

// Note [Propagated changes]: round-to-nearest changes weights but is not
// propagated (as in llm-compressor), so the input observers of layer 1 see
// what they see without propagate_error, bit for bit, and no propagation
// pass runs.
TEST(PipelineTest, RoundToNearestIsNotPropagated) {
  const LoadedForCalibration& llama = Fixture("llama");
  CalibrationData data = Data(llama, 8, /*seed=*/3, /*batch_size=*/2);
  std::map<bool, CalibrationResults> results;
  for (bool propagate : {false, true}) {
    SCOPED_TRACE(propagate);
    runtime::GraphModule gm = CloneOf(llama);
    ObserverOptions in;
    in.modules = LinearsButLmHead();
    Observer input_observer(in);
    WeightQuantOptions w;
    w.modules = LinearsButLmHead();
    w.scheme = W4G128();
    RtnModifier rtn(w);
    PipelineOptions options = Options(PipelineKind::kSequential, llama);
    options.propagate_error = propagate;
    absl::StatusOr<PipelineResult> r = RunPipeline(
        gm, data, {&input_observer, &rtn}, results[propagate], options);
    ASSERT_OK(r);
    for (const SubgraphCacheStats& s : r->subgraphs) {
      EXPECT_FALSE(s.propagated) << s.label;
    }
  }
  const ModuleRecord* a =
      results[false].FindModule("model.layers.1.self_attn.q_proj");
  const ModuleRecord* b =
      results[true].FindModule("model.layers.1.self_attn.q_proj");
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(a->input.min, b->input.min);
  EXPECT_EQ(a->input.max, b->input.max);
  EXPECT_TRUE(SameTensor(a->weight_scale, b->weight_scale));
}

TEST(PipelineTest, GptqWithPropagationFinishesAndRespectsCacheBudget) {
  const LoadedForCalibration& llama = Fixture("llama");
  CalibrationData data = Data(llama, 16, /*seed=*/5, /*batch_size=*/2);
  const int64_t batches = static_cast<int64_t>(data.batches.size());
  GptqModifierOptions g;
  g.weights.modules = LinearsButLmHead();
  g.weights.scheme = W4G128();

  // Unbounded: the cache never holds more than the live values plus one
  // subgraph's outputs.
  runtime::GraphModule unbounded = CloneOf(llama);
  CalibrationResults unbounded_results;
  PipelineResult unbounded_run;
  {
    GptqModifier gptq(g);
    absl::StatusOr<PipelineResult> r =
        RunPipeline(unbounded, data, {&gptq}, unbounded_results,
                    Options(PipelineKind::kSequential, llama));
    ASSERT_OK(r);
    unbounded_run = *r;
  }
  absl::StatusOr<partition::Partition> partition = partition::PartitionGraph(
      llama.model.graph(), Options(PipelineKind::kSequential, llama).partition);
  ASSERT_OK(partition);
  EXPECT_LE(unbounded_run.peak_cache_values, CacheBound(*partition, batches));
  EXPECT_EQ(unbounded_run.cache.values, 0);  // Everything released.
  ASSERT_GE(unbounded_run.subgraphs.size(), 3);
  for (size_t i = 0; i < unbounded_run.subgraphs.size(); ++i) {
    const SubgraphCacheStats& s = unbounded_run.subgraphs[i];
    // Layers change weights and are propagated; the head has no Linear, and
    // the last subgraph's outputs (the logits) feed no later one.
    const bool last = i + 1 == unbounded_run.subgraphs.size();
    EXPECT_EQ(s.propagated, s.label != "(head)" && !last) << s.label;
  }

  // A budget of a third of the unbounded peak: values spill to disk, the
  // budget holds, and the result is bit for bit the same.
  const int64_t budget = unbounded_run.cache.peak_bytes_held / 3;
  runtime::GraphModule bounded = CloneOf(llama);
  CalibrationResults bounded_results;
  {
    GptqModifier gptq(g);
    PipelineOptions options = Options(PipelineKind::kSequential, llama);
    options.cache.memory_budget_bytes = budget;
    absl::StatusOr<PipelineResult> r =
        RunPipeline(bounded, data, {&gptq}, bounded_results, options);
    ASSERT_OK(r);
    EXPECT_LE(r->cache.peak_bytes_held, budget);
    EXPECT_GT(r->cache.spill_count, 0);
    EXPECT_GT(r->cache.reload_count, 0);
  }
  ExpectSameTensors(unbounded, bounded);

  // The basic pipeline finishes too (one compression at the end).
  runtime::GraphModule basic = CloneOf(llama);
  CalibrationResults basic_results;
  {
    GptqModifier gptq(g);
    absl::StatusOr<PipelineResult> r =
        RunPipeline(basic, data, {&gptq}, basic_results,
                    Options(PipelineKind::kBasic, llama));
    ASSERT_OK(r);
  }
  EXPECT_EQ(basic_results.modules.size(), 14u);
  for (const auto& [path, rec] : basic_results.modules) {
    EXPECT_EQ(rec.weight_method, "gptq") << path;
    EXPECT_EQ(rec.calibration_tokens, 16 * 16) << path;
  }
}

// Final-logit error of `calibrated` against the original fixture on
// held-out data.
double LogitError(const LoadedForCalibration& f,
                  const runtime::GraphModule& calibrated) {
  CalibrationData eval = Data(f, 32, /*seed=*/1234, /*batch_size=*/8);
  absl::StatusOr<OutputError> e =
      CompareOutputs(f.model.module(), calibrated.module(), eval);
  EXPECT_OK(e);
  return e->relative;
}

class GptqVsRtnTest : public testing::TestWithParam<std::string> {};

TEST_P(GptqVsRtnTest, GptqHasLowerLogitAndPerLayerError) {
  const LoadedForCalibration& f = Fixture(GetParam());
  CalibrationData data = Data(f, 128, /*seed=*/0, /*batch_size=*/8);

  runtime::GraphModule gptq_model = CloneOf(f);
  CalibrationResults gptq_results;
  {
    GptqModifierOptions g;
    g.weights.modules = LinearsButLmHead();
    g.weights.scheme = W4G128();
    GptqModifier gptq(g);
    absl::StatusOr<PipelineResult> r =
        RunPipeline(gptq_model, data, {&gptq}, gptq_results,
                    Options(PipelineKind::kSequential, f));
    ASSERT_OK(r);
  }
  runtime::GraphModule rtn_model = CloneOf(f);
  CalibrationResults rtn_results;
  {
    WeightQuantOptions w;
    w.modules = LinearsButLmHead();
    w.scheme = W4G128();
    RtnModifier rtn(w);
    absl::StatusOr<PipelineResult> r =
        RunPipeline(rtn_model, data, {&rtn}, rtn_results,
                    Options(PipelineKind::kSequential, f));
    ASSERT_OK(r);
  }

  const double gptq_error = LogitError(f, gptq_model);
  const double rtn_error = LogitError(f, rtn_model);
  std::cout << GetParam() << ": final-logit relative error on held-out data: "
            << "GPTQ " << gptq_error << ", RTN " << rtn_error << "\n";
  RecordProperty("gptq_logit_error", absl::StrCat(gptq_error));
  RecordProperty("rtn_logit_error", absl::StrCat(rtn_error));
  EXPECT_GT(rtn_error, 0);
  EXPECT_LT(gptq_error, rtn_error);

  ASSERT_FALSE(gptq_results.modules.empty());
  EXPECT_EQ(gptq_results.modules.size(), rtn_results.modules.size());
  for (const auto& [path, rec] : gptq_results.modules) {
    SCOPED_TRACE(path);
    EXPECT_EQ(rec.weight_method, "gptq");
    EXPECT_TRUE(rec.notes.empty());
    // Same inputs: GPTQ against what RTN would do with them.
    EXPECT_LT(rec.weight_error, rec.rtn_error);
    // Separate runs (each layer's inputs carry its own run's error).
    const ModuleRecord* rtn = rtn_results.FindModule(path);
    ASSERT_NE(rtn, nullptr);
    EXPECT_LT(rec.weight_error, rtn->weight_error);
    std::cout << "  " << path << ": GPTQ " << rec.weight_error << ", RTN "
              << rtn->weight_error << "\n";
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, GptqVsRtnTest,
                         testing::Values("llama", "opt"));

TEST(PipelineTest, NaNActivationsNameTheSubgraph) {
  const LoadedForCalibration& llama = Fixture("llama");
  CalibrationData data = Data(llama, 4, 0, 2);
  for (PipelineKind kind : {PipelineKind::kBasic, PipelineKind::kSequential}) {
    SCOPED_TRACE(PipelineKindName(kind));
    runtime::GraphModule gm = CloneOf(llama);
    absl::StatusOr<at::Tensor> w =
        gm.GetTensor("model.layers.1.mlp.down_proj.weight");
    ASSERT_OK(w);
    {
      c10::NoGradGuard no_grad;
      (*w)[3][5] = std::numeric_limits<float>::quiet_NaN();
    }
    WeightQuantOptions o;
    o.modules = LinearsButLmHead();
    RtnModifier rtn(o);
    CalibrationResults results;
    absl::StatusOr<PipelineResult> r =
        RunPipeline(gm, data, {&rtn}, results, Options(kind, llama));
    ASSERT_THAT(r, StatusIs(absl::StatusCode::kInvalidArgument));
    EXPECT_TRUE(absl::StrContains(r.status().message(), "non-finite"))
        << r.status();
    EXPECT_TRUE(absl::StrContains(r.status().message(), "NaN")) << r.status();
    if (kind == PipelineKind::kSequential) {
      EXPECT_TRUE(absl::StrContains(r.status().message(), "model.layers.1"))
          << r.status();
    }
  }
}

TEST(PipelineTest, NaNInputOfAQuantizedLinearNamesIt) {
  const LoadedForCalibration& llama = Fixture("llama");
  CalibrationData data = Data(llama, 2, 0, 2);
  runtime::GraphModule gm = CloneOf(llama);
  absl::StatusOr<at::Tensor> w =
      gm.GetTensor("model.layers.0.mlp.up_proj.weight");
  ASSERT_OK(w);
  {
    c10::NoGradGuard no_grad;
    (*w)[0][0] = std::numeric_limits<float>::infinity();
  }
  GptqModifierOptions g;
  g.weights.modules = LinearsButLmHead();
  GptqModifier gptq(g);
  CalibrationResults results;
  absl::StatusOr<PipelineResult> r = RunPipeline(
      gm, data, {&gptq}, results, Options(PipelineKind::kSequential, llama));
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(absl::StrContains(r.status().message(), "non-finite"))
      << r.status();
  EXPECT_TRUE(
      absl::StrContains(r.status().message(), "model.layers.0.mlp.down_proj"))
      << r.status();
}

TEST(PipelineTest, TargetsMatchingNothingFailBeforeRunning) {
  const LoadedForCalibration& llama = Fixture("llama");
  CalibrationData data = Data(llama, 2, 0, 2);
  runtime::GraphModule gm = CloneOf(llama);
  WeightQuantOptions o;
  o.modules.targets = {"Conv2d"};
  RtnModifier rtn(o);
  CalibrationResults results;
  PipelineOptions options = Options(PipelineKind::kSequential, llama);
  options.run_dir = absl::StrCat(testing::TempDir(), "/never_created");
  absl::StatusOr<PipelineResult> r =
      RunPipeline(gm, data, {&rtn}, results, options);
  ASSERT_THAT(r, StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_TRUE(absl::StrContains(r.status().message(),
                                "match no leaf module of the model"))
      << r.status();
  EXPECT_TRUE(absl::StrContains(r.status().message(), "Linear")) << r.status();
  EXPECT_NE(access(options.run_dir.c_str(), F_OK), 0);

  options.partition.targets = {"GPT2Block"};
  o.modules.targets = {"Linear"};
  RtnModifier rtn2(o);
  r = RunPipeline(gm, data, {&rtn2}, results, options);
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(absl::StrContains(r.status().message(), "GPT2Block"))
      << r.status();
}

// The first value a subgraph after the first target reads that is neither
// an output of the subgraph before it nor an input of the first target (what
// layer_sequential cannot feed); "" when the partition is such a chain.
std::string ChainBreak(const partition::Partition& p) {
  size_t first = 0;
  while (first < p.subgraphs.size() &&
         p.subgraphs[first].module_paths.empty()) {
    ++first;
  }
  if (first == p.subgraphs.size()) return "";
  const std::vector<std::string>& captured = p.subgraphs[first].input_names;
  for (size_t j = first + 1; j < p.subgraphs.size(); ++j) {
    const std::vector<std::string>& prev = p.subgraphs[j - 1].output_names;
    for (const std::string& name : p.subgraphs[j].input_names) {
      if (absl::c_linear_search(captured, name) ||
          absl::c_linear_search(prev, name)) {
        continue;
      }
      return name;
    }
  }
  return "";
}

TEST(PipelineTest, LayerSequentialRejectsModelsThatAreNotAChain) {
  const LoadedForCalibration& llama = Fixture("llama");
  CalibrationData data = Data(llama, 2, 0, 2);
  runtime::GraphModule gm = CloneOf(llama);
  ObserverOptions o;
  Observer observer(o);
  CalibrationResults results;
  // Splitting at the MLP blocks only: the subgraph after layer 0's MLP adds
  // the residual computed before it (in the head), which the MLP subgraph
  // neither reads nor returns.
  PipelineOptions options = Options(PipelineKind::kLayerSequential, llama);
  options.partition.targets = {"LlamaMLP"};
  ASSERT_OK_AND_ASSIGN(
      partition::Partition split,
      partition::PartitionGraph(gm.graph(), options.partition));
  const std::string breaks = ChainBreak(split);
  ASSERT_FALSE(breaks.empty()) << "the split is a chain; choose another";
  absl::StatusOr<PipelineResult> r =
      RunPipeline(gm, data, {&observer}, results, options);
  ASSERT_THAT(r, StatusIs(absl::StatusCode::kFailedPrecondition,
                          AllOf(HasSubstr("plain chain of target layers"),
                                HasSubstr(absl::StrCat("reads '", breaks, "'")),
                                HasSubstr("--pipeline=sequential"))));
  // The sequential pipeline handles the same split.
  options.kind = PipelineKind::kSequential;
  CalibrationResults seq_results;
  Observer observer2(o);
  EXPECT_OK(RunPipeline(gm, data, {&observer2}, seq_results, options));
}

// Note [Devices]: records made on a GPU go to the host; host tensors stay
// the same objects (a CPU run is byte-identical to one without devices).
TEST(RecordsToHostTest, KeepsHostTensors) {
  CalibrationResults results;
  ModuleRecord& r = results.Module("a");
  r.weight_scale = at::ones({2, 1});
  r.input.scale = at::ones({1});
  const at::Tensor scale = r.weight_scale;
  const at::Tensor input_scale = r.input.scale;
  ASSERT_OK(internal::RecordsToHost(results));
  EXPECT_TRUE(results.Module("a").weight_scale.is_same(scale));
  EXPECT_TRUE(results.Module("a").input.scale.is_same(input_scale));
  EXPECT_FALSE(results.Module("a").weight_zero_point.defined());
}

}  // namespace
}  // namespace tracecut::pipelines
