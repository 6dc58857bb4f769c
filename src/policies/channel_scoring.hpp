#pragma once
/// K-cache channel scoring and selection of one (sequence, KV head): ThinK and GRACE.
///
/// Inputs are the two d×d Gram matrices of the head, in double precision:
///   G_Q = Q_obsᵀ Q_obs   (the last w queries; for GQA the group's query heads stacked as rows,
///                         so G_Q is the sum of the heads' Grams)
///   G_K = K0ᵀ K0          (the prompt's keys after RoPE)
/// With node weights w_i = G_Q[i,i]·G_K[i,i] (= ‖q_i‖²‖k_i‖²) and edge weights
/// w_ij = 2·G_Q[i,j]·G_K[i,j] (= 2(q_iᵀq_j)(k_iᵀk_j)), pruning the channel set P changes the
/// attention logits Q Kᵀ by exactly Q_P K_Pᵀ, and
///   ‖Q_P K_Pᵀ‖_F² = Σ_{i∈P} w_i + Σ_{i<j∈P} w_ij = Σ_{i,j∈P} G_Q[i,j]·G_K[i,j].
///
/// - ThinK prunes the ⌊λd⌋ channels of lowest node weight (independent scores; ThinK's reference
///   code prunes int(λ·d) channels).
/// - GRACE protects the salient channels (‖k_i‖ > mean + std of the d key-channel norms; their
///   share clamped to [a, b]) and runs MIES on the others: greedily add to P the candidate of
///   smallest s_k = w_k + Σ_{j∈P} w_kj, updating every s_k by w_km after m joins P (O(d) per
///   step, O(d²) per head): the published method. MIES is greedy; with the guard on (an option,
///   off by default) GRACE then takes
///   ThinK's choice among the same candidates when that scores lower on the objective, so GRACE
///   is never worse than ThinK restricted to the unprotected channels (and never worse than
///   ThinK itself whenever ThinK's choice prunes no protected channel).
///
/// Ties are broken by the lower channel index, so every choice is deterministic.
#include <string>
#include <vector>

namespace sparsim::pruning {

enum class KvMethod { Think, Grace };
const char* to_string(KvMethod m);

/// Gram matrices of one (sequence, KV head), d×d row-major.
struct HeadGram {
  int d = 0;
  std::vector<double> gq, gk;
  double q(int i, int j) const { return gq[static_cast<std::size_t>(i) * d + j]; }
  double k(int i, int j) const { return gk[static_cast<std::size_t>(i) * d + j]; }
  /// w_i = ‖q_i‖²‖k_i‖²
  double node(int i) const { return q(i, i) * k(i, i); }
  /// w_ij = 2(q_iᵀq_j)(k_iᵀk_j)
  double edge(int i, int j) const { return 2.0 * q(i, j) * k(i, j); }
};

/// Builds the Grams of Q [m][d] and K [n][d] (row-major) in double precision.
HeadGram gram_of(const std::vector<double>& q, int m, const std::vector<double>& k, int n, int d);

/// ‖Q_P K_Pᵀ‖_F² from the Grams: Σ_{i,j∈P} G_Q[i,j]·G_K[i,j] (P: distinct channel indices).
double pruned_error(const HeadGram& g, const std::vector<int>& pruned);
/// ‖Q Kᵀ‖_F²: the error of pruning every channel.
double total_energy(const HeadGram& g);

/// Channels pruned per head: ⌊λd⌋, as ThinK's reference code (λd within 1e−9 of an integer
/// counts as that integer).
int prune_count(double lambda, int d);

/// Options of ThinK / GRACE.
struct KvPruneOptions {
  KvMethod method = KvMethod::Think;
  double lambda = 0.5;       ///< pruned fraction of each head's key channels, in [0, 1)
  int window = 32;           ///< w: observed queries (the last w of the prompt)
  double protect_lo = 0.05;  ///< a: GRACE's lower bound on the protected share
  double protect_hi = 0.25;  ///< b: GRACE's upper bound on the protected share
  bool guard = false;        ///< GRACE: fall back to ThinK's choice on the candidates if lower
  /// The last `recent` prompt keys stay at full width (ThinK's reference code: recent_size = 32);
  /// only the keys before them are compacted. 0: the whole prompt is compacted.
  int recent = 32;
  /// What needs no model: throws OptionError naming the quantity for λ outside [0, 1), w < 1,
  /// a negative recent window, [a, b] not within 0 ≤ a ≤ b < 1.
  void check_values() const;
  /// check_values(), and for heads of `head_dim` channels: λ leaving a head with none, or a
  /// lower bound a that needs more protected channels than the ⌊λd⌋ pruned ones leave.
  void validate(int head_dim) const;
};

/// ThinK: the `n` candidates of lowest node weight, in ascending (weight, index) order.
/// `candidate` (size d; empty: every channel) marks the channels that may be pruned.
std::vector<int> think_prune(const HeadGram& g, int n, const std::vector<char>& candidate = {});

/// GRACE's salient-channel protection for a head that prunes `n_prune` channels.
struct Protection {
  std::vector<char> is_protected;  ///< per channel
  int salient = 0;                 ///< channels with ‖k_i‖ > mean + std (before clamping)
  int count = 0;                   ///< channels protected
};
/// Norms ‖k_i‖ = √G_K[i,i]; threshold mean + std (sample standard deviation, n − 1) of the d
/// norms; count = clamp(salient, ⌈a·d⌉, ⌊b·d⌋), at most d − n_prune; the `count` largest norms
/// (ties: lower index) are protected.
Protection protect_salient(const HeadGram& g, double a, double b, int n_prune);

/// MIES: `pruned` in the order chosen; `increments[t]` the objective increase of step t (the
/// chosen candidate's score), `objective` their sum = ‖Q_P K_Pᵀ‖_F².
struct MiesResult {
  std::vector<int> pruned;
  std::vector<double> increments;
  double objective = 0;
};
MiesResult mies(const HeadGram& g, int n, const std::vector<char>& candidate = {});

/// What one head keeps and the reconstruction errors of both methods at the same λ.
struct HeadChoice {
  std::vector<int> kept;    ///< ascending
  std::vector<int> pruned;  ///< ascending
  double energy = 0;        ///< ‖Q Kᵀ‖_F²
  double err_think = 0;     ///< ‖Q_P K_Pᵀ‖_F² of ThinK's choice
  double err_mies = 0;      ///< … of MIES on GRACE's candidates (before the guard)
  double err_grace = 0;     ///< … of GRACE's choice (after the guard)
  int salient = 0, protected_count = 0;
  bool guard_used = false;  ///< GRACE took ThinK's choice on its candidates
  /// Relative errors ‖Q_P K_Pᵀ‖_F / ‖Q Kᵀ‖_F (0 when the energy is 0).
  double rel(double err) const;
};
/// Runs ThinK and GRACE on the head and keeps the channels of `opt.method`.
HeadChoice choose_channels(const HeadGram& g, const KvPruneOptions& opt);

}  // namespace sparsim::pruning
