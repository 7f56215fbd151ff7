// Fused gather-dot for sampled softmax on CPU: logits[i, j] = queries[i] . table[ids[i, j]].
//
// TensorFlow computes this either as a gather of a [n, k, dim] block of embeddings and a
// batched dot (memory: n * k * dim floats per step, 1 GB at the paper's MNS shapes), or as a
// [n, catalog] matmul and a gather (catalog / k times the arithmetic). This kernel reads the
// table rows in place. Its gradient op returns d/dqueries and a dense d/dtable; the table
// gradient is split by id range between threads, so every thread scans the ids in the same
// order and the result is deterministic (no atomics); each thread scans all n * k ids, which
// is cheap beside the dim-wide updates at a few threads (ids are not sorted by block).
//
// Built on first use by `tfrs_logq.sasrec.native` (g++ with TensorFlow's compile flags).

#include <algorithm>
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

inline float Dot(const float* __restrict a, const float* __restrict b, int64_t dim) {
  float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
  for (int64_t d = 0; d < dim; ++d) sum += a[d] * b[d];
  return sum;
}

inline void Axpy(float alpha, const float* __restrict x, float* __restrict y, int64_t dim) {
#pragma omp simd
  for (int64_t d = 0; d < dim; ++d) y[d] += alpha * x[d];
}

// Checks ranks, matching sizes and that every id is in [0, num_rows).
Status ValidateInputs(const Tensor& queries, const Tensor& table, const Tensor& ids) {
  if (queries.dims() != 2) {
    return InvalidArgument("queries must be [n, dim], received shape ",
                           queries.shape().DebugString());
  }
  if (table.dims() != 2) {
    return InvalidArgument("table must be [num_rows, dim], received shape ",
                           table.shape().DebugString());
  }
  if (ids.dims() != 2) {
    return InvalidArgument("ids must be [n, k], received shape ", ids.shape().DebugString());
  }
  if (queries.dim_size(1) != table.dim_size(1)) {
    return InvalidArgument("queries and table must have the same dim, received ",
                           queries.dim_size(1), " and ", table.dim_size(1));
  }
  if (queries.dim_size(0) != ids.dim_size(0)) {
    return InvalidArgument("queries and ids must have the same number of rows, received ",
                           queries.dim_size(0), " and ", ids.dim_size(0));
  }
  const int32_t* id = ids.flat<int32_t>().data();
  const int64_t count = ids.NumElements();
  const int64_t rows = table.dim_size(0);
  for (int64_t i = 0; i < count; ++i) {
    if (id[i] < 0 || id[i] >= rows) {
      return InvalidArgument("ids[", i / ids.dim_size(1), ", ", i % ids.dim_size(1), "] = ",
                             id[i], " is not in [0, ", rows, ")");
    }
  }
  return Status();
}

}  // namespace

REGISTER_OP("TfrsLogqSampledDot")
    .Input("queries: float")
    .Input("table: float")
    .Input("ids: int32")
    .Output("logits: float")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle queries, table, ids;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 2, &queries));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 2, &table));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(2), 2, &ids));
      DimensionHandle unused;
      TF_RETURN_IF_ERROR(c->Merge(c->Dim(queries, 1), c->Dim(table, 1), &unused));
      DimensionHandle n;
      TF_RETURN_IF_ERROR(c->Merge(c->Dim(queries, 0), c->Dim(ids, 0), &n));
      c->set_output(0, c->Matrix(n, c->Dim(ids, 1)));
      return Status();
    });

REGISTER_OP("TfrsLogqSampledDotGrad")
    .Input("upstream: float")
    .Input("queries: float")
    .Input("table: float")
    .Input("ids: int32")
    .Output("d_queries: float")
    .Output("d_table: float")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle upstream, queries, table, ids;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 2, &upstream));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 2, &queries));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(2), 2, &table));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(3), 2, &ids));
      ShapeHandle unused;
      TF_RETURN_IF_ERROR(c->Merge(upstream, ids, &unused));
      c->set_output(0, queries);
      c->set_output(1, table);
      return Status();
    });

class SampledDotOp : public OpKernel {
 public:
  explicit SampledDotOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    const Tensor& queries = ctx->input(0);
    const Tensor& table = ctx->input(1);
    const Tensor& ids = ctx->input(2);
    OP_REQUIRES_OK(ctx, ValidateInputs(queries, table, ids));
    const int64_t n = ids.dim_size(0), k = ids.dim_size(1), dim = table.dim_size(1);
    Tensor* logits = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({n, k}), &logits));
    const float* q = queries.flat<float>().data();
    const float* t = table.flat<float>().data();
    const int32_t* id = ids.flat<int32_t>().data();
    float* out = logits->flat<float>().data();
    auto work = [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        const float* qi = q + i * dim;
        for (int64_t j = 0; j < k; ++j) out[i * k + j] = Dot(qi, t + id[i * k + j] * dim, dim);
      }
    };
    auto* workers = ctx->device()->tensorflow_cpu_worker_threads();
    ::tensorflow::Shard(workers->num_threads, workers->workers, n, k * dim * 2, work);
  }
};

class SampledDotGradOp : public OpKernel {
 public:
  explicit SampledDotGradOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    const Tensor& upstream = ctx->input(0);
    const Tensor& queries = ctx->input(1);
    const Tensor& table = ctx->input(2);
    const Tensor& ids = ctx->input(3);
    OP_REQUIRES_OK(ctx, ValidateInputs(queries, table, ids));
    OP_REQUIRES(ctx, upstream.shape() == ids.shape(),
                InvalidArgument("upstream must have the shape of ids ",
                                ids.shape().DebugString(), ", received ",
                                upstream.shape().DebugString()));
    const int64_t n = ids.dim_size(0), k = ids.dim_size(1), dim = table.dim_size(1);
    const int64_t rows = table.dim_size(0);
    Tensor* d_queries = nullptr;
    Tensor* d_table = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, queries.shape(), &d_queries));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, table.shape(), &d_table));
    const float* g = upstream.flat<float>().data();
    const float* q = queries.flat<float>().data();
    const float* t = table.flat<float>().data();
    const int32_t* id = ids.flat<int32_t>().data();
    float* dq = d_queries->flat<float>().data();
    float* dt = d_table->flat<float>().data();
    auto* workers = ctx->device()->tensorflow_cpu_worker_threads();

    // d/dqueries[i] = sum_j upstream[i, j] * table[ids[i, j]]: rows are independent.
    auto query_rows = [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        float* dqi = dq + i * dim;
        std::memset(dqi, 0, sizeof(float) * dim);
        for (int64_t j = 0; j < k; ++j) Axpy(g[i * k + j], t + id[i * k + j] * dim, dqi, dim);
      }
    };
    ::tensorflow::Shard(workers->num_threads, workers->workers, n, k * dim * 2, query_rows);

    // d/dtable[r] = sum over (i, j) with ids[i, j] == r of upstream[i, j] * queries[i]. Each
    // block of table rows is owned by one thread, which scans all ids in order.
    const int64_t blocks = std::max<int64_t>(1, std::min<int64_t>(workers->num_threads, rows));
    const int64_t per_block = (rows + blocks - 1) / blocks;
    auto table_blocks = [&](int64_t begin, int64_t end) {
      for (int64_t b = begin; b < end; ++b) {
        const int64_t lo = b * per_block, hi = std::min(rows, lo + per_block);
        if (lo >= hi) continue;
        std::memset(dt + lo * dim, 0, sizeof(float) * (hi - lo) * dim);
        for (int64_t i = 0; i < n; ++i) {
          const float* qi = q + i * dim;
          for (int64_t j = 0; j < k; ++j) {
            const int64_t r = id[i * k + j];
            if (r >= lo && r < hi) Axpy(g[i * k + j], qi, dt + r * dim, dim);
          }
        }
      }
    };
    // A large cost per block makes Shard give each block its own thread.
    ::tensorflow::Shard(workers->num_threads, workers->workers, blocks,
                        std::max<int64_t>(n * k * dim, 1 << 20), table_blocks);
  }
};

REGISTER_KERNEL_BUILDER(Name("TfrsLogqSampledDot").Device(DEVICE_CPU), SampledDotOp);
REGISTER_KERNEL_BUILDER(Name("TfrsLogqSampledDotGrad").Device(DEVICE_CPU), SampledDotGradOp);

}  // namespace tfrs_logq
