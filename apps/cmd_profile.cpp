// sparsim profile: the block sensitivity profile e_i (paper 000, Sec. 2.2, Figure 1) and the
// sensitivity-aware block budgets s_i = clamp(s + λ(ē − e_i), 0.05, 0.95) it implies, from a
// calibration file or measured afresh; written to an HDF5 file, a table and optionally a PNG plot
// (drawn by the report generator, scripts/report.py).
#include "calibrate_options.hpp"
#include "common.hpp"
#include "core/interrupt.hpp"
#include "core/log.hpp"
#include "core/timer.hpp"
#include "eval/corpus.hpp"
#include "io/run_file.hpp"
#include "io/run_guard.hpp"
#include "model/loader.hpp"
#include "model_io.hpp"
#include "records.hpp"
#include "report_tool.hpp"
#include "sparsity/calibrate.hpp"
#include "sparsity/rotation.hpp"

#include <fmt/format.h>

#include <unistd.h>
#include <cmath>
#include <iostream>
#include <memory>
#include <optional>

namespace sparsim::app {

namespace {

/// Bounds of block_budgets' clamp (its defaults).
constexpr double kBudgetLo = 0.05;
constexpr double kBudgetHi = 0.95;

std::string join_levels(const std::vector<double>& v) {
  std::string s;
  for (double x : v) s += (s.empty() ? "" : ", ") + fmt::format("{:g}", x);
  return s.empty() ? "none" : s;
}

/// What the profile was made from and what it holds.
struct Profile {
  std::string variant;  ///< "plain" or "rotated"
  std::string source;   ///< "calibration file" or "computed"
  std::string calibration_file;
  std::string model_fingerprint, model_path, corpus_fingerprint, corpus_path;
  bool model_checked = false;  ///< the model was loaded and its fingerprint compared / used
  int n_layer = 0;
  std::vector<double> probe_levels;
  std::vector<std::vector<double>> sensitivity;  ///< [probe][layer]
  std::string set;  ///< how the sensitivities were probed (Sensitivity::describe)
};

/// The sensitivity set of `var` probed with `rule` over positions ≥ from (column norms on k and
/// gate preferred); throws naming what the variant holds.
const sparsity::Sensitivity& pick_set(const sparsity::CalibrationVariant& var,
                                      sparsity::ProbeRule rule, int from, const std::string& src) {
  const sparsity::Sensitivity* best = nullptr;
  for (const auto& s : var.sensitivity)
    if (s.rule == rule && s.from == from && (!best || (best->norms_all && !s.norms_all))) best = &s;
  if (best) return *best;
  std::string have;
  for (const auto& s : var.sensitivity) have += "\n    " + s.describe();
  fail("{} holds no sensitivities probed with {} masking over positions ≥ {}; it holds:{}", src,
       sparsity::probe_rule_name(rule), from, have.empty() ? std::string(" none") : have);
}

struct BudgetRequest {
  std::vector<double> sparsity;
  double lambda = 0.4;
  double probe = 0.4;
};

int probe_index(const std::vector<double>& levels, double probe) {
  for (std::size_t i = 0; i < levels.size(); ++i)
    if (std::fabs(levels[i] - probe) < 1e-9) return static_cast<int>(i);
  return -1;
}

double mean_of(const std::vector<double>& v) {
  double m = 0;
  for (double x : v) m += x;
  return v.empty() ? 0.0 : m / static_cast<double>(v.size());
}

/// Writes the run file (and the plot), then prints the table. `header` writes the groups every
/// run file starts with.
template <class Header>
void publish(const Profile& p, const BudgetRequest& br, const std::string& out,
             const std::string& plot, Header&& header) {
  const std::size_t P = p.probe_levels.size(), L = static_cast<std::size_t>(p.n_layer);
  const std::size_t S = br.sparsity.size();
  const auto k = static_cast<std::size_t>(probe_index(p.probe_levels, br.probe));
  std::vector<double> means(P);
  for (std::size_t i = 0; i < P; ++i) means[i] = mean_of(p.sensitivity[i]);
  std::vector<std::vector<double>> budgets(S);
  std::vector<double> budget_mean(S);
  for (std::size_t j = 0; j < S; ++j) {
    budgets[j] =
        sparsity::block_budgets(p.sensitivity[k], br.sparsity[j], br.lambda, kBudgetLo, kBudgetHi);
    budget_mean[j] = mean_of(budgets[j]);
  }

  io::RunFile rf(out);
  io::Group root = rf.root();
  header(root);
  io::Group g = root.create_group("profile");
  g.set_attr("variant", p.variant);
  g.set_attr("source", p.source);
  g.set_attr("calibration_file", p.calibration_file);
  g.set_attr("model_fingerprint", p.model_fingerprint);
  g.set_attr("model_path", p.model_path);
  g.set_attr("model_checked", p.model_checked ? 1 : 0);
  g.set_attr("corpus_fingerprint", p.corpus_fingerprint);
  g.set_attr("corpus_path", p.corpus_path);
  g.set_attr("sensitivity_set", p.set);
  g.set_attr("budget_lower", kBudgetLo);
  g.set_attr("budget_upper", kBudgetHi);
  g.write("probe_levels", p.probe_levels,
          {"1", "[probe] probe sparsities s̄ at which the sensitivities were measured"});
  std::vector<double> e(P * L);
  for (std::size_t i = 0; i < P; ++i)
    std::copy(p.sensitivity[i].begin(), p.sensitivity[i].end(), e.begin() + i * L);
  g.write<double>("sensitivity", e.data(), {P, L},
                  {"1",
                   "[probe][layer] e_i: mean relative output error of block i when only it is "
                   "sparsified at probe level s̄"});
  g.write("mean", means, {"1", "[probe] ē: mean of e_i over the layers"});
  g.write("sparsity", br.sparsity, {"1", "[s] target mean sparsities s of the budgets"});
  std::vector<double> b(S * L);
  for (std::size_t j = 0; j < S; ++j)
    std::copy(budgets[j].begin(), budgets[j].end(), b.begin() + j * L);
  g.write<double>("budgets", b.data(), {S, L},
                  {"1",
                   "[s][layer] s_i = clamp(s + lambda (mean e - e_i), budget_lower, "
                   "budget_upper) with e at probe level `probe`"});
  io::Dataset bd = g.dataset("budgets");
  bd.set_attr("lambda", br.lambda);
  bd.set_attr("probe", br.probe);
  g.write("budget_mean", budget_mean,
          {"1", "[s] realised mean of the budgets (the clamp can move it away from s)"});
  interruption_point("write");
  rf.commit();
  // The plot comes from the report generator, from the run file just written (which stays,
  // complete, if the plot fails).
  if (!plot.empty()) run_report_tool({"sensitivity-plot", out, "--png", plot});

  // stdout: layer × probe, then the budgets at the chosen probe
  std::cout << fmt::format("block sensitivity profile, {} model ({})\n", p.variant,
                           p.source == "computed" ? fmt::format("computed on {}", p.corpus_path)
                                                  : fmt::format("from {}", p.calibration_file));
  std::cout << fmt::format("  model {} (fingerprint {}{})\n", p.model_path, p.model_fingerprint,
                           p.model_checked ? "" : ", not checked: no --model given");
  std::cout << fmt::format("  sensitivities probed with {}\n", p.set);
  std::cout << fmt::format("  budgets s_i = clamp(s + λ(ē − e_i), {}, {}), λ = {:g}, s̄ = {:g}\n\n",
                           kBudgetLo, kBudgetHi, br.lambda, br.probe);
  std::cout << fmt::format("  {:>5}", "layer");
  for (double v : p.probe_levels) std::cout << fmt::format(" {:>9}", fmt::format("e@{:.2f}", v));
  std::cout << "  ";
  for (double v : br.sparsity) std::cout << fmt::format(" {:>8}", fmt::format("s={:.2f}", v));
  std::cout << "\n";
  for (std::size_t l = 0; l < L; ++l) {
    std::cout << fmt::format("  {:>5}", l);
    for (std::size_t i = 0; i < P; ++i) std::cout << fmt::format(" {:>9.4f}", p.sensitivity[i][l]);
    std::cout << "  ";
    for (std::size_t j = 0; j < S; ++j) std::cout << fmt::format(" {:>8.4f}", budgets[j][l]);
    std::cout << "\n";
  }
  std::cout << fmt::format("  {:>5}", "mean");
  for (double m : means) std::cout << fmt::format(" {:>9.4f}", m);
  std::cout << "  ";
  for (double m : budget_mean) std::cout << fmt::format(" {:>8.4f}", m);
  std::cout << "\n\n  wrote " << out << (plot.empty() ? "" : " and " + plot) << "\n";
}

/// profile's options and their checks (all made before anything is loaded or written).
struct ProfileArgs {
  CommonOptions co;
  std::string calib_path, model_arg, corpus_arg, text_field, out, plot, storage, sparsity_arg,
      variant, progress_arg, masking_arg;
  int positions_from = 0;
  CalibrateCli cc;
  BudgetRequest br;
  bool strict = false;
  // Set by check():
  ProgressBar::Mode pmode = ProgressBar::Mode::Lines;
  sparsity::ProbeRule rule = sparsity::ProbeRule::Guided;
  bool from_file = false;  ///< the sensitivities come from --calibration
  bool load = false;       ///< the model is loaded (computed afresh, or checked against the file)

  void add_options(po::options_description& d) {
    d.add_options()("calibration", po::value(&calib_path),
                    "calibration file (from sparsim calibrate) to take e_i from; with --model its "
                    "fingerprint is checked")(
        "model,m", po::value(&model_arg),
        "model: a GGUF file, a Hugging Face directory, or the alias smollm2 (default smollm2 "
        "when there is no --calibration)")(
        "variant", po::value(&variant)->default_value("rotated"),
        "plain (unrotated; TEAL) or rotated (WINA-rotated; WINA, TopK-Guided)")(
        "sparsity,s", po::value(&sparsity_arg)->default_value("0.3,0.5,0.7"),
        "target mean sparsities s of the budgets (comma-separated, each in [0, 1))")(
        "lambda", po::value(&br.lambda)->default_value(0.4), "redistribution strength λ ≥ 0")(
        "probe", po::value(&br.probe)->default_value(0.4),
        "probe level s̄ whose sensitivities set the budgets (one of the measured levels)")(
        "out,o", po::value(&out), "HDF5 file to write (required)")(
        "plot", po::value(&plot),
        "PNG: e_i over the layers, one line per probe level, and the budgets (drawn by "
        "scripts/report.py from the run file; needs the Python environment of scripts/setup.sh)")(
        "corpus,c", po::value(&corpus_arg)->default_value("default"),
        "calibration text when computing afresh: a file, a directory, JSONL, or 'default'")(
        "text-field", po::value(&text_field)->default_value("text"),
        "JSONL field holding the text")("storage", po::value(&storage)->default_value("f32"),
                                        "weight storage: f32, bf16 or f16")(
        "strict", po::bool_switch(&strict), "NaN/Inf in the weights is an error, not a warning")(
        "masking", po::value(&masking_arg)->default_value("auto"),
        "which sensitivities: those probed with threshold, topk or guided masking (auto: "
        "threshold for the plain model, guided for the rotated one)")(
        "positions-from", po::value(&positions_from)->default_value(0),
        "which sensitivities: those over the positions ≥ this of each sequence (0: all; see "
        "calibrate --sensitivity-from)")(
        "progress", po::value(&progress_arg)->default_value("auto"),
        "progress on stderr, per stage with its ETA: auto (a bar on a terminal, else a line per "
        "tenth of each stage), always (bar), lines, never");
    cc.add(d);
    add_common_options(d, co);
  }

  void check(const po::variables_map& vm) {
    require(!out.empty(), "profile: --out FILE.h5 is required");
    require(variant == "plain" || variant == "rotated",
            "--variant must be plain or rotated, got '{}'", variant);
    br.sparsity = parse_double_list(sparsity_arg, "--sparsity");
    for (double v : br.sparsity)
      require(std::isfinite(v) && v >= 0 && v < 1, "--sparsity: {} is outside [0, 1)", v);
    require(std::isfinite(br.lambda) && br.lambda >= 0, "--lambda {} must be ≥ 0", br.lambda);
    require(std::isfinite(br.probe), "--probe {} is not a number", br.probe);
    pmode = progress_mode(progress_arg, ProgressBar::Mode::Lines);
    rule = masking_arg == "auto"
               ? (variant == "plain" ? sparsity::ProbeRule::Threshold : sparsity::ProbeRule::Guided)
               : sparsity::parse_probe_rule(masking_arg);
    require(positions_from >= 0, "--positions-from {} is negative", positions_from);
    from_file = !calib_path.empty();
    if (from_file) {
      std::vector<std::string> afresh = {"corpus", "text-field"};
      afresh.insert(afresh.end(), CalibrateCli::names().begin(), CalibrateCli::names().end());
      for (const std::string& o : afresh)
        require(vm[o].defaulted(),
                "--{} is only used when computing the profile afresh, not with --calibration", o);
    }
    load = !from_file || !model_arg.empty();
    if (model_arg.empty()) model_arg = "smollm2";
  }
};

/// The profile's sensitivities from the calibration file (the model, if loaded, is checked
/// against it later).
Profile profile_from_file(const ProfileArgs& a, const sparsity::Calibration& cal) {
  Profile p;
  p.variant = a.variant;
  const auto& var = a.variant == "plain" ? cal.plain : cal.rotated;
  require(var.has_value(), "calibration file {} has no {} calibration", a.calib_path, a.variant);
  require(!var->sensitivity.empty(), "calibration file {} has no sensitivities for the {} model",
          a.calib_path, a.variant);
  const sparsity::Sensitivity& set =
      pick_set(*var, a.rule, a.positions_from, "calibration file " + a.calib_path);
  p.source = "calibration file";
  p.calibration_file = a.calib_path;
  p.model_fingerprint = cal.model_fingerprint;
  p.model_path = cal.model_path;
  p.corpus_fingerprint = cal.corpus_fingerprint;
  p.corpus_path = cal.corpus_path;
  p.n_layer = cal.n_layer;
  p.probe_levels = cal.probe_levels;
  p.sensitivity = set.e;
  p.set = set.describe();
  return p;
}

/// The sensitivities computed afresh: the greedy and the probes of calibrate, for the one set
/// shown.
template <class E>
void compute_profile(const ProfileArgs& a, std::shared_ptr<const Weights<E>> w,
                     const ResolvedModel& rm, const Corpus& corpus, DType storage, Profile& p) {
  const sparsity::CalibrateOptions& opt = a.cc.opt;
  const Config& c = w->cfg;
  require(opt.context <= c.context_length && opt.greedy_tokens <= c.context_length,
          "--context / --greedy-tokens exceed the model's context of {}", c.context_length);
  const Tokenizer tok = tokenizer_for(rm.path);
  const std::vector<int> stream = corpus_stream(corpus, tok);
  log().info("calibration corpus {}: {} tokens", corpus.source, stream.size());
  p.corpus_fingerprint = corpus.fingerprint;
  p.corpus_path = corpus.source;
  CalibrationProgress prog(a.pmode);
  sparsity::CalibrationVariant v;
  if (a.variant == "rotated") {
    log().info("computing the WINA rotation");
    const sparsity::Rotation rot = sparsity::compute_rotation(*w);
    std::shared_ptr<const Weights<E>> wr = sparsity::apply_rotation(*w, rot, storage);
    sparsity::calibrate_variant<E>(wr, stream, opt, sparsity::ProbeMasking::Guided, v,
                                   prog.callback(a.variant));
  } else {
    sparsity::calibrate_variant<E>(w, stream, opt, sparsity::ProbeMasking::Threshold, v,
                                   prog.callback(a.variant));
  }
  prog.finish();
  const sparsity::Sensitivity& set = pick_set(v, a.rule, a.positions_from, "the computed profile");
  p.sensitivity = set.e;
  p.set = set.describe();
}

}  // namespace

int cmd_profile(int argc, char** argv) {
  ProfileArgs a;
  po::options_description d("sparsim profile options");
  a.add_options(d);
  po::variables_map vm;
  if (!parse(argc, argv,
             "usage: sparsim profile --out FILE.h5 (--calibration FILE [--model M] | [--model M] "
             "[--corpus C]) [--plot FILE.png] [options]",
             d, vm))
    return 0;

  // Every check that can fail runs before anything is loaded or written.
  a.check(vm);
  sparsity::CalibrateOptions& opt = a.cc.opt;
  const BudgetRequest& br = a.br;
  std::optional<ResolvedModel> rm_;
  if (a.load) rm_ = resolve_model(a.model_arg);
  io::guard_run({{"--calibration", a.calib_path},
                 {"--model", a.load ? rm_->path : ""},
                 {"--corpus", a.from_file ? "" : corpus_input_path(a.corpus_arg)}},
                {{"--out", a.out}, {"--plot", a.plot}});

  Profile p;
  std::optional<sparsity::Calibration> cal;
  if (a.from_file) {
    cal = sparsity::read_calibration(a.calib_path);
    p = profile_from_file(a, *cal);
  } else {
    a.cc.finish();
    p.variant = a.variant;
    p.source = "computed";
    p.probe_levels = opt.probes;
    // compute only the set that is shown
    opt.probe_rules = {a.rule};
    opt.sensitivity_from = {a.positions_from};
    require(a.positions_from < opt.greedy_tokens,
            "--positions-from {} is outside the greedy sequences of {} tokens", a.positions_from,
            opt.greedy_tokens);
  }
  require(probe_index(p.probe_levels, br.probe) >= 0,
          "--probe {} is not among the probe levels ({}){}", br.probe, join_levels(p.probe_levels),
          a.from_file ? " of " + a.calib_path : "");
  if (!a.plot.empty()) check_report_tool();

  if (!a.load) {
    // The calibration file alone: no model, no Kokkos. /run and /model come from the file.
    publish(p, br, a.out, a.plot, [&](io::Group root) {
      write_run_group(root, argc, argv);
      io::Group m = root.create_group("model");
      m.set_attr("path", cal->model_path);
      m.set_attr("fingerprint", cal->model_fingerprint);
      m.set_attr("n_layer", cal->n_layer);
      m.set_attr("d_model", cal->d_model);
      m.set_attr("d_ff", cal->d_ff);
      m.set_attr("checked", 0);
    });
    return 0;
  }

  LoadOptions lo;
  lo.storage = parse_dtype(a.storage);
  lo.strict = a.strict;
  const ResolvedModel& rm = *rm_;
  Corpus corpus;
  if (!a.from_file) corpus = load_corpus_arg(a.corpus_arg, CorpusOptions{a.text_field});

  Runtime rt(a.co);
  const std::string backend = resolve_backend(a.co.backend);
  return with_backend(a.co.backend, [&](auto exec) {
    using E = decltype(exec);
    Stopwatch wall;
    ModelInfo mi;
    std::shared_ptr<const Weights<E>> w = load_model<E>(rm.path, lo, &mi);
    const Config& c = w->cfg;
    p.model_checked = true;
    p.model_fingerprint = mi.fingerprint;
    p.model_path = mi.path;
    p.n_layer = c.n_layer;
    if (cal)
      cal->check_model(mi.fingerprint, c, mi.path);
    else
      compute_profile(a, w, rm, corpus, lo.storage, p);
    publish(p, br, a.out, a.plot, [&](io::Group root) {
      write_run_header(root, argc, argv, backend, rt.threads(), mi, c, lo.storage);
    });
    log().info("profile: {:.1f} s", wall.seconds());
    return 0;
  });
}

}  // namespace sparsim::app
