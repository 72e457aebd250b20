// The native verify path (docs/native.md): `skinny_linear(x, w)` = x @ w.T for a few rows of x.
//
// Why: a decode step and a verify of a few tokens are bound by reading the weights once. MLX's CPU
// matmul (BLAS sgemm) does not keep that bound for 2-16 rows: the same bytes cost about twice as
// long at 8 rows as at 1. This kernel streams each weight row once from memory and, while it is
// in L1, multiplies it with every row of x.
//
// The kernels are kernel.inc (skinny_linear), panel.inc (packed_linear: float32 weights repacked in
// panels), qpanel.inc (quantized_linear: MLX's affine 4- and 8-bit weights in panels) and
// softmax.inc (causal_softmax, for attention over a prompt chunk), each built for AVX2 and for
// AVX-512 and chosen at run time; layer.inc (a llama layer's two calls around its KV cache) builds
// on qpanel.inc's entry points.
//
// Layout: x [R, K] row-contiguous (R = the product of x's leading dimensions), w [N, K] with unit
// column stride (an mlx.nn.Linear weight), out [R, N] row-major.

#include <omp.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdlib>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include <nanobind/nanobind.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include "mlx/allocator.h"
#include "mlx/array.h"
#include "mlx/backend/cpu/encoder.h"
#include "mlx/ops.h"
#include "mlx/primitives.h"
#include "mlx/utils.h"

#include "kernel.h"

namespace mx = mlx::core;
namespace nb = nanobind;
using namespace nb::literals;

namespace {

// DSPARK_NATIVE_ISA=avx2 forces the AVX2 build on an AVX-512 CPU (for comparing the two).
bool has_avx512() {
  __builtin_cpu_init();
  const char* isa = std::getenv("DSPARK_NATIVE_ISA");
  return __builtin_cpu_supports("avx512f") && !(isa && std::string(isa) == "avx2");
}

// fn(begin, end, wide) over [0, units) split into `threads` contiguous ranges, each a multiple of
// `align` units and at least `min_units` long (so no two threads share a cache line of a row, and
// a thread has enough work); `wide`: run the AVX-512 build.
template <typename Fn>
void split(int64_t units, int64_t align, int64_t min_units, int threads, Fn fn) {
  static const bool wide = has_avx512();
  threads = std::max(1, std::min<int>(threads, static_cast<int>((units + min_units - 1) / min_units)));
  int64_t chunk = ((units + threads - 1) / threads + align - 1) / align * align;
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1)
  for (int t = 0; t < threads; ++t) {
    int64_t begin = std::min<int64_t>(units, t * chunk), end = std::min<int64_t>(units, begin + chunk);
    fn(begin, end, wide);
  }
}

// Outputs in ranges of multiples of 16.
void skinny_gemm(const float* x, int64_t R, int64_t K, const float* w, int64_t ldw, float* out, int64_t N,
                 int threads) {
  split(N, 16, 64, threads, [&](int64_t n0, int64_t n1, bool wide) {
    if (wide)
      dspark_native::avx512::gemm(x, R, K, w, ldw, out, N, n0, n1);
    else
      dspark_native::avx2::gemm(x, R, K, w, ldw, out, N, n0, n1);
  });
}

// Panels in ranges of multiples of 12 (the AVX-512 build walks three or four at a time).
void packed_gemm(const float* x, int64_t R, int64_t K, const float* wp, int64_t P, float* out, int64_t N,
                 int threads) {
  split(P, 12, 12, threads, [&](int64_t p0, int64_t p1, bool wide) {
    if (wide)
      dspark_native::avx512::gemm_packed(x, R, K, wp, out, N, p0, p1);
    else
      dspark_native::avx2::gemm_packed(x, R, K, wp, out, N, p0, p1);
  });
}

// Quantized panels [p0, p1) through the build `wide` picks.
void qpacked_range(bool wide, const float* x, int64_t R, int64_t K, int64_t G, int bits, const uint8_t* qp,
                   const uint16_t* sp, const uint16_t* bp, float* out, int64_t N, int64_t p0, int64_t p1) {
  if (wide)
    dspark_native::avx512::gemm_qpacked(x, R, K, G, bits, qp, sp, bp, out, N, p0, p1);
  else
    dspark_native::avx2::gemm_qpacked(x, R, K, G, bits, qp, sp, bp, out, N, p0, p1);
}

// Quantized panels in ranges of multiples of 4 (the AVX-512 build walks two or four at a time).
void qpacked_gemm(const float* x, int64_t R, int64_t K, int64_t G, int bits, const uint8_t* qp,
                  const uint16_t* sp, const uint16_t* bp, int64_t P, float* out, int64_t N, int threads) {
  split(P, 4, 8, threads, [&](int64_t p0, int64_t p1, bool wide) {
    qpacked_range(wide, x, R, K, G, bits, qp, sp, bp, out, N, p0, p1);
  });
}

// A weight quantized to `bits` with groups of `group` and packed by pack_quantized (codes qp
// [P, K * bits / 8, 16] uint8, scales sp and biases bp [P, K / group, 16] float16) holding n <= 16 P
// outputs, for inputs of K values; otherwise invalid_argument naming `what`.
void check_quantized(const mx::array& qp, const mx::array& sp, const mx::array& bp, int64_t n, int bits,
                     int64_t group, int64_t K, const std::string& what) {
  if (qp.dtype() != mx::uint8 || sp.dtype() != mx::float16 || bp.dtype() != mx::float16)
    throw std::invalid_argument(what + ": uint8 codes, float16 scales and biases expected");
  if (bits != 4 && bits != 8) throw std::invalid_argument(what + ": 4 or 8 bits");
  if (group < 2 || group % 2 || K % group || qp.ndim() != 3 || qp.shape(2) != 16 || qp.shape(1) != K * bits / 8 ||
      sp.shape() != mx::Shape{qp.shape(0), static_cast<int>(K / group), 16} || bp.shape() != sp.shape() || n < 0 ||
      n > 16 * static_cast<int64_t>(qp.shape(0)))
    throw std::invalid_argument(what + ": codes [P, K*bits/8, 16], scales and biases [P, K/group, 16] and "
                                "n <= 16 P expected for inputs of K values");
}

// Weights (inputs from `first` on) are passed in row-contiguous (row_contiguous below); a primitive
// reads them as such.
void require_row_contiguous(const std::vector<mx::array>& inputs, size_t first, const char* what) {
  for (size_t i = first; i < inputs.size(); ++i)
    if (!inputs[i].flags().row_contiguous) throw std::runtime_error(std::string(what) + ": weights must be row-contiguous");
}

// The start of every primitive's eval_cpu here: allocate the output and register the arrays
// with the stream's CPU encoder, which then dispatches the kernel after the ops before it.
mx::cpu::CommandEncoder& begin_eval(mx::Stream stream, const std::vector<mx::array>& inputs,
                                    std::vector<mx::array>& outputs) {
  auto& encoder = mx::cpu::get_command_encoder(stream);
  for (auto& out : outputs) out.set_data(mx::allocator::malloc(out.nbytes()));
  for (const auto& a : inputs) encoder.set_input_array(a);
  for (auto& out : outputs) encoder.set_output_array(out);
  return encoder;
}

mx::cpu::CommandEncoder& begin_eval(mx::Stream stream, const std::vector<mx::array>& inputs, mx::array& out) {
  std::vector<mx::array> outputs{out};  // a copy of an array shares its data
  return begin_eval(stream, inputs, outputs);
}

// An operand as a primitive here reads it: `a` itself where it is already evaluated and
// row-contiguous (weights, always), else a contiguous-copy op (a lazy array's layout is unknown
// until it is evaluated; the op shares the buffer when it turns out contiguous). An op a weight
// saves matters: each costs a dispatch and an allocation at every forward.
mx::array row_contiguous(const mx::array& a, mx::Stream s) {
  return a.is_available() && a.flags().row_contiguous ? a : mx::contiguous(a, false, s);
}

// `a`'s float32 elements in row-major order, read inside a dispatched task (the data is ready
// then): its own buffer where it is row-contiguous, else a copy into `scratch` walked through its
// strides. So a primitive can take a lazy activation as it comes, without a contiguous-copy op
// (whose layout is only known once evaluated) in front of it at every forward.
const float* row_major(const mx::array& a, std::vector<float>& scratch) {
  if (a.flags().row_contiguous) return a.data<float>();
  const float* base = a.data<float>();
  scratch.resize(a.size());
  std::vector<int64_t> index(a.ndim(), 0);
  for (size_t i = 0; i < a.size(); ++i) {
    int64_t at = 0;
    for (size_t d = 0; d < index.size(); ++d) at += index[d] * a.strides(d);
    scratch[i] = base[at];
    for (int d = static_cast<int>(index.size()) - 1; d >= 0 && ++index[d] == a.shape(d); --d) index[d] = 0;
  }
  return scratch.data();
}

#include "layer.inc"

// x @ w.T on the CPU; `packed_n` >= 0: w is packed in panels [P, K, 16] (pack_panels) for
// packed_n outputs, else w is [N, K] as it is.
class SkinnyLinear : public mx::UnaryPrimitive {
 public:
  SkinnyLinear(mx::Stream stream, int threads, int64_t packed_n = -1)
      : mx::UnaryPrimitive(stream), threads_(threads), packed_n_(packed_n) {}

  void eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) override {
    const mx::array& x = inputs[0];
    const mx::array& w = inputs[1];
    bool packed = packed_n_ >= 0;
    if (!x.flags().row_contiguous || (packed ? !w.flags().row_contiguous : w.strides(1) != 1))
      throw std::runtime_error("skinny_linear: x must be row-contiguous, w have unit column stride (packed: be "
                               "row-contiguous)");
    auto& encoder = begin_eval(stream(), inputs, out);
    int64_t K = w.shape(1), threads = threads_;
    const float* xp = x.data<float>();
    const float* wp = w.data<float>();
    float* op = out.data<float>();
    if (packed) {
      int64_t P = w.shape(0), N = packed_n_, R = x.size() / K;
      encoder.dispatch([=]() { packed_gemm(xp, R, K, wp, P, op, N, threads); });
    } else {
      int64_t N = w.shape(0), R = x.size() / K, ldw = w.strides(0);
      encoder.dispatch([=]() { skinny_gemm(xp, R, K, wp, ldw, op, N, threads); });
    }
  }

  void eval_gpu(const std::vector<mx::array>&, mx::array&) override {
    throw std::runtime_error("skinny_linear runs on the CPU only");
  }

  const char* name() const override { return "SkinnyLinear"; }

  bool is_equivalent(const mx::Primitive& other) const override {
    auto& o = static_cast<const SkinnyLinear&>(other);
    return threads_ == o.threads_ && packed_n_ == o.packed_n_;
  }

  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& inputs) override {
    mx::Shape shape = inputs[0].shape();
    shape.back() = packed_n_ >= 0 ? static_cast<int>(packed_n_) : inputs[1].shape(0);
    return {shape};
  }

 private:
  int threads_;
  int64_t packed_n_;
};

// x @ w.T for MLX affine-quantized w held in quantized panels (qpanel.inc): inputs x, codes
// [P, K * bits / 8, 16] uint8, scales and biases [P, K / G, 16] float16.
class QuantizedPanelLinear : public mx::UnaryPrimitive {
 public:
  QuantizedPanelLinear(mx::Stream stream, int64_t n, int bits, int64_t group, int threads)
      : mx::UnaryPrimitive(stream), n_(n), bits_(bits), group_(group), threads_(threads) {}

  void eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) override {
    require_row_contiguous(inputs, 1, "quantized_linear");
    const mx::array &x = inputs[0], &qp = inputs[1], &sp = inputs[2], &bp = inputs[3];
    auto& encoder = begin_eval(stream(), inputs, out);
    int64_t K = x.shape(-1), R = x.size() / K, P = qp.shape(0), N = n_, G = group_;
    int bits = bits_, threads = threads_;
    const uint8_t* codes = qp.data<uint8_t>();
    const auto* scales = reinterpret_cast<const uint16_t*>(sp.data<mx::float16_t>());
    const auto* biases = reinterpret_cast<const uint16_t*>(bp.data<mx::float16_t>());
    float* op = out.data<float>();
    encoder.dispatch([=]() {
      std::vector<float> scratch;
      qpacked_gemm(row_major(x, scratch), R, K, G, bits, codes, scales, biases, P, op, N, threads);
    });
  }

  void eval_gpu(const std::vector<mx::array>&, mx::array&) override {
    throw std::runtime_error("quantized_linear runs on the CPU only");
  }

  const char* name() const override { return "QuantizedPanelLinear"; }

  bool is_equivalent(const mx::Primitive& other) const override {
    auto& o = static_cast<const QuantizedPanelLinear&>(other);
    return n_ == o.n_ && bits_ == o.bits_ && group_ == o.group_ && threads_ == o.threads_;
  }

  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& inputs) override {
    mx::Shape shape = inputs[0].shape();
    shape.back() = static_cast<int>(n_);
    return {shape};
  }

 private:
  int64_t n_;
  int bits_;
  int64_t group_;
  int threads_;
};

mx::array skinny_linear(const mx::array& x, const mx::array& w, int threads) {
  if (x.dtype() != mx::float32 || w.dtype() != mx::float32)
    throw std::invalid_argument("skinny_linear: float32 only");
  if (w.ndim() != 2 || x.ndim() < 1 || x.shape(-1) != w.shape(1))
    throw std::invalid_argument("skinny_linear: x [..., K] and w [N, K] expected");
  mx::Stream s = mx::to_stream(mx::Device::cpu);
  mx::Shape shape = x.shape();
  shape.back() = w.shape(0);
  return mx::array(shape, mx::float32, std::make_shared<SkinnyLinear>(s, threads),
                   {row_contiguous(x, s), w});
}

// x [..., K] @ w.T for w packed by pack_panels: wp [P, K, 16] holding n outputs (n <= 16 P).
mx::array packed_linear(const mx::array& x, const mx::array& wp, int64_t n, int threads) {
  if (x.dtype() != mx::float32 || wp.dtype() != mx::float32)
    throw std::invalid_argument("packed_linear: float32 only");
  if (wp.ndim() != 3 || wp.shape(2) != 16 || x.ndim() < 1 || x.shape(-1) != wp.shape(1) || n < 0 ||
      n > 16 * static_cast<int64_t>(wp.shape(0)))
    throw std::invalid_argument("packed_linear: x [..., K], wp [P, K, 16] and n <= 16 P expected");
  mx::Stream s = mx::to_stream(mx::Device::cpu);
  mx::Shape shape = x.shape();
  shape.back() = static_cast<int>(n);
  return mx::array(shape, mx::float32, std::make_shared<SkinnyLinear>(s, threads, n),
                   {row_contiguous(x, s), row_contiguous(wp, s)});
}

// x [..., K] @ w.T for w quantized (affine, `bits` 4 or 8, group size `group`) and packed by
// pack_quantized: codes qp [P, K * bits / 8, 16] uint8, scales sp and biases bp [P, K / group, 16]
// float16, holding n outputs (n <= 16 P).
mx::array quantized_linear(const mx::array& x, const mx::array& qp, const mx::array& sp, const mx::array& bp,
                           int64_t n, int bits, int64_t group, int threads) {
  if (x.dtype() != mx::float32 || x.ndim() < 1) throw std::invalid_argument("quantized_linear: float32 x [..., K] expected");
  check_quantized(qp, sp, bp, n, bits, group, x.shape(-1), "quantized_linear");
  mx::Stream s = mx::to_stream(mx::Device::cpu);
  mx::Shape shape = x.shape();
  shape.back() = static_cast<int>(n);
  return mx::array(shape, mx::float32, std::make_shared<QuantizedPanelLinear>(s, n, bits, group, threads),
                   {x, row_contiguous(qp, s), row_contiguous(sp, s),
                    row_contiguous(bp, s)});
}

// Softmax over the last axis of attention scores s [..., L, S] (contiguous), row r being query
// r % L of a chunk whose first query sits at key position `offset`: keys past a query get 0.
class CausalSoftmax : public mx::UnaryPrimitive {
 public:
  CausalSoftmax(mx::Stream stream, int64_t offset, int threads)
      : mx::UnaryPrimitive(stream), offset_(offset), threads_(threads) {}

  void eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) override {
    const mx::array& s = inputs[0];
    if (!s.flags().row_contiguous) throw std::runtime_error("causal_softmax: scores must be row-contiguous");
    auto& encoder = begin_eval(stream(), inputs, out);
    int64_t S = s.shape(-1), L = s.shape(-2), rows = s.size() / S, offset = offset_;
    int threads = threads_;
    const float* sp = s.data<float>();
    float* op = out.data<float>();
    encoder.dispatch([=]() {
      split(rows, 1, 16, threads, [&](int64_t r0, int64_t r1, bool wide) {
        if (wide)
          dspark_native::avx512::causal_softmax(sp, op, S, L, offset, r0, r1);
        else
          dspark_native::avx2::causal_softmax(sp, op, S, L, offset, r0, r1);
      });
    });
  }

  void eval_gpu(const std::vector<mx::array>&, mx::array&) override {
    throw std::runtime_error("causal_softmax runs on the CPU only");
  }

  const char* name() const override { return "CausalSoftmax"; }

  bool is_equivalent(const mx::Primitive& other) const override {
    auto& o = static_cast<const CausalSoftmax&>(other);
    return offset_ == o.offset_ && threads_ == o.threads_;
  }

  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& inputs) override {
    return {inputs[0].shape()};
  }

 private:
  int64_t offset_;
  int threads_;
};

mx::array causal_softmax(const mx::array& s, int64_t offset, int threads) {
  if (s.dtype() != mx::float32) throw std::invalid_argument("causal_softmax: float32 scores only");
  if (s.ndim() < 2 || offset < 0) throw std::invalid_argument("causal_softmax: scores [..., L, S] and offset >= 0");
  mx::Stream st = mx::to_stream(mx::Device::cpu);
  return mx::array(s.shape(), mx::float32, std::make_shared<CausalSoftmax>(st, offset, threads),
                   {row_contiguous(s, st)});
}

// softmax(q k^T * scale, causal) v for a few query rows: q [B, H, L, D] (the last L positions of
// S), k and v [B, Hkv, S, D] as the KV cache holds them (any strides: a cache's slice is read in
// place). One primitive a layer, each query row computed alone.
class FewRowAttention : public mx::UnaryPrimitive {
 public:
  FewRowAttention(mx::Stream stream, float scale, int threads)
      : mx::UnaryPrimitive(stream), scale_(scale), threads_(threads) {}

  void eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) override {
    const mx::array &q = inputs[0], &k = inputs[1], &v = inputs[2];
    auto& encoder = begin_eval(stream(), inputs, out);
    dspark_native::AttentionArgs args{nullptr, k.data<float>(), v.data<float>(), out.data<float>(),
                                      q.shape(1), k.shape(1), q.shape(2), k.shape(2), q.shape(3),
                                      {static_cast<int64_t>(k.strides(0)), static_cast<int64_t>(k.strides(1)),
                                       static_cast<int64_t>(k.strides(2)), static_cast<int64_t>(k.strides(3))},
                                      {static_cast<int64_t>(v.strides(0)), static_cast<int64_t>(v.strides(1)),
                                       static_cast<int64_t>(v.strides(2)), static_cast<int64_t>(v.strides(3))},
                                      scale_};
    int64_t units = static_cast<int64_t>(q.shape(0)) * k.shape(1) * q.shape(2);  // (batch, key head, query row)
    int threads = threads_;
    encoder.dispatch([=]() {
      std::vector<float> scratch;
      dspark_native::AttentionArgs with_q = args;
      with_q.q = row_major(q, scratch);
      split(units, 1, 1, threads, [&](int64_t u0, int64_t u1, bool wide) {
        if (wide)
          dspark_native::avx512::few_row_attention(with_q, u0, u1);
        else
          dspark_native::avx2::few_row_attention(with_q, u0, u1);
      });
    });
  }

  void eval_gpu(const std::vector<mx::array>&, mx::array&) override {
    throw std::runtime_error("few_row_attention runs on the CPU only");
  }

  const char* name() const override { return "FewRowAttention"; }

  bool is_equivalent(const mx::Primitive& other) const override {
    auto& o = static_cast<const FewRowAttention&>(other);
    return scale_ == o.scale_ && threads_ == o.threads_;
  }

  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& inputs) override {
    return {inputs[0].shape()};
  }

 private:
  float scale_;
  int threads_;
};

mx::array few_row_attention(const mx::array& q, const mx::array& k, const mx::array& v, float scale, int threads) {
  if (q.dtype() != mx::float32 || k.dtype() != mx::float32 || v.dtype() != mx::float32)
    throw std::invalid_argument("few_row_attention: float32 only");
  if (q.ndim() != 4 || k.ndim() != 4 || v.shape() != k.shape() || q.shape(0) != k.shape(0) ||
      q.shape(3) != k.shape(3) || k.shape(1) == 0 || q.shape(1) % k.shape(1) || q.shape(2) > k.shape(2))
    throw std::invalid_argument("few_row_attention: q [B, H, L, D], k and v [B, Hkv, S, D], H a multiple of "
                                "Hkv and L <= S expected");
  mx::Stream st = mx::to_stream(mx::Device::cpu);
  return mx::array(q.shape(), mx::float32, std::make_shared<FewRowAttention>(st, scale, threads),
                   {q, k, v});
}

bool cpu_supported() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
}

}  // namespace

NB_MODULE(_native, m) {
  m.doc() = "dspark-serve's native CPU kernels (docs/native.md)";
  m.def("skinny_linear", &skinny_linear, "x"_a, "w"_a, "threads"_a = 1,
        "x @ w.T for float32 x [..., K] and w [N, K], streaming w once for all rows of x (CPU only).");
  m.def("packed_linear", &packed_linear, "x"_a, "wp"_a, "n"_a, "threads"_a = 1,
        "x @ w.T for float32 x [..., K] and w packed in panels wp [P, K, 16] (engine.native.pack_panels) "
        "holding n outputs (CPU only).");
  m.def("quantized_linear", &quantized_linear, "x"_a, "qp"_a, "sp"_a, "bp"_a, "n"_a, "bits"_a, "group_size"_a,
        "threads"_a = 1,
        "x @ w.T for float32 x [..., K] and an MLX affine-quantized w (4 or 8 bits) packed by "
        "engine.native.pack_quantized, holding n outputs (CPU only).");
  m.def("few_row_attention", &few_row_attention, "q"_a, "k"_a, "v"_a, "scale"_a, "threads"_a = 1,
        "softmax(q k^T * scale) v for float32 q [B, H, L, D], the last L positions of k and v [B, Hkv, S, D], "
        "each query seeing the keys up to its own position; each row computed alone (CPU only).");
  m.def("causal_softmax", &causal_softmax, "s"_a, "offset"_a, "threads"_a = 1,
        "Softmax over the last axis of float32 attention scores s [..., L, S], row r being query r % L "
        "at key position offset + r % L: the keys after it get weight 0 (CPU only).");
  m.def("llama_attention_in", &llama_attention_in, "x"_a, "norm"_a, "eps"_a, "q"_a, "k"_a, "v"_a, "heads"_a,
        "kv_heads"_a, "head_dim"_a, "rope_base"_a, "rope_scale"_a, "offset"_a, "threads"_a = 1,
        "A llama layer up to its KV cache, for float32 x [B, L, E]: RMSNorm, the q/k/v products (each "
        "(codes, scales, biases, n, bits, group_size) as pack_quantized holds it) and RoPE at positions "
        "offset + l: [q [B, H, L, D], k [B, Hkv, L, D], v [B, Hkv, L, D]] (CPU only).");
  m.def("llama_attention_out", &llama_attention_out, "a"_a, "x"_a, "o"_a, "norm"_a, "eps"_a, "gate"_a, "up"_a,
        "down"_a, "threads"_a = 1,
        "The rest of a llama layer after attention a [B, H, L, D] with residual x [B, L, E]: "
        "h = x + o(a), then h + down(silu(gate(n)) * up(n)) with n = RMSNorm(h) (CPU only).");
  m.def("cpu_supported", &cpu_supported, "Whether this CPU has the AVX2, FMA and F16C the kernel needs.");
  m.def("instruction_set", []() { return has_avx512() ? "avx512" : "avx2"; }, "The kernel build in use.");
}
