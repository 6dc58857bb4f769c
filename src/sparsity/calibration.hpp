#pragma once
/// Host-side data of activation-sparsity calibration (METHODS.md §1): the greedy per-projection
/// allocation (paper 000, Appendix D), the sensitivity-aware block budgets (Sec. 2.2, Eq. 5) and
/// the calibration file `sparsim calibrate` writes (layout: docs/run-file-schema.md, "Calibration
/// file"). Plain host code; the model enums come from model/weights.hpp.
#include "calibration/fisher_scores.hpp"
#include "calibration/probe_history.hpp"
#include "model/config.hpp"
#include "model/weights.hpp"
#include "sparsity/histogram.hpp"

#include <array>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace sparsim::sparsity {

// ---------------------------------------------------------------------------------------------
// Greedy per-projection allocation

/// Default base step α of the greedy search (paper: 0.025).
inline constexpr double kDefaultGreedyAlpha = 0.025;
/// Default stopping point of the greedy search: stop once P >= 0.95 (the paper runs to P = 1).
inline constexpr double kDefaultGreedyCap = 0.95;

/// The table traced by greedy_allocate for one block of n matrices.
struct GreedyTable {
  /// Number of matrices n (7 for a Llama block, in Proj order).
  std::size_t n = 0;
  /// One row per committed step, each of 1 + n entries (P, p_1, …, p_n): P = Σ p_i f_i / F the
  /// block's parameter-weighted sparsity, p_i in [0, 1] the sparsity of matrix i. rows[0] is the
  /// start, all zeros; P is nondecreasing down the table.
  std::vector<std::vector<double>> rows;

  bool empty() const { return rows.empty(); }
  /// The row whose P is nearest to `P` (ties → the row with the lower P, i.e. the earlier one).
  /// Throws sparsim::Error for an empty table or a NaN P.
  const std::vector<double>& nearest(double P) const;
  /// The point on the path between consecutive rows whose P equals `P` (clamped to the table's
  /// first and last P): (P, p) linearly interpolated between the rows a and b = a + 1 with
  /// P_a <= P <= P_b. Consecutive rows differ in one matrix, so only that p_i takes a value
  /// between two steps; the row's P is exactly `P` (P is linear in p). Throws as nearest().
  std::vector<double> interpolate(double P) const;
};

/// Error of the block with the given per-matrix sparsities p (size n); lower is better.
using BlockErrorFn = std::function<double(const std::vector<double>& p)>;

/// The greedy search's view of the block: `error(p, i)` is the error with the sparsities p, which
/// differ from the last committed ones in matrix i only; `commit(i, p)` (optional) is called when
/// the step of matrix i is taken, with the new committed p. Lets an evaluator keep the committed
/// state and recompute only what matrix i changes.
struct GreedyEvaluator {
  std::function<double(const std::vector<double>& p, std::size_t changed)> error;
  std::function<void(std::size_t chosen, const std::vector<double>& p)> commit;
};

/// Step of matrix i: α·F/f_i (paper), or min(α·F/f_i, step_cap) when step_cap > 0.
double greedy_step(double alpha, double F, double f_i, double step_cap = 0.0);

/// Greedy per-matrix allocation (paper 000, Appendix D, Algorithm 1). `f`: parameter counts of the
/// n matrices (a zero entry = matrix absent: it never moves and keeps p = 0); F = Σ f_i.
/// From p = 0, each step tentatively raises every movable p_i (p_i < 1, f_i > 0) by its step
/// (greedy_step: α·F/f_i, capped at step_cap when that is > 0), clipped to 1, evaluates
/// E_i = block_error(p) on that tentative vector, undoes it, then commits the argmin (ties → the
/// lowest index) and records (P, p). p_i after k steps is min(1, k·step_i) (computed from the step
/// count, so no rounding drift). Stops when P >= cap or no matrix can move. Throws sparsim::Error
/// for bad arguments or a NaN error value (+inf is allowed).
GreedyTable greedy_allocate(const std::vector<double>& f, double alpha, double cap,
                            const BlockErrorFn& block_error);
GreedyTable greedy_allocate(const std::vector<double>& f, double alpha, double cap, double step_cap,
                            const GreedyEvaluator& eval);

// ---------------------------------------------------------------------------------------------
// Sensitivity-aware block budgets

/// s_i = clamp(s + λ(ē − e_i), lo, hi), ē = mean of e (paper 000, Eq. 5): less sensitive blocks
/// (small e_i) get more sparsity. The clamp can move the mean away from s. Throws for an empty or
/// non-finite e, or lo > hi.
std::vector<double> block_budgets(const std::vector<double>& e, double s, double lambda,
                                  double lo = 0.05, double hi = 0.95);

// ---------------------------------------------------------------------------------------------
// Calibration file

/// Value of the root attribute "format" of a calibration file.
inline constexpr const char* kCalibrationFormat = "sparsim-calibration";
/// Layout version written and the only one read.
inline constexpr std::int64_t kCalibrationVersion = 2;

/// Sites that carry a histogram, in storage order (BlockIn has none).
inline constexpr int kNumHistogramSites = 4;
inline constexpr std::array<Site, kNumHistogramSites> kHistogramSites = {Site::Attn, Site::O,
                                                                         Site::Mlp, Site::Down};
/// Position of `s` in kHistogramSites; throws sparsim::Error for Site::BlockIn.
int histogram_slot(Site s);

/// The masking rule a block was sparsified with while its sensitivity was probed.
enum class ProbeRule { Threshold, TopK, Guided };
/// "threshold", "topk", "guided"; parse_probe_rule throws for anything else.
const char* probe_rule_name(ProbeRule r);
ProbeRule parse_probe_rule(const std::string& s);

/// The block sensitivities of one probing setup (paper 000, Sec. 2.2, Eq. 4): e[k][i] is, for
/// probe level probe_levels[k], the mean over the calibration sequences x of
/// ‖f_i(x) − f̂_i(x; s̄)‖₂ / (‖f_i(x)‖₂ + ε), where f_i(x) is block i's output (residual stream
/// included) at positions `from` … T−1 of the sequence, and f̂_i the same with only block i
/// sparsified by the greedy row nearest s̄, masked by `rule`. from = 0 averages over every token;
/// from > 0 leaves out the first positions (the attention-sink tokens, whose residual stream is
/// much larger than the others').
struct Sensitivity {
  ProbeRule rule = ProbeRule::Guided;
  double delta = 0.0;      ///< Guided: clip margin δ (0 for the other rules)
  bool norms_all = false;  ///< TopK / Guided: column norms on every projection (false: k, gate)
  int from = 0;            ///< first position of each sequence that counts
  std::vector<std::vector<double>> e;  ///< [probe][layer]

  /// Whether this set was probed as an evaluation with these settings masks (delta compared to
  /// 1e-9; for Threshold delta and norms_all do not matter).
  bool matches(ProbeRule r, double d, bool all, int first) const;
  /// "guided (δ = 0.01, norms k,gate, positions ≥ 0)" and the like.
  std::string describe() const;
};

/// Everything calibrated for one form of the model.
struct CalibrationVariant {
  /// histograms[layer][slot], slot = histogram_slot(site): the signed activations at that site
  /// over the calibration tokens. Required: one entry per layer, every histogram finished.
  std::vector<std::array<Histogram, kNumHistogramSites>> histograms;
  /// greedy[layer]: the block's greedy table over the 7 projections in Proj order (n = 7), scored
  /// on the last greedy_score_fraction of each greedy sequence. Empty = not computed; otherwise one
  /// table per layer, each with at least its all-zero first row.
  std::vector<GreedyTable> greedy;
  /// Block sensitivities, one set per probing setup (rule, δ, norms, first position). Each set
  /// has probe_levels.size() rows of n_layer values. Empty = not computed.
  std::vector<Sensitivity> sensitivity;
  /// The set probed with these settings, or nullptr.
  const Sensitivity* find_sensitivity(ProbeRule r, double delta, bool norms_all, int from) const;
  /// WINA rotations Q_attn,i, i = 0..L (index L is Q_final), row-major [L + 1][D][D]: element
  /// (r, c) of Q_attn,i at ((i·D) + r)·D + c. Empty = not stored (rotated variant only).
  std::vector<double> q_attn;
  /// WINA rotations Q_mlp,i, i = 0..L−1, row-major [L][D][D] as q_attn. Empty = not stored.
  std::vector<double> q_mlp;
  /// col_norms[proj][layer·d_in + j] = ‖W_:,j‖₂ of that projection's (rotated, norm-folded)
  /// weight in that layer, j < d_in(proj) (Calibration::d_in). Each entry empty = not stored.
  std::array<std::vector<float>, kNumProj> col_norms;
};

/// The contents of a calibration file (see docs/run-file-schema.md, "Calibration file").
struct Calibration {
  /// Model identity: ModelInfo::fingerprint (16 hex digits) and the path it was loaded from.
  std::string model_fingerprint;
  std::string model_path;
  /// Calibration text identity: eval::Corpus fingerprint (16 hex digits) and its source path.
  std::string corpus_fingerprint;
  std::string corpus_path;
  /// Model shape (Config): blocks, hidden size, MLP size, query and key/value widths.
  int n_layer = 0;
  int d_model = 0;
  int d_ff = 0;
  int q_dim = 0;
  int kv_dim = 0;
  /// Calibration tokens that went into the histograms (all windows together).
  std::int64_t tokens = 0;
  /// Tokens per calibration window (sequence length).
  int context = 0;
  /// Calibration windows (sequences) used.
  std::int64_t windows = 0;
  /// Greedy base step α and the P at which the greedy search stopped.
  double alpha = kDefaultGreedyAlpha;
  double greedy_cap = kDefaultGreedyCap;
  /// Tokens fed to each greedy block-error evaluation (all greedy sequences together).
  std::int64_t greedy_tokens = 0;
  /// Greedy / sensitivity sequences and the tokens of each (greedy_tokens = their product).
  int greedy_seqs = 0;
  int greedy_seq_tokens = 0;
  /// Cap on each matrix's greedy step (0: none, the paper's α·F/f_i).
  double greedy_step_cap = 0.0;
  /// Fraction of each greedy sequence, at its end, whose block-output error is scored (TEAL: 0.25).
  double greedy_score_fraction = 0.25;
  /// Values buffered to fix each histogram's range (Histogram::range_values).
  std::int64_t histogram_range_values = std::int64_t{1} << 20;
  /// Probe sparsities s̄ of the sensitivity measurement, one per sensitivity row (may be empty).
  std::vector<double> probe_levels;
  /// The command line that made the file (informational; may be empty).
  std::string command;
  /// Wall and CPU seconds of each calibration stage, in the order run (informational).
  struct Timing {
    std::string stage;
    double wall_seconds = 0;
    double cpu_seconds = 0;
  };
  std::vector<Timing> timings;
  /// Unrotated model (TEAL). Absent = not calibrated.
  std::optional<CalibrationVariant> plain;
  /// WINA-rotated model (WINA, TopK-Guided). Absent = not calibrated.
  std::optional<CalibrationVariant> rotated;
  /// Fisher scores of the K and V channels (RAP, KVPruner). Absent = not calibrated.
  std::optional<calibration::FisherScores> fisher;
  /// Probe Pruning's historical states (mean x² of the W_o / W_down inputs per position). Absent =
  /// not calibrated.
  std::optional<calibration::ProbeHistory> probe_history;

  /// Set by read_calibration to the path read (not stored in the file); used in messages.
  std::string file;

  /// Input width of projection p: q_dim for O, d_ff for Down, d_model otherwise.
  int d_in(Proj p) const;
  /// Throws sparsim::Error unless this calibration was made for the model with this fingerprint
  /// (16 hex digits, ModelInfo::fingerprint, compared case-insensitively) and shape. `what` names
  /// the model in the message, e.g. its path: "calibration file X was made for model fingerprint
  /// A (path P), this model (what) is B".
  void check_model(const std::string& fingerprint, const Config& cfg,
                   const std::string& what) const;
  /// The same with the fingerprint as a number (formatted as 16 hex digits).
  void check_model(std::uint64_t fingerprint, const Config& cfg, const std::string& what) const;
  /// Throws sparsim::Error naming the first field that is inconsistent (sizes against n_layer and
  /// the widths, non-finite or out-of-range numbers, unfinished histograms).
  void validate() const;
};

/// Writes `cal` to `path` atomically (temporary file + rename; nothing is left at `path` or beside
/// it when this throws). Validates first.
void write_calibration(const std::string& path, const Calibration& cal);
/// Reads and validates a calibration file. Throws sparsim::Error naming the file and the problem
/// (not HDF5, wrong format or version, missing group/dataset/attribute, wrong shape, NaN, ...).
Calibration read_calibration(const std::string& path);

}  // namespace sparsim::sparsity
