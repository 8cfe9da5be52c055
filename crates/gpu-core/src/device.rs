//! Devices and device selection.

use crate::error::{GpuError, Result};
use crate::probe;
use std::fmt;
use std::str::FromStr;

/// Environment variable that overrides [`Device::auto`]: `cpu`, `cuda`, `cuda:N` or `auto`.
pub const DEVICE_ENV: &str = "HYBRID_DEVICE";

/// Where a buffer lives and where an op runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Device {
    /// The host CPU: always present, and the reference for every op.
    Cpu,
    /// The CUDA device with this ordinal.
    Cuda(usize),
}

impl Device {
    /// Picks a device: the [`DEVICE_ENV`] override when set, else CUDA device 0 when a usable
    /// GPU is present, else the CPU.
    ///
    /// An override that names a CUDA device that does not exist is an error, not a silent
    /// fallback: whoever set it asked for that GPU.
    pub fn auto() -> Result<Device> {
        match std::env::var(DEVICE_ENV) {
            Ok(v) if !v.trim().is_empty() && v.trim() != "auto" => {
                let dev: Device = v.parse()?;
                dev.check_present()?;
                Ok(dev)
            }
            _ => Ok(Self::detect()),
        }
    }

    /// CUDA device 0 when present, else the CPU; ignores the environment.
    pub fn detect() -> Device {
        if probe::cuda_is_available() {
            Device::Cuda(0)
        } else {
            Device::Cpu
        }
    }

    /// Errors when this is a CUDA device that the machine does not have.
    pub fn check_present(self) -> Result<()> {
        match self {
            Device::Cpu => Ok(()),
            Device::Cuda(ordinal) => {
                let count = probe::cuda_device_count()?;
                if ordinal < count {
                    Ok(())
                } else {
                    Err(GpuError::InvalidOrdinal { ordinal, count })
                }
            }
        }
    }

    /// True for CUDA devices.
    pub fn is_cuda(self) -> bool {
        matches!(self, Device::Cuda(_))
    }
}

/// Prints which device was chosen and why (the override, or detection).
pub fn describe_choice(device: Device) {
    match std::env::var(DEVICE_ENV) {
        Ok(v) if !v.trim().is_empty() => println!("device {device} ({DEVICE_ENV}={v})"),
        _ => match (device, probe::cuda_device_count()) {
            (Device::Cpu, Err(e)) => println!("device cpu ({e})"),
            (Device::Cpu, Ok(0)) => println!("device cpu (the CUDA driver reports no GPU)"),
            (d, _) => println!("device {d}"),
        },
    }
}

impl FromStr for Device {
    type Err = GpuError;

    /// Parses `cpu`, `cuda` (ordinal 0), `cuda:N` or `gpu`/`gpu:N`, case-insensitively.
    fn from_str(s: &str) -> Result<Self> {
        let t = s.trim().to_ascii_lowercase();
        let bad = || GpuError::InvalidDevice(s.to_string());
        match t.as_str() {
            "cpu" => Ok(Device::Cpu),
            "cuda" | "gpu" => Ok(Device::Cuda(0)),
            _ => {
                let rest = t
                    .strip_prefix("cuda:")
                    .or_else(|| t.strip_prefix("gpu:"))
                    .ok_or_else(bad)?;
                rest.parse::<usize>().map(Device::Cuda).map_err(|_| bad())
            }
        }
    }
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Device::Cpu => f.write_str("cpu"),
            Device::Cuda(i) => write!(f, "cuda:{i}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_round_trip() {
        for s in ["cpu", "cuda:0", "cuda:3"] {
            assert_eq!(s.parse::<Device>().unwrap().to_string(), s);
        }
        assert_eq!("CUDA".parse::<Device>().unwrap(), Device::Cuda(0));
        assert_eq!("gpu:1".parse::<Device>().unwrap(), Device::Cuda(1));
        for bad in ["", "tpu", "cuda:", "cuda:-1", "cuda:x", "cuda0"] {
            assert!(matches!(
                bad.parse::<Device>(),
                Err(GpuError::InvalidDevice(_))
            ));
        }
    }

    #[test]
    fn absent_ordinal_is_an_error() {
        let err = Device::Cuda(10_000).check_present().unwrap_err();
        assert!(matches!(
            err,
            GpuError::InvalidOrdinal {
                ordinal: 10_000,
                ..
            } | GpuError::CudaUnavailable(_)
        ));
        assert!(Device::Cpu.check_present().is_ok());
    }
}
