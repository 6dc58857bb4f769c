#pragma once
/// Sliding-window perplexity (the TEAL / WINA protocol: windows of C tokens every R tokens,
/// scoring the last S tokens of each window) and multiple-choice scoring.
#include "engine/engine.hpp"

#include <functional>
#include <string>
#include <vector>

namespace sparsim {

struct PplOptions {
  int context = 2048;   ///< C: tokens per window (including the BOS token when one is added)
  int stride = 512;     ///< R: tokens between window starts
  int score = 512;      ///< S: trailing positions of each window that are scored
  int batch = 1;        ///< windows per forward pass
  int max_windows = 0;  ///< 0: all
  int bos_id = -1;      ///< prepended to every window when >= 0
  /// What needs no model: throws OptionError naming the quantity at fault.
  void check_values() const;
  /// check_values(), and the window against the model's context (0: not known yet).
  void validate(int model_context) const;
};

/// The windows a token stream yields: start offsets into the stream.
std::vector<std::size_t> window_starts(std::size_t stream_len, const PplOptions& o);

struct PplResult {
  double nll_sum = 0;  ///< nats, over all scored tokens
  std::uint64_t tokens_scored = 0;
  std::vector<double> window_nll;  ///< per window, summed nats
  std::vector<std::uint64_t> window_tokens;
  std::vector<std::uint64_t> window_start;
  std::uint64_t argmax_hits = 0;  ///< scored tokens the model ranked first
  double perplexity() const;
};

/// Progress callback: windows done, windows total.
using Progress = std::function<void(int, int)>;

/// Runs sequences of equal length T and returns the logits of their last `tail` positions
/// ([n_seq·tail][vocab]), the scored rows: activation sparsity applies to them, the prefix
/// stays dense. With a K-cache channel selector or a token evictor on the engine, the prefix
/// (T − tail tokens) is one prefill whose keys the selector compacts and whose tokens the
/// evictor evicts, and the scored rows a second call against that cache; the prefix must hold
/// the selector's observation window.
template <class E>
Mat<E> run_scored(Engine<E>& eng, const std::vector<std::vector<int>>& seqs, int tail);

/// A resumable run: the first windows are taken from `done` (what an earlier run of the same
/// stream and options computed) instead of being run again, and `after_batch` sees the result
/// after every batch. Windows do not depend on the batch they ran in (bitwise), so a resumed
/// run gives the same result as one that was never interrupted.
struct PplResume {
  PplResult done;
  std::function<void(const PplResult&)> after_batch;
};

/// Interruption points: between batches ("forward") and in the engine's layers.
template <class E>
PplResult perplexity(Engine<E>& eng, const std::vector<int>& stream, const PplOptions& o,
                     const Progress& progress = {}, PplResume* resume = nullptr);

/// Summed log-likelihood (nats) of `continuation` after `context`, scored in one forward pass.
template <class E>
double loglikelihood(Engine<E>& eng, const std::vector<int>& context,
                     const std::vector<int>& continuation, bool* greedy = nullptr);

}  // namespace sparsim
