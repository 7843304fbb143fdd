// The device communicators in a build without CUDA: asking for one says how to get it.
#include <string>

#include "flexcp/comm.h"
#include "flexcp/status.h"

namespace flexcp {
namespace {

[[noreturn]] void no_cuda(const char* fn) {
  throw Error(Status::kNotCompiled,
              std::string(fn) +
                  ": this build has no CUDA (configured without nvcc or with -DFLEXCP_CUDA=OFF); "
                  "the device communicators need a CUDA build");
}

}  // namespace

NcclUniqueId make_nccl_unique_id() {
  no_cuda("flexcp::make_nccl_unique_id");
}
std::unique_ptr<Communicator> make_nccl_communicator(const NcclUniqueId&, int, int,
                                                     const DeviceCommOptions&) {
  no_cuda("flexcp::make_nccl_communicator");
}
std::unique_ptr<Communicator> make_nccl_communicator(Communicator&, const DeviceCommOptions&) {
  no_cuda("flexcp::make_nccl_communicator");
}
std::unique_ptr<Communicator> make_staged_communicator(Communicator&, const DeviceCommOptions&) {
  no_cuda("flexcp::make_staged_communicator");
}

}  // namespace flexcp
