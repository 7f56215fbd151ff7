// Fused layer normalisation over the last axis on CPU, with its gradient:
//
//   y = (x - mean) * rstd * gamma + beta,   rstd = 1 / sqrt(var + epsilon)
//
// (var is the biased variance of the row, as in Keras and PyTorch). Keras'
// `LayerNormalization` takes its unfused path for epsilon < 1.001e-5 (gSASRec's 1e-5)
// and then spends about six full-size elementwise ops forward and more backward; this
// kernel reads each row once forward (and returns mean and rstd for the gradient) and
// once backward. d/dgamma and d/dbeta sum over rows in fixed blocks of rows whose
// partial sums are added in block order, so the result does not depend on the number
// of threads (deterministic).
//
// Built on first use by `tfrs_logq.sasrec.native` (g++ with TensorFlow's compile flags).

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tensorflow/core/util/work_sharder.h"

namespace tfrs_logq {

using ::tensorflow::DEVICE_CPU;
using ::tensorflow::OpKernel;
using ::tensorflow::OpKernelConstruction;
using ::tensorflow::OpKernelContext;
using ::tensorflow::Status;
using ::tensorflow::Tensor;
using ::tensorflow::TensorShape;
using ::tensorflow::errors::InvalidArgument;
using ::tensorflow::shape_inference::DimensionHandle;
using ::tensorflow::shape_inference::InferenceContext;
using ::tensorflow::shape_inference::ShapeHandle;

namespace {

// Rows per block of the d/dgamma, d/dbeta partial sums (fixed: determinism).
constexpr int64_t kBlockRows = 64;

Status ValidateNormInputs(const Tensor& x, const Tensor& gamma, const Tensor& beta) {
  if (x.dims() < 1) {
    return InvalidArgument("x must have at least one axis, received a scalar");
  }
  const int64_t dim = x.dim_size(x.dims() - 1);
  if (gamma.dims() != 1 || gamma.dim_size(0) != dim) {
    return InvalidArgument("gamma must be [", dim, "] (x's last axis), received shape ",
                           gamma.shape().DebugString());
  }
  if (beta.dims() != 1 || beta.dim_size(0) != dim) {
    return InvalidArgument("beta must be [", dim, "] (x's last axis), received shape ",
                           beta.shape().DebugString());
  }
  return Status();
}

}  // namespace

REGISTER_OP("TfrsLogqLayerNorm")
    .Input("x: float")
    .Input("gamma: float")
    .Input("beta: float")
    .Attr("epsilon: float")
    .Output("y: float")
    .Output("mean: float")
    .Output("rstd: float")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle x, gamma, beta;
      TF_RETURN_IF_ERROR(c->WithRankAtLeast(c->input(0), 1, &x));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 1, &gamma));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(2), 1, &beta));
      DimensionHandle unused;
      TF_RETURN_IF_ERROR(c->Merge(c->Dim(x, -1), c->Dim(gamma, 0), &unused));
      TF_RETURN_IF_ERROR(c->Merge(c->Dim(x, -1), c->Dim(beta, 0), &unused));
      c->set_output(0, x);
      c->set_output(1, c->Vector(c->UnknownDim()));
      c->set_output(2, c->Vector(c->UnknownDim()));
      return Status();
    });

REGISTER_OP("TfrsLogqLayerNormGrad")
    .Input("upstream: float")
    .Input("x: float")
    .Input("gamma: float")
    .Input("mean: float")
    .Input("rstd: float")
    .Output("d_x: float")
    .Output("d_gamma: float")
    .Output("d_beta: float")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle unused;
      TF_RETURN_IF_ERROR(c->Merge(c->input(0), c->input(1), &unused));
      c->set_output(0, c->input(1));
      c->set_output(1, c->input(2));
      c->set_output(2, c->input(2));
      return Status();
    });

class LayerNormOp : public OpKernel {
 public:
  explicit LayerNormOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("epsilon", &epsilon_));
    OP_REQUIRES(ctx, epsilon_ >= 0.0f,
                InvalidArgument("epsilon must be >= 0, received ", epsilon_));
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& x = ctx->input(0);
    const Tensor& gamma = ctx->input(1);
    const Tensor& beta = ctx->input(2);
    OP_REQUIRES_OK(ctx, ValidateNormInputs(x, gamma, beta));
    const int64_t dim = x.dim_size(x.dims() - 1);
    const int64_t rows = dim == 0 ? 0 : x.NumElements() / dim;
    Tensor *y = nullptr, *mean = nullptr, *rstd = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, x.shape(), &y));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({rows}), &mean));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(2, TensorShape({rows}), &rstd));
    if (rows == 0) return;
    const float* xs = x.flat<float>().data();
    const float* g = gamma.flat<float>().data();
    const float* b = beta.flat<float>().data();
    float* ys = y->flat<float>().data();
    float* ms = mean->flat<float>().data();
    float* rs = rstd->flat<float>().data();
    const float inv_dim = 1.0f / static_cast<float>(dim);
    const float epsilon = epsilon_;
    auto work = [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        const float* __restrict xr = xs + r * dim;
        float* __restrict yr = ys + r * dim;
        float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
        for (int64_t d = 0; d < dim; ++d) sum += xr[d];
        const float m = sum * inv_dim;
        float squares = 0.0f;
#pragma omp simd reduction(+ : squares)
        for (int64_t d = 0; d < dim; ++d) squares += (xr[d] - m) * (xr[d] - m);
        const float s = 1.0f / std::sqrt(squares * inv_dim + epsilon);
#pragma omp simd
        for (int64_t d = 0; d < dim; ++d) yr[d] = (xr[d] - m) * s * g[d] + b[d];
        ms[r] = m;
        rs[r] = s;
      }
    };
    auto* workers = ctx->device()->tensorflow_cpu_worker_threads();
    ::tensorflow::Shard(workers->num_threads, workers->workers, rows, dim * 8, work);
  }

 private:
  float epsilon_;
};

class LayerNormGradOp : public OpKernel {
 public:
  explicit LayerNormGradOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    const Tensor& upstream = ctx->input(0);
    const Tensor& x = ctx->input(1);
    const Tensor& gamma = ctx->input(2);
    const Tensor& mean = ctx->input(3);
    const Tensor& rstd = ctx->input(4);
    OP_REQUIRES_OK(ctx, ValidateNormInputs(x, gamma, gamma));
    OP_REQUIRES(ctx, upstream.shape() == x.shape(),
                InvalidArgument("upstream must have the shape of x ", x.shape().DebugString(),
                                ", received ", upstream.shape().DebugString()));
    const int64_t dim = x.dim_size(x.dims() - 1);
    const int64_t rows = dim == 0 ? 0 : x.NumElements() / dim;
    OP_REQUIRES(ctx, mean.dims() == 1 && mean.dim_size(0) == rows && rstd.shape() == mean.shape(),
                InvalidArgument("mean and rstd must be [", rows, "], received ",
                                mean.shape().DebugString(), " and ", rstd.shape().DebugString()));
    Tensor *d_x = nullptr, *d_gamma = nullptr, *d_beta = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, x.shape(), &d_x));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, gamma.shape(), &d_gamma));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(2, gamma.shape(), &d_beta));
    float* dg = d_gamma->flat<float>().data();
    float* db = d_beta->flat<float>().data();
    std::fill(dg, dg + dim, 0.0f);
    std::fill(db, db + dim, 0.0f);
    if (rows == 0) return;
    const int64_t blocks = (rows + kBlockRows - 1) / kBlockRows;
    Tensor partial;
    OP_REQUIRES_OK(ctx, ctx->allocate_temp(::tensorflow::DT_FLOAT,
                                           TensorShape({blocks, 2, dim}), &partial));
    const float* dy = upstream.flat<float>().data();
    const float* xs = x.flat<float>().data();
    const float* g = gamma.flat<float>().data();
    const float* ms = mean.flat<float>().data();
    const float* rs = rstd.flat<float>().data();
    float* dxs = d_x->flat<float>().data();
    float* parts = partial.flat<float>().data();
    const float inv_dim = 1.0f / static_cast<float>(dim);

    // dx = rstd * (dy*gamma - mean(dy*gamma) - xhat * mean(dy*gamma*xhat)), xhat = (x - mean) * rstd.
    auto work = [&](int64_t begin, int64_t end) {
      for (int64_t block = begin; block < end; ++block) {
        float* __restrict pg = parts + block * 2 * dim;
        float* __restrict pb = pg + dim;
        std::fill(pg, pg + 2 * dim, 0.0f);
        const int64_t last = std::min(rows, (block + 1) * kBlockRows);
        for (int64_t r = block * kBlockRows; r < last; ++r) {
          const float* __restrict xr = xs + r * dim;
          const float* __restrict dyr = dy + r * dim;
          float* __restrict dxr = dxs + r * dim;
          const float m = ms[r], s = rs[r];
          float sum_g = 0.0f, sum_gx = 0.0f;
#pragma omp simd reduction(+ : sum_g, sum_gx)
          for (int64_t d = 0; d < dim; ++d) {
            const float xhat = (xr[d] - m) * s;
            const float gd = dyr[d] * g[d];
            sum_g += gd;
            sum_gx += gd * xhat;
            pg[d] += dyr[d] * xhat;
            pb[d] += dyr[d];
          }
          const float mean_g = sum_g * inv_dim, mean_gx = sum_gx * inv_dim;
#pragma omp simd
          for (int64_t d = 0; d < dim; ++d) {
            const float xhat = (xr[d] - m) * s;
            dxr[d] = s * (dyr[d] * g[d] - mean_g - xhat * mean_gx);
          }
        }
      }
    };
    auto* workers = ctx->device()->tensorflow_cpu_worker_threads();
    ::tensorflow::Shard(workers->num_threads, workers->workers, blocks, kBlockRows * dim * 12,
                        work);
    for (int64_t block = 0; block < blocks; ++block) {
      const float* pg = parts + block * 2 * dim;
      const float* pb = pg + dim;
      for (int64_t d = 0; d < dim; ++d) {
        dg[d] += pg[d];
        db[d] += pb[d];
      }
    }
  }
};

REGISTER_KERNEL_BUILDER(Name("TfrsLogqLayerNorm").Device(DEVICE_CPU), LayerNormOp);
REGISTER_KERNEL_BUILDER(Name("TfrsLogqLayerNormGrad").Device(DEVICE_CPU), LayerNormGradOp);

}  // namespace tfrs_logq
