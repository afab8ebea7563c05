// libFuzzer target for partition plans (partition/plan.h): any bytes given
// to PlanFromJson must load or fail with a Status; a plan that loads must
// print to JSON that loads back to the same plan and prints the same bytes,
// and must print as a text table. The same bytes are also read as a binary
// PartitionPlan, so the printers see plans JSON cannot express. Run as
// //tests/fuzz:plan_fuzzer_smoke_test.

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/strings/string_view.h"
#include "google/protobuf/stubs/logging.h"
#include "google/protobuf/util/message_differencer.h"
#include "partition/plan.h"
#include "partition/plan.pb.h"

namespace {

using ::tracecut::partition::PartitionPlan;

[[noreturn]] void Fail(const char* what, const std::string& detail) {
  std::fprintf(stderr, "plan_fuzzer: %s\n%s\n", what, detail.c_str());
  std::abort();
}

// JSON and text of a plan from any source: the JSON must round-trip.
void CheckPrinters(const PartitionPlan& plan) {
  (void)tracecut::partition::PlanToText(plan);
  const std::string json = tracecut::partition::PlanToJson(plan);
  auto back = tracecut::partition::PlanFromJson(json);
  if (!back.ok()) {
    Fail("PlanToJson output does not load",
         std::string(back.status().message()) + "\n" + json);
  }
  // Equivalent, not Equals: the JSON always has "options", so an unset
  // options message comes back set (and empty).
  if (!google::protobuf::util::MessageDifferencer::Equivalent(plan, *back)) {
    Fail("JSON round trip changed the plan", json);
  }
  if (tracecut::partition::PlanToJson(*back) != json) {
    Fail("PlanToJson is not stable", json);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // Invalid UTF-8 in binary string fields is an expected parse failure;
  // protobuf's log line for each would drown the output.
  static const bool kQuiet = (google::protobuf::SetLogHandler(nullptr), true);
  (void)kQuiet;
  absl::string_view input(reinterpret_cast<const char*>(data), size);
  auto plan = tracecut::partition::PlanFromJson(input);
  if (plan.ok()) CheckPrinters(*plan);
  PartitionPlan binary;
  if (binary.ParseFromArray(data, static_cast<int>(size))) {
    CheckPrinters(binary);
  }
  return 0;
}
