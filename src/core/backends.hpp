#pragma once
/// SPARSIM_FOR_EACH_BACKEND(M) expands M(E) once for every Kokkos execution space this build
/// enables (Serial, OpenMP, Cuda): the explicit instantiations of a template over the backend.
#include <Kokkos_Core.hpp>

#ifdef KOKKOS_ENABLE_SERIAL
#define SPARSIM_IF_SERIAL(M) M(Kokkos::Serial)
#else
#define SPARSIM_IF_SERIAL(M)
#endif
#ifdef KOKKOS_ENABLE_OPENMP
#define SPARSIM_IF_OPENMP(M) M(Kokkos::OpenMP)
#else
#define SPARSIM_IF_OPENMP(M)
#endif
#ifdef KOKKOS_ENABLE_CUDA
#define SPARSIM_IF_CUDA(M) M(Kokkos::Cuda)
#else
#define SPARSIM_IF_CUDA(M)
#endif

#define SPARSIM_FOR_EACH_BACKEND(M) SPARSIM_IF_SERIAL(M) SPARSIM_IF_OPENMP(M) SPARSIM_IF_CUDA(M)
