#include "model/weights.hpp"
#include "core/backends.hpp"

namespace sparsim {

const char* proj_name(Proj p) {
  switch (p) {
    case Proj::Q:
      return "q";
    case Proj::K:
      return "k";
    case Proj::V:
      return "v";
    case Proj::O:
      return "o";
    case Proj::Gate:
      return "gate";
    case Proj::Up:
      return "up";
    case Proj::Down:
      return "down";
  }
  return "?";
}

const char* site_name(Site s) {
  switch (s) {
    case Site::BlockIn:
      return "block_in";
    case Site::Attn:
      return "attn_in";
    case Site::O:
      return "o_in";
    case Site::Mlp:
      return "mlp_in";
    case Site::Down:
      return "down_in";
  }
  return "?";
}

template <class E>
std::size_t Weights<E>::bytes() const {
  std::size_t b = tok_embd.bytes() + out_norm.extent(0) * 4;
  if (!cfg.tied_embeddings) b += output.bytes();
  for (const auto& l : layers) {
    b += (l.attn_norm.extent(0) + l.ffn_norm.extent(0) + l.o_bias.extent(0) +
          l.down_bias.extent(0)) *
         4;
    for (const auto* m :
         {&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down, &l.k_up, &l.v_up})
      b += m->bytes();
  }
  for (const auto& m : rot_attn_mlp) b += m.bytes();
  for (const auto& m : rot_mlp_next) b += m.bytes();
  return b;
}

#define SPARSIM_INSTANTIATE_WEIGHTS(E) template struct Weights<E>;
SPARSIM_FOR_EACH_BACKEND(SPARSIM_INSTANTIATE_WEIGHTS)

}  // namespace sparsim
