//! [`MatmulOps`] on CUDA: cuBLAS SGEMM (see `blas.rs`).

use crate::backend::CudaBackend;
use crate::pool::CudaBuffer;
use gpu_core::{MatmulOps, MatmulSpec, Result};

impl MatmulOps for CudaBackend {
    fn matmul(
        &self,
        spec: MatmulSpec,
        a: &CudaBuffer,
        b: &CudaBuffer,
        c: &mut CudaBuffer,
    ) -> Result<()> {
        spec.validate(a, b, c)?;
        if gpu_core::BufferInfo::dtype(a) == gpu_core::DType::BF16 {
            return self.matmul_bf16(spec, a, b, c);
        }
        self.sgemm(spec, a, b, c)
    }
}
