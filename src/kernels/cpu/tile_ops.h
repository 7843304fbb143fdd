// Moving tiles between user tensors (any dtype, any strides) and the fp32 buffers of the CPU
// kernels, and the element-wise steps between the GEMMs. Tile rows are ordered (token, head):
// row r holds token x0 + r / group of head head0 + r % group.
#pragma once

#include <cstdint>

#include "flexcp/tensor.h"
#include "kernels/lse_merge.h"
#include "kernels/worklist/worklist.h"

namespace flexcp::cpu {

struct TileRows {
  std::int64_t x0 = 0;  // first token
  int num_tokens = 0;
  std::int64_t head0 = 0;  // first head
  int group = 1;           // heads per token
  int rows() const { return num_tokens * group; }
};

// dst[r * ld + d] = t[token][head][d] * mul for d < D, 0 for D <= d < ld; rows past rows() up to
// rows_padded are zero too (so that padded rows add nothing to a product).
void gather_rows(const TensorView& t, const TileRows& tile, float mul, float* dst, int ld,
                 int rows_padded);
// dst[d * ld + r] = t[token][head][d] * mul for d < D; zero for r in [rows(), ld) and d in [D, dp).
void gather_transposed(const TensorView& t, const TileRows& tile, float mul, float* dst, int ld,
                       int dp);
// t[token][head][d] = src[r * ld + d] * row_mul[r] (row_mul may be null for 1).
void scatter_rows(const float* src, int ld, const float* row_mul, const TensorView& t,
                  const TileRows& tile);

// Sets s[r][c] = -inf for every column c in [0, ld) that row r does not attend, where row r is
// token `rows.x0 + r / group` and column c is token `c0 + c` (c < num_cols are real columns).
void mask_block(float* s, int ld, const TileRows& rows, std::int64_t c0, int num_cols,
                const Band& band, EntryMask mask);

// One block of the forward's online softmax. s holds logits in log2 units; on return it holds
// p = 2^(s - m_new) (0 where masked), and m, l and the output rows o are rescaled.
void online_softmax(float* s, int ld, int rows, float* m, float* l, float* o, int ldo);

// s[r][c] = 2^(s[r][c] - sub[r]) (row_wise) or 2^(s[r][c] - sub[c]) (column-wise).
void exp2_minus_rows(float* s, int ld, int rows, const float* sub);
void exp2_minus_cols(float* s, int ld, int rows, const float* sub);

// ds[r][c] = p[r][c] * (dp[r][c] - delta) with delta = d[r] (rows) or d[c] (cols), times deriv
// when given (the softcap's chain factor). Written in place of dp.
void softmax_grad_rows(const float* p, float* dp, int ld, int rows, const float* d,
                       const float* deriv);
void softmax_grad_cols(const float* p, float* dp, int ld, int rows, const float* d,
                       const float* deriv);

// Softcap on logits s (natural units, already scaled): s = cap * tanh(s / cap) * out_mul, and
// deriv = 1 - tanh^2 when deriv is not null.
void apply_softcap(float* s, int ld, int rows, float cap, float out_mul, float* deriv);

}  // namespace flexcp::cpu
