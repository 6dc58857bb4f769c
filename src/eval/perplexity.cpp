#include "eval/perplexity.hpp"

#include "core/backends.hpp"
#include "core/error.hpp"
#include "core/interrupt.hpp"
#include "kernels/loss.hpp"

#include <algorithm>
#include <cmath>

namespace sparsim {

void PplOptions::check_values() const {
  require_setting(context >= 2, "perplexity.context", "the window length",
                  "must be at least 2 tokens (one predicts the next), got {}", context);
  require_setting(stride >= 1, "perplexity.stride", "the window stride",
                  "must be at least 1, got {}", stride);
  require_setting(score >= 1 && score < context, "perplexity.score",
                  "the number of scored tokens per window",
                  "{} must be between 1 and the context minus one ({})", score, context - 1);
  require_setting(batch >= 1, "perplexity.batch", "the number of windows per forward pass",
                  "must be at least 1, got {}", batch);
  require_setting(max_windows >= 0, "perplexity.max_windows", "the window limit",
                  "must be non-negative, got {}", max_windows);
}

void PplOptions::validate(int model_context) const {
  check_values();
  require_setting(model_context <= 0 || context <= model_context, "perplexity.context",
                  "the window length", "{} is longer than the model supports ({} tokens)", context,
                  model_context);
}

std::vector<std::size_t> window_starts(std::size_t n, const PplOptions& o) {
  const std::size_t body = o.context - (o.bos_id >= 0 ? 1 : 0);  // stream tokens per window
  std::vector<std::size_t> s;
  for (std::size_t start = 0; start + body <= n; start += o.stride) {
    s.push_back(start);
    if (o.max_windows > 0 && static_cast<int>(s.size()) == o.max_windows) break;
  }
  return s;
}

double PplResult::perplexity() const {
  return tokens_scored ? std::exp(nll_sum / static_cast<double>(tokens_scored)) : 0.0;
}

template <class E>
Mat<E> run_scored(Engine<E>& eng, const std::vector<std::vector<int>>& seqs, int tail) {
  const int T = static_cast<int>(seqs[0].size()), P = T - tail;
  ChannelSelector<E>* sel = eng.channel_selector();
  const bool compacts = sel && sel->compacts();
  const bool evicts = eng.token_evictor() && eng.token_evictor()->evicts(P);
  if (!compacts && !evicts) {
    eng.set_sparse_from(P);
    Mat<E> logits = eng.forward_tail(seqs, 0, tail);
    eng.set_sparse_from(Engine<E>::kDecodeOnly);
    return logits;
  }
  // K-cache channel pruning and token eviction happen once per prefill: the prefix is
  // prefilled (its attention reads the full cache), the selector compacts its cached keys and
  // the evictor masks the tokens it evicts, and the scored rows then run as one call against
  // that cache, as decoded tokens do (their own keys and values all kept, full width).
  const int w_obs = compacts ? sel->observation_window() : 0;
  require(P >= w_obs,
          "K-channel pruning: the observation window of {} queries is longer than the {} "
          "prefilled tokens before the scored ones",
          w_obs, P);
  std::vector<std::vector<int>> pre, post;
  for (const auto& s : seqs) {
    pre.emplace_back(s.begin(), s.begin() + P);
    post.emplace_back(s.begin() + P, s.end());
  }
  eng.set_sparse_from(P);  // no row of the prefix
  eng.forward_tail(pre, 0, 1);
  eng.set_sparse_from(0);
  Mat<E> logits = eng.forward_tail(post, P, tail);
  eng.set_sparse_from(Engine<E>::kDecodeOnly);
  return logits;
}

template <class E>
PplResult perplexity(Engine<E>& eng, const std::vector<int>& stream, const PplOptions& o,
                     const Progress& progress, PplResume* resume) {
  o.validate(eng.config().context_length);
  require(o.context <= eng.max_ctx() && o.batch <= eng.max_seqs(),
          "perplexity: engine sized for {} x {} tokens, need {} x {}", eng.max_seqs(),
          eng.max_ctx(), o.batch, o.context);
  const auto starts = window_starts(stream.size(), o);
  require(
      !starts.empty(),
      "the corpus has {} tokens, fewer than one window of {} (a shorter window or a longer corpus)",
      stream.size(), o.context);
  const int C = o.context, S = o.score, tail = S + 1;
  const int bos = o.bos_id >= 0 ? 1 : 0;
  PplResult res;
  if (resume) {
    res = resume->done;
    const std::size_t k = res.window_nll.size();
    require(k <= starts.size() && res.window_start.size() == k && res.window_tokens.size() == k &&
                std::equal(res.window_start.begin(), res.window_start.end(), starts.begin()),
            "perplexity: the {} windows to resume from are not the first windows of this run", k);
  }
  Kokkos::View<double*, DeviceOf<E>> nll("sparsim::eval::nll", o.batch * tail);
  IVec<E> target("sparsim::eval::target", o.batch * tail),
      amax("sparsim::eval::argmax", o.batch * tail);
  auto h_target = Kokkos::create_mirror_view(target);
  const int total = static_cast<int>(starts.size());
  for (int w0 = static_cast<int>(res.window_nll.size()); w0 < total; w0 += o.batch) {
    const int nb = std::min(o.batch, total - w0);
    std::vector<std::vector<int>> seqs(nb);
    for (int b = 0; b < nb; ++b) {
      auto& s = seqs[b];
      s.reserve(C);
      if (bos) s.push_back(o.bos_id);
      s.insert(s.end(), stream.begin() + starts[w0 + b], stream.begin() + starts[w0 + b] + C - bos);
      // Logit row i (position C − tail + i) predicts the token at position C − tail + i + 1;
      // the last row predicts past the window and is not scored.
      for (int i = 0; i < tail; ++i)
        h_target(b * tail + i) = i + 1 < tail ? s[C - tail + i + 1] : -1;
    }
    Kokkos::deep_copy(target, h_target);
    // Activation sparsity (when the engine has a masker) applies to the rows whose logits are
    // scored; the context prefix stays dense.
    const Mat<E> logits = run_scored(eng, seqs, tail);
    Kokkos::View<double*, DeviceOf<E>> nll_b(nll.data(), nb * tail);
    IVec<E> tgt_b(target.data(), nb * tail), am_b(amax.data(), nb * tail);
    nll_rows(eng.exec(), CMat<E>(logits), tgt_b, nll_b, am_b);
    auto hn = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), nll);
    auto ha = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), amax);
    for (int b = 0; b < nb; ++b) {
      double wsum = 0;  // fixed order: position by position
      for (int i = 0; i < S; ++i) {
        wsum += hn(b * tail + i);
        if (ha(b * tail + i) == h_target(b * tail + i)) ++res.argmax_hits;
      }
      res.window_nll.push_back(wsum);
      res.window_tokens.push_back(S);
      res.window_start.push_back(starts[w0 + b]);
      res.nll_sum += wsum;
      res.tokens_scored += S;
    }
    if (progress) progress(w0 + nb, total);
    if (resume && resume->after_batch) resume->after_batch(res);
    interruption_point("forward");
  }
  return res;
}

template <class E>
double loglikelihood(Engine<E>& eng, const std::vector<int>& context,
                     const std::vector<int>& continuation, bool* greedy) {
  require(!context.empty(), "loglikelihood: empty context");
  require(!continuation.empty(), "loglikelihood: empty continuation");
  std::vector<int> seq = context;
  seq.insert(seq.end(), continuation.begin(), continuation.end());
  const int T = static_cast<int>(seq.size());
  require(T <= eng.max_ctx(), "a task item of {} tokens exceeds the context of {}", T,
          eng.max_ctx());
  const int tail = static_cast<int>(continuation.size()) + 1;
  IVec<E> target("sparsim::eval::target", tail), amax("sparsim::eval::argmax", tail);
  Kokkos::View<double*, DeviceOf<E>> nll("sparsim::eval::nll", tail);
  auto ht = Kokkos::create_mirror_view(target);
  for (int i = 0; i < tail; ++i) ht(i) = i + 1 < tail ? continuation[i] : -1;
  Kokkos::deep_copy(target, ht);
  const Mat<E> logits = run_scored(eng, {seq}, tail);  // the rows that score the continuation
  nll_rows(eng.exec(), CMat<E>(logits), target, nll, amax);
  auto hn = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), nll);
  auto ha = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), amax);
  double ll = 0;
  bool all = true;
  for (int i = 0; i + 1 < tail; ++i) {
    ll -= hn(i);
    all = all && ha(i) == continuation[i];
  }
  if (greedy) *greedy = all;
  return ll;
}

#define SPARSIM_INSTANTIATE_EVAL(E)                                                              \
  template Mat<E> run_scored<E>(Engine<E>&, const std::vector<std::vector<int>>&, int);          \
  template PplResult perplexity<E>(Engine<E>&, const std::vector<int>&, const PplOptions&,       \
                                   const Progress&, PplResume*);                                 \
  template double loglikelihood<E>(Engine<E>&, const std::vector<int>&, const std::vector<int>&, \
                                   bool*);
SPARSIM_FOR_EACH_BACKEND(SPARSIM_INSTANTIATE_EVAL)

}  // namespace sparsim
