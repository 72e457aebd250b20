// The native kernels' entry points, one per instruction set (kernel.inc, panel.inc, qpanel.inc,
// softmax.inc).
#pragma once

#include <cstdint>

namespace dspark_native {

// few_row_attention's operands: q and out [B, H, L, D] contiguous; k and v [B, Hkv, S, D] with these
// strides (in floats) along B, Hkv, S and D.
struct AttentionArgs {
  const float* q;
  const float* k;
  const float* v;
  float* out;
  int64_t H, Hkv, L, S, D;
  int64_t k_strides[4], v_strides[4];
  float scale;
};
namespace avx2 {
void few_row_attention(const AttentionArgs& a, int64_t u0, int64_t u1);
void causal_softmax(const float* s, float* out, int64_t S, int64_t L, int64_t offset, int64_t r0, int64_t r1);
void gemm(const float* x, int64_t R, int64_t K, const float* w, int64_t ldw, float* out, int64_t N,
          int64_t n0, int64_t n1);
void gemm_packed(const float* x, int64_t R, int64_t K, const float* wp, float* out, int64_t N, int64_t p0,
                 int64_t p1);
void gemm_qpacked(const float* x, int64_t R, int64_t K, int64_t G, int bits, const uint8_t* qp,
                  const uint16_t* sp, const uint16_t* bp, float* out, int64_t N, int64_t p0, int64_t p1);
}
namespace avx512 {
void few_row_attention(const AttentionArgs& a, int64_t u0, int64_t u1);
void causal_softmax(const float* s, float* out, int64_t S, int64_t L, int64_t offset, int64_t r0, int64_t r1);
void gemm(const float* x, int64_t R, int64_t K, const float* w, int64_t ldw, float* out, int64_t N,
          int64_t n0, int64_t n1);
void gemm_packed(const float* x, int64_t R, int64_t K, const float* wp, float* out, int64_t N, int64_t p0,
                 int64_t p1);
void gemm_qpacked(const float* x, int64_t R, int64_t K, int64_t G, int bits, const uint8_t* qp,
                  const uint16_t* sp, const uint16_t* bp, float* out, int64_t N, int64_t p0, int64_t p1);
}
}  // namespace dspark_native
