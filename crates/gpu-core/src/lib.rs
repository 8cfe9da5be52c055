//! `gpu-core`: the hardware-abstraction layer of hybrid-trainer.
//! Devices and device selection, dtypes, shapes, the one error enum, the [`Backend`] and the
//! op-family traits ([`nn`], [`MatmulOps`]), and the CPU backend that is always present and is the reference.
//!
//! A backend joins op by op: it implements [`Backend`] (8 required methods: buffers, host
//! copies, synchronize), [`MatmulOps::matmul`] and the 12 [`nn::Primitives`] (fill, cast,
//! block copy, permute, broadcast binary ops, the activation map and its derivative, axis
//! reductions, row argmax, row gather and scatter-add, dropout); every method of the op
//! families in [`nn`] — the fused rows, attention (packed, with dropout), decoding, quantized
//! matmuls, sampling, the optimisers (scheduled AdamW included), the dropout with a device seed
//! offset — has a default body built from those (`nn/defaults`), which a backend overrides
//! where it is faster (the CPU and CUDA backends override nearly all of them; see the table in
//! [`nn`]). [`testing::PrimitivesOnly`] is such a backend with nothing but the primitives
//! (119 lines of impls); the GPT's training step, the world model and greedy decoding run on it.

pub mod backend;
pub mod cpu;
pub mod device;
pub mod dtype;
pub mod error;
pub mod linalg;
pub mod nn;
pub mod ops;
pub mod probe;
pub mod shape;
pub mod testing;

pub use backend::{Backend, BufferInfo, DeviceType};
pub use cpu::{CpuBackend, CpuStorage};
pub use device::{Device, DEVICE_ENV};
pub use dtype::{DType, Element};
pub use error::{GpuError, Result};
pub use ops::{MatmulOps, MatmulSpec};
pub use shape::Shape;

/// The guard of `m`, taken even where a panicking thread poisoned it: the HAL's locks guard
/// caches and pools whose state stays valid when a holder panics.
pub fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[cfg(test)]
mod lock_tests {
    use std::sync::Mutex;

    #[test]
    fn lock_takes_a_poisoned_mutex_with_its_value() {
        let m = Mutex::new(7);
        let poisoned = std::thread::scope(|s| {
            s.spawn(|| {
                let mut g = m.lock().unwrap();
                *g = 8;
                panic!("poison it");
            })
            .join()
            .is_err()
        });
        assert!(poisoned && m.is_poisoned());
        assert_eq!(*super::lock(&m), 8);
    }
}
