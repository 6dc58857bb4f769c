# Warnings for sparsim's own targets (never for dependencies).
add_library(sparsim_warnings INTERFACE)
if(CMAKE_CXX_COMPILER_ID MATCHES "GNU|Clang")
  target_compile_options(sparsim_warnings INTERFACE
    $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wshadow -Wnon-virtual-dtor -Wno-unused-parameter>)
endif()

# Host builds may target the build machine's vector units; BLAS picks its kernels at run time
# anyway, sparsim's own kernels (16-bit weights, pointwise ops) need it to vectorise.
if(SPARSIM_NATIVE AND CMAKE_CXX_COMPILER_ID MATCHES "GNU|Clang" AND NOT SPARSIM_EXEC_SPACE STREQUAL "Cuda")
  target_compile_options(sparsim_warnings INTERFACE $<$<COMPILE_LANGUAGE:CXX>:-march=native>)
endif()

# Without clones the host kernels are compiled once, for the flags of the build.
if(NOT SPARSIM_KERNEL_CLONES)
  target_compile_definitions(sparsim_warnings INTERFACE SPARSIM_NO_KERNEL_CLONES)
endif()
