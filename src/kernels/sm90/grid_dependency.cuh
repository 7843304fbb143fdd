// Programmatic dependent launch, the device side (the host side is launch.cuh's LaunchOrder);
// apart from kernel_common.cuh so that the small CUDA-C kernels use it without CuTe.
#pragma once

namespace flexcp::sm90::detail {

// A kernel launched with LaunchOrder::kOverlapPrevious may start before the one ahead of it on the
// stream has finished, and must wait here before it reads or writes anything that kernel touches;
// the wait returns once that kernel has completed and its writes are visible. A no-op in a kernel
// launched the ordinary way.
__device__ __forceinline__ void wait_for_previous_kernel() {
  asm volatile("griddepcontrol.wait;" ::: "memory");
}
// Lets the kernel queued behind this one (if launched with kOverlapPrevious) start launching as
// soon as every block of this one has called it or exited; it says nothing about memory (the
// other kernel's wait does).
__device__ __forceinline__ void allow_next_kernel_to_launch() {
  asm volatile("griddepcontrol.launch_dependents;" :::);
}

}  // namespace flexcp::sm90::detail
