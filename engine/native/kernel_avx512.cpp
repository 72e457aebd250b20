// AVX-512F build of the kernel (compiled with -mavx512f -mfma), chosen at run time where the CPU has it.
#define KERNEL_NS avx512
#include "kernel.inc"
#include "panel.inc"
#include "qpanel.inc"
#include "softmax.inc"
