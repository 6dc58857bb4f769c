#pragma once
/// Llama hyper-parameters, as read from a model file's metadata.
#include "core/rope_units.hpp"

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace sparsim {

/// Which dimensions RoPE rotates together.
enum class RopeLayout {
  Adjacent,  ///< (2j, 2j+1): the GGUF / llama.cpp layout
  Half       ///< (j, j + D/2): the Hugging Face rotate_half layout
};

/// Llama-3 style frequency scaling ("rope_scaling" with rope_type "llama3").
struct RopeScaling {
  bool enabled = false;
  float factor = 1.0f;
  float low_freq_factor = 1.0f;
  float high_freq_factor = 4.0f;
  int original_context = 8192;
};

/// Attention widths of one layer of a pruned model (RAP, KVPruner: METHODS.md §4). A reduced head
/// keeps its kept channels in ascending order of their channel in the full head, so the full
/// model's RoPE layout carries over: adjacent pairs stay adjacent, rotate_half pairs (j, j + D/2)
/// become (i, i + m) when m whole pairs are kept.
struct LayerAttention {
  int qk_dim = 0;  ///< per-head width of q and k (the same for every head of the layer)
  int v_dim = 0;   ///< per-head width of v and of each head's attention output
  /// Channel of the full head (0 … head_dim−1) of every kept K channel, [n_kv_head][qk_dim]
  /// flattened, strictly ascending within a head. The query heads of a group keep the same
  /// channels of W_q as their KV head keeps of W_k.
  std::vector<int> k_channels;
  /// Channel of the full head of every kept V channel, [n_kv_head][v_dim], ascending within a
  /// head. The query heads of a group keep the matching columns of W_o.
  std::vector<int> v_channels;
};

/// Low-rank keys and values of one layer (PaLU, SVD-LLM: METHODS.md §5): W_k ≈ B_k·A_k, the
/// KV heads taken `group` at a time (Config::lr_group), group g factorised at rank k_ranks[g]
/// (B_k block-diagonal, [n_kv·D][Σ ranks]; A_k [Σ ranks][d_model]); the cache holds the latent
/// A_k·x of every token, and keys are rebuilt as B_k·latent, then rotated, at attention time.
/// The same for V.
struct LayerLowRank {
  std::vector<int> k_ranks, v_ranks;  ///< rank of each group of KV heads
  int k_rank() const;                 ///< latent width of the keys (Σ k_ranks)
  int v_rank() const;
};

/// Structured pruning of one layer (FLAP, METHODS.md): whole query heads and whole FFN channels
/// removed. A KV head goes when every query head of its group goes; the kept query heads of a
/// layer are shared out evenly over its kept KV heads (the attention kernels' GQA grouping).
/// The outputs of W_o and W_down carry biases (Weights: o_bias, down_bias) that stand in for
/// the mean contribution of what was removed.
struct LayerStructure {
  std::vector<int> q_heads;  ///< kept query heads (their index in the full model), ascending
  std::vector<int> ffn;      ///< kept FFN channels (their index in the full model), ascending
};

/// How a pruned model was made (GGUF keys sparsim.prune.*); empty method = not pruned.
struct PruneRecord {
  std::string method;     ///< "rap", "kvpruner", "kvpruner-naive", "palu", "svd-llm" or "flap"
  double retain = 1.0;    ///< target mean retain ratio ρ
  int flops_context = 0;  ///< context the attention FLOP fraction is reported at
  std::string source_fingerprint;  ///< fingerprint of the model it was pruned from
  std::string calibration;         ///< model and corpus fingerprints of the Fisher scores
  /// the selection recipe ("score=fisher budget=adaptive pair=joint k_share=0.5 kv=balanced"; "" in
  /// files written before the recipe was recorded, which all used that default)
  std::string recipe;
};

struct Config {
  std::string name;        ///< general.name, informational
  int n_layer = 0;         ///< transformer blocks
  int d_model = 0;         ///< hidden size
  int n_head = 0;          ///< query heads
  int n_kv_head = 0;       ///< key/value heads (GQA: n_head % n_kv_head == 0)
  int head_dim = 0;        ///< per-head dimension
  int d_ff = 0;            ///< SwiGLU inner size
  int vocab = 0;           ///< vocabulary size
  int context_length = 0;  ///< trained context
  float rope_theta = 10000.0f;
  float rms_eps = 1e-5f;
  RopeLayout rope_layout = RopeLayout::Adjacent;
  RopeScaling rope_scaling;
  bool tied_embeddings = false;  ///< LM head reuses the token embedding
  int bos_id = -1;
  int eos_id = -1;
  /// Per-layer attention widths of a pruned model; empty for a dense model (every head
  /// head_dim wide). The softmax scale stays 1/sqrt(head_dim) and RoPE frequencies stay those
  /// of head_dim whatever the widths.
  std::vector<LayerAttention> attn;
  /// Per-layer low-rank K/V factors (PaLU, SVD-LLM); empty when W_k and W_v are whole. Heads keep
  /// their full width (attn is empty): only the cache and the K/V projections change.
  std::vector<LayerLowRank> low_rank;
  int lr_group = 0;  ///< KV heads per low-rank group (divides n_kv_head)
  /// Per-layer kept query heads and FFN channels of a structurally pruned model (FLAP), whose
  /// W_o and W_down outputs carry biases; empty for a whole model. Heads keep head_dim.
  std::vector<LayerStructure> structure;
  PruneRecord prune;

  /// Widths of the full (unpruned) model.
  int q_dim() const { return n_head * head_dim; }
  int kv_dim() const { return n_kv_head * head_dim; }

  bool pruned() const { return !attn.empty(); }
  bool structured() const { return !structure.empty(); }
  /// Query heads, key/value heads and FFN width of layer l (the model's own when whole).
  int n_head_at(int l) const {
    return structure.empty()
               ? n_head
               : static_cast<int>(structure[static_cast<std::size_t>(l)].q_heads.size());
  }
  int n_kv_head_at(int l) const;
  int d_ff_at(int l) const {
    return structure.empty() ? d_ff
                             : static_cast<int>(structure[static_cast<std::size_t>(l)].ffn.size());
  }
  /// The kept KV heads of layer l (index in the full model), ascending.
  std::vector<int> kv_heads_at(int l) const;
  int max_d_ff() const;
  bool low_rank_kv() const { return !low_rank.empty(); }
  /// Cache width per token of layer l's keys / values: the latent rank of a low-rank layer,
  /// else k_dim(l) / v_dim(l).
  int k_cache_width(int l) const;
  int v_cache_width(int l) const;
  /// Parameters of layer l's K and V projections (a low-rank layer: A and the blocks of B).
  std::uint64_t kv_params(int l) const;
  /// Per-head width of q and k in layer l.
  int qk_head_dim(int l) const { return attn.empty() ? head_dim : attn[l].qk_dim; }
  /// Per-head width of v (and of the attention output) in layer l.
  int v_head_dim(int l) const { return attn.empty() ? head_dim : attn[l].v_dim; }
  int q_dim(int l) const { return n_head_at(l) * qk_head_dim(l); }  ///< rows of W_q
  /// rows of W_k, K-cache width
  int k_dim(int l) const { return n_kv_head_at(l) * qk_head_dim(l); }
  int v_dim(int l) const { return n_kv_head_at(l) * v_head_dim(l); }  ///< rows of W_v
  int att_dim(int l) const { return n_head_at(l) * v_head_dim(l); }   ///< columns of W_o
  /// Widest of each over the layers (buffer sizes).
  int max_q_dim() const;
  int max_k_dim() const;
  int max_v_dim() const;
  int max_att_dim() const;
  /// Full-head channel of kept K channel i of KV head h in layer l (identity when dense).
  int k_channel(int l, int h, int i) const {
    return attn.empty() ? i : attn[l].k_channels[static_cast<std::size_t>(h) * attn[l].qk_dim + i];
  }
  int v_channel(int l, int h, int i) const {
    return attn.empty() ? i : attn[l].v_channels[static_cast<std::size_t>(h) * attn[l].v_dim + i];
  }
  /// RoPE frequency index j (θ_j = base^(−2j/head_dim)) of channel c of a full head, and the
  /// channel it is rotated together with, in this model's layout.
  int rope_freq_index(int c) const {
    return rope_layout == RopeLayout::Adjacent ? c / 2 : c % (head_dim / 2);
  }
  int rope_partner(int c) const {
    return rope_layout == RopeLayout::Adjacent ? (c ^ 1) : (c + head_dim / 2) % head_dim;
  }
  /// Whether c is the first member of its pair (rotated as a·cos − b·sin).
  bool rope_first(int c) const {
    return rope_layout == RopeLayout::Adjacent ? c % 2 == 0 : c < head_dim / 2;
  }
  /// The naive KVPruner (prune.method "kvpruner-naive"): the kept K channels of a head are
  /// re-packed as a smaller head of width w = qk_head_dim(l) and rotated as its pairs, at that
  /// head's frequencies base^(−2i/w), not at the frequencies the channels had.
  bool naive_rope() const { return pruned() && prune.method == "kvpruner-naive"; }
  /// How RoPE rotates the heads of layer l (see RopeUnits).
  struct RopeUnits rope_units(int l) const;
  /// Throws sparsim::Error naming the first inconsistent field.
  void validate() const;
  /// Number of parameters (embedding counted once when tied), at this model's widths.
  std::uint64_t n_params() const;
  /// Inverse RoPE frequencies θ_j for j < head_dim/2, with Llama-3 scaling applied and, when
  /// given, per-frequency divisors (GGUF `rope_freqs.weight`); for naive_rope(), followed by
  /// the w/2 frequencies of each distinct reduced width w (ascending), which rope_units index.
  std::vector<double> rope_inv_freq(const std::vector<float>& freq_factors = {}) const;
};

}  // namespace sparsim
