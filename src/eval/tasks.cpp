#include "eval/tasks.hpp"

#include "core/backends.hpp"
#include "core/error.hpp"
#include "eval/corpus.hpp"
#include "eval/perplexity.hpp"

#include <nlohmann/json.hpp>

#include <fstream>

namespace sparsim {

std::vector<TaskItem> load_tasks(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  require(static_cast<bool>(f), "tasks: cannot read '{}'", path);
  std::vector<TaskItem> items;
  std::string line;
  std::size_t lineno = 0;
  while (std::getline(f, line)) {
    ++lineno;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = fmt::format("{}:{}", path, lineno);
    require(invalid_utf8_offset(line) == std::string::npos, "tasks: {}: invalid UTF-8", where);
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception& e) {
      fail("tasks: {}: malformed JSON ({})", where, e.what());
    }
    require(j.is_object(), "tasks: {}: expected a JSON object", where);
    require(j.contains("context") && j["context"].is_string(), "tasks: {}: no string 'context'",
            where);
    require(j.contains("choices") && j["choices"].is_array() && j["choices"].size() >= 2,
            "tasks: {}: 'choices' must be an array of at least two strings", where);
    require(j.contains("gold") && j["gold"].is_number_integer(), "tasks: {}: no integer 'gold'",
            where);
    TaskItem it;
    it.context = j["context"].get<std::string>();
    for (const auto& c : j["choices"]) {
      require(c.is_string() && !c.get<std::string>().empty(),
              "tasks: {}: every choice must be a non-empty string", where);
      it.choices.push_back(c.get<std::string>());
    }
    it.gold = j["gold"].get<int>();
    require(it.gold >= 0 && it.gold < static_cast<int>(it.choices.size()),
            "tasks: {}: gold {} is not a valid choice index (0 … {})", where, it.gold,
            it.choices.size() - 1);
    items.push_back(std::move(it));
  }
  require(!items.empty(), "tasks: '{}' holds no items", path);
  return items;
}

template <class E>
TaskResult score_tasks(Engine<E>& eng, const Tokenizer& tok, const std::vector<TaskItem>& items,
                       bool add_bos, const std::function<void(int, int)>& progress) {
  TaskResult r;
  int hits = 0, hits_norm = 0;
  for (std::size_t i = 0; i < items.size(); ++i) {
    const TaskItem& it = items[i];
    std::vector<int> ctx = tok.encode(it.context, add_bos);
    if (ctx.empty()) {
      require(tok.bos_id() >= 0, "tasks: item {} has an empty context and the model has no BOS",
              i + 1);
      ctx.push_back(tok.bos_id());
    }
    r.choice_offset.push_back(static_cast<int>(r.loglik.size()));
    int best = 0, best_norm = 0;
    double bv = -1e300, bn = -1e300;
    for (std::size_t c = 0; c < it.choices.size(); ++c) {
      std::vector<int> whole = tok.encode(it.context + it.choices[c], add_bos);
      std::vector<int> cont;
      const std::size_t nctx = tok.encode(it.context, add_bos).size();
      if (whole.size() > nctx) cont.assign(whole.begin() + nctx, whole.end());
      require(!cont.empty(), "tasks: item {} choice {} adds no tokens to the context", i + 1, c);
      std::vector<int> prefix(whole.begin(), whole.begin() + nctx);
      if (prefix.empty()) prefix = ctx;
      const double ll = loglikelihood(eng, prefix, cont);
      r.loglik.push_back(ll);
      const double norm = ll / static_cast<double>(it.choices[c].size());
      if (ll > bv) bv = ll, best = static_cast<int>(c);
      if (norm > bn) bn = norm, best_norm = static_cast<int>(c);
    }
    r.pred.push_back(best);
    r.pred_norm.push_back(best_norm);
    hits += best == it.gold;
    hits_norm += best_norm == it.gold;
    if (progress) progress(static_cast<int>(i + 1), static_cast<int>(items.size()));
  }
  r.items = static_cast<int>(items.size());
  r.acc = static_cast<double>(hits) / r.items;
  r.acc_norm = static_cast<double>(hits_norm) / r.items;
  return r;
}

#define SPARSIM_INSTANTIATE_TASKS(E)                                                             \
  template TaskResult score_tasks<E>(Engine<E>&, const Tokenizer&, const std::vector<TaskItem>&, \
                                     bool, const std::function<void(int, int)>&);
SPARSIM_FOR_EACH_BACKEND(SPARSIM_INSTANTIATE_TASKS)

}  // namespace sparsim
