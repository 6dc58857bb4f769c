// sparsim eval's report: the table, the JSON summary and the run file of a finished run.
#include "eval_report.hpp"

#include "records.hpp"
#include "run_summary.hpp"
#include "transforms/flap.hpp"
#include "transforms/kv_weight_pruning.hpp"
#include "transforms/low_rank.hpp"

#include <fmt/format.h>

#include <algorithm>

namespace sparsim::app {

namespace {

/// One line of the result table: "  name   value".
std::string line(const std::string& name, const std::string& value) {
  return fmt::format("  {:<22} {:>14}\n", name, value);
}
std::string line(const std::string& name, double value) {
  return fmt::format("  {:<22} {:>14.4f}\n", name, value);
}

/// The pruned model's shape lines (RAP/KVPruner, low-rank K/V).
std::string pruned_lines(const Config& c) {
  std::string s;
  if (c.pruned()) {
    const pruning::PruneReport pr = pruning::prune_report(c);
    s += fmt::format(
        "          pruned ({}, retain {:.2f}): KV cache {:.3f}, attention parameters {:.3f}, "
        "FLOPs {:.3f} of the full model, orphan ratio {:.3f}\n",
        pr.method, pr.retain, pr.kv_bytes_fraction, pr.attn_params_fraction, pr.attn_flops_fraction,
        pr.orphan_ratio);
  }
  if (c.low_rank_kv()) {
    const pruning::LowRankReport lr = pruning::low_rank_summary(c);
    s += fmt::format(
        "          low-rank K/V ({}, ρ {:.2f}): KV cache {:.3f}, attention parameters {:.3f}, "
        "FLOPs {:.3f} (prefill), {:.3f} (decode step) of the full model\n",
        lr.method, lr.retain, lr.kv_bytes_fraction, lr.attn_params_fraction, lr.attn_flops_fraction,
        lr.attn_decode_flops_fraction);
  }
  return s;
}

/// The perplexity lines: corpus, windows and the metrics.
std::string perplexity_lines(const EvalInputs& in, const PplResult& ppl) {
  const EvalArgs& a = in.a;
  const Corpus& corpus = in.corpus;
  std::string s = fmt::format("corpus    {}  ({} documents, {} bytes, {} tokens, fingerprint {})\n",
                              corpus.source, corpus.documents.size(), corpus.bytes,
                              in.stream.size(), corpus.fingerprint);
  s += fmt::format("windows   {} of {} tokens, stride {}, scoring the last {}, BOS {}\n",
                   ppl.window_nll.size(), a.ppl.context, a.ppl.stride, a.ppl.score,
                   in.add_bos ? "yes" : "no");
  s += fmt::format("\n  {:<22} {:>14}\n", "metric", "value");
  s += line("perplexity", ppl.perplexity());
  s += line("nll / token (nats)", ppl.nll_sum / std::max<std::uint64_t>(1, ppl.tokens_scored));
  s += line("tokens scored", std::to_string(ppl.tokens_scored));
  s += line("top-1 accuracy",
            static_cast<double>(ppl.argmax_hits) / std::max<std::uint64_t>(1, ppl.tokens_scored));
  const PplSpread sp = ppl_spread(ppl);
  if (sp.windows > 1)
    s += line("perplexity 95% CI", fmt::format("{:.3f} … {:.3f}", sp.ci95[0], sp.ci95[1]));
  return s;
}

/// The retrieval task's summary block, with its accuracy per (length, depth) cell and the
/// correctness of every prompt in item order (for paired comparisons).
nlohmann::json retrieval_json(const EvalInputs& in, const RetrievalResult& rr) {
  const RetrievalOptions& ro = in.a.ro;
  nlohmann::json cells = nlohmann::json::array();
  for (std::size_t li = 0; li < ro.lengths.size(); ++li)
    for (std::size_t di = 0; di < ro.depths.size(); ++di)
      cells.push_back({{"length", ro.lengths[li]},
                       {"depth", ro.depths[di]},
                       {"accuracy", rr.cell_accuracy[li * ro.depths.size() + di]},
                       {"items", ro.samples}});
  return {{"task", in.a.task},     {"accuracy", rr.accuracy}, {"items", in.ritems.size()},
          {"lengths", ro.lengths}, {"depths", ro.depths},     {"samples", ro.samples},
          {"seed", ro.seed},       {"digits", ro.digits},     {"cells", cells},
          {"correct", rr.correct}};
}

void write_perplexity(io::Group root, io::Group res, const EvalInputs& in, const PplResult& ppl) {
  const Corpus& corpus = in.corpus;
  io::Group cg = root.create_group("corpus");
  cg.set_attr("source", corpus.source);
  cg.set_attr("fingerprint", corpus.fingerprint);
  cg.set_attr("bytes", static_cast<std::int64_t>(corpus.bytes));
  cg.set_attr("documents", static_cast<std::int64_t>(corpus.documents.size()));
  cg.set_attr("tokens", static_cast<std::int64_t>(in.stream.size()));
  if (in.a.save_tokens) {
    std::vector<std::int32_t> t32(in.stream.begin(), in.stream.end());
    cg.write<std::int32_t>("tokens", t32, {"token id", "the corpus token stream"});
  }
  io::Group pg = res.create_group("perplexity");
  pg.set_attr("perplexity", ppl.perplexity());
  pg.set_attr("tokens_scored", static_cast<std::int64_t>(ppl.tokens_scored));
  pg.set_attr("nll_sum", ppl.nll_sum);
  pg.write<double>("window_nll", ppl.window_nll, {"nat", "summed NLL of the scored tokens"});
  pg.write<std::uint64_t>("window_tokens", ppl.window_tokens, {"token", "tokens scored"});
  pg.write<std::uint64_t>("window_start", ppl.window_start,
                          {"token", "window start offset in the corpus token stream"});
}

void write_tasks(io::Group res, const EvalInputs& in, const TaskResult& tr) {
  io::Group tg = res.create_group("tasks");
  tg.set_attr("file", in.a.tasks_path);
  tg.set_attr("acc", tr.acc);
  tg.set_attr("acc_norm", tr.acc_norm);
  tg.write<double>("loglik", tr.loglik, {"nat", "continuation log-likelihood per choice"});
  std::vector<std::int32_t> off(tr.choice_offset.begin(), tr.choice_offset.end());
  tg.write<std::int32_t>("choice_offset", off, {"", "first loglik entry of each item"});
  std::vector<std::int32_t> pred(tr.pred.begin(), tr.pred.end()),
      pn(tr.pred_norm.begin(), tr.pred_norm.end());
  tg.write<std::int32_t>("pred", pred, {"", "argmax choice"});
  tg.write<std::int32_t>("pred_norm", pn, {"", "argmax choice by loglik per byte"});
}

void write_retrieval(io::Group res, const EvalInputs& in, const RetrievalResult& rr) {
  const RetrievalOptions& ro = in.a.ro;
  io::Group rg = res.create_group("retrieval");
  rg.set_attr("task", in.a.task);
  rg.set_attr("accuracy", rr.accuracy);
  rg.set_attr("samples", ro.samples);
  rg.set_attr("seed", static_cast<std::int64_t>(ro.seed));
  rg.set_attr("digits", ro.digits);
  std::vector<std::int32_t> lens(ro.lengths.begin(), ro.lengths.end());
  rg.write<std::int32_t>("lengths", lens, {"token", "prompt lengths (first index)"});
  rg.write<double>("depths", ro.depths, {"1", "needle depths (second index)"});
  rg.write<double>(
      "accuracy", rr.cell_accuracy.data(),
      {static_cast<hsize_t>(ro.lengths.size()), static_cast<hsize_t>(ro.depths.size())},
      {"1", "exact-match accuracy per [length][depth]"});
  std::vector<std::int32_t> il, ok;
  std::vector<double> idp, ipl;
  std::vector<std::string> ans, outp, keys;
  for (std::size_t k = 0; k < in.ritems.size(); ++k) {
    il.push_back(in.ritems[k].length);
    idp.push_back(in.ritems[k].depth);
    ipl.push_back(in.ritems[k].placed);
    ok.push_back(rr.correct[k]);
    ans.push_back(in.ritems[k].answer);
    outp.push_back(rr.output[k]);
    keys.push_back(in.ritems[k].key);
  }
  rg.write<std::int32_t>("item_length", il, {"token", "prompt length of each item"});
  rg.write<double>("item_depth", idp, {"1", "requested needle depth of each item"});
  rg.write<double>("item_placed", ipl, {"1", "needle start / filler length, as placed"});
  rg.write<std::int32_t>("item_correct", ok, {"", "1: exact match"});
  rg.write_strings("item_answer", ans, {"", "the number to retrieve"});
  rg.write_strings("item_output", outp, {"", "greedy continuation"});
  if (ro.kind == "kv") rg.write_strings("item_key", keys, {"", "the key asked for"});
}

}  // namespace

std::string eval_table_head(const EvalInputs& in, const EvalResults& r) {
  const Config& c = in.c;
  std::string s =
      fmt::format("model     {}  [{}]\n          fingerprint {}, {} params, {} storage\n",
                  in.mi.path, in.rm.origin, in.mi.fingerprint, c.n_params(), in.a.storage);
  s += pruned_lines(c);
  if (!in.a.no_ppl) s += perplexity_lines(in, r.ppl);
  return s;
}

std::string eval_table_tail(const EvalInputs& in, const EvalResults& r, const flops::Ledger& ledger,
                            bool sparse) {
  const EvalArgs& a = in.a;
  std::string s;
  if (a.retrieval) s += line(fmt::format("{} accuracy", a.task), r.retrieval.accuracy);
  if (a.ruler) {
    const nlohmann::json& rj = r.ruler_json;
    for (const auto& t : a.ruo.tasks)
      s += line(fmt::format("ruler {}", t),
                fmt::format("{:.4f} ({})", rj["by_task"][t]["accuracy"].get<double>(),
                            rj["by_task"][t]["items"].get<int>()));
    s += line("ruler accuracy", rj["accuracy"].get<double>());
  }
  if (!in.tasks.empty()) {
    s += line("tasks acc", r.tasks.acc);
    s += line("tasks acc_norm", r.tasks.acc_norm);
    s += line("task items", std::to_string(r.tasks.items));
  }
  s += cost_table(ledger, sparse);
  s += fmt::format("  {:<22} {:>14.3f}\n", "wall seconds", r.t.wall);
  s += line("backend / threads", fmt::format("{} / {}", in.backend, in.threads));
  return s;
}

nlohmann::json eval_summary_head(const EvalInputs& in, const EvalResults& r,
                                 const flops::Ledger& ledger, io::SummaryColumns& cols) {
  const EvalArgs& a = in.a;
  const Config& c = in.c;
  nlohmann::json j;
  j["method"] = a.ma.method;
  j["model"] = {{"path", in.mi.path}, {"fingerprint", in.mi.fingerprint}, {"origin", in.rm.origin}};
  j["storage"] = a.storage;
  j["bf16_compute"] = a.bf16_compute;
  j["threads"] = in.threads;
  j["backend"] = in.backend;
  j["wall_seconds"] = r.t.wall;
  const nlohmann::json cost = cost_json(ledger);
  j["flops"] = cost["flops"];
  j["bytes"] = cost["bytes"];
  if (c.pruned()) {
    const pruning::PruneReport pr = pruning::prune_report(c);
    j["pruned"] = pr.json();
    pr.add_columns(cols);
  }
  if (c.low_rank_kv()) j["low_rank"] = pruning::low_rank_summary(c).json();
  j["n_params"] = c.n_params();
  if (c.structured()) {  // FLAP: kept heads and FFN widths against the full model
    Config full = c;
    full.structure.clear();
    nlohmann::json sj = pruning::flap_report(full, c, 1.0 - c.prune.retain).json();
    sj["n_params_full"] = full.n_params();
    sj["recipe"] = c.prune.recipe;
    j["structured"] = sj;
  }
  if (a.no_ppl) {
    j["perplexity"] = nullptr;
    j["tokens_scored"] = 0;
    j["windows"] = 0;
    j["corpus"] = {{"fingerprint", nullptr}};
    return j;
  }
  const PplResult& ppl = r.ppl;
  j["perplexity"] = ppl.perplexity();
  const PplSpread sp = ppl_spread(ppl);
  j["perplexity_spread"] = {{"mean_nll_per_window", sp.mean_nll},
                            {"se", sp.se},
                            {"ci95", {sp.ci95[0], sp.ci95[1]}},
                            {"what", "exp(mean ± 1.96 se) of the windows' per-token NLL"}};
  j["tokens_scored"] = ppl.tokens_scored;
  j["windows"] = ppl.window_nll.size();
  j["corpus"] = {{"source", in.corpus.source},
                 {"fingerprint", in.corpus.fingerprint},
                 {"bytes", in.corpus.bytes},
                 {"tokens", in.stream.size()}};
  j["protocol"] = {{"context", a.ppl.context},
                   {"stride", a.ppl.stride},
                   {"score", a.ppl.score},
                   {"bos", in.add_bos}};
  return j;
}

void eval_summary_tail(const EvalInputs& in, const EvalResults& r, nlohmann::json& j,
                       io::SummaryColumns& cols) {
  const EvalArgs& a = in.a;
  if (a.retrieval) {
    j["retrieval"] = retrieval_json(in, r.retrieval);
    cols.add("retrieval_task", a.task, "", "generated retrieval task");
    cols.add("retrieval_accuracy", r.retrieval.accuracy, "1",
             "retrieval accuracy over every (length, depth) cell's prompts");
    cols.add("retrieval_items", static_cast<double>(in.ritems.size()), "1",
             "retrieval prompts scored");
  }
  if (a.ruler) {
    j["ruler"] = r.ruler_json;
    cols.add("ruler_accuracy", r.ruler_json["accuracy"].get<double>(), "1",
             "long-context suite accuracy: share of items whose continuation holds every answer");
    cols.add("ruler_items", r.ruler_json["items_total"].get<double>(), "1",
             "long-context suite items scored");
  }
  if (!in.tasks.empty())
    j["tasks"] = {{"file", a.tasks_path},
                  {"items", r.tasks.items},
                  {"acc", r.tasks.acc},
                  {"acc_norm", r.tasks.acc_norm}};
  // (tasks have fixed columns of the sweep table: tasks_acc, tasks_acc_norm, task_items)
  j["columns"] = cols.json();
}

void write_eval_results(io::Group root, const EvalInputs& in, const EvalResults& r, int argc,
                        char** argv) {
  const EvalArgs& a = in.a;
  write_run_header(root, argc, argv, in.backend, in.threads, in.mi, in.c, a.lo.storage,
                   a.lo.bf16_compute);
  io::Group cfg = root.create_group("config");
  cfg.set_attr("method", a.ma.method);
  cfg.set_attr("context", a.ppl.context);
  cfg.set_attr("stride", a.ppl.stride);
  cfg.set_attr("score", a.ppl.score);
  cfg.set_attr("batch", a.ppl.batch);
  cfg.set_attr("max_windows", a.ppl.max_windows);
  cfg.set_attr("bos", in.add_bos ? 1 : 0);
  cfg.set_attr("model_origin", in.rm.origin);
  io::Group res = root.create_group("results");
  if (!a.no_ppl) write_perplexity(root, res, in, r.ppl);
  if (!in.tasks.empty()) write_tasks(res, in, r.tasks);
  if (a.retrieval) write_retrieval(res, in, r.retrieval);
  if (a.ruler) {
    io::Group rg = res.create_group("ruler");
    write_ruler(rg, a.ruo, in.ruitems, r.ruler);
  }
}

void write_eval_extras(io::Group root, const EvalInputs& in, const EvalResults& r) {
  const EvalArgs& a = in.a;
  if (a.tf_mass) {
    io::Group tg = root.open_group("token_filter");
    io::Group mg = tg.create_group("attention_mass");
    mg.set_attr("meaning",
                "dense model, first window: similarity S of every position in every layer "
                "and the mean attention (over later queries and heads) it receives");
    const std::vector<hsize_t> dims = {static_cast<hsize_t>(in.c.n_layer),
                                       static_cast<hsize_t>(a.ppl.context)};
    mg.write<float>("similarity", r.similarity.data(), dims,
                    {"1", "similarity S [layer][position] (NaN: no anchor)"});
    mg.write<float>("attention_received", r.attention_received.data(), dims,
                    {"1", "mean softmax weight from later queries [layer][position]"});
  }
  io::Group tm = root.create_group("timings");
  tm.write_scalar("load_seconds", r.t.load, {"s", "model load and dequantization"});
  tm.write_scalar("tokenize_seconds", r.t.tokenize, {"s", "corpus tokenization"});
  tm.write_scalar("perplexity_seconds", r.t.perplexity, {"s", "perplexity forward passes"});
  tm.write_scalar("tasks_seconds", r.t.tasks, {"s", "task scoring"});
  tm.write_scalar("retrieval_seconds", r.t.retrieval, {"s", "retrieval task"});
  tm.write_scalar("ruler_seconds", r.t.ruler, {"s", "ruler suite"});
  tm.write_scalar("wall_seconds", r.t.wall, {"s", "whole command"});
  tm.set_attr("resumed_windows", static_cast<std::int64_t>(r.resumed_windows));
}

}  // namespace sparsim::app
