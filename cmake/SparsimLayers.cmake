# The layers of src/: a folder may include its own headers and those of folders in lower layers,
# never a folder of its own layer or above. Checked when the project is configured (an upward
# include stops the configuration) and by the test Layers.NoUpwardIncludes. A new folder under
# src/ must be given a layer here.
#
#   cmake -DSPARSIM_LAYER_SRC=<dir> -P cmake/SparsimLayers.cmake   checks <dir>, exit 1 on violation
set(SPARSIM_LAYERS
  "core|gemm_bf16"                   # types, errors, BLAS selection, timers; bf16 GEMM tiles
  "io|kernels"                       # HDF5 run files, atomic outputs; Kokkos kernels
  "model|flops"                      # model files, config, weights; the FLOP/byte ledger
  "cost|calibration"                 # roofline cost; calibration data
  "engine"                           # the forward pass, KV cache, backward pass
  "policies|transforms|sparsity|recovery" # methods: run-time policies (token gate, K-channel
                                     # selection, eviction, Probe Pruning), offline model
                                     # transforms (RAP/KVPruner, FLAP, SlimGPT, low rank),
                                     # activation sparsity, LoRA recovery
  "eval"                             # perplexity, tasks, retrieval
  "sweep")                           # grids of runs

# Sets <out> to the layer index of folder <dir>, or -1.
function(sparsim_layer_of dir out)
  set(i 0)
  foreach(layer IN LISTS SPARSIM_LAYERS)
    string(REGEX MATCH "^(${layer})$" hit "${dir}")
    if(hit)
      set(${out} ${i} PARENT_SCOPE)
      return()
    endif()
    math(EXPR i "${i} + 1")
  endforeach()
  set(${out} -1 PARENT_SCOPE)
endfunction()

# Appends to <out> one line per violation in the source tree <src>.
function(sparsim_check_layers src out)
  set(problems "")
  file(GLOB folders RELATIVE ${src} ${src}/*)
  foreach(folder IN LISTS folders)
    if(NOT IS_DIRECTORY ${src}/${folder})
      continue()
    endif()
    sparsim_layer_of(${folder} mine)
    if(mine EQUAL -1)
      list(APPEND problems "src/${folder}/ has no layer in cmake/SparsimLayers.cmake")
      continue()
    endif()
    file(GLOB_RECURSE files RELATIVE ${src} ${src}/${folder}/*.hpp ${src}/${folder}/*.cpp
         ${src}/${folder}/*.h)
    foreach(f IN LISTS files)
      file(STRINGS ${src}/${f} incs REGEX "^[ \t]*#[ \t]*include[ \t]*\"[A-Za-z0-9_]+/")
      foreach(line IN LISTS incs)
        string(REGEX REPLACE "^[ \t]*#[ \t]*include[ \t]*\"([A-Za-z0-9_]+)/([^\"]*)\".*" "\\1;\\2"
               parts "${line}")
        list(GET parts 0 dep)
        list(GET parts 1 rest)
        if(dep STREQUAL folder OR NOT IS_DIRECTORY ${src}/${dep})
          continue()
        endif()
        sparsim_layer_of(${dep} theirs)
        if(theirs EQUAL -1 OR theirs GREATER_EQUAL mine)
          list(APPEND problems "src/${f} includes ${dep}/${rest} (${dep}/ is not in a layer below ${folder}/)")
        endif()
      endforeach()
    endforeach()
  endforeach()
  set(${out} "${problems}" PARENT_SCOPE)
endfunction()

# At configure time: the project's own src/.
if(NOT CMAKE_SCRIPT_MODE_FILE)
  sparsim_check_layers(${PROJECT_SOURCE_DIR}/src problems)
  if(problems)
    string(REPLACE ";" "\n  " text "${problems}")
    message(FATAL_ERROR "upward includes (cmake/SparsimLayers.cmake):\n  ${text}")
  endif()
elseif(DEFINED SPARSIM_LAYER_SRC)
  sparsim_check_layers(${SPARSIM_LAYER_SRC} problems)
  if(problems)
    string(REPLACE ";" "\n  " text "${problems}")
    message(FATAL_ERROR "upward includes:\n  ${text}")
  endif()
  message(STATUS "layers: no upward includes in ${SPARSIM_LAYER_SRC}")
endif()
