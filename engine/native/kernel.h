// The native kernels' entry points, one per instruction set (kernel.inc, panel.inc, qpanel.inc,
// softmax.inc).
#pragma once

#include <cstdint>

namespace dspark_native {
namespace avx2 {
void causal_softmax(const float* s, float* out, int64_t S, int64_t L, int64_t offset, int64_t r0, int64_t r1);
void gemm(const float* x, int64_t R, int64_t K, const float* w, int64_t ldw, float* out, int64_t N,
          int64_t n0, int64_t n1);
void gemm_packed(const float* x, int64_t R, int64_t K, const float* wp, float* out, int64_t N, int64_t p0,
                 int64_t p1);
void gemm_qpacked(const float* x, int64_t R, int64_t K, int64_t G, int bits, const uint8_t* qp,
                  const uint16_t* sp, const uint16_t* bp, float* out, int64_t N, int64_t p0, int64_t p1);
}
namespace avx512 {
void causal_softmax(const float* s, float* out, int64_t S, int64_t L, int64_t offset, int64_t r0, int64_t r1);
void gemm(const float* x, int64_t R, int64_t K, const float* w, int64_t ldw, float* out, int64_t N,
          int64_t n0, int64_t n1);
void gemm_packed(const float* x, int64_t R, int64_t K, const float* wp, float* out, int64_t N, int64_t p0,
                 int64_t p1);
void gemm_qpacked(const float* x, int64_t R, int64_t K, int64_t G, int bits, const uint8_t* qp,
                  const uint16_t* sp, const uint16_t* bp, float* out, int64_t N, int64_t p0, int64_t p1);
}
}  // namespace dspark_native
