#include "recovery/distill.hpp"

#include "core/backends.hpp"
#include "core/error.hpp"

#include <cmath>

namespace sparsim::recovery {

const char* kd_direction_name(KdDirection d) {
  return d == KdDirection::Reverse ? "reverse" : "forward";
}

KdDirection parse_kd_direction(const std::string& s) {
  if (s == "reverse") return KdDirection::Reverse;
  if (s == "forward") return KdDirection::Forward;
  fail(
      "distillation direction must be reverse (KL(student || teacher)) or forward "
      "(KL(teacher || student)), got '{}'",
      s);
}

void DistillOptions::validate() const {
  require(std::isfinite(temperature) && temperature > 0,
          "distillation temperature must be a positive number, got {}", temperature);
  require(std::isfinite(weight) && weight >= 0, "distillation weight must be a number >= 0, got {}",
          weight);
}

template <class E, class T>
DistillLoss<E, T>::DistillLoss(const DistillOptions& o, int max_tokens, int vocab, E exec)
    : o_(o), rows_("sparsim::distill::rows", max_tokens, 2), exec_(exec) {
  o_.validate();
  require(max_tokens >= 2 && vocab >= 1, "distillation loss: {} tokens, vocabulary {}", max_tokens,
          vocab);
}

template <class E, class T>
double DistillLoss<E, T>::loss_and_gradient(const E& exec, const MatT<E, T>& z,
                                            const IVec<E>& tok) {
  const int n = static_cast<int>(z.extent(0)), V = static_cast<int>(z.extent(1));
  require(n >= 2 && n <= static_cast<int>(rows_.extent(0)),
          "distillation loss: {} tokens, expected 2 … {}", n, rows_.extent(0));
  const bool kd = o_.weight > 0;
  if (kd)
    require(static_cast<int>(teacher_.extent(0)) >= n && static_cast<int>(teacher_.extent(1)) == V,
            "distillation loss: the teacher's logits are {}×{}, the student's {}×{} (set_teacher "
            "before each forward)",
            teacher_.extent(0), teacher_.extent(1), n, V);
  const auto zt = teacher_;
  const auto rows = rows_;
  const bool reverse = o_.direction == KdDirection::Reverse;
  const T temp = static_cast<T>(o_.temperature);
  const T inv_temp = T(1) / temp;
  const T kd_scale = static_cast<T>(o_.weight * o_.temperature);  // w·T²·(1/T)
  const T inv_n = T(1) / static_cast<T>(n - 1);
  // One team per row. The row's exponentials are taken once, into per-team scratch rows:
  // e1 = exp(z − max z) (softmax at T = 1), e2 = exp((z − max z)/T) (student at T) and
  // e3 = exp((z_t − max z_t)/T) (teacher at T); the probabilities are these over their sums.
  using Team = typename Kokkos::TeamPolicy<E>::member_type;
  using Row = Kokkos::View<T*, typename E::scratch_memory_space, Kokkos::MemoryUnmanaged>;
  const int n_rows = kd ? 3 : 1;
  const std::size_t bytes = Row::shmem_size(V) * static_cast<std::size_t>(n_rows);
  Kokkos::parallel_for(
      "sparsim::distill::loss",
      Kokkos::TeamPolicy<E>(exec, n, 1).set_scratch_size(1, Kokkos::PerTeam(bytes)),
      KOKKOS_LAMBDA(const Team& team) {
        const int t = team.league_rank();
        if (t == n - 1) {
          for (int v = 0; v < V; ++v) z(t, v) = 0;
          rows(t, 0) = 0;
          rows(t, 1) = 0;
          return;
        }
        const Row e1(team.team_scratch(1), V);
        const Row e2 = kd ? Row(team.team_scratch(1), V) : Row();
        const Row e3 = kd ? Row(team.team_scratch(1), V) : Row();
        const int y = tok(t + 1);
        T mz = z(t, 0);
        for (int v = 1; v < V; ++v) mz = z(t, v) > mz ? z(t, v) : mz;
        T mt = 0;
        if (kd) {
          mt = static_cast<T>(zt(t, 0));
          for (int v = 1; v < V; ++v)
            mt = static_cast<T>(zt(t, v)) > mt ? static_cast<T>(zt(t, v)) : mt;
        }
        double s1 = 0, ss = 0, st = 0;
        for (int v = 0; v < V; ++v) {
          e1(v) = bwd::exp_(z(t, v) - mz);
          s1 += static_cast<double>(e1(v));
        }
        if (kd)
          for (int v = 0; v < V; ++v) {
            e2(v) = bwd::exp_((z(t, v) - mz) * inv_temp);
            e3(v) = bwd::exp_((static_cast<T>(zt(t, v)) - mt) * inv_temp);
            ss += static_cast<double>(e2(v));
            st += static_cast<double>(e3(v));
          }
        const T ls1 = static_cast<T>(kx::log(s1));
        rows(t, 0) = static_cast<double>(ls1) - static_cast<double>(z(t, y) - mz);
        const T inv_s1 = static_cast<T>(1.0 / s1);
        T lss = 0, lst = 0, inv_ss = 0, inv_st = 0;
        double kl = 0;
        if (kd) {
          lss = static_cast<T>(kx::log(ss));
          lst = static_cast<T>(kx::log(st));
          inv_ss = static_cast<T>(1.0 / ss);
          inv_st = static_cast<T>(1.0 / st);
          for (int v = 0; v < V; ++v) {
            const T ls = (z(t, v) - mz) * inv_temp - lss;
            const T lt = (static_cast<T>(zt(t, v)) - mt) * inv_temp - lst;
            kl += reverse ? static_cast<double>(e2(v) * inv_ss * (ls - lt))
                          : static_cast<double>(e3(v) * inv_st * (lt - ls));
          }
        }
        rows(t, 1) = kl;
        const T klt = static_cast<T>(kl);
        for (int v = 0; v < V; ++v) {
          T g = e1(v) * inv_s1;
          if (kd) {
            const T ps = e2(v) * inv_ss;
            if (reverse) {
              const T ls = (z(t, v) - mz) * inv_temp - lss;
              const T lt = (static_cast<T>(zt(t, v)) - mt) * inv_temp - lst;
              g += kd_scale * ps * (ls - lt - klt);
            } else {
              g += kd_scale * (ps - e3(v) * inv_st);
            }
          }
          z(t, v) = g * inv_n;
        }
        z(t, y) -= inv_n;
      });
  exec.fence();
  auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), rows_);
  double ce = 0, kl = 0;
  for (int t = 0; t + 1 < n; ++t) {
    ce += h(t, 0);
    kl += h(t, 1);
  }
  ce_ = ce / (n - 1);
  kl_ = kl / (n - 1);
  return ce_ + o_.weight * o_.temperature * o_.temperature * kl_;
}

#define SPARSIM_INSTANTIATE_DISTILL(E)  \
  template class DistillLoss<E, float>; \
  template class DistillLoss<E, double>;
SPARSIM_FOR_EACH_BACKEND(SPARSIM_INSTANTIATE_DISTILL)

}  // namespace sparsim::recovery
