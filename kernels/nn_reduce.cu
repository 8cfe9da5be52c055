// Axis reductions, f32: Sum / Mean / Max over the middle axis of x viewed as [outer, n, inner],
// and the backward of Max. CPU reference: gpu_core::cpu::elementwise (f64 accumulation). The
// templates and the layout live in nn_reduce.cuh (shared with the bf16 kernels of
// nn_reduce_bf16.cu); this file instantiates them for float.

#include "nn_reduce.cuh"

// reduce_{sum,max}_f32, reduce_rowsv_{sum,max}_f32 and reduce_colsv_{sum,max}_f32 (float4 reads
// along a row or across 4 adjacent columns).
REDUCE_KERNELS(sum, SumOp, float, float, f32)
REDUCE_KERNELS(max, MaxOp, float, float, f32)

MAX_AXIS_BWD_KERNEL(float, f32)
