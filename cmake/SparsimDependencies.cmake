# Finds everything sparsim depends on. Kokkos and Kokkos Kernels come from Kokkos_ROOT /
# KokkosKernels_ROOT (scripts/setup.sh bootstraps 3.4.1; clusters bring 4.x).
find_package(Kokkos 3.4 REQUIRED)
# A preset (cuda-a100) can insist on the GPU architecture Kokkos was built for: code built for
# another architecture fails only at run time on the target GPU, so catch it here.
set(SPARSIM_REQUIRE_ARCH "" CACHE STRING
    "Kokkos architecture (e.g. AMPERE80) the Kokkos at Kokkos_ROOT must be built for; empty: any")
if(SPARSIM_REQUIRE_ARCH)
  kokkos_check(ARCH ${SPARSIM_REQUIRE_ARCH} RETURN_VALUE _sparsim_arch_ok)
  if(NOT _sparsim_arch_ok)
    set(_sparsim_archs "${Kokkos_ARCH}")
    if(NOT _sparsim_archs)
      set(_sparsim_archs "none")
    endif()
    message(FATAL_ERROR
      "SPARSIM_REQUIRE_ARCH=${SPARSIM_REQUIRE_ARCH}, but the Kokkos at ${Kokkos_DIR} was built "
      "for the architectures: ${_sparsim_archs} (backends: ${Kokkos_DEVICES}). Point Kokkos_ROOT "
      "at a Kokkos built with -DKokkos_ARCH_${SPARSIM_REQUIRE_ARCH}=ON, or pass "
      "-DSPARSIM_REQUIRE_ARCH= to skip this check.")
  endif()
endif()
# Kokkos Kernels is usually installed beside Kokkos; KokkosKernels_ROOT points elsewhere.
find_package(KokkosKernels REQUIRED HINTS ${KokkosKernels_ROOT} ${Kokkos_ROOT} $ENV{Kokkos_ROOT})
find_package(HDF5 REQUIRED COMPONENTS C)
find_package(Boost 1.71 REQUIRED COMPONENTS program_options)
find_package(fmt REQUIRED)
find_package(spdlog REQUIRED)
find_package(nlohmann_json 3.9 REQUIRED)
find_package(ZLIB REQUIRED)
# toml++ reads sweep specifications (Debian: libtomlplusplus-dev; Spack: tomlplusplus).
find_package(tomlplusplus 3 REQUIRED)
# MPI only for sparsim sweep's MPI front end.
if(SPARSIM_MPI)
  find_package(MPI REQUIRED COMPONENTS C)
endif()
# PCRE2 (8-bit, UTF + UCP) runs the tokenizer pre-tokenizer regexes.
find_package(PkgConfig REQUIRED)
pkg_check_modules(PCRE2 REQUIRED IMPORTED_TARGET libpcre2-8)
# LAPACKE (symmetric eigensolver) and CBLAS (float64 GEMM) for the WINA tensor rotation.
# The CBLAS symbols come from the BLAS Kokkos Kernels links (OpenBLAS provides them); without a
# BLAS there, find one.
pkg_check_modules(LAPACKE REQUIRED IMPORTED_TARGET lapacke)
find_path(SPARSIM_CBLAS_INCLUDE_DIR cblas.h PATH_SUFFIXES openblas)
if(NOT SPARSIM_CBLAS_INCLUDE_DIR)
  message(FATAL_ERROR "cblas.h not found (Debian: libopenblas-dev); set SPARSIM_CBLAS_INCLUDE_DIR")
endif()
set(SPARSIM_CBLAS_LIBRARIES "")
if(NOT TARGET Kokkos::BLAS)
  find_package(BLAS REQUIRED)
  set(SPARSIM_CBLAS_LIBRARIES BLAS::BLAS)
endif()
if(SPARSIM_BUILD_TESTS)
  find_package(GTest REQUIRED)
endif()
if(SPARSIM_BUILD_BENCHMARKS)
  find_package(benchmark QUIET)
endif()

# Kokkos 3.4 spells the backend query differently from 4.x; both provide kokkos_check.
set(SPARSIM_BACKENDS "")
foreach(_be SERIAL OPENMP THREADS CUDA HIP SYCL)
  if(Kokkos_ENABLE_${_be} OR KOKKOS_ENABLE_${_be})
    list(APPEND SPARSIM_BACKENDS ${_be})
  endif()
endforeach()
if(NOT SPARSIM_BACKENDS)
  foreach(_be SERIAL OPENMP CUDA)
    kokkos_check(DEVICES ${_be} RETURN_VALUE _has)
    if(_has)
      list(APPEND SPARSIM_BACKENDS ${_be})
    endif()
  endforeach()
endif()
# The apps' default backend must be one this Kokkos provides (else every run fails at start-up).
string(TOUPPER "${SPARSIM_EXEC_SPACE}" _sparsim_exec_uc)
if(NOT _sparsim_exec_uc STREQUAL "DEFAULT" AND NOT _sparsim_exec_uc IN_LIST SPARSIM_BACKENDS)
  message(FATAL_ERROR
    "SPARSIM_EXEC_SPACE=${SPARSIM_EXEC_SPACE}, but the Kokkos at ${Kokkos_DIR} provides only "
    "the backends '${SPARSIM_BACKENDS}'.")
endif()

# oneDNN (Debian: libdnnl-dev) for the opt-in bf16-compute prefill of bf16 weights. Optional:
# without it the option reports itself unavailable.
option(SPARSIM_DNNL "Use oneDNN's bf16 matmul for the opt-in bf16-compute prefill when found" ON)
# Found by header and library rather than its CMake package: Debian's package config asks for
# OpenCL's development files (its GPU runtime), which the CPU matmul used here does not need.
set(dnnl_FOUND FALSE)
if(SPARSIM_DNNL)
  find_path(SPARSIM_DNNL_INCLUDE_DIR oneapi/dnnl/dnnl.hpp)
  find_library(SPARSIM_DNNL_LIBRARY dnnl)
  if(SPARSIM_DNNL_INCLUDE_DIR AND SPARSIM_DNNL_LIBRARY)
    set(dnnl_FOUND TRUE)
    file(STRINGS "${SPARSIM_DNNL_INCLUDE_DIR}/oneapi/dnnl/dnnl_version.h" _dnnl_v
         REGEX "#define DNNL_VERSION_(MAJOR|MINOR|PATCH) ")
    string(REGEX REPLACE ".*MAJOR ([0-9]+).*MINOR ([0-9]+).*PATCH ([0-9]+).*" "\\1.\\2.\\3"
           dnnl_VERSION "${_dnnl_v}")
    add_library(sparsim::dnnl UNKNOWN IMPORTED)
    set_target_properties(sparsim::dnnl PROPERTIES IMPORTED_LOCATION "${SPARSIM_DNNL_LIBRARY}"
                          INTERFACE_INCLUDE_DIRECTORIES "${SPARSIM_DNNL_INCLUDE_DIR}")
  endif()
endif()
