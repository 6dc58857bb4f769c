#pragma once
/// Multiple-choice tasks scored the lm-evaluation-harness way: each choice's summed
/// continuation log-likelihood; acc takes the best sum, acc_norm the best sum per byte of the
/// choice's text.
#include "engine/engine.hpp"
#include "model/tokenizer.hpp"

#include <string>
#include <vector>

namespace sparsim {

struct TaskItem {
  std::string context;
  std::vector<std::string> choices;
  int gold = 0;
};

/// Reads JSONL lines {"context": str, "choices": [str, ...], "gold": int}; errors name the file
/// and line.
std::vector<TaskItem> load_tasks(const std::string& path);

struct TaskResult {
  int items = 0;
  double acc = 0, acc_norm = 0;
  std::vector<int> pred, pred_norm;
  std::vector<double> loglik;      ///< flattened over items and choices
  std::vector<int> choice_offset;  ///< item i's choices start at loglik[choice_offset[i]]
};

/// Continuation tokens of `choice` after `context`: encode(context + choice) minus the first
/// |encode(context)| tokens, as the harness does.
template <class E>
TaskResult score_tasks(Engine<E>& eng, const Tokenizer& tok, const std::vector<TaskItem>& items,
                       bool add_bos, const std::function<void(int, int)>& progress = {});

}  // namespace sparsim
