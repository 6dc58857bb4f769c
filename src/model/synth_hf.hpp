#pragma once
/// Seeded random Llama models written as Hugging Face model directories (config.json +
/// model.safetensors), holding the same model as write_synth_gguf writes for the same spec.
#include "model/safetensors.hpp"
#include "model/synth.hpp"

#include <string>
#include <vector>

namespace sparsim {

/// Reorders the rows of a Q or K projection ([n_heads·head_dim][cols], row-major) from the GGUF
/// (llama.cpp) layout to the Hugging Face layout.
///
/// RoPE rotates pairs of dimensions of each head by the angle pos·θ_j (j < D/2, D = head_dim).
/// Hugging Face's rotate_half pairs dimension j with j + D/2; GGUF (llama.cpp's "normal" RoPE)
/// pairs 2j with 2j+1. llama.cpp's converter therefore permutes HF's rows within each head so
/// that GGUF row (h, 2j) = HF row (h, j) and GGUF row (h, 2j+1) = HF row (h, j + D/2); attention
/// scores q·k are unchanged because q and k get the same permutation. This function applies the
/// inverse:
///
///   HF row (h, j)       = GGUF row (h, 2j)
///   HF row (h, j + D/2) = GGUF row (h, 2j + 1)      for j < D/2.
std::vector<float> qk_rows_gguf_to_hf(const std::vector<float>& w, int n_heads, int head_dim,
                                      int cols);
/// The converter's direction (the inverse of qk_rows_gguf_to_hf).
std::vector<float> qk_rows_hf_to_gguf(const std::vector<float>& w, int n_heads, int head_dim,
                                      int cols);

/// The Hugging Face name of a synthetic tensor's GGUF name ("blk.3.attn_q.weight" →
/// "model.layers.3.self_attn.q_proj.weight"); throws for names without one.
std::string hf_tensor_name(const std::string& gguf_name);

/// Writes `dir`/config.json and `dir`/model.safetensors (creating `dir`): the model
/// write_synth_gguf(spec, …) writes, in Hugging Face layout. Every value is the one the GGUF
/// file holds (matrices quantized to spec.type and back, for quantized types), then stored as
/// `dtype` (F32, F16 or BF16); Q and K rows are permuted with qk_rows_gguf_to_hf. Llama-3 RoPE
/// scaling (spec.rope_freqs or cfg.rope_scaling.enabled) goes into config.json's rope_scaling.
/// With spec.with_tokenizer, bos/eos ids 1/2 go into config.json (no tokenizer.json is written).
void write_synth_safetensors(const SynthSpec& spec, const std::string& dir,
                             safetensors::Dtype dtype = safetensors::Dtype::F32);

}  // namespace sparsim
