#pragma once
// Comparisons and a small fixture shared by the numeric tests: relative max-norm errors, bitwise
// equality of float vectors, and a K/V-pruned configuration of a model.
#include "model/config.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

namespace sparsim::test {

/// ‖a − b‖_∞ / ‖b‖_∞.
inline double rel_err(const std::vector<float>& a, const std::vector<float>& b) {
  double scale = 0, err = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    scale = std::max(scale, double(std::fabs(b[i])));
    err = std::max(err, double(std::fabs(a[i] - b[i])));
  }
  return err / scale;
}

/// ‖a − b‖_∞ / ‖b‖_∞ against a float64 reference.
inline double rel_err(const std::vector<float>& a, const std::vector<double>& b) {
  double scale = 0, err = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    scale = std::max(scale, std::fabs(b[i]));
    err = std::max(err, std::fabs(a[i] - b[i]));
  }
  return err / scale;
}

/// ‖a − b‖_∞ / ‖b‖_∞ in float64.
inline double rel_inf(const std::vector<double>& a, const std::vector<double>& b) {
  double err = 0, scale = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    err = std::max(err, std::fabs(a[i] - b[i]));
    scale = std::max(scale, std::fabs(b[i]));
  }
  return err / scale;
}

/// The same size and the same bits.
inline bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

/// The same size and the same bits (float64, e.g. the windows' NLL of two runs).
inline bool same_bits(const std::vector<double>& a, const std::vector<double>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(double)) == 0;
}

/// `c` with the given K / V channels kept in every layer and KV head (a pruned model's
/// config); prune fields filled so that it validates.
inline Config pruned_config(const Config& c, const std::vector<int>& k_keep,
                            const std::vector<int>& v_keep) {
  Config p = c;
  p.attn.assign(static_cast<std::size_t>(c.n_layer), LayerAttention{});
  for (auto& a : p.attn) {
    a.qk_dim = static_cast<int>(k_keep.size());
    a.v_dim = static_cast<int>(v_keep.size());
    for (int h = 0; h < c.n_kv_head; ++h) {
      a.k_channels.insert(a.k_channels.end(), k_keep.begin(), k_keep.end());
      a.v_channels.insert(a.v_channels.end(), v_keep.begin(), v_keep.end());
    }
  }
  p.prune.method = "test";
  p.prune.retain = 0.5;
  p.validate();
  return p;
}

}  // namespace sparsim::test
