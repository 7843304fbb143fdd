// What the device communicators (nccl.cc, staged.cc) share: they move device memory, and a plain
// start() is start_on() the legacy default stream.
#pragma once

#include <memory>
#include <vector>

#include "flexcp/comm.h"

namespace flexcp::comm_detail {

class DeviceCommunicator : public Communicator {
 public:
  Device memory() const final { return Device::kCuda; }
  std::unique_ptr<CommHandle> start(const std::vector<SendOp>& sends,
                                    const std::vector<RecvOp>& recvs) final {
    return start_on(nullptr, sends, recvs);
  }
};

}  // namespace flexcp::comm_detail
