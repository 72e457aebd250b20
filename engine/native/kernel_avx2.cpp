// AVX2 + FMA build of the kernel (compiled with -mavx2 -mfma -mf16c).
#define KERNEL_NS avx2
#include "kernel.inc"
#include "panel.inc"
#include "qpanel.inc"
#include "softmax.inc"
