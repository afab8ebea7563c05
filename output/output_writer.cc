#include "output/output_writer.h"

#include <memory>
#include <string>
#include <utility>

#include "runtime/lowering.h"

namespace tracecut::output {
namespace {

class CompressedTensors : public OutputWriter {
 public:
  explicit CompressedTensors(CompressedOutputOptions options)
      : options_(std::move(options)) {}
  absl::Status Write(const runtime::GraphModule& gm,
                     const modifiers::CalibrationResults& results) override {
    return WriteCompressedTensors(gm, results, options_);
  }

 private:
  CompressedOutputOptions options_;
};

class TorchScript : public OutputWriter {
 public:
  explicit TorchScript(std::string path) : path_(std::move(path)) {}
  absl::Status Write(const runtime::GraphModule& gm,
                     const modifiers::CalibrationResults&) override {
    return runtime::SaveTorchScript(gm, path_);
  }

 private:
  std::string path_;
};

class Streamed : public OutputWriter {
 public:
  explicit Streamed(CompressedTensorsWriter& writer) : writer_(writer) {}
  absl::Status Write(const runtime::GraphModule&,
                     const modifiers::CalibrationResults& results) override {
    return writer_.Finish(results);
  }

 private:
  CompressedTensorsWriter& writer_;
};

}  // namespace

std::unique_ptr<OutputWriter> CompressedTensorsOutput(
    CompressedOutputOptions options) {
  return std::make_unique<CompressedTensors>(std::move(options));
}

std::unique_ptr<OutputWriter> TorchScriptOutput(std::string path) {
  return std::make_unique<TorchScript>(std::move(path));
}

std::unique_ptr<OutputWriter> StreamedOutput(CompressedTensorsWriter& writer) {
  return std::make_unique<Streamed>(writer);
}

}  // namespace tracecut::output
