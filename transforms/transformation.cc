#include "transforms/transformation.h"

#include <algorithm>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace tracecut::transforms {

int64_t MarkApplicationId(const ir::TransformMark& mark) {
  auto it = mark.data.find(std::string(kAppKey));
  int64_t id = -1;
  if (it == mark.data.end() || !absl::SimpleAtoi(it->second, &id)) return -1;
  return id;
}

std::optional<int64_t> PinnedApplicationId(const ir::Graph& graph) {
  auto it = graph.meta().extra.find(std::string(kPinnedAppKey));
  if (it == graph.meta().extra.end() ||
      it->second.kind() != ir::Argument::Kind::kInt) {
    return std::nullopt;
  }
  return it->second.as_int();
}

void PinApplicationId(ir::Graph& graph, std::optional<int64_t> app) {
  if (app) {
    graph.meta().extra[std::string(kPinnedAppKey)] = ir::Argument::Int(*app);
  } else {
    graph.meta().extra.erase(std::string(kPinnedAppKey));
  }
}

int64_t NextApplicationId(const ir::Graph& graph) {
  if (std::optional<int64_t> pinned = PinnedApplicationId(graph)) {
    return *pinned;
  }
  int64_t max_id = 0;
  for (const ir::Node* n : graph.nodes()) {
    for (const ir::TransformMark& m : n->meta().transforms) {
      max_id = std::max(max_id, MarkApplicationId(m));
    }
  }
  return max_id + 1;
}

std::optional<int64_t> LatestApplicationId(const ir::Graph& graph,
                                           absl::string_view pass) {
  std::optional<int64_t> latest;
  for (const ir::Node* n : graph.nodes()) {
    for (const ir::TransformMark& m : n->meta().transforms) {
      if (m.pass != pass) continue;
      const int64_t id = MarkApplicationId(m);
      if (!latest || id > *latest) latest = id;
    }
  }
  return latest;
}

void MarkTransformed(ir::Node* node, absl::string_view pass, int64_t app,
                     std::map<std::string, std::string> data) {
  data[std::string(kAppKey)] = absl::StrCat(app);
  node->meta().transforms.push_back(
      ir::TransformMark{std::string(pass), std::move(data)});
}

const ir::TransformMark* FindMark(const ir::Node& node, absl::string_view pass,
                                  std::optional<int64_t> app) {
  const auto& marks = node.meta().transforms;
  for (auto it = marks.rbegin(); it != marks.rend(); ++it) {
    if (it->pass != pass) continue;
    if (app && MarkApplicationId(*it) != *app) continue;
    return &*it;
  }
  return nullptr;
}

int RemoveMarks(ir::Node* node, absl::string_view pass, int64_t app) {
  auto& marks = node->meta().transforms;
  const size_t before = marks.size();
  marks.erase(std::remove_if(marks.begin(), marks.end(),
                             [&](const ir::TransformMark& m) {
                               return m.pass == pass &&
                                      MarkApplicationId(m) == app;
                             }),
              marks.end());
  return static_cast<int>(before - marks.size());
}

std::vector<ir::Node*> GetTransformedNodes(const ir::Graph& graph,
                                           absl::string_view pass_name) {
  std::vector<ir::Node*> out;
  for (ir::Node* n : graph.nodes()) {
    if (FindMark(*n, pass_name) != nullptr) out.push_back(n);
  }
  return out;
}

std::vector<ir::Node*> GetTransformedNodes(const ir::Graph& graph,
                                           absl::string_view pass_name,
                                           int64_t app) {
  std::vector<ir::Node*> out;
  for (ir::Node* n : graph.nodes()) {
    if (FindMark(*n, pass_name, app) != nullptr) out.push_back(n);
  }
  return out;
}

absl::Status CheckIsLatestApplication(const ir::Graph& graph,
                                      absl::string_view pass, int64_t app) {
  for (const ir::Node* n : graph.nodes()) {
    for (const ir::TransformMark& m : n->meta().transforms) {
      if (MarkApplicationId(m) > app) {
        return absl::FailedPreconditionError(absl::StrCat(
            "cannot undo ", pass, " (application ", app, "): ", m.pass,
            " (application ", MarkApplicationId(m), ") changed ", n->Describe(),
            " later; undo that first"));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status CheckLastMark(const ir::Node& node,
                           const ir::TransformMark& mark) {
  const auto& marks = node.meta().transforms;
  if (marks.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat(node.Describe(), " carries no transform mark"));
  }
  const ir::TransformMark& last = marks.back();
  if (&last == &mark || last == mark) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "cannot undo ", mark.pass, " (application ", MarkApplicationId(mark),
      ") on ", node.Describe(), ": ", last.pass, " (application ",
      MarkApplicationId(last), ") rewrote it later; undo that first"));
}

}  // namespace tracecut::transforms
