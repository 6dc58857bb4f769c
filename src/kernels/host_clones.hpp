#pragma once
/// SPARSIM_CLONES: a host kernel compiled once per x86-64 level and chosen at run time by the
/// CPU's features (GCC's target_clones: x86-64-v4 = AVX-512, x86-64-v3 = AVX2 + FMA, and the
/// build's own baseline), so that a portable build (SPARSIM_NATIVE=OFF) still runs it with the
/// widest vectors the node has. `flatten`: everything a clone calls is inlined into it. An
/// out-of-line helper would be compiled once, for the build's baseline, and every clone would call
/// that one (a portable build then decoded F32 at 0.69x native). SPARSIM_NO_KERNEL_CLONES (CMake
/// SPARSIM_KERNEL_CLONES=OFF) compiles them once, for the build's own flags: with
/// `-march=x86-64-v3` an AVX-512 CPU then runs the AVX2 kernels.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__CUDACC__) && \
    defined(__linux__) && !defined(SPARSIM_NO_KERNEL_CLONES)
#define SPARSIM_CLONES \
  __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default"), flatten))
#define SPARSIM_HAS_CLONES 1
#else
#define SPARSIM_CLONES
#define SPARSIM_HAS_CLONES 0
#endif
