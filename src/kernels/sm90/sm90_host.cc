#include "kernels/sm90/sm90_host.h"

#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include "flexcp/status.h"
#include "kernels/cuda/runtime.h"

namespace flexcp::sm90 {
namespace {

PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder(const std::string& fn) {
  static PFN_cuTensorMapEncodeTiled_v12000 encoder = [&] {
    void* ptr = nullptr;
    cudaDriverEntryPointQueryResult found{};
    cuda::check(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &ptr, 12000,
                                                 cudaEnableDefault, &found),
                fn, "looking up cuTensorMapEncodeTiled in the driver");
    if (found != cudaDriverEntryPointSuccess || ptr == nullptr)
      throw Error(Status::kCudaError,
                  fn + ": the CUDA driver has no cuTensorMapEncodeTiled (needs CUDA 12+)");
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(ptr);
  }();
  return encoder;
}

void check_encoded(const std::string& fn, CUresult res, const char* name,
                   const std::string& shape) {
  if (res != CUDA_SUCCESS)
    throw Error(Status::kCudaError, fn + ": describing " + name + " (shape " + shape +
                                        ") for the tensor memory accelerator failed, CUresult " +
                                        std::to_string(static_cast<int>(res)));
}

}  // namespace

CUtensorMap tensor_map(const std::string& fn, const char* name, const TensorView& t,
                       std::uint32_t box_rows, std::uint32_t box_heads) {
  const std::size_t esize = dtype_size(t.dtype);
  const cuuint64_t dims[3] = {static_cast<cuuint64_t>(t.shape[2]),
                              static_cast<cuuint64_t>(t.shape[0]),
                              static_cast<cuuint64_t>(t.shape[1])};
  const cuuint64_t strides[2] = {static_cast<cuuint64_t>(t.strides[0]) * esize,
                                 static_cast<cuuint64_t>(t.strides[1]) * esize};
  const cuuint32_t box[3] = {64, box_rows, box_heads};
  const cuuint32_t element_strides[3] = {1, 1, 1};
  CUtensorMap map;
  check_encoded(
      fn,
      tensor_map_encoder(fn)(&map,
                             t.dtype == DType::kBFloat16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
                                                         : CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
                             3, t.data, dims, strides, box, element_strides,
                             CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                             CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE),
      name, t.shape_string());
  return map;
}

CUtensorMap accumulator_map(const std::string& fn, const char* name, float* data,
                            std::int64_t tokens, std::int64_t heads, std::int64_t head_dim,
                            std::uint32_t box_cols, std::uint32_t box_rows) {
  constexpr std::size_t esize = sizeof(float);
  const cuuint64_t dims[3] = {static_cast<cuuint64_t>(head_dim), static_cast<cuuint64_t>(tokens),
                              static_cast<cuuint64_t>(heads)};
  const cuuint64_t strides[2] = {static_cast<cuuint64_t>(heads * head_dim) * esize,
                                 static_cast<cuuint64_t>(head_dim) * esize};
  const cuuint32_t box[3] = {box_cols, box_rows, 1};
  const cuuint32_t element_strides[3] = {1, 1, 1};
  CUtensorMap map;
  check_encoded(fn,
                tensor_map_encoder(fn)(
                    &map, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 3, data, dims, strides, box,
                    element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                    CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE),
                name,  // a std::string first: g++ 12 warns (-Wrestrict) on "[" + string
                std::string("[") + std::to_string(tokens) + ", " + std::to_string(heads) + ", " +
                    std::to_string(head_dim) + "] fp32");
  return map;
}

void check_layout(const std::string& fn, const char* name, const TensorView& t) {
  const std::size_t esize = dtype_size(t.dtype);
  const bool aligned = reinterpret_cast<std::uintptr_t>(t.data) % 16 == 0 &&
                       (t.strides[0] * esize) % 16 == 0 && (t.strides[1] * esize) % 16 == 0;
  if (t.strides[2] != 1 || !aligned)
    throw Error(Status::kInvalidArgument,
                fn + ": " + name + " has strides [" + std::to_string(t.strides[0]) + ", " +
                    std::to_string(t.strides[1]) + ", " + std::to_string(t.strides[2]) +
                    "]; the CUDA kernel expects a unit stride along D, a 16-byte aligned data "
                    "pointer and token/head strides that are multiples of 16 bytes");
}

int check_device(const std::string& fn, int device_index) {
  int major = 0, minor = 0, sms = 0;
  cuda::check(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device_index), fn,
              "reading the compute capability");
  cuda::check(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device_index), fn,
              "reading the compute capability");
  cuda::check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device_index), fn,
              "reading the multiprocessor count");
  if (major != 9 || minor != 0)
    throw Error(Status::kNotCompiled,
                fn + ": the CUDA kernel is built for sm_90a (Hopper); device " +
                    std::to_string(device_index) + " has compute capability " +
                    std::to_string(major) + "." + std::to_string(minor));
  return sms;
}

int planned_multiprocessors(int device_index) {
  constexpr int kHopperSms = 132;
  int sms = 0;
  if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device_index) != cudaSuccess) {
    cudaGetLastError();  // not sticky: clear it for the caller's next check
    return kHopperSms;
  }
  return sms > 0 ? sms : kHopperSms;
}

double planned_memory_gbs_per_sm(int device_index) {
  int khz = 0, bits = 0;
  if (cudaDeviceGetAttribute(&khz, cudaDevAttrMemoryClockRate, device_index) != cudaSuccess ||
      cudaDeviceGetAttribute(&bits, cudaDevAttrGlobalMemoryBusWidth, device_index) != cudaSuccess) {
    cudaGetLastError();  // not sticky: clear it for the caller's next check
    return 0;
  }
  if (khz <= 0 || bits <= 0) return 0;
  // Over the SMs the units are planned for (one per SM).
  return 2.0 * double(khz) * 1e3 * double(bits) / 8.0 /
         double(planned_multiprocessors(device_index)) / 1e9;
}

}  // namespace flexcp::sm90
