// CPU kernels that fuse elementwise chains TensorFlow runs as many passes (built by
// init_tf.sh, loaded by kernels.py; without them precision.py, dropout.py and
// optimization.py use TensorFlow's ops).
//
// BertGelu / BertGeluGrad: precision.gelu on bfloat16 in one pass each way, the math in
// float32 as there. The backward pass recomputes the sigmoid from x instead of keeping
// float32 copies of the forward's values.
// BertAttentionProbs / BertAttentionProbsGrad / BertDropout: the attention's softmax and
// its dropout (precision.dropped_attention), one pass over a row each way;
// BertMaskedAttentionProbs adds the mask in that pass.
// BertBiasAdd / BertBiasAddGrad: bias_add in bfloat16, TensorFlow's BiasAdd kept apart from
// its matmul (oneDNN's fused product is slower at most of BERT's shapes), and the bias
// gradient, the column sums BiasAddGrad computes several times slower, and less exactly.
// BertDropoutAddLayerNorm / BertDropoutAddLayerNormGrad: the end of a Transformer sublayer
// (precision.fused_dropout_add_normalize), dropout of the bfloat16 projection, the float32
// residual added and layer norm, in one pass over a row each way; the output also in
// bfloat16 for the next matmul, whose gradient the backward pass adds in.
// BertToBfloat16 / BertToFloat: tf.cast between float32 and bfloat16 (the weights' copies
// and their gradients, every micro-batch) at memory speed, the same bits as TensorFlow's.
// BertSquareSum / BertAccumulate: a bfloat16 gradient's sum of squares for the global
// norm, and its addition to a float32 accumulator, without a float32 copy of it.
// BertKeepMask: dropout's keep mask (dropout.random_keep_mask) straight from Philox, the
// same bits as StatelessRandomUniformFullInt and the compare, without the uint32 tensor.
// BertLambApply: one update of a variable by LAMB or Adam with decoupled weight decay
// (optimization.py), in place, from a float32 or bfloat16 gradient: moments, direction,
// norms and weights in two passes over memory (one without the trust ratio) instead of
// TensorFlow's dozen.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/util/work_sharder.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

// One build for every x86 CPU: the loader picks the widest vector clone the CPU runs.
// CPU_LOOP(type, name, (params), (args)) makes `name` of the always-inlined nameLoop
// compiled twice: for AVX-512 with its 16-bit instructions (avx512bw, which target_clones
// cannot name), where loops over bfloat16 values fill whole registers instead of half,
// and as CLONES for every other CPU; `name` calls the one the CPU runs.
#if defined(__x86_64__)
#define CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#define AVX512 __attribute__((target("avx512f,avx512bw")))
#define INLINED __attribute__((always_inline)) inline
#define CPU_LOOP(type, name, params, args)                                \
  AVX512 type name##Avx512 params { return name##Loop args; }             \
  CLONES type name##Clones params { return name##Loop args; }             \
  type name params { return HasAvx512() ? name##Avx512 args : name##Clones args; }
#else
#define CLONES
#define INLINED inline
#define CPU_LOOP(type, name, params, args) \
  type name params { return name##Loop args; }
#endif

namespace {

using tensorflow::OpKernel;
using tensorflow::OpKernelConstruction;
using tensorflow::OpKernelContext;
using tensorflow::Tensor;

#if defined(__x86_64__)
// Whether this CPU runs the AVX-512 loops; BERT_PRETRAIN_KERNELS_AVX512=0 in the environment
// says no (the portable loops compared with them, and with a test).
bool HasAvx512() {
  static const bool has = __builtin_cpu_supports("avx512f") &&
                          __builtin_cpu_supports("avx512bw") &&
                          std::strcmp(std::getenv("BERT_PRETRAIN_KERNELS_AVX512") ?: "1", "0");
  return has;
}
#endif

constexpr float kA = 1.5957691216057308f;   // 2 * sqrt(2 / pi)
constexpr float kB = 0.07135481627159672f;  // kA * 0.044715
constexpr int64_t kBlock = 4096;            // values a shard takes at a time

inline float ToFloat(uint16_t bits) {
  uint32_t wide = static_cast<uint32_t>(bits) << 16;
  float value;
  std::memcpy(&value, &wide, sizeof(value));
  return value;
}

// Round to nearest even, as TensorFlow's Cast to bfloat16 does; NaN stays a quiet NaN.
inline uint16_t ToBfloat16(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  uint32_t rounded = (bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16;
  uint32_t quiet_nan = (bits >> 16) | 0x40u;
  return static_cast<uint16_t>((bits & 0x7fffffffu) > 0x7f800000u ? quiet_nan : rounded);
}

// exp(x) to about 2 float32 ulps, 0 below float32's normal range (as the softmax of a
// masked score is), written so that the compiler vectorizes it.
inline float Exp(float input) {
  float x = input < -87.0f ? -87.0f : (input > 88.0f ? 88.0f : input);
  // Adding and taking away 1.5 * 2^23 rounds to the nearest integer.
  float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  float r = x - n * 0.693359375f + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  int32_t exponent = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &exponent, sizeof(scale));
  return input < -87.0f ? 0.0f : p * scale;
}

INLINED void GeluForwardLoop(const uint16_t* x, uint16_t* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    float v = ToFloat(x[i]);
    float s = 1.0f / (1.0f + Exp(-v * (kA + kB * v * v)));
    y[i] = ToBfloat16(v * s);
  }
}
CPU_LOOP(void, GeluForward, (const uint16_t* x, uint16_t* y, int64_t n), (x, y, n))

INLINED void GeluBackwardLoop(const uint16_t* x, const uint16_t* dy, uint16_t* dx, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    float v = ToFloat(x[i]);
    float square = v * v;
    float s = 1.0f / (1.0f + Exp(-v * (kA + kB * square)));
    float slope = s + s * (1.0f - s) * (v * (kA + 3.0f * kB * square));
    // The slope rounded to bfloat16 first, as precision.gelu multiplies it in x's type.
    dx[i] = ToBfloat16(ToFloat(dy[i]) * ToFloat(ToBfloat16(slope)));
  }
}
CPU_LOOP(void, GeluBackward, (const uint16_t* x, const uint16_t* dy, uint16_t* dx, int64_t n),
         (x, dy, dx, n))

// `value` where keep, else 0 (+0.0 in bfloat16), without a branch.
inline uint16_t Kept(uint8_t keep, uint16_t value) {
  return static_cast<uint16_t>(value & (0u - static_cast<uint32_t>(keep)));
}

constexpr int kLanes = 16;  // partial sums and maxima the compiler keeps in one vector

// probs = softmax(x) rounded to bfloat16; dropped = probs * scale where keep, else 0, as
// precision.dropped_attention's float32 ops compute them. `e` holds a row's exponentials.
INLINED void SoftmaxDropoutRowLoop(const float* x, const uint8_t* keep, float scale, float* e,
                                   uint16_t* probs, uint16_t* dropped, int64_t n) {
  float lanes[kLanes];
  for (int j = 0; j < kLanes; ++j) lanes[j] = -INFINITY;
  int64_t whole = n - n % kLanes;
  for (int64_t i = 0; i < whole; i += kLanes)
    for (int j = 0; j < kLanes; ++j) lanes[j] = x[i + j] > lanes[j] ? x[i + j] : lanes[j];
  float max = -INFINITY;
  for (int j = 0; j < kLanes; ++j) max = lanes[j] > max ? lanes[j] : max;
  for (int64_t i = whole; i < n; ++i) max = x[i] > max ? x[i] : max;
  for (int j = 0; j < kLanes; ++j) lanes[j] = 0.0f;
  for (int64_t i = 0; i < whole; i += kLanes)
    for (int j = 0; j < kLanes; ++j) lanes[j] += (e[i + j] = Exp(x[i + j] - max));
  float sum = 0.0f;
  for (int64_t i = whole; i < n; ++i) sum += (e[i] = Exp(x[i] - max));
  for (int j = 0; j < kLanes; ++j) sum += lanes[j];
  float inverse = 1.0f / sum;
  for (int64_t i = 0; i < n; ++i) {
    uint16_t p = ToBfloat16(e[i] * inverse);
    probs[i] = p;
    dropped[i] = Kept(keep[i], ToBfloat16(ToFloat(p) * scale));
  }
}
CPU_LOOP(void, SoftmaxDropoutRow, (const float* x, const uint8_t* keep, float scale, float* e,
         uint16_t* probs, uint16_t* dropped, int64_t n),
         (x, keep, scale, e, probs, dropped, n))

// The gradient of the scores: g = upstream * scale where keep, else 0, then
// p * (g - sum(g * p)), with p the kept probabilities. `g` holds a row of g.
INLINED void SoftmaxDropoutGradRowLoop(const uint16_t* probs, const uint8_t* keep,
                                       const uint16_t* upstream, float scale, float* g,
                                       float* grad, int64_t n) {
  float lanes[kLanes] = {0.0f};
  int64_t whole = n - n % kLanes;
  for (int64_t i = 0; i < whole; i += kLanes)
    for (int j = 0; j < kLanes; ++j) {
      g[i + j] = ToFloat(upstream[i + j]) * (keep[i + j] ? scale : 0.0f);
      lanes[j] += g[i + j] * ToFloat(probs[i + j]);
    }
  float dot = 0.0f;
  for (int64_t i = whole; i < n; ++i) {
    g[i] = ToFloat(upstream[i]) * (keep[i] ? scale : 0.0f);
    dot += g[i] * ToFloat(probs[i]);
  }
  for (int j = 0; j < kLanes; ++j) dot += lanes[j];
  for (int64_t i = 0; i < n; ++i) grad[i] = ToFloat(probs[i]) * (g[i] - dot);
}
CPU_LOOP(void, SoftmaxDropoutGradRow, (const uint16_t* probs, const uint8_t* keep,
         const uint16_t* upstream, float scale, float* g, float* grad, int64_t n),
         (probs, keep, upstream, scale, g, grad, n))

INLINED void DropoutRowLoop(const uint16_t* x, const uint8_t* keep, float scale, uint16_t* y,
                            int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = Kept(keep[i], ToBfloat16(ToFloat(x[i]) * scale));
}
CPU_LOOP(void, DropoutRow, (const uint16_t* x, const uint8_t* keep, float scale, uint16_t* y,
         int64_t n),
         (x, keep, scale, y, n))

// The sum of fn(i) over i < n, in kLanes partial sums the compiler keeps in a vector.
template <typename Fn>
inline float RowSum(int64_t n, Fn fn) {
  float lanes[kLanes] = {0.0f};
  int64_t whole = n - n % kLanes;
  for (int64_t i = 0; i < whole; i += kLanes)
    for (int j = 0; j < kLanes; ++j) lanes[j] += fn(i + j);
  float sum = 0.0f;
  for (int64_t i = whole; i < n; ++i) sum += fn(i);
  for (int j = 0; j < kLanes; ++j) sum += lanes[j];
  return sum;
}

// summed = dropout(x) + residual, then x_hat = (summed - mean) / sqrt(variance + 1e-12)
// and y = x_hat * gamma + beta, as modeling.dropout_add_layer_norm's float32 ops compute
// them (two passes for the variance, as tf.nn.moments), and y_half = y in bfloat16 (the
// next matmul's input). Returns the row's 1 / std.
INLINED float DropoutAddNormalizeRowLoop(const uint16_t* x, const float* residual,
                                         const uint8_t* keep, float scale, const float* gamma,
                                         const float* beta, float* x_hat, float* y,
                                         uint16_t* y_half, int64_t n) {
  for (int64_t i = 0; i < n; ++i)
    x_hat[i] = (keep[i] ? ToFloat(x[i]) * scale : 0.0f) + residual[i];
  float mean = RowSum(n, [&](int64_t i) { return x_hat[i]; }) / n;
  float variance = RowSum(n, [&](int64_t i) {
    float centered = x_hat[i] - mean;
    return centered * centered;
  }) / n;
  float inverse_std = 1.0f / std::sqrt(variance + 1e-12f);
  for (int64_t i = 0; i < n; ++i) {
    x_hat[i] = (x_hat[i] - mean) * inverse_std;
    y[i] = x_hat[i] * gamma[i] + beta[i];
    y_half[i] = ToBfloat16(y[i]);
  }
  return inverse_std;
}
CPU_LOOP(float, DropoutAddNormalizeRow, (const uint16_t* x, const float* residual,
         const uint8_t* keep, float scale, const float* gamma, const float* beta, float* x_hat,
         float* y, uint16_t* y_half, int64_t n),
         (x, residual, keep, scale, gamma, beta, x_hat, y, y_half, n))

// The gradients of a row of DropoutAddNormalizeRow from its outputs' gradients: with
// dy = dy_float + dy_half (y's and y_half's, added as TensorFlow's AddN adds the gradients
// of a value and of its cast) and g = dy * gamma, d = inverse_std * (g - mean(g) - x_hat *
// mean(g * x_hat)) is the residual's, d * scale where keep (else 0) in bfloat16 is x's;
// dy * x_hat and dy are added to gamma's and beta's. `dy` holds the row's dy.
INLINED void DropoutAddNormalizeGradRowLoop(const float* dy_float, const uint16_t* dy_half,
                                            const float* x_hat, float inverse_std,
                                            const float* gamma, const uint8_t* keep, float scale,
                                            float* dy, float* d_residual, uint16_t* dx,
                                            float* d_gamma, float* d_beta, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dy[i] = dy_float[i] + ToFloat(dy_half[i]);
  float mean_g = RowSum(n, [&](int64_t i) { return dy[i] * gamma[i]; }) / n;
  float mean_g_x_hat = RowSum(n, [&](int64_t i) { return dy[i] * gamma[i] * x_hat[i]; }) / n;
  for (int64_t i = 0; i < n; ++i) {
    float d = inverse_std * (dy[i] * gamma[i] - mean_g - x_hat[i] * mean_g_x_hat);
    d_residual[i] = d;
    dx[i] = Kept(keep[i], ToBfloat16(d * scale));
    d_gamma[i] += dy[i] * x_hat[i];
    d_beta[i] += dy[i];
  }
}
CPU_LOOP(void, DropoutAddNormalizeGradRow, (const float* dy_float, const uint16_t* dy_half,
         const float* x_hat, float inverse_std, const float* gamma, const uint8_t* keep,
         float scale, float* dy, float* d_residual, uint16_t* dx, float* d_gamma,
         float* d_beta, int64_t n),
         (dy_float, dy_half, x_hat, inverse_std, gamma, keep, scale, dy, d_residual, dx,
          d_gamma, d_beta, n))

INLINED void ToFloatsLoop(const uint16_t* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = ToFloat(x[i]);
}
CPU_LOOP(void, ToFloats, (const uint16_t* x, float* y, int64_t n), (x, y, n))

INLINED void ToBfloat16sLoop(const float* x, uint16_t* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = ToBfloat16(x[i]);
}
CPU_LOOP(void, ToBfloat16s, (const float* x, uint16_t* y, int64_t n), (x, y, n))

template <typename Fn>
void Shard(OpKernelContext* context, int64_t n, Fn fn) {
  auto* workers = context->device()->tensorflow_cpu_worker_threads();
  int64_t blocks = (n + kBlock - 1) / kBlock;
  tensorflow::Shard(workers->num_threads, workers->workers, blocks, 50 * kBlock,
                    [&](int64_t first, int64_t last) {
                      int64_t begin = first * kBlock;
                      int64_t end = last * kBlock < n ? last * kBlock : n;
                      fn(begin, end - begin);
                    });
}

const uint16_t* Bits(const Tensor& t) {
  return reinterpret_cast<const uint16_t*>(t.tensor_data().data());
}

uint16_t* MutableBits(Tensor* t) {
  return reinterpret_cast<uint16_t*>(const_cast<char*>(t->tensor_data().data()));
}

// A cast of every value between float32 (From) and bfloat16 (To) or back.
template <typename From, typename To>
class BertCastOp : public OpKernel {
 public:
  explicit BertCastOp(OpKernelConstruction* context) : OpKernel(context) {}
  void Compute(OpKernelContext* context) override {
    const Tensor& x = context->input(0);
    Tensor* y = nullptr;
    OP_REQUIRES_OK(context, context->allocate_output(0, x.shape(), &y));
    const From* in = reinterpret_cast<const From*>(x.tensor_data().data());
    To* out = reinterpret_cast<To*>(const_cast<char*>(y->tensor_data().data()));
    Shard(context, x.NumElements(),
          [&](int64_t begin, int64_t n) { Convert(in + begin, out + begin, n); });
  }

 private:
  static void Convert(const float* x, uint16_t* y, int64_t n) { ToBfloat16s(x, y, n); }
  static void Convert(const uint16_t* x, float* y, int64_t n) { ToFloats(x, y, n); }
};

class BertGeluOp : public OpKernel {
 public:
  explicit BertGeluOp(OpKernelConstruction* context) : OpKernel(context) {}
  void Compute(OpKernelContext* context) override {
    const Tensor& x = context->input(0);
    Tensor* y = nullptr;
    OP_REQUIRES_OK(context, context->allocate_output(0, x.shape(), &y));
    const uint16_t* in = Bits(x);
    uint16_t* out = MutableBits(y);
    Shard(context, x.NumElements(),
          [&](int64_t begin, int64_t n) { GeluForward(in + begin, out + begin, n); });
  }
};

class BertGeluGradOp : public OpKernel {
 public:
  explicit BertGeluGradOp(OpKernelConstruction* context) : OpKernel(context) {}
  void Compute(OpKernelContext* context) override {
    const Tensor& x = context->input(0);
    const Tensor& dy = context->input(1);
    OP_REQUIRES(context, x.shape() == dy.shape(),
                tensorflow::errors::InvalidArgument("BertGeluGrad: x and dy differ in shape"));
    Tensor* dx = nullptr;
    OP_REQUIRES_OK(context, context->allocate_output(0, x.shape(), &dx));
    const uint16_t* in = Bits(x);
    const uint16_t* upstream = Bits(dy);
    uint16_t* out = MutableBits(dx);
    Shard(context, x.NumElements(), [&](int64_t begin, int64_t n) {
      GeluBackward(in + begin, upstream + begin, out + begin, n);
    });
  }
};


// Rows of the last axis, sharded over the CPU's threads.
template <typename Fn>
void ShardRows(OpKernelContext* context, int64_t rows, int64_t width, Fn fn) {
  auto* workers = context->device()->tensorflow_cpu_worker_threads();
  tensorflow::Shard(workers->num_threads, workers->workers, rows, 40 * width,
                    [&](int64_t first, int64_t last) { fn(first, last); });
}

// A row of T as floats: float rows are read in place, bfloat16 ones through `buffer`.
const float* RowAsFloats(const float* row, float*, int64_t) { return row; }
const float* RowAsFloats(const tensorflow::bfloat16* row, float* buffer, int64_t n) {
  ToFloats(reinterpret_cast<const uint16_t*>(row), buffer, n);
  return buffer;
}

// Where a float row is written: a float output in place, a bfloat16 one through `buffer`
// and StoreRow.
float* RowToWrite(float* row, float*) { return row; }
float* RowToWrite(tensorflow::bfloat16*, float* buffer) { return buffer; }
void StoreRow(const float*, float*, int64_t) {}
void StoreRow(const float* buffer, tensorflow::bfloat16* row, int64_t n) {
  ToBfloat16s(buffer, reinterpret_cast<uint16_t*>(row), n);
}

INLINED void AddMaskLoop(const uint16_t* x, const float* adder, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = ToFloat(x[i]) + adder[i];
}
CPU_LOOP(void, AddMask, (const uint16_t* x, const float* adder, float* y, int64_t n),
         (x, adder, y, n))

// A row of T plus the mask's adder, as floats in `buffer`.
const float* MaskedRow(const float* row, const float* adder, float* buffer, int64_t n) {
  for (int64_t i = 0; i < n; ++i) buffer[i] = row[i] + adder[i];
  return buffer;
}
const float* MaskedRow(const tensorflow::bfloat16* row, const float* adder, float* buffer,
                       int64_t n) {
  AddMask(reinterpret_cast<const uint16_t*>(row), adder, buffer, n);
  return buffer;
}

// A bool Tensor's bytes (0 or 1): the compiler vectorizes loads of bytes, not of bools.
const uint8_t* KeepBytes(const Tensor& keep) {
  return reinterpret_cast<const uint8_t*>(keep.tensor_data().data());
}

bool SameShapes(OpKernelContext* context, const Tensor& a, const Tensor& b, const char* op) {
  if (a.shape() == b.shape() && a.dims() >= 1) return true;
  context->CtxFailure(tensorflow::errors::InvalidArgument(
      op, ": the inputs differ in shape or are scalars: ", a.shape().DebugString(), " and ",
      b.shape().DebugString()));
  return false;
}

// A kernel of an op with dropout's scale, 1 / (1 - rate), as its attribute `scale`.
class ScaledOpKernel : public OpKernel {
 public:
  explicit ScaledOpKernel(OpKernelConstruction* context) : OpKernel(context) {
    OP_REQUIRES_OK(context, context->GetAttr("scale", &scale_));
  }

 protected:
  float scale_;
};

// BertAttentionProbs(scores, keep) -> (probs, dropped): the attention's softmax over the
// last axis and its dropout, each in bfloat16. BertMaskedAttentionProbs(scores, keep,
// adder): the same of scores + adder, the mask's float32 adder [batch, 1, 1 or from, to]
// added to scores [batch, heads, from, to] in the row's pass, as TensorFlow's float32
// add of the scores cast to float32 does.
template <typename T>
class BertAttentionProbsOp : public ScaledOpKernel {
 public:
  using ScaledOpKernel::ScaledOpKernel;
  void Compute(OpKernelContext* context) override {
    const Tensor& scores = context->input(0);
    const Tensor& keep = context->input(1);
    const char* op = context->num_inputs() == 3 ? "BertMaskedAttentionProbs"
                                                 : "BertAttentionProbs";
    if (!SameShapes(context, scores, keep, op)) return;
    const float* adder = nullptr;
    int64_t heads = 1, from = 1, adder_from = 1;
    if (context->num_inputs() == 3) {
      const Tensor& mask = context->input(2);
      bool fits = scores.dims() == 4 && mask.dims() == 4 &&
                  mask.dim_size(0) == scores.dim_size(0) && mask.dim_size(1) == 1 &&
                  (mask.dim_size(2) == 1 || mask.dim_size(2) == scores.dim_size(2)) &&
                  mask.dim_size(3) == scores.dim_size(3);
      OP_REQUIRES(context, fits, tensorflow::errors::InvalidArgument(
          op, ": the mask's adder must be [batch, 1, 1 or from, to] of the scores' [batch, "
          "heads, from, to]: ", mask.shape().DebugString(), " and ",
          scores.shape().DebugString()));
      adder = mask.flat<float>().data();
      heads = scores.dim_size(1);
      from = scores.dim_size(2);
      adder_from = mask.dim_size(2);
    }
    Tensor* probs = nullptr;
    Tensor* dropped = nullptr;
    OP_REQUIRES_OK(context, context->allocate_output(0, scores.shape(), &probs));
    OP_REQUIRES_OK(context, context->allocate_output(1, scores.shape(), &dropped));
    int64_t width = scores.dim_size(scores.dims() - 1);
    if (scores.NumElements() == 0) return;
    const T* in = scores.flat<T>().data();
    const uint8_t* kept = KeepBytes(keep);
    uint16_t* out_probs = MutableBits(probs);
    uint16_t* out_dropped = MutableBits(dropped);
    ShardRows(context, scores.NumElements() / width, width, [&](int64_t first, int64_t last) {
      std::vector<float> buffer(2 * width);
      for (int64_t row = first; row < last; ++row) {
        int64_t at = row * width;
        const float* x;
        if (adder == nullptr) {
          x = RowAsFloats(in + at, buffer.data() + width, width);
        } else {  // row = (b * heads + head) * from + f: the adder's row b * adder_from (+ f)
          int64_t b = row / (heads * from);
          int64_t f = adder_from == 1 ? 0 : row % from;
          x = MaskedRow(in + at, adder + (b * adder_from + f) * width, buffer.data() + width,
                        width);
        }
        SoftmaxDropoutRow(x, kept + at, scale_, buffer.data(), out_probs + at,
                          out_dropped + at, width);
      }
    });
  }
};

// BertAttentionProbsGrad(probs, keep, upstream) -> the gradient of BertAttentionProbs's
// scores from the gradient of its dropped output.
template <typename T>
class BertAttentionProbsGradOp : public ScaledOpKernel {
 public:
  using ScaledOpKernel::ScaledOpKernel;
  void Compute(OpKernelContext* context) override {
    const Tensor& probs = context->input(0);
    const Tensor& keep = context->input(1);
    const Tensor& upstream = context->input(2);
    if (!SameShapes(context, probs, keep, "BertAttentionProbsGrad") ||
        !SameShapes(context, probs, upstream, "BertAttentionProbsGrad")) return;
    Tensor* grad = nullptr;
    OP_REQUIRES_OK(context, context->allocate_output(0, probs.shape(), &grad));
    int64_t width = probs.dim_size(probs.dims() - 1);
    if (probs.NumElements() == 0) return;
    const uint16_t* p = Bits(probs);
    const uint8_t* kept = KeepBytes(keep);
    const uint16_t* up = Bits(upstream);
    T* out = grad->flat<T>().data();
    ShardRows(context, probs.NumElements() / width, width, [&](int64_t first, int64_t last) {
      std::vector<float> buffer(2 * width);
      for (int64_t row = first; row < last; ++row) {
        int64_t at = row * width;
        float* written = RowToWrite(out + at, buffer.data() + width);
        SoftmaxDropoutGradRow(p + at, kept + at, up + at, scale_, buffer.data(), written, width);
        StoreRow(written, out + at, width);
      }
    });
  }
};

// BertDropout(x, keep) -> x * scale where keep, else 0, in bfloat16.
class BertDropoutOp : public ScaledOpKernel {
 public:
  using ScaledOpKernel::ScaledOpKernel;
  void Compute(OpKernelContext* context) override {
    const Tensor& x = context->input(0);
    const Tensor& keep = context->input(1);
    if (!SameShapes(context, x, keep, "BertDropout")) return;
    Tensor* y = nullptr;
    OP_REQUIRES_OK(context, context->allocate_output(0, x.shape(), &y));
    const uint16_t* in = Bits(x);
    const uint8_t* kept = KeepBytes(keep);
    uint16_t* out = MutableBits(y);
    Shard(context, x.NumElements(), [&](int64_t begin, int64_t n) {
      DropoutRow(in + begin, kept + begin, scale_, out + begin, n);
    });
  }
};

// The rows of a [..., width] tensor whose gamma and beta are [width], or -1 (the op failed).
// Adds rows [0, rows) of x, each `width` long, to sums[0, width), in row order; four rows
// a pass over sums.
INLINED void AddRowsLoop(const uint16_t* x, int64_t rows, int64_t width, float* sums) {
  int64_t r = 0;
  for (; r + 4 <= rows; r += 4) {
    const uint16_t* x0 = x + r * width;
    for (int64_t c = 0; c < width; ++c) {
      float sum = sums[c] + ToFloat(x0[c]);
      sum += ToFloat(x0[width + c]);
      sum += ToFloat(x0[2 * width + c]);
      sums[c] = sum + ToFloat(x0[3 * width + c]);
    }
  }
  for (; r < rows; ++r)
    for (int64_t c = 0; c < width; ++c) sums[c] += ToFloat(x[r * width + c]);
}
CPU_LOOP(void, AddRows, (const uint16_t* x, int64_t rows, int64_t width, float* sums),
         (x, rows, width, sums))

INLINED void AddBiasLoop(const uint16_t* x, const uint16_t* bias, uint16_t* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = ToBfloat16(ToFloat(x[i]) + ToFloat(bias[i]));
}
CPU_LOOP(void, AddBias, (const uint16_t* x, const uint16_t* bias, uint16_t* y, int64_t n),
         (x, bias, y, n))

// BertBiasAdd(value, bias) -> value + bias on every row, rounded once, as BiasAdd; in place
// where nothing else reads value.
class BertBiasAddOp : public OpKernel {
 public:
  explicit BertBiasAddOp(OpKernelConstruction* context) : OpKernel(context) {}
  void Compute(OpKernelContext* context) override {
    const Tensor& x = context->input(0);
    const Tensor& bias = context->input(1);
    int64_t width = x.dims() ? x.dim_size(x.dims() - 1) : -1;
    OP_REQUIRES(context, x.dims() >= 2 && bias.dims() == 1 && bias.dim_size(0) == width,
                tensorflow::errors::InvalidArgument(
                    "BertBiasAdd: bias must be [width] of value's last axis, value of at "
                    "least 2 dimensions: ", x.shape().DebugString(), " and ",
                    bias.shape().DebugString()));
    Tensor* y = nullptr;
    OP_REQUIRES_OK(context, context->forward_input_or_allocate_output({0}, 0, x.shape(), &y));
    int64_t rows = width == 0 ? 0 : x.NumElements() / width;
    const uint16_t* in = Bits(x);
    const uint16_t* b = Bits(bias);
    uint16_t* out = MutableBits(y);
    ShardRows(context, rows, width, [&](int64_t first, int64_t last) {
      for (int64_t row = first; row < last; ++row)
        AddBias(in + row * width, b, out + row * width, width);
    });
  }
};

INLINED double SquareSumLoop(const uint16_t* x, int64_t n) {
  float lanes[kLanes] = {0.0f};
  int64_t whole = n - n % kLanes;
  for (int64_t i = 0; i < whole; i += kLanes)
    for (int j = 0; j < kLanes; ++j) lanes[j] += ToFloat(x[i + j]) * ToFloat(x[i + j]);
  for (int64_t i = whole; i < n; ++i) lanes[0] += ToFloat(x[i]) * ToFloat(x[i]);
  double sum = 0.0;
  for (int j = 0; j < kLanes; ++j) sum += lanes[j];
  return sum;
}
CPU_LOOP(double, SquareSum, (const uint16_t* x, int64_t n), (x, n))

// BertSquareSum(x) -> the sum of the squares of x's bfloat16 values, in float32: a
// gradient's share of the global norm read without a float32 copy of it. A float sum
// for each block of kBlock values, the blocks added in order in double: the same bits on
// any number of threads.
class BertSquareSumOp : public OpKernel {
 public:
  explicit BertSquareSumOp(OpKernelConstruction* context) : OpKernel(context) {}
  void Compute(OpKernelContext* context) override {
    const Tensor& x = context->input(0);
    Tensor* sum = nullptr;
    OP_REQUIRES_OK(context, context->allocate_output(0, {}, &sum));
    int64_t n = x.NumElements();
    std::vector<double> blocks((n + kBlock - 1) / kBlock, 0.0);
    const uint16_t* in = Bits(x);
    Shard(context, n, [&](int64_t begin, int64_t count) {
      for (int64_t at = begin; at < begin + count; at += kBlock)
        blocks[at / kBlock] = SquareSum(in + at, std::min(kBlock, begin + count - at));
    });
    double total = 0.0;
    for (double block : blocks) total += block;
    sum->scalar<float>()() = static_cast<float>(total);
  }
};

INLINED void AccumulateLoop(const uint16_t* g, float factor, float* sum, int64_t n) {
  for (int64_t i = 0; i < n; ++i) sum[i] += ToFloat(g[i]) * factor;
}
CPU_LOOP(void, Accumulate, (const uint16_t* g, float factor, float* sum, int64_t n),
         (g, factor, sum, n))

// BertAccumulate(sum, grad, factor) -> sum: sum += grad * factor in place, grad in
// bfloat16 as the backward pass computed it: the bits of TensorFlow's
// ApplyGradientDescent(sum, -factor, grad cast to float32), without the cast.
class BertAccumulateOp : public OpKernel {
 public:
  explicit BertAccumulateOp(OpKernelConstruction* context) : OpKernel(context) {}
  void Compute(OpKernelContext* context) override {
    context->forward_ref_input_to_ref_output(0, 0);
    Tensor sum = context->mutable_input(0, false);
    const Tensor& grad = context->input(1);
    const Tensor& factor = context->input(2);
    OP_REQUIRES(context, sum.IsInitialized(),
                tensorflow::errors::FailedPrecondition(
                    "BertAccumulate: the sum is not initialized"));
    OP_REQUIRES(context, sum.shape() == grad.shape() && factor.dims() == 0,
                tensorflow::errors::InvalidArgument(
                    "BertAccumulate: sum and grad must have one shape and factor none: ",
                    sum.shape().DebugString(), ", ", grad.shape().DebugString(), " and ",
                    factor.shape().DebugString()));
    float f = factor.scalar<float>()();
    float* out = sum.flat<float>().data();
    const uint16_t* in = Bits(grad);
    Shard(context, sum.NumElements(),
          [&](int64_t begin, int64_t n) { Accumulate(in + begin, f, out + begin, n); });
  }
};

constexpr int64_t kBiasRows = 64;  // rows of a partial sum of BertBiasAddGrad

// BertBiasAddGrad(dy) -> the sums of dy's rows, bias_add's bias gradient, in bfloat16:
// float sums, rounded once. A float sum for each block of
// kBiasRows rows, the blocks then added in order: the same bits on any number of threads.
class BertBiasAddGradOp : public OpKernel {
 public:
  explicit BertBiasAddGradOp(OpKernelConstruction* context) : OpKernel(context) {}
  void Compute(OpKernelContext* context) override {
    const Tensor& dy = context->input(0);
    OP_REQUIRES(context, dy.dims() >= 2,
                tensorflow::errors::InvalidArgument(
                    "BertBiasAddGrad: dy must have at least 2 dimensions, not ",
                    dy.shape().DebugString()));
    int64_t width = dy.dim_size(dy.dims() - 1);
    Tensor* sums = nullptr;
    OP_REQUIRES_OK(context, context->allocate_output(0, {width}, &sums));
    int64_t rows = width == 0 ? 0 : dy.NumElements() / width;
    int64_t blocks = (rows + kBiasRows - 1) / kBiasRows;
    std::vector<float> partial(blocks * width, 0.0f);
    const uint16_t* in = Bits(dy);
    auto* workers = context->device()->tensorflow_cpu_worker_threads();
    tensorflow::Shard(workers->num_threads, workers->workers, blocks, kBiasRows * width,
                      [&](int64_t first, int64_t last) {
                        for (int64_t block = first; block < last; ++block) {
                          int64_t row = block * kBiasRows;
                          AddRows(in + row * width, std::min(kBiasRows, rows - row), width,
                                  partial.data() + block * width);
                        }
                      });
    for (int64_t block = 1; block < blocks; ++block)
      for (int64_t c = 0; c < width; ++c) partial[c] += partial[block * width + c];
    uint16_t* out = MutableBits(sums);
    for (int64_t c = 0; c < width; ++c) out[c] = blocks ? ToBfloat16(partial[c]) : 0;
  }
};

int64_t RowsOf(OpKernelContext* context, const Tensor& x, const Tensor& gamma,
               const Tensor& beta, const char* op) {
  int64_t width = x.dim_size(x.dims() - 1);
  if (gamma.dims() != 1 || gamma.dim_size(0) != width || gamma.shape() != beta.shape()) {
    context->CtxFailure(tensorflow::errors::InvalidArgument(
        op, ": gamma and beta must be [width] of the rows' last axis: ",
        x.shape().DebugString(), ", ", gamma.shape().DebugString(), " and ",
        beta.shape().DebugString()));
    return -1;
  }
  int64_t rows = 1;
  for (int axis = 0; axis + 1 < x.dims(); ++axis) rows *= x.dim_size(axis);
  return rows;
}

constexpr int64_t kChunks = 32;  // fixed row chunks: gamma's and beta's sums in one order

// BertDropoutAddLayerNorm(x, residual, keep, gamma, beta) -> (y, x_hat, inverse_std).
class BertDropoutAddLayerNormOp : public ScaledOpKernel {
 public:
  using ScaledOpKernel::ScaledOpKernel;
  void Compute(OpKernelContext* context) override {
    const Tensor& x = context->input(0);
    const Tensor& residual = context->input(1);
    const Tensor& keep = context->input(2);
    const Tensor& gamma = context->input(3);
    const Tensor& beta = context->input(4);
    if (!SameShapes(context, x, residual, "BertDropoutAddLayerNorm") ||
        !SameShapes(context, x, keep, "BertDropoutAddLayerNorm")) return;
    int64_t rows = RowsOf(context, x, gamma, beta, "BertDropoutAddLayerNorm");
    if (rows < 0) return;
    Tensor* y = nullptr;
    Tensor* x_hat = nullptr;
    Tensor* inverse_std = nullptr;
    Tensor* y_half = nullptr;
    OP_REQUIRES_OK(context, context->allocate_output(0, x.shape(), &y));
    OP_REQUIRES_OK(context, context->allocate_output(1, x.shape(), &x_hat));
    OP_REQUIRES_OK(context, context->allocate_output(
        2, tensorflow::TensorShape({rows}), &inverse_std));
    OP_REQUIRES_OK(context, context->allocate_output(3, x.shape(), &y_half));
    int64_t width = gamma.NumElements();
    if (rows == 0 || width == 0) return;
    const uint16_t* in = Bits(x);
    const float* res = residual.flat<float>().data();
    const uint8_t* kept = KeepBytes(keep);
    const float* g = gamma.flat<float>().data();
    const float* b = beta.flat<float>().data();
    float* out = y->flat<float>().data();
    float* normalized = x_hat->flat<float>().data();
    float* inverse = inverse_std->flat<float>().data();
    uint16_t* out_half = MutableBits(y_half);
    ShardRows(context, rows, width, [&](int64_t first, int64_t last) {
      for (int64_t row = first; row < last; ++row) {
        int64_t at = row * width;
        inverse[row] = DropoutAddNormalizeRow(in + at, res + at, kept + at, scale_, g, b,
                                              normalized + at, out + at, out_half + at, width);
      }
    });
  }
};

// BertDropoutAddLayerNormGrad(dy, x_hat, inverse_std, gamma, keep) -> (d_residual, dx,
// d_gamma, d_beta). The rows go in kChunks fixed chunks, each summing its own part of
// d_gamma and d_beta, added in chunk order: the same bits on any number of threads.
class BertDropoutAddLayerNormGradOp : public ScaledOpKernel {
 public:
  using ScaledOpKernel::ScaledOpKernel;
  void Compute(OpKernelContext* context) override {
    const Tensor& dy = context->input(0);
    const Tensor& x_hat = context->input(1);
    const Tensor& inverse_std = context->input(2);
    const Tensor& gamma = context->input(3);
    const Tensor& keep = context->input(4);
    const Tensor& dy_half = context->input(5);
    if (!SameShapes(context, dy, x_hat, "BertDropoutAddLayerNormGrad") ||
        !SameShapes(context, dy, keep, "BertDropoutAddLayerNormGrad") ||
        !SameShapes(context, dy, dy_half, "BertDropoutAddLayerNormGrad")) return;
    int64_t rows = RowsOf(context, dy, gamma, gamma, "BertDropoutAddLayerNormGrad");
    if (rows < 0) return;
    OP_REQUIRES(context, inverse_std.NumElements() == rows,
                tensorflow::errors::InvalidArgument(
                    "BertDropoutAddLayerNormGrad: inverse_std must hold one value a row"));
    Tensor* d_residual = nullptr;
    Tensor* dx = nullptr;
    Tensor* d_gamma = nullptr;
    Tensor* d_beta = nullptr;
    OP_REQUIRES_OK(context, context->allocate_output(0, dy.shape(), &d_residual));
    OP_REQUIRES_OK(context, context->allocate_output(1, dy.shape(), &dx));
    OP_REQUIRES_OK(context, context->allocate_output(2, gamma.shape(), &d_gamma));
    OP_REQUIRES_OK(context, context->allocate_output(3, gamma.shape(), &d_beta));
    int64_t width = gamma.NumElements();
    float* sum_gamma = d_gamma->flat<float>().data();
    float* sum_beta = d_beta->flat<float>().data();
    std::fill(sum_gamma, sum_gamma + width, 0.0f);
    std::fill(sum_beta, sum_beta + width, 0.0f);
    if (rows == 0 || width == 0) return;
    int64_t chunks = rows < kChunks ? rows : kChunks;
    std::vector<float> partial(2 * chunks * width, 0.0f);
    const float* upstream = dy.flat<float>().data();
    const uint16_t* upstream_half = Bits(dy_half);
    const float* normalized = x_hat.flat<float>().data();
    const float* inverse = inverse_std.flat<float>().data();
    const float* g = gamma.flat<float>().data();
    const uint8_t* kept = KeepBytes(keep);
    float* out_residual = d_residual->flat<float>().data();
    uint16_t* out_x = MutableBits(dx);
    auto* workers = context->device()->tensorflow_cpu_worker_threads();
    tensorflow::Shard(
        workers->num_threads, workers->workers, chunks, 60 * width * (rows / chunks),
        [&](int64_t first, int64_t last) {
          std::vector<float> summed(width);
          for (int64_t chunk = first; chunk < last; ++chunk) {
            float* chunk_gamma = partial.data() + 2 * chunk * width;
            float* chunk_beta = chunk_gamma + width;
            for (int64_t row = chunk * rows / chunks; row < (chunk + 1) * rows / chunks;
                 ++row) {
              int64_t at = row * width;
              DropoutAddNormalizeGradRow(upstream + at, upstream_half + at, normalized + at,
                                         inverse[row], g, kept + at, scale_, summed.data(),
                                         out_residual + at, out_x + at, chunk_gamma,
                                         chunk_beta, width);
            }
          }
        });
    for (int64_t chunk = 0; chunk < chunks; ++chunk)
      for (int64_t i = 0; i < width; ++i) {
        sum_gamma[i] += partial[2 * chunk * width + i];
        sum_beta[i] += partial[(2 * chunk + 1) * width + i];
      }
  }
};

// Philox4x32-10 as TensorFlow's random::PhiloxRandom computes it (its round, key schedule
// and constants). The counters' 32-bit words are held in 64-bit lanes, which the compiler
// vectorizes; x86 CPUs with AVX-512 run KeepMaskRangeAvx512 instead, 16 draws at a time.
constexpr uint32_t kPhiloxW32A = 0x9E3779B9u;
constexpr uint32_t kPhiloxW32B = 0xBB67AE85u;
constexpr uint32_t kPhiloxM4x32A = 0xD2511F53u;
constexpr uint32_t kPhiloxM4x32B = 0xCD9E8D57u;

template <int kWidth>
inline void PhiloxRounds(uint64_t (&c0)[kWidth], uint64_t (&c1)[kWidth],
                         uint64_t (&c2)[kWidth], uint64_t (&c3)[kWidth], uint32_t key0,
                         uint32_t key1) {
  uint64_t k0 = key0, k1 = key1;
  for (int round = 0; round < 10; ++round) {
#pragma GCC unroll 1  // a loop over the lanes, which the compiler vectorizes; unrolled it does not
    for (int l = 0; l < kWidth; ++l) {
      uint64_t p0 = c0[l] * kPhiloxM4x32A;
      uint64_t p1 = c2[l] * kPhiloxM4x32B;
      c0[l] = (p1 >> 32) ^ c1[l] ^ k0;
      c1[l] = p1 & 0xffffffffu;
      c2[l] = (p0 >> 32) ^ c3[l] ^ k1;
      c3[l] = p0 & 0xffffffffu;
    }
    k0 = (k0 + kPhiloxW32A) & 0xffffffffu;
    k1 = (k1 + kPhiloxW32B) & 0xffffffffu;
  }
}

// The key and counter high half the stateless random ops derive from a seed [s0, s1]
// (TensorFlow's GenerateKey): Philox of the counter (s0, s1) under a fixed key.
struct PhiloxStream {
  uint32_t key0, key1, counter2, counter3;
};

PhiloxStream StreamOfSeed(uint64_t s0, uint64_t s1) {
  uint64_t c0[1] = {s0 & 0xffffffffu}, c1[1] = {s0 >> 32};
  uint64_t c2[1] = {s1 & 0xffffffffu}, c3[1] = {s1 >> 32};
  PhiloxRounds<1>(c0, c1, c2, c3, 0x3ec8f720u, 0x02461e29u);
  return PhiloxStream{static_cast<uint32_t>(c0[0]), static_cast<uint32_t>(c1[0]),
                      static_cast<uint32_t>(c2[0]), static_cast<uint32_t>(c3[0])};
}

// keep[i] for i in [begin, end): Philox draw g (the counter's low half g) gives four
// 32-bit words, word j the values 8g + 2j (its low 16 bits) and 8g + 2j + 1 (its high
// ones); a value is kept where its 16 bits are >= threshold. begin is a multiple of 8.
CLONES void KeepMaskRange(PhiloxStream stream, uint32_t threshold, int64_t begin,
                          int64_t end, uint8_t* keep) {
  for (int64_t at = begin; at < end; at += 8 * kLanes) {
    uint64_t c0[kLanes], c1[kLanes], c2[kLanes], c3[kLanes];
    for (int l = 0; l < kLanes; ++l) {
      uint64_t group = static_cast<uint64_t>(at / 8 + l);
      c0[l] = group & 0xffffffffu;
      c1[l] = group >> 32;
      c2[l] = stream.counter2;
      c3[l] = stream.counter3;
    }
    PhiloxRounds<kLanes>(c0, c1, c2, c3, stream.key0, stream.key1);
    uint8_t bytes[8 * kLanes];
    const uint64_t* words[4] = {c0, c1, c2, c3};
    for (int j = 0; j < 4; ++j)
      for (int l = 0; l < kLanes; ++l) {
        bytes[8 * l + 2 * j] = (words[j][l] & 0xffffu) >= threshold;
        bytes[8 * l + 2 * j + 1] = (words[j][l] >> 16) >= threshold;
      }
    int64_t n = end - at < 8 * kLanes ? end - at : 8 * kLanes;
    std::memcpy(keep + at, bytes, n);
  }
}

#if defined(__x86_64__)
// The low and high 32 bits of c * m in each of 16 lanes.
AVX512 inline void MultiplyLanes(__m512i c, __m512i m, __m512i* lo, __m512i* hi) {
  __m512i even = _mm512_mul_epu32(c, m);
  __m512i odd = _mm512_mul_epu32(_mm512_srli_epi64(c, 32), m);
  *lo = _mm512_mask_blend_epi32(0xAAAA, even, _mm512_slli_epi64(odd, 32));
  *hi = _mm512_mask_blend_epi32(0xAAAA, _mm512_srli_epi64(even, 32), odd);
}

// KeepMaskRange's mask, 16 draws (128 values) at a time in AVX-512 registers. Draws
// whose counters' low halves would carry into the high ones go to KeepMaskRange.
AVX512 void KeepMaskRangeAvx512(PhiloxStream stream, uint32_t threshold, int64_t begin,
                                int64_t end, uint8_t* keep) {
  const __m512i multiplier_a = _mm512_set1_epi32(static_cast<int>(kPhiloxM4x32A));
  const __m512i multiplier_b = _mm512_set1_epi32(static_cast<int>(kPhiloxM4x32B));
  const __m512i lanes = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  const __m512i limit = _mm512_set1_epi16(static_cast<int16_t>(threshold));
  const __m512i ones = _mm512_set1_epi8(1);
  for (int64_t at = begin; at < end; at += 128) {
    uint64_t group = static_cast<uint64_t>(at / 8);
    int64_t n = end - at < 128 ? end - at : 128;
    if (static_cast<uint32_t>(group) > 0xFFFFFFFFu - 15u) {
      KeepMaskRange(stream, threshold, at, at + n, keep);
      continue;
    }
    __m512i c0 = _mm512_add_epi32(_mm512_set1_epi32(static_cast<int>(group)), lanes);
    __m512i c1 = _mm512_set1_epi32(static_cast<int>(group >> 32));
    __m512i c2 = _mm512_set1_epi32(static_cast<int>(stream.counter2));
    __m512i c3 = _mm512_set1_epi32(static_cast<int>(stream.counter3));
    uint32_t k0 = stream.key0, k1 = stream.key1;
    for (int round = 0; round < 10; ++round) {
      __m512i lo0, hi0, lo1, hi1;
      MultiplyLanes(c0, multiplier_a, &lo0, &hi0);
      MultiplyLanes(c2, multiplier_b, &lo1, &hi1);
      c0 = _mm512_xor_si512(_mm512_xor_si512(hi1, c1), _mm512_set1_epi32(static_cast<int>(k0)));
      c1 = lo1;
      c2 = _mm512_xor_si512(_mm512_xor_si512(hi0, c3), _mm512_set1_epi32(static_cast<int>(k1)));
      c3 = lo0;
      k0 += kPhiloxW32A;
      k1 += kPhiloxW32B;
    }
    // The four words of 16 draws, transposed into draw order: draws[q] holds draws 4q..4q+3.
    __m512i t01lo = _mm512_unpacklo_epi32(c0, c1), t01hi = _mm512_unpackhi_epi32(c0, c1);
    __m512i t23lo = _mm512_unpacklo_epi32(c2, c3), t23hi = _mm512_unpackhi_epi32(c2, c3);
    __m512i r0 = _mm512_unpacklo_epi64(t01lo, t23lo), r1 = _mm512_unpackhi_epi64(t01lo, t23lo);
    __m512i r2 = _mm512_unpacklo_epi64(t01hi, t23hi), r3 = _mm512_unpackhi_epi64(t01hi, t23hi);
    __m512i s0 = _mm512_shuffle_i32x4(r0, r1, 0x44), s1 = _mm512_shuffle_i32x4(r0, r1, 0xEE);
    __m512i s2 = _mm512_shuffle_i32x4(r2, r3, 0x44), s3 = _mm512_shuffle_i32x4(r2, r3, 0xEE);
    __m512i draws[4] = {_mm512_shuffle_i32x4(s0, s2, 0x88), _mm512_shuffle_i32x4(s0, s2, 0xDD),
                        _mm512_shuffle_i32x4(s1, s3, 0x88), _mm512_shuffle_i32x4(s1, s3, 0xDD)};
    alignas(64) uint8_t bytes[128];
    for (int half = 0; half < 2; ++half) {
      uint64_t kept =
          static_cast<uint64_t>(_mm512_cmpge_epu16_mask(draws[2 * half], limit)) |
          static_cast<uint64_t>(_mm512_cmpge_epu16_mask(draws[2 * half + 1], limit)) << 32;
      _mm512_store_si512(reinterpret_cast<__m512i*>(bytes + 64 * half),
                         _mm512_maskz_mov_epi8(kept, ones));
    }
    std::memcpy(keep + at, bytes, n);
  }
}
#endif

// BertKeepMask(shape, seed) -> keep: bool of `shape`, False where the value's 16 random
// bits are below `threshold` (dropout_prob * 65536). `portable` runs KeepMaskRange on
// every CPU.
class BertKeepMaskOp : public OpKernel {
 public:
  explicit BertKeepMaskOp(OpKernelConstruction* context) : OpKernel(context) {
    OP_REQUIRES_OK(context, context->GetAttr("threshold", &threshold_));
    OP_REQUIRES_OK(context, context->GetAttr("portable", &portable_));
    OP_REQUIRES(context, threshold_ >= 0 && threshold_ <= 65536,
                tensorflow::errors::InvalidArgument("BertKeepMask: threshold must be in "
                                                    "[0, 65536]"));
  }
  void Compute(OpKernelContext* context) override {
    const Tensor& shape = context->input(0);
    const Tensor& seed = context->input(1);
    OP_REQUIRES(context, seed.dims() == 1 && seed.dim_size(0) == 2,
                tensorflow::errors::InvalidArgument("BertKeepMask: the seed must be a vector "
                                                    "of 2 values, not ",
                                                    seed.shape().DebugString()));
    tensorflow::TensorShape output_shape;
    OP_REQUIRES(context, tensorflow::TensorShapeUtils::IsVector(shape.shape()),
                tensorflow::errors::InvalidArgument("BertKeepMask: the shape must be a vector"));
    OP_REQUIRES_OK(context, tensorflow::TensorShapeUtils::MakeShape(
                                shape.flat<int32_t>().data(), shape.NumElements(), &output_shape));
    Tensor* keep = nullptr;
    OP_REQUIRES_OK(context, context->allocate_output(0, output_shape, &keep));
    auto seeds = seed.flat<tensorflow::int64>();
    PhiloxStream stream = StreamOfSeed(static_cast<uint64_t>(seeds(0)),
                                       static_cast<uint64_t>(seeds(1)));
    uint8_t* out = reinterpret_cast<uint8_t*>(const_cast<char*>(keep->tensor_data().data()));
    uint32_t threshold = static_cast<uint32_t>(threshold_);
    if (keep->NumElements() == 0) return;
    if (threshold > 0xFFFFu) {  // every value dropped
      std::memset(out, 0, keep->NumElements());
      return;
    }
#if defined(__x86_64__)
    if (HasAvx512() && !portable_) {
      Shard(context, keep->NumElements(), [&](int64_t begin, int64_t n) {
        KeepMaskRangeAvx512(stream, threshold, begin, begin + n, out);
      });
      return;
    }
#endif
    Shard(context, keep->NumElements(), [&](int64_t begin, int64_t n) {
      KeepMaskRange(stream, threshold, begin, begin + n, out);
    });
  }

 private:
  int threshold_;
  bool portable_;  // the loop every CPU runs, also where AVX-512's is faster (tests)
};

// The hyperparameters of BertLambApply, in the order of its `hyper` input.
struct LambHyper {
  float lr, grad_scale, one_minus_beta_1, one_minus_beta_2, direction_scale,
      direction_epsilon, weight_decay;
};
constexpr int kLambHyper = 6;  // the values of `hyper` (weight_decay is an attribute)

// The update's direction, as optimization.py's plain ops compute it:
// m * direction_scale / (sqrt(v) + direction_epsilon) (+ weight_decay * w).
template <bool kDecay>
inline float LambDirection(float m, float v, float w, const LambHyper& h) {
  float u = m * h.direction_scale / (std::sqrt(v) + h.direction_epsilon);
  return kDecay ? u + h.weight_decay * w : u;
}

inline float GradValue(float g) { return g; }
inline float GradValue(uint16_t g) { return ToFloat(g); }  // a bfloat16 gradient's bits

// One value of LambMoments: its moments, then its weight or the two squares.
template <bool kDecay, bool kApply, typename G>
inline void LambMoment(const G* g, float* m, float* v, float* w, const LambHyper& h,
                       float* w_square, float* u_square) {
  float grad = GradValue(*g) * h.grad_scale;
  float next_m = *m + (grad - *m) * h.one_minus_beta_1;
  float next_v = *v + (grad * grad - *v) * h.one_minus_beta_2;
  float u = LambDirection<kDecay>(next_m, next_v, *w, h);
  *m = next_m;
  *v = next_v;
  if (kApply) {
    *w = *w - h.lr * u;
  } else {
    *w_square += *w * *w;
    *u_square += u * u;
  }
}

// The moments take the gradient over [0, n); with kApply the weights move by lr times the
// direction too (trust ratio 1), else the squares of the weights and of the direction
// are summed into `sums` (two doubles).
template <bool kDecay, bool kApply, typename G>
CLONES void LambMoments(const G* g, float* m, float* v, float* w, const LambHyper& h,
                        int64_t n, double* sums) {
  float w_lanes[kLanes] = {0.0f}, u_lanes[kLanes] = {0.0f};
  int64_t whole = n - n % kLanes;
  for (int64_t i = 0; i < whole; i += kLanes)
    for (int j = 0; j < kLanes; ++j)
      LambMoment<kDecay, kApply>(g + i + j, m + i + j, v + i + j, w + i + j, h, w_lanes + j,
                                 u_lanes + j);
  for (int64_t i = whole; i < n; ++i)
    LambMoment<kDecay, kApply>(g + i, m + i, v + i, w + i, h, w_lanes, u_lanes);
  if (kApply) return;
  for (int j = 0; j < kLanes; ++j) {
    sums[0] += w_lanes[j];
    sums[1] += u_lanes[j];
  }
}

// The weights move by `step` times the direction, recomputed from the new moments.
template <bool kDecay>
CLONES void LambMove(const float* m, const float* v, float* w, const LambHyper& h,
                     float step, int64_t n) {
  for (int64_t i = 0; i < n; ++i) w[i] = w[i] - step * LambDirection<kDecay>(m[i], v[i], w[i], h);
}

// BertLambApply(var, m, v, grad, hyper) -> var: grad (float32, or bfloat16 as the
// backward pass computed it) * grad_scale updates the moments m and v, and var moves by
// lr times the direction, times ||var|| / ||direction|| where `adapt` (1 where either
// norm is 0). hyper: lr, grad_scale, 1 - beta_1, 1 - beta_2, direction_scale,
// direction_epsilon.
class BertLambApplyOp : public OpKernel {
 public:
  explicit BertLambApplyOp(OpKernelConstruction* context) : OpKernel(context) {
    OP_REQUIRES_OK(context, context->GetAttr("adapt", &adapt_));
    OP_REQUIRES_OK(context, context->GetAttr("weight_decay", &weight_decay_));
  }
  void Compute(OpKernelContext* context) override {
    context->forward_ref_input_to_ref_output(0, 0);
    Tensor var = context->mutable_input(0, false);
    Tensor m = context->mutable_input(1, false);
    Tensor v = context->mutable_input(2, false);
    const Tensor& grad = context->input(3);
    const Tensor& hyper = context->input(4);
    OP_REQUIRES(context, var.IsInitialized() && m.IsInitialized() && v.IsInitialized(),
                tensorflow::errors::FailedPrecondition(
                    "BertLambApply: a variable or slot is not initialized"));
    OP_REQUIRES(context, var.shape() == m.shape() && var.shape() == v.shape() &&
                             var.shape() == grad.shape(),
                tensorflow::errors::InvalidArgument(
                    "BertLambApply: var, m, v and grad differ in shape: ",
                    var.shape().DebugString(), ", ", m.shape().DebugString(), ", ",
                    v.shape().DebugString(), " and ", grad.shape().DebugString()));
    OP_REQUIRES(context, hyper.dims() == 1 && hyper.dim_size(0) == kLambHyper,
                tensorflow::errors::InvalidArgument("BertLambApply: hyper must be a vector "
                                                    "of ", kLambHyper, " values, not ",
                                                    hyper.shape().DebugString()));
    auto values = hyper.flat<float>();
    LambHyper h = {values(0), values(1), values(2), values(3), values(4), values(5),
                   weight_decay_};
    bool half = grad.dtype() == tensorflow::DT_BFLOAT16;
    if (weight_decay_ != 0.0f) {
      half ? Update<true>(context, var, m, v, Bits(grad), h)
           : Update<true>(context, var, m, v, grad.flat<float>().data(), h);
    } else {
      half ? Update<false>(context, var, m, v, Bits(grad), h)
           : Update<false>(context, var, m, v, grad.flat<float>().data(), h);
    }
  }

 private:
  template <bool kDecay, typename G>
  void Update(OpKernelContext* context, Tensor& var, Tensor& m, Tensor& v, const G* g_data,
              const LambHyper& h) {
    int64_t n = var.NumElements();
    float* w_data = var.flat<float>().data();
    float* m_data = m.flat<float>().data();
    float* v_data = v.flat<float>().data();
    if (!adapt_) {
      Shard(context, n, [&](int64_t begin, int64_t count) {
        LambMoments<kDecay, true>(g_data + begin, m_data + begin, v_data + begin,
                                  w_data + begin, h, count, nullptr);
      });
      return;
    }
    // A sum for each block, added in order: the same norms whatever the threads did.
    std::vector<double> sums(2 * ((n + kBlock - 1) / kBlock), 0.0);
    Shard(context, n, [&](int64_t begin, int64_t count) {
      for (int64_t at = begin; at < begin + count; at += kBlock) {
        int64_t block = std::min(kBlock, begin + count - at);
        LambMoments<kDecay, false>(g_data + at, m_data + at, v_data + at, w_data + at, h,
                                   block, &sums[2 * (at / kBlock)]);
      }
    });
    double w_square = 0.0, u_square = 0.0;
    for (size_t i = 0; i < sums.size(); i += 2) {
      w_square += sums[i];
      u_square += sums[i + 1];
    }
    float w_norm = static_cast<float>(std::sqrt(w_square));
    float u_norm = static_cast<float>(std::sqrt(u_square));
    float ratio = w_norm > 0.0f && u_norm > 0.0f ? w_norm / u_norm : 1.0f;
    float step = ratio * h.lr;
    Shard(context, n, [&](int64_t begin, int64_t count) {
      LambMove<kDecay>(m_data + begin, v_data + begin, w_data + begin, h, step, count);
    });
  }

  bool adapt_;
  float weight_decay_;
};

}  // namespace

REGISTER_OP("BertGelu")
    .Input("x: bfloat16")
    .Output("y: bfloat16")
    .SetShapeFn(tensorflow::shape_inference::UnchangedShape);

REGISTER_OP("BertGeluGrad")
    .Input("x: bfloat16")
    .Input("dy: bfloat16")
    .Output("dx: bfloat16")
    .SetShapeFn(tensorflow::shape_inference::UnchangedShape);

// The shape function of the attention's kernels: probs and dropped have the scores' shape.
tensorflow::Status TwoOutputsOfTheScoresShape(tensorflow::shape_inference::InferenceContext* c) {
  c->set_output(0, c->input(0));
  c->set_output(1, c->input(0));
  return tensorflow::Status();
}

REGISTER_OP("BertAttentionProbs")
    .Input("scores: T")
    .Input("keep: bool")
    .Output("probs: bfloat16")
    .Output("dropped: bfloat16")
    .Attr("scale: float")
    .Attr("T: {float, bfloat16}")
    .SetShapeFn(TwoOutputsOfTheScoresShape);

REGISTER_OP("BertMaskedAttentionProbs")
    .Input("scores: T")
    .Input("keep: bool")
    .Input("adder: float")
    .Output("probs: bfloat16")
    .Output("dropped: bfloat16")
    .Attr("scale: float")
    .Attr("T: {float, bfloat16}")
    .SetShapeFn(TwoOutputsOfTheScoresShape);

REGISTER_OP("BertAttentionProbsGrad")
    .Input("probs: bfloat16")
    .Input("keep: bool")
    .Input("upstream: bfloat16")
    .Output("grad: T")
    .Attr("scale: float")
    .Attr("T: {float, bfloat16}")
    .SetShapeFn(tensorflow::shape_inference::UnchangedShape);

REGISTER_OP("BertDropout")
    .Input("x: bfloat16")
    .Input("keep: bool")
    .Output("y: bfloat16")
    .Attr("scale: float")
    .SetShapeFn(tensorflow::shape_inference::UnchangedShape);

REGISTER_KERNEL_BUILDER(Name("BertGelu").Device(tensorflow::DEVICE_CPU), BertGeluOp);
REGISTER_KERNEL_BUILDER(Name("BertGeluGrad").Device(tensorflow::DEVICE_CPU), BertGeluGradOp);
#define REGISTER_ATTENTION_PROBS(T)                                                    \
  REGISTER_KERNEL_BUILDER(                                                           \
      Name("BertAttentionProbs").Device(tensorflow::DEVICE_CPU).TypeConstraint<T>("T"), \
      BertAttentionProbsOp<T>);                                                      \
  REGISTER_KERNEL_BUILDER(Name("BertMaskedAttentionProbs")                           \
                              .Device(tensorflow::DEVICE_CPU)                        \
                              .TypeConstraint<T>("T"),                               \
                          BertAttentionProbsOp<T>);                                  \
  REGISTER_KERNEL_BUILDER(                                                           \
      Name("BertAttentionProbsGrad").Device(tensorflow::DEVICE_CPU).TypeConstraint<T>("T"), \
      BertAttentionProbsGradOp<T>)
REGISTER_ATTENTION_PROBS(float);
REGISTER_ATTENTION_PROBS(tensorflow::bfloat16);
REGISTER_KERNEL_BUILDER(Name("BertDropout").Device(tensorflow::DEVICE_CPU), BertDropoutOp);

REGISTER_OP("BertToBfloat16")
    .Input("x: float")
    .Output("y: bfloat16")
    .SetShapeFn(tensorflow::shape_inference::UnchangedShape);

REGISTER_OP("BertToFloat")
    .Input("x: bfloat16")
    .Output("y: float")
    .SetShapeFn(tensorflow::shape_inference::UnchangedShape);

REGISTER_KERNEL_BUILDER(Name("BertToBfloat16").Device(tensorflow::DEVICE_CPU),
                        BertCastOp<float, uint16_t>);
REGISTER_KERNEL_BUILDER(Name("BertToFloat").Device(tensorflow::DEVICE_CPU),
                        BertCastOp<uint16_t, float>);

REGISTER_OP("BertSquareSum")
    .Input("x: bfloat16")
    .Output("sum: float")
    .SetShapeFn(tensorflow::shape_inference::ScalarShape);

REGISTER_KERNEL_BUILDER(Name("BertSquareSum").Device(tensorflow::DEVICE_CPU),
                        BertSquareSumOp);

REGISTER_OP("BertAccumulate")
    .Input("sum: Ref(float)")
    .Input("grad: bfloat16")
    .Input("factor: float")
    .Output("out: Ref(float)")
    .SetShapeFn([](tensorflow::shape_inference::InferenceContext* c) {
      tensorflow::shape_inference::ShapeHandle shape, factor;
      TF_RETURN_IF_ERROR(c->Merge(c->input(0), c->input(1), &shape));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(2), 0, &factor));
      c->set_output(0, shape);
      return tensorflow::Status();
    });

REGISTER_KERNEL_BUILDER(Name("BertAccumulate").Device(tensorflow::DEVICE_CPU),
                        BertAccumulateOp);

REGISTER_OP("BertBiasAdd")
    .Input("value: bfloat16")
    .Input("bias: bfloat16")
    .Output("y: bfloat16")
    .SetShapeFn([](tensorflow::shape_inference::InferenceContext* c) {
      tensorflow::shape_inference::ShapeHandle value, bias;
      tensorflow::shape_inference::DimensionHandle width;
      TF_RETURN_IF_ERROR(c->WithRankAtLeast(c->input(0), 2, &value));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 1, &bias));
      TF_RETURN_IF_ERROR(c->Merge(c->Dim(value, -1), c->Dim(bias, 0), &width));
      c->set_output(0, value);
      return tensorflow::Status();
    });

REGISTER_KERNEL_BUILDER(Name("BertBiasAdd").Device(tensorflow::DEVICE_CPU), BertBiasAddOp);

REGISTER_OP("BertBiasAddGrad")
    .Input("dy: bfloat16")
    .Output("sums: bfloat16")
    .SetShapeFn([](tensorflow::shape_inference::InferenceContext* c) {
      tensorflow::shape_inference::ShapeHandle dy;
      TF_RETURN_IF_ERROR(c->WithRankAtLeast(c->input(0), 2, &dy));
      c->set_output(0, c->Vector(c->Dim(dy, -1)));
      return tensorflow::Status();
    });

REGISTER_KERNEL_BUILDER(Name("BertBiasAddGrad").Device(tensorflow::DEVICE_CPU),
                        BertBiasAddGradOp);

REGISTER_OP("BertDropoutAddLayerNorm")
    .Input("x: bfloat16")
    .Input("residual: float")
    .Input("keep: bool")
    .Input("gamma: float")
    .Input("beta: float")
    .Output("y: float")
    .Output("x_hat: float")
    .Output("inverse_std: float")
    .Output("y_half: bfloat16")
    .Attr("scale: float")
    .SetShapeFn([](tensorflow::shape_inference::InferenceContext* c) {
      tensorflow::shape_inference::ShapeHandle rows, unused;
      TF_RETURN_IF_ERROR(c->WithRankAtLeast(c->input(0), 1, &rows));
      TF_RETURN_IF_ERROR(c->Merge(rows, c->input(1), &rows));
      TF_RETURN_IF_ERROR(c->Merge(rows, c->input(2), &rows));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(3), 1, &unused));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(4), 1, &unused));
      c->set_output(0, rows);
      c->set_output(1, rows);
      c->set_output(2, c->Vector(tensorflow::shape_inference::InferenceContext::kUnknownDim));
      c->set_output(3, rows);
      return tensorflow::Status();
    });

REGISTER_OP("BertDropoutAddLayerNormGrad")
    .Input("dy: float")
    .Input("x_hat: float")
    .Input("inverse_std: float")
    .Input("gamma: float")
    .Input("keep: bool")
    .Input("dy_half: bfloat16")
    .Output("d_residual: float")
    .Output("dx: bfloat16")
    .Output("d_gamma: float")
    .Output("d_beta: float")
    .Attr("scale: float")
    .SetShapeFn([](tensorflow::shape_inference::InferenceContext* c) {
      c->set_output(0, c->input(0));
      c->set_output(1, c->input(0));
      c->set_output(2, c->input(3));
      c->set_output(3, c->input(3));
      return tensorflow::Status();
    });

REGISTER_KERNEL_BUILDER(Name("BertDropoutAddLayerNorm").Device(tensorflow::DEVICE_CPU),
                        BertDropoutAddLayerNormOp);
REGISTER_KERNEL_BUILDER(Name("BertDropoutAddLayerNormGrad").Device(tensorflow::DEVICE_CPU),
                        BertDropoutAddLayerNormGradOp);

REGISTER_OP("BertKeepMask")
    .Input("shape: int32")
    .Input("seed: int64")
    .Output("keep: bool")
    .Attr("threshold: int")
    .Attr("portable: bool = false")
    .SetShapeFn([](tensorflow::shape_inference::InferenceContext* c) {
      tensorflow::shape_inference::ShapeHandle shape;
      TF_RETURN_IF_ERROR(c->MakeShapeFromShapeTensor(0, &shape));
      tensorflow::shape_inference::ShapeHandle seed;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 1, &seed));
      c->set_output(0, shape);
      return tensorflow::Status();
    });

REGISTER_KERNEL_BUILDER(Name("BertKeepMask").Device(tensorflow::DEVICE_CPU), BertKeepMaskOp);

REGISTER_OP("BertLambApply")
    .Input("var: Ref(float)")
    .Input("m: Ref(float)")
    .Input("v: Ref(float)")
    .Input("grad: T")
    .Input("hyper: float")
    .Output("out: Ref(float)")
    .Attr("T: {float, bfloat16} = DT_FLOAT")
    .Attr("adapt: bool")
    .Attr("weight_decay: float = 0.0")
    .SetShapeFn([](tensorflow::shape_inference::InferenceContext* c) {
      tensorflow::shape_inference::ShapeHandle shape, hyper;
      tensorflow::shape_inference::DimensionHandle values;
      TF_RETURN_IF_ERROR(c->Merge(c->input(0), c->input(1), &shape));
      TF_RETURN_IF_ERROR(c->Merge(shape, c->input(2), &shape));
      TF_RETURN_IF_ERROR(c->Merge(shape, c->input(3), &shape));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(4), 1, &hyper));
      TF_RETURN_IF_ERROR(c->WithValue(c->Dim(hyper, 0), kLambHyper, &values));
      c->set_output(0, shape);
      return tensorflow::Status();
    });

REGISTER_KERNEL_BUILDER(Name("BertLambApply").Device(tensorflow::DEVICE_CPU), BertLambApplyOp);
