//! `gpu-core`: the hardware-abstraction layer of hybrid-trainer.
//! Devices and device selection, dtypes, shapes, the one error enum, the [`Backend`] and the
//! op-family traits ([`nn`], [`MatmulOps`]), and the CPU backend that is always present and is the reference.
//!
//! A backend joins op by op: it implements [`Backend`] (buffers, host copies), [`MatmulOps`]
//! and [`nn::Primitives`] (fill, cast, block copy, permute, broadcast binary ops, the
//! activation map and its derivative, axis reductions, row argmax, row gather and
//! scatter-add, dropout); every method of the op families in [`nn`] has a default body built
//! from those (`nn/defaults`), which a backend overrides where it is faster (the CPU and CUDA
//! backends override all of them). [`testing::PrimitivesOnly`] is such a backend with nothing
//! but the primitives.

pub mod backend;
pub mod cpu;
pub mod device;
pub mod dtype;
pub mod error;
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
