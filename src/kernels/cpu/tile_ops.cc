#include "kernels/cpu/tile_ops.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "core/dtype.h"
#include "kernels/cpu/simd.h"

namespace flexcp::cpu {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// fp16 elements: the compiler's _Float16 where the target has it (the conversions vectorise), else
// their bits, converted in integer arithmetic (core/dtype.h; clang 14 on x86 without AVX512-FP16).
#if defined(__FLT16_MANT_DIG__)
using Half = _Float16;
#else
struct Half {
  std::uint16_t bits;
};
#endif

template <class Visit>
void with_typed(DType dtype, Visit&& visit) {
  switch (dtype) {
    case DType::kFloat32:
      visit(static_cast<const float*>(nullptr));
      break;
    case DType::kBFloat16:
      visit(static_cast<const std::uint16_t*>(nullptr));
      break;
    case DType::kFloat16:
      visit(static_cast<const Half*>(nullptr));
      break;
    case DType::kFloat64:
      visit(static_cast<const double*>(nullptr));
      break;
  }
}

template <class T>
float to_float(T x) {
  if constexpr (std::is_same_v<T, std::uint16_t>)
    return bf16_to_float(x);
  else if constexpr (std::is_class_v<T>)
    return fp16_to_float(x.bits);
  else
    return static_cast<float>(x);
}

template <class T>
T from_float(float x) {
  if constexpr (std::is_same_v<T, std::uint16_t>)
    return float_to_bf16(x);
  else if constexpr (std::is_class_v<T>)
    return T{float_to_fp16(x)};
  else
    return static_cast<T>(x);
}

std::int64_t row_offset(const TensorView& t, const TileRows& tile, int r) {
  return (tile.x0 + r / tile.group) * t.strides[0] + (tile.head0 + r % tile.group) * t.strides[1];
}

}  // namespace

void gather_rows(const TensorView& t, const TileRows& tile, float mul, float* dst, int ld,
                 int rows_padded) {
  const int dim = static_cast<int>(t.shape[2]);
  const std::int64_t sd = t.strides[2];
  with_typed(t.dtype, [&](auto tag) {
    using T = std::remove_const_t<std::remove_pointer_t<decltype(tag)>>;
    const T* base = static_cast<const T*>(t.data);
    for (int r = 0; r < tile.rows(); ++r) {
      const T* src = base + row_offset(t, tile, r);
      float* out = dst + static_cast<std::int64_t>(r) * ld;
      for (int d = 0; d < dim; ++d) out[d] = to_float(src[d * sd]) * mul;
      std::fill(out + dim, out + ld, 0.0f);
    }
  });
  for (int r = tile.rows(); r < rows_padded; ++r)
    std::fill(dst + static_cast<std::int64_t>(r) * ld, dst + static_cast<std::int64_t>(r + 1) * ld,
              0.0f);
}

void gather_transposed(const TensorView& t, const TileRows& tile, float mul, float* dst, int ld,
                       int dp) {
  const int dim = static_cast<int>(t.shape[2]);
  const std::int64_t sd = t.strides[2];
  const int rows = tile.rows();
  with_typed(t.dtype, [&](auto tag) {
    using T = std::remove_const_t<std::remove_pointer_t<decltype(tag)>>;
    const T* base = static_cast<const T*>(t.data);
    for (int r = 0; r < rows; ++r) {
      const T* src = base + row_offset(t, tile, r);
      for (int d = 0; d < dim; ++d)
        dst[static_cast<std::int64_t>(d) * ld + r] = to_float(src[d * sd]) * mul;
    }
  });
  for (int d = 0; d < dp; ++d) {
    float* row = dst + static_cast<std::int64_t>(d) * ld;
    std::fill(row + (d < dim ? rows : 0), row + ld, 0.0f);
  }
}

void scatter_rows(const float* src, int ld, const float* row_mul, const TensorView& t,
                  const TileRows& tile) {
  const int dim = static_cast<int>(t.shape[2]);
  const std::int64_t sd = t.strides[2];
  with_typed(t.dtype, [&](auto tag) {
    using T = std::remove_const_t<std::remove_pointer_t<decltype(tag)>>;
    T* base = static_cast<T*>(t.data);
    for (int r = 0; r < tile.rows(); ++r) {
      T* out = base + row_offset(t, tile, r);
      const float* in = src + static_cast<std::int64_t>(r) * ld;
      const float mul = row_mul ? row_mul[r] : 1.0f;
      for (int d = 0; d < dim; ++d) out[d * sd] = from_float<T>(in[d] * mul);
    }
  });
}

void mask_block(float* s, int ld, const TileRows& rows, std::int64_t c0, int num_cols,
                const Band& band, EntryMask mask) {
  for (int xi = 0; xi < rows.num_tokens; ++xi) {
    const BlockColumns cols = attended_columns(band, mask, rows.x0 + xi, c0, c0 + num_cols, ld);
    const std::int64_t lo = cols.lo, hi = cols.hi;
    if (lo == 0 && hi == ld) continue;
    for (int j = 0; j < rows.group; ++j) {
      float* row = s + static_cast<std::int64_t>(xi * rows.group + j) * ld;
      std::fill(row, row + lo, kNegInf);
      std::fill(row + hi, row + ld, kNegInf);
    }
  }
}

void online_softmax(float* s, int ld, int rows, float* m, float* l, float* o, int ldo) {
  for (int r = 0; r < rows; ++r) {
    float* row = s + static_cast<std::int64_t>(r) * ld;
    Vec vmax = splat(kNegInf);
    for (int c = 0; c < ld; c += kLanes) {
      const Vec v = load(row + c);
      vmax = v > vmax ? v : vmax;
    }
    const float m_new = std::max(m[r], reduce_max(vmax));
    if (m_new == kNegInf) {  // nothing attended in this row yet, or only NaN logits
      // The maximum passes over NaN; a row whose attended logits are all NaN (a NaN in its q,
      // an infinity times zero) must end as NaN, not as a row that attends nothing.
      if (std::any_of(row, row + ld, [](float x) { return x != x; }))
        m[r] = l[r] = std::numeric_limits<float>::quiet_NaN();
      std::fill(row, row + ld, 0.0f);
      continue;
    }
    const Vec vm = splat(m_new);
    Vec vsum = splat(0.0f);
    for (int c = 0; c < ld; c += kLanes) {
      const Vec p = exp2(load(row + c) - vm);
      store(row + c, p);
      vsum += p;
    }
    const float alpha = exp2(m[r] - m_new);
    l[r] = l[r] * alpha + reduce_sum(vsum);
    m[r] = m_new;
    if (alpha != 1.0f) {
      float* orow = o + static_cast<std::int64_t>(r) * ldo;
      const Vec va = splat(alpha);
      for (int d = 0; d < ldo; d += kLanes) store(orow + d, load(orow + d) * va);
    }
  }
}

void exp2_minus_rows(float* s, int ld, int rows, const float* sub) {
  for (int r = 0; r < rows; ++r) {
    float* row = s + static_cast<std::int64_t>(r) * ld;
    const Vec vs = splat(sub[r]);
    for (int c = 0; c < ld; c += kLanes) store(row + c, exp2(load(row + c) - vs));
  }
}

void exp2_minus_cols(float* s, int ld, int rows, const float* sub) {
  for (int r = 0; r < rows; ++r) {
    float* row = s + static_cast<std::int64_t>(r) * ld;
    for (int c = 0; c < ld; c += kLanes) store(row + c, exp2(load(row + c) - load(sub + c)));
  }
}

void softmax_grad_rows(const float* p, float* dp, int ld, int rows, const float* d,
                       const float* deriv) {
  for (int r = 0; r < rows; ++r) {
    const std::int64_t off = static_cast<std::int64_t>(r) * ld;
    const Vec vd = splat(d[r]);
    for (int c = 0; c < ld; c += kLanes) {
      Vec g = load(p + off + c) * (load(dp + off + c) - vd);
      if (deriv) g *= load(deriv + off + c);
      store(dp + off + c, g);
    }
  }
}

void softmax_grad_cols(const float* p, float* dp, int ld, int rows, const float* d,
                       const float* deriv) {
  for (int r = 0; r < rows; ++r) {
    const std::int64_t off = static_cast<std::int64_t>(r) * ld;
    for (int c = 0; c < ld; c += kLanes) {
      Vec g = load(p + off + c) * (load(dp + off + c) - load(d + c));
      if (deriv) g *= load(deriv + off + c);
      store(dp + off + c, g);
    }
  }
}

void apply_softcap(float* s, int ld, int rows, float cap, float out_mul, float* deriv) {
  const std::int64_t n = static_cast<std::int64_t>(rows) * ld;
  for (std::int64_t i = 0; i < n; ++i) {
    const float t = std::tanh(s[i] / cap);
    s[i] = cap * t * out_mul;
    if (deriv) deriv[i] = 1.0f - t * t;
  }
}

}  // namespace flexcp::cpu
