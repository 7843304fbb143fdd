# Finds every dependency of DESIGN §5 and, when one is missing, stops with the command that
# installs it (Debian 12 package names).
function(flexcp_require found what install)
  if(NOT ${found})
    message(FATAL_ERROR "flexcp needs ${what}. Install it with:\n  ${install}")
  endif()
endfunction()

find_package(OpenMP COMPONENTS CXX)
flexcp_require(OpenMP_CXX_FOUND "OpenMP for C++" "apt-get install -y libomp-dev")

if(FLEXCP_WITH_MPI)
  find_package(MPI COMPONENTS CXX)
  flexcp_require(MPI_CXX_FOUND "MPI (Open MPI) for the distributed runtime (or configure with \
-DFLEXCP_WITH_MPI=OFF: no MPI communicator, no `flexcp run`)"
                 "apt-get install -y libopenmpi-dev openmpi-bin")
endif()

find_package(nlohmann_json 3.10 QUIET)
flexcp_require(nlohmann_json_FOUND "nlohmann-json (>= 3.10)" "apt-get install -y nlohmann-json3-dev")

find_package(CLI11 QUIET)
flexcp_require(CLI11_FOUND "CLI11" "apt-get install -y libcli11-dev")

if(FLEXCP_BUILD_TESTS)
  find_package(GTest QUIET)
  flexcp_require(GTest_FOUND "GoogleTest" "apt-get install -y libgtest-dev libgmock-dev")
endif()

if(FLEXCP_BUILD_BENCH)
  # The CPU benchmark compares against the machine's OpenBLAS sgemm (DESIGN §6).
  find_library(FLEXCP_OPENBLAS_LIB NAMES openblas)
  find_path(FLEXCP_CBLAS_INCLUDE NAMES cblas.h PATH_SUFFIXES openblas)
  if(NOT FLEXCP_OPENBLAS_LIB OR NOT FLEXCP_CBLAS_INCLUDE)
    set(_blas_found FALSE)
  else()
    set(_blas_found TRUE)
  endif()
  flexcp_require(_blas_found "OpenBLAS (benchmark baseline)" "apt-get install -y libopenblas-dev")
endif()
