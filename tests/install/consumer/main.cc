// Uses the installed public header only: builds a mask, runs the forward, checks a known value.
#include <flexcp/flexcp.h>

#include <cmath>
#include <cstdio>
#include <vector>

int main() {
  // One query attending two keys with equal logits: out is the mean of the two values.
  const flexcp::Mask mask = flexcp::masks::full(1, 2);
  std::vector<float> q = {1, 0}, k = {0, 1, 0, 1}, v = {2, 4, 6, 8}, out(2), lse(1);
  flexcp::forward(flexcp::make_view(q.data(), flexcp::DType::kFloat32, {1, 1, 2}),
                  flexcp::make_view(k.data(), flexcp::DType::kFloat32, {2, 1, 2}),
                  flexcp::make_view(v.data(), flexcp::DType::kFloat32, {2, 1, 2}), mask,
                  flexcp::make_view(out.data(), flexcp::DType::kFloat32, {1, 1, 2}),
                  flexcp::make_view(lse.data(), flexcp::DType::kFloat32, {1, 1}));
  const bool ok = std::abs(out[0] - 4) < 1e-6 && std::abs(out[1] - 6) < 1e-6 &&
                  std::abs(lse[0] - std::log(2.0f)) < 1e-6;
  std::printf("flexcp %s: out = [%g, %g], lse = %g: %s\n", flexcp::version(), out[0], out[1],
              lse[0], ok ? "ok" : "WRONG");
  return ok ? 0 : 1;
}
