// Dropout on CPU in one pass: y = keep ? x * scale : 0, with the keep decisions read from a
// Philox stream keyed by a seed pair.
//
// Entry e (in row-major order) is kept when its field of `bits` bits in the stream is
// >= `threshold`. `tfrs_logq.sasrec.native.dropout` sets them from the rate (in double precision):
// the fewest of 1, 8, 16 bits that represent the rate exactly (1 bit for the usual 0.5), else
// 32 bits (keep probability within 2^-33 of 1 - rate), threshold = rate * 2^bits, and
// scale = 1 / (1 - rate). TensorFlow's
// `tf.nn.dropout` draws one float per entry and takes about five full-size ops; this kernel
// draws 1/32 of a word per entry at rate 0.5 and writes y directly. The stream position of an
// entry depends only on e, so the result does not depend on the number of threads, and the
// gradient is the same op applied to the upstream gradient with the same seed (the mask is
// recomputed, not stored).
//
// Built on first use by `tfrs_logq.sasrec.native` (g++ with TensorFlow's compile flags).

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tensorflow/core/lib/random/philox_random.h"
#include "tensorflow/core/util/work_sharder.h"

namespace tfrs_logq {

using ::tensorflow::DEVICE_CPU;
using ::tensorflow::OpKernel;
using ::tensorflow::OpKernelConstruction;
using ::tensorflow::OpKernelContext;
using ::tensorflow::Status;
using ::tensorflow::Tensor;
using ::tensorflow::errors::InvalidArgument;
using ::tensorflow::shape_inference::InferenceContext;
using ::tensorflow::shape_inference::ShapeHandle;

namespace {

// Entries per chunk: a multiple of 128, so that every chunk starts on a 128-bit Philox
// sample for every field width.
constexpr int64_t kChunk = 512;

// scale when field >= threshold, else 0, without a comparison the compiler could turn into a
// branch: the sign of field - threshold in 64 bits.
inline float Factor(uint32_t field, uint32_t threshold, float scale) {
  const int64_t kept = 1 + ((static_cast<int64_t>(field) - static_cast<int64_t>(threshold)) >> 63);
  return static_cast<float>(kept) * scale;
}

template <int kBits>
void DropChunk(const float* __restrict x, float* __restrict y, int64_t count, uint64_t seed_lo,
               uint64_t seed_hi, int64_t chunk, uint32_t threshold, float scale) {
  constexpr int64_t kWords = kChunk * kBits / 32;
  uint32_t words[kWords];
  ::tensorflow::random::PhiloxRandom philox(seed_lo, seed_hi);
  philox.Skip(static_cast<uint64_t>(chunk) * (kWords / 4));
  for (int64_t w = 0; w < kWords; w += 4) {
    const auto sample = philox();
    for (int i = 0; i < 4; ++i) words[w + i] = sample[i];
  }
  // Branch-free (x * 0 or x * scale, as `inputs * mask`): the decisions are random, so a
  // branch would be mispredicted half the time (about 5x slower). Whole words first, in
  // vector lanes.
  constexpr int kPerWord = 32 / kBits;
  constexpr uint32_t kMask = kBits == 32 ? 0xFFFFFFFFu : ((1u << (kBits % 32)) - 1u);
  const int64_t full = count / kPerWord;
  for (int64_t w = 0; w < full; ++w) {
    const uint32_t word = words[w];
    const float* __restrict xw = x + w * kPerWord;
    float* __restrict yw = y + w * kPerWord;
#pragma omp simd
    for (int j = 0; j < kPerWord; ++j) {
      const uint32_t field = kBits == 32 ? word : (word >> (j * kBits)) & kMask;
      yw[j] = xw[j] * Factor(field, threshold, scale);
    }
  }
  for (int64_t i = full * kPerWord; i < count; ++i) {
    const uint32_t word = words[i / kPerWord];
    const uint32_t field = kBits == 32 ? word : (word >> ((i % kPerWord) * kBits)) & kMask;
    y[i] = x[i] * Factor(field, threshold, scale);
  }
}

}  // namespace

REGISTER_OP("TfrsLogqDropout")
    .Input("x: float")
    .Input("seed: int64")
    .Attr("bits: int")
    .Attr("threshold: int")
    .Attr("scale: float")
    .Output("y: float")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle seed;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 1, &seed));
      ::tensorflow::shape_inference::DimensionHandle unused;
      TF_RETURN_IF_ERROR(c->WithValue(c->Dim(seed, 0), 2, &unused));
      c->set_output(0, c->input(0));
      return Status();
    });

class DropoutOp : public OpKernel {
 public:
  explicit DropoutOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    int64_t threshold = 0;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("bits", &bits_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("threshold", &threshold));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("scale", &scale_));
    OP_REQUIRES(ctx, bits_ == 1 || bits_ == 8 || bits_ == 16 || bits_ == 32,
                InvalidArgument("bits must be 1, 8, 16 or 32, received ", bits_));
    OP_REQUIRES(ctx, threshold >= 0 && threshold < (int64_t{1} << bits_),
                InvalidArgument("threshold must be in [0, 2^", bits_, "), received ", threshold));
    OP_REQUIRES(ctx, std::isfinite(scale_) && scale_ >= 1.0f,
                InvalidArgument("scale must be finite and >= 1, received ", scale_));
    threshold_ = static_cast<uint32_t>(threshold);
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& x = ctx->input(0);
    const Tensor& seed = ctx->input(1);
    OP_REQUIRES(ctx, seed.dims() == 1 && seed.dim_size(0) == 2,
                InvalidArgument("seed must be [2] int64, received shape ",
                                seed.shape().DebugString()));
    Tensor* y = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, x.shape(), &y));
    const int64_t size = x.NumElements();
    if (size == 0) return;
    const float* xs = x.flat<float>().data();
    float* ys = y->flat<float>().data();
    const uint64_t seed_lo = static_cast<uint64_t>(seed.flat<int64_t>()(0));
    const uint64_t seed_hi = static_cast<uint64_t>(seed.flat<int64_t>()(1));
    const int bits = bits_;
    const uint32_t threshold = threshold_;
    const float scale = scale_;
    auto work = [&](int64_t begin, int64_t end) {
      for (int64_t chunk = begin; chunk < end; ++chunk) {
        const int64_t first = chunk * kChunk;
        const int64_t count = std::min(kChunk, size - first);
        const float* xc = xs + first;
        float* yc = ys + first;
        switch (bits) {
          case 1:
            DropChunk<1>(xc, yc, count, seed_lo, seed_hi, chunk, threshold, scale);
            break;
          case 8:
            DropChunk<8>(xc, yc, count, seed_lo, seed_hi, chunk, threshold, scale);
            break;
          case 16:
            DropChunk<16>(xc, yc, count, seed_lo, seed_hi, chunk, threshold, scale);
            break;
          default:
            DropChunk<32>(xc, yc, count, seed_lo, seed_hi, chunk, threshold, scale);
        }
      }
    };
    auto* workers = ctx->device()->tensorflow_cpu_worker_threads();
    ::tensorflow::Shard(workers->num_threads, workers->workers, (size + kChunk - 1) / kChunk,
                        kChunk * 4, work);
  }

 private:
  int bits_;
  uint32_t threshold_;
  float scale_;
};

REGISTER_KERNEL_BUILDER(Name("TfrsLogqDropout").Device(DEVICE_CPU).HostMemory("seed"),
                        DropoutOp);

}  // namespace tfrs_logq
