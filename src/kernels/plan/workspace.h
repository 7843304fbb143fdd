// A plan's device workspace (DESIGN §3, FlashInfer's rule): one function, lay_out, places every
// region of a work list in the workspace; run once with no image it sizes the workspace, run again
// with a host image it also writes the contents, so size and contents cannot drift apart. Kernels
// see the typed views of DeviceWorkList, never offsets.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "flexcp/band.h"
#include "kernels/worklist/tile_mask.h"

namespace flexcp {

struct WorkEntry;
struct WorkList;

// Regions start on this boundary (TMA descriptors and vector loads need 16 bytes; 256 keeps each
// region on its own cache lines).
inline constexpr std::size_t kWorkspaceAlign = 256;
// The persistent scheduler's counters: {next item - gridDim.x, CTAs done}, zero between launches
// (the kernel's last CTA resets them).
inline constexpr int kSchedulerInts = 2;

// A row-major (or column-major) work list as a kernel reads it from the workspace.
struct DeviceWorkList {
  const std::int64_t* tile_offsets = nullptr;  // [num_tiles + 1]
  const WorkEntry* entries = nullptr;
  const Band* bands = nullptr;
  const std::int32_t* tile_order = nullptr;  // [num_tiles], busiest first
  int* scheduler = nullptr;                  // [kSchedulerInts]
  std::int64_t num_tiles = 0;
};

// Places regions one after another from `base` (a device address, or 0 when only sizing); with
// an image (host memory of copied_size() bytes, laid out like the workspace) it also copies in the
// regions that are not scratch.
class WorkspaceWriter {
 public:
  WorkspaceWriter(std::uintptr_t base, unsigned char* image) : base_(base), image_(image) {}

  template <class T>
  const T* put(const char* name, const std::vector<T>& values) {
    return static_cast<const T*>(place(name, values.data(), values.size() * sizeof(T)));
  }
  template <class T>
  T* zeros(const char* name, std::size_t count) {
    return static_cast<T*>(place(name, nullptr, count * sizeof(T)));
  }
  // A region the kernels fill themselves (scratch): nothing is copied to it, so it may be large.
  // Scratch regions come after every copied one.
  template <class T>
  T* scratch(const char* name, std::size_t count) {
    return static_cast<T*>(place(name, nullptr, count * sizeof(T), /*copied=*/false));
  }
  std::size_t size() const { return offset_; }
  // The leading bytes that hold copied regions: what the host image covers.
  std::size_t copied_size() const { return copied_; }
  // "entries 1234 B, bands 64 B, ...": what a too-small workspace is told it lacks.
  const std::string& regions() const { return regions_; }

 private:
  void* place(const char* name, const void* src, std::size_t bytes, bool copied = true) {
    offset_ = (offset_ + kWorkspaceAlign - 1) / kWorkspaceAlign * kWorkspaceAlign;
    if (copied && scratch_seen_)
      throw std::logic_error("WorkspaceWriter: a copied region after a scratch region");
    scratch_seen_ = scratch_seen_ || !copied;
    if (copied && image_) {
      if (src)
        std::memcpy(image_ + offset_, src, bytes);
      else
        std::memset(image_ + offset_, 0, bytes);
    }
    regions_ +=
        (regions_.empty() ? "" : ", ") + std::string(name) + " " + std::to_string(bytes) + " B";
    void* at = reinterpret_cast<void*>(base_ + offset_);
    offset_ += bytes;
    if (copied) copied_ = offset_;
    return at;
  }

  std::uintptr_t base_;
  unsigned char* image_;
  std::size_t offset_ = 0;
  std::size_t copied_ = 0;
  bool scratch_seen_ = false;
  std::string regions_;
};

// Every region of `list`, in a fixed order.
DeviceWorkList lay_out(const WorkList& list, WorkspaceWriter& writer);

}  // namespace flexcp
