# CUDA is optional (DESIGN §5): CPU only, CUDA compile-only (no GPU here: GPU tests skip), or full.
set(FLEXCP_WITH_CUDA OFF)
if(NOT FLEXCP_CUDA STREQUAL "OFF")
  include(CheckLanguage)
  if(NOT CMAKE_CUDA_COMPILER AND EXISTS /usr/local/cuda/bin/nvcc)
    set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
  endif()
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    set(FLEXCP_WITH_CUDA ON)
  elseif(FLEXCP_CUDA STREQUAL "ON")
    message(FATAL_ERROR "FLEXCP_CUDA=ON but no CUDA compiler was found. Install the CUDA toolkit "
                        "(nvcc under /usr/local/cuda) or configure with -DFLEXCP_CUDA=OFF.")
  endif()
endif()

if(FLEXCP_WITH_CUDA)
  if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
    # Hopper with its architecture-specific features (wgmma, setmaxnreg).
    set(CMAKE_CUDA_ARCHITECTURES 90a)
  endif()
  enable_language(CUDA)
  # CMake 3.25 does not know nvcc's C++20 switch (nvcc 12+ has it); teach it.
  set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
  set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
  set(CMAKE_CUDA_STANDARD 20)
  set(CMAKE_CUDA_STANDARD_REQUIRED ON)
  find_package(CUDAToolkit REQUIRED)
  message(STATUS "flexcp: CUDA sources enabled for ${CMAKE_CUDA_ARCHITECTURES}")
else()
  message(STATUS "flexcp: CPU-only build (no CUDA)")
endif()

# CUTLASS/CuTe 4.2 headers for the Hopper kernels: from -DFLEXCP_CUTLASS_INCLUDE, else
# .deps/cutlass/include (scripts/install-deps.sh puts the pinned wheel's headers there).
if(FLEXCP_WITH_CUDA)
  set(FLEXCP_CUTLASS_INCLUDE "${PROJECT_SOURCE_DIR}/.deps/cutlass/include" CACHE PATH
      "Folder holding CUTLASS 4.2's cute/ and cutlass/ headers")
  set(_cutlass_version_h "${FLEXCP_CUTLASS_INCLUDE}/cutlass/version.h")
  if(NOT EXISTS "${_cutlass_version_h}" OR NOT EXISTS "${FLEXCP_CUTLASS_INCLUDE}/cute/tensor.hpp")
    message(FATAL_ERROR "CUTLASS 4.2 headers not found under FLEXCP_CUTLASS_INCLUDE="
                        "${FLEXCP_CUTLASS_INCLUDE}. Run scripts/install-deps.sh (it downloads the "
                        "pinned wheel nvidia-cutlass==4.2.0.0 into .deps/cutlass), pass "
                        "-DFLEXCP_CUTLASS_INCLUDE=<dir>, or configure with -DFLEXCP_CUDA=OFF.")
  endif()
  file(STRINGS "${_cutlass_version_h}" _cutlass_major REGEX "#define CUTLASS_MAJOR ")
  file(STRINGS "${_cutlass_version_h}" _cutlass_minor REGEX "#define CUTLASS_MINOR ")
  string(REGEX MATCH "[0-9]+" _cutlass_major "${_cutlass_major}")
  string(REGEX MATCH "[0-9]+" _cutlass_minor "${_cutlass_minor}")
  if(NOT _cutlass_major EQUAL 4 OR NOT _cutlass_minor EQUAL 2)
    message(FATAL_ERROR "CUTLASS under ${FLEXCP_CUTLASS_INCLUDE} is ${_cutlass_major}.${_cutlass_minor}; "
                        "flexcp is pinned to 4.2 (scripts/install-deps.sh fetches it)")
  endif()
  # Which sm90 forward instantiations to compile (pruned ones answer "not compiled" at run time).
  set(FLEXCP_SM90_DTYPES "bf16;fp16" CACHE STRING "dtypes of the sm90 forward kernel")
  set(FLEXCP_SM90_HEAD_DIMS "64;128" CACHE STRING "head dims of the sm90 forward kernel")
endif()

# NCCL's header for the nccl communicator (the library is loaded at run time, comm/nccl.cc): the
# CUDA toolkit's, else the one of the nvidia-nccl wheel beside PyTorch.
if(FLEXCP_WITH_CUDA)
  set(_nccl_hints ${CUDAToolkit_INCLUDE_DIRS})
  find_package(Python3 COMPONENTS Interpreter QUIET)
  if(Python3_Interpreter_FOUND)
    execute_process(COMMAND ${Python3_EXECUTABLE} -c
                            "import nvidia.nccl, os; print(os.path.dirname(nvidia.nccl.__file__))"
                    OUTPUT_VARIABLE _nccl_py OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
    if(_nccl_py)
      list(APPEND _nccl_hints ${_nccl_py}/include)
    endif()
  endif()
  find_path(FLEXCP_NCCL_INCLUDE nccl.h HINTS ${_nccl_hints}
            DOC "Folder holding nccl.h (the nccl communicator)")
  if(NOT FLEXCP_NCCL_INCLUDE)
    message(FATAL_ERROR "nccl.h not found (looked in ${_nccl_hints}). Install NCCL (NVIDIA's "
                        "libnccl-dev, or `pip install nvidia-nccl-cu13`), pass "
                        "-DFLEXCP_NCCL_INCLUDE=<dir>, or configure with -DFLEXCP_CUDA=OFF.")
  endif()
endif()
