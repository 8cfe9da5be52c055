//! `gpu-core`: the hardware-abstraction layer of hybrid-trainer.
//! Devices and device selection, dtypes, shapes, the one error enum, the [`Backend`] and the
//! op-family traits ([`nn`], [`MatmulOps`]), and the CPU backend that is always present and is the reference.

pub mod backend;
pub mod cpu;
pub mod device;
pub mod dtype;
pub mod error;
pub mod nn;
pub mod ops;
pub mod probe;
pub mod shape;

pub use backend::{Backend, BufferInfo, DeviceType};
pub use cpu::{CpuBackend, CpuStorage};
pub use device::{Device, DEVICE_ENV};
pub use dtype::{DType, Element};
pub use error::{GpuError, Result};
pub use ops::{MatmulOps, MatmulSpec};
pub use shape::Shape;
