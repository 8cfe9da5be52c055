// Axis reductions on bf16 buffers (bf16 mixed precision): Sum / Mean / Max over the middle axis
// of x viewed as [outer, n, inner], and the backward of Max. CPU reference:
// gpu_core::cpu::elementwise, via f32 math and one rounding: the kernels of nn_reduce.cu (the
// same templates and layout, nn_reduce.cuh) on widened bf16 inputs, accumulating and finishing
// (the Mean divisor) in f32, and rounding once to nearest even when the output is bf16.

#include "nn_reduce.cuh"

// reduce_{sum,max}_<suffix>, reduce_rowsv_{sum,max}_<suffix> and reduce_colsv_{sum,max}_<suffix>
// (16 bytes a read: 8 bf16 or 4 f32, along a row or across adjacent columns):
//   _bf16      bf16 in, bf16 out (one pass);
//   _bf16_f32  bf16 in, f32 out (the first pass of a split reduction: f32 partials);
//   _f32_bf16  f32 in, bf16 out (the second pass, over the f32 partials).
REDUCE_KERNELS(sum, SumOp, bf16, bf16, bf16)
REDUCE_KERNELS(max, MaxOp, bf16, bf16, bf16)
REDUCE_KERNELS(sum, SumOp, bf16, float, bf16_f32)
REDUCE_KERNELS(max, MaxOp, bf16, float, bf16_f32)
REDUCE_KERNELS(sum, SumOp, float, bf16, f32_bf16)
REDUCE_KERNELS(max, MaxOp, float, bf16, f32_bf16)

// max_axis_bwd_bf16: the first i with x == y (compared in f32: y, a bf16 max, is exactly one
// of the x) gets dy, the others 0.
MAX_AXIS_BWD_KERNEL(bf16, bf16)
