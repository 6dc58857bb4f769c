#pragma once
/// The consistency checks every model file goes through before anything is loaded (and that
/// `sparsim inspect` reports): the hyper-parameters a file states against the tensors it holds.
/// Host-only (no Kokkos), shared by the GGUF and the Hugging Face readers.
///
/// The tensors are taken as the truth and each stated value is compared with the tensor that
/// shows it, so that a message names the key that is actually wrong: the embedding width from
/// token_embd, the head width from the query projection of block 0, the block count from the
/// block tensors present, and so on. The values derived from the tensors are then used for
/// every other comparison, so one wrong key gives one message, not a cascade.
#include <array>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace sparsim {

/// How a file format spells the hyper-parameters and tensors of a Llama model.
struct LlamaNames {
  /// Keys, as the file spells them ("llama.block_count" / "num_hidden_layers").
  std::string n_layer, d_model, n_head, n_kv_head, head_dim, value_dim, rope_dims, d_ff, vocab;
  /// The key that unties the output head from the embedding ("" when its absence decides).
  std::string tied;
  /// Tensors.
  std::string embd, out_norm, output, rope_freqs;
  /// Block tensors are "<block_prefix><l>.<suffix>" with the suffixes of attn_norm, q, k, v, o,
  /// ffn_norm, gate, up, down (in that order).
  std::string block_prefix;
  std::array<std::string, 9> block;
  /// Shapes as the file lists them: innermost first (GGUF "ne") or outermost first.
  bool inner_first = false;

  static LlamaNames gguf(const std::string& arch);
  static LlamaNames hugging_face();
};

/// Hyper-parameters as the metadata states them (nullopt: the key is absent).
struct StatedShape {
  std::optional<std::int64_t> n_layer, d_model, n_head, n_kv_head, head_dim, value_dim, rope_dims,
      d_ff, vocab;
  bool output_required = false;  ///< untied embeddings: the output tensor must be there
  /// A pruned model (RAP, KVPruner): per-layer q/k and v head widths (empty: every head
  /// head_dim wide); the attention tensors of layer l are checked against these.
  std::vector<std::int64_t> qk_widths, v_widths;
  /// A low-rank K/V model (PaLU, SVD-LLM): the rank of each group of `lr_group` KV heads of every
  /// layer, [layer][group] (empty: W_k and W_v whole); attn_k / attn_v of layer l are then
  /// [Σ ranks][d_model] and attn_k_up / attn_v_up [n_kv·head_dim][Σ ranks].
  std::vector<std::int64_t> k_ranks, v_ranks;
  std::int64_t lr_group = 0;
  /// A structurally pruned model (FLAP): kept query heads, KV heads and FFN channels of every
  /// layer (empty: whole); its blocks also hold the biases of W_o and W_down.
  std::vector<std::int64_t> head_counts, kv_counts, ffn_widths;
};

/// Name → shape as the file lists it.
using TensorShapes = std::map<std::string, std::vector<std::uint64_t>>;

/// Every contradiction, one sentence each naming the key(s) and the tensor; empty when the file
/// is consistent. At most kMaxProblems are listed, then "... and N more".
std::vector<std::string> check_llama_shapes(const StatedShape& stated, const TensorShapes& tensors,
                                            const LlamaNames& names);

inline constexpr std::size_t kMaxProblems = 20;

/// One message for a list of problems: "<where>: <p>" for one, a bulleted list for several.
std::string describe_problems(const std::string& where, const std::vector<std::string>& problems);

}  // namespace sparsim
