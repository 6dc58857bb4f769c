#pragma once
/// The GGUF metadata of a pruned model (RAP, KVPruner): per-layer head widths, the full-head
/// channel of every kept K and V channel, the RoPE frequency index of every kept K channel and
/// how the model was made. A model file without these keys is dense. Layout (all `sparsim.`):
///
///   attention.key_length_per_layer    uint32[L]   q/k head width of each layer
///   attention.value_length_per_layer  uint32[L]   v head width of each layer
///   attention.key_channels            int32[Σ_l n_kv·qk_l]  kept K channels, [layer][kv head][i]
///   attention.value_channels          int32[Σ_l n_kv·v_l]   kept V channels, [layer][kv head][i]
///   rope.freq_index                   int32[Σ_l n_kv·qk_l]  frequency index of each kept K channel
///   prune.method, prune.retain, prune.flops_context, prune.source_fingerprint,
///   prune.calibration
///   prune.recipe                      string      scores, layer budgets, pair score, K share
///   prune.tensor_type                 string      sparsim prune --type (auto, source, q8_0, …)
///   prune.retyped_tensors             string[]    "<tensor> <FROM>-><TO> exact|lossy" for each
///                                                 tensor not copied as stored
///                                                 (retyped/requantized)
///
/// A low-rank K/V model (PaLU, SVD-LLM) instead carries, beside the prune.* keys:
///
///   low_rank.group                    uint32      KV heads per factorised group
///   low_rank.key_ranks                int32[L·G]  rank of each group's keys, [layer][group]
///   low_rank.value_ranks              int32[L·G]
///
/// and its blk.N.attn_k / attn_v tensors are the down factors A ([rank][d_model]), with the up
/// factors B ([n_kv·D][rank], block-diagonal over the groups) in blk.N.attn_k_up / attn_v_up.
///
/// A structurally pruned model (FLAP) instead carries, beside the prune.* keys:
///
///   structure.head_count_per_layer    uint32[L]   kept query heads of each layer
///   structure.query_heads             int32[Σ_l]  kept query heads (full-model index), [layer][i]
///   structure.ffn_length_per_layer    uint32[L]   kept FFN channels of each layer
///   structure.ffn_channels            int32[Σ_l]  kept FFN channels (full-model index)
///
/// with W_q, W_k, W_v, W_o, W_gate, W_up, W_down of every block cut to the kept heads (a KV head
/// goes with the last query head of its group) and channels, and two more F32 tensors per block,
/// blk.N.attn_output.bias and blk.N.ffn_down.bias ([d_model]), added to those projections' outputs.
///
/// `llama.attention.key_length` stays the full head dimension D: it sets the softmax scale
/// 1/√D and the RoPE frequencies θ_j = base^(−2j/D) of the reduced heads.
#include "model/config.hpp"

namespace sparsim {

namespace gguf {
class File;
class Writer;
}  // namespace gguf

namespace prune_keys {
inline constexpr const char* kKeyWidths = "sparsim.attention.key_length_per_layer";
inline constexpr const char* kValueWidths = "sparsim.attention.value_length_per_layer";
inline constexpr const char* kKeyChannels = "sparsim.attention.key_channels";
inline constexpr const char* kValueChannels = "sparsim.attention.value_channels";
inline constexpr const char* kFreqIndex = "sparsim.rope.freq_index";
inline constexpr const char* kMethod = "sparsim.prune.method";
inline constexpr const char* kRetain = "sparsim.prune.retain";
inline constexpr const char* kFlopsContext = "sparsim.prune.flops_context";
inline constexpr const char* kSource = "sparsim.prune.source_fingerprint";
inline constexpr const char* kCalibration = "sparsim.prune.calibration";
inline constexpr const char* kRecipe = "sparsim.prune.recipe";
inline constexpr const char* kTensorType = "sparsim.prune.tensor_type";
inline constexpr const char* kRetyped = "sparsim.prune.retyped_tensors";
inline constexpr const char* kLowRankGroup = "sparsim.low_rank.group";
inline constexpr const char* kLowRankKeyRanks = "sparsim.low_rank.key_ranks";
inline constexpr const char* kLowRankValueRanks = "sparsim.low_rank.value_ranks";
inline constexpr const char* kHeadCounts = "sparsim.structure.head_count_per_layer";
inline constexpr const char* kQueryHeads = "sparsim.structure.query_heads";
inline constexpr const char* kFfnWidths = "sparsim.structure.ffn_length_per_layer";
inline constexpr const char* kFfnChannels = "sparsim.structure.ffn_channels";
}  // namespace prune_keys

/// Per-layer kept query-head and FFN-channel counts of a structurally pruned file (empty vectors
/// when it is not one); throws naming the key when a count list has the wrong length.
void read_structure_counts(const gguf::File& f, int n_layer, std::vector<std::int64_t>& heads,
                           std::vector<std::int64_t>& ffn);

/// Reads the pruned layout of `f` into c.attn (c.structure, c.low_rank) and c.prune (c's shape
/// fields must be set). A file without sparsim.attention.* keys leaves c dense. Throws
/// sparsim::Error naming the file and the key for a partial or inconsistent layout (wrong lengths,
/// widths outside 1 … head_dim, channels out of range or not ascending, a frequency index that does
/// not match its channel).
void read_pruned_layout(const gguf::File& f, Config& c);

/// Adds the keys above but prune.tensor_type and prune.retyped_tensors (which only the writer of
/// the tensors knows) for a pruned config (nothing for a dense one).
void write_pruned_layout(gguf::Writer& w, const Config& c);

}  // namespace sparsim
