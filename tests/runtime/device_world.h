// The main of the MPI test programs on device communicators (device_comm_test.cc,
// dist_device_test.cc): `--backend staged|nccl` picks the communicator under test, built over
// MPI with one GPU per rank (round robin); where no GPU is present `skip` says why and the tests
// skip. Returns nonzero when any rank had a failure.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "flexcp/comm.h"
#include "kernels/cuda/device.h"

namespace flexcp::test {

inline int run_device_tests(int argc, char** argv, Communicator*& host_out,
                            Communicator*& device_out, std::string& backend, std::string& skip) {
  ::testing::InitGoogleTest(&argc, argv);
  backend = "staged";
  for (int i = 1; i + 1 < argc; ++i)
    if (std::string(argv[i]) == "--backend") backend = argv[i + 1];
  auto host = make_mpi_communicator();
  host_out = host.get();
  std::unique_ptr<Communicator> device;
  std::string why;
  const int gpus = cuda::device_count(&why);
  if (gpus == 0) {
    skip = "no CUDA device here (" + why + ")";
  } else {
    if (cudaSetDevice(host->rank() % gpus) != cudaSuccess) return 2;
    device = backend == "nccl" ? make_nccl_communicator(*host) : make_staged_communicator(*host);
    device_out = device.get();
  }
  if (host->rank() != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
  }
  int failed = RUN_ALL_TESTS();
  std::vector<int> all(host->size());
  host->all_gather(&failed, sizeof failed, all.data());
  for (int r = 0; r < host->size(); ++r)
    if (all[r]) {
      if (host->rank() == 0) std::printf("rank %d had failures\n", r);
      failed = 1;
    }
  device.reset();  // before MPI goes with the host communicator
  return failed;
}

}  // namespace flexcp::test
