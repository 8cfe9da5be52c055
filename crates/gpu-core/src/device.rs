//! Devices and device selection.

use crate::error::{GpuError, Result};
use crate::probe;
use std::fmt;
use std::str::FromStr;

/// Environment variable that overrides [`Device::auto`]: `cpu`, `cuda`, `cuda:N`, `wgpu`,
/// `wgpu:N` or `auto`.
pub const DEVICE_ENV: &str = "HYBRID_DEVICE";

/// Where a buffer lives and where an op runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Device {
    /// The host CPU: always present, and the reference for every op.
    Cpu,
    /// The CUDA device with this ordinal.
    Cuda(usize),
    /// The wgpu adapter with this index (Vulkan, Metal or DX12), in the order the registered
    /// probe ([`probe::register_wgpu_probe`]) lists them.
    Wgpu(usize),
}

impl Device {
    /// Picks a device: the [`DEVICE_ENV`] override when set, else CUDA device 0 when a usable
    /// GPU is present, else the first hardware wgpu adapter when a wgpu probe is registered
    /// (software rasterisers such as lavapipe are never picked: the CPU backend is faster),
    /// else the CPU.
    ///
    /// An override that names a CUDA or wgpu device that does not exist is an error, not a
    /// silent fallback: whoever set it asked for that GPU.
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

    /// CUDA device 0 when present, else the first hardware wgpu adapter (when a wgpu probe is
    /// registered), else the CPU; ignores the environment.
    pub fn detect() -> Device {
        if probe::cuda_is_available() {
            return Device::Cuda(0);
        }
        let adapters = if probe::wgpu_probe_registered() {
            probe::wgpu_adapters().ok()
        } else {
            None
        };
        Self::choose(false, adapters.as_deref())
    }

    /// The choice [`Device::detect`] makes from what it found: CUDA, else the first adapter that
    /// is not a software rasteriser, else the CPU.
    pub fn choose(cuda: bool, wgpu: Option<&[probe::AdapterSummary]>) -> Device {
        if cuda {
            return Device::Cuda(0);
        }
        wgpu.and_then(|a| a.iter().position(|a| !a.software))
            .map_or(Device::Cpu, Device::Wgpu)
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
            Device::Wgpu(index) => {
                let adapters = probe::wgpu_adapters()?;
                if index < adapters.len() {
                    Ok(())
                } else {
                    Err(GpuError::WgpuUnavailable(format!(
                        "adapter {index} does not exist ({} adapter(s) present)",
                        adapters.len()
                    )))
                }
            }
        }
    }

    /// True for CUDA devices.
    pub fn is_cuda(self) -> bool {
        matches!(self, Device::Cuda(_))
    }

    /// True for wgpu devices.
    pub fn is_wgpu(self) -> bool {
        matches!(self, Device::Wgpu(_))
    }

    /// The backend's short name: `cpu`, `cuda` or `wgpu`.
    pub const fn backend_name(self) -> &'static str {
        match self {
            Device::Cpu => "cpu",
            Device::Cuda(_) => "cuda",
            Device::Wgpu(_) => "wgpu",
        }
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

    /// Parses `cpu`, `cuda` (ordinal 0), `cuda:N`, `gpu`/`gpu:N` (CUDA), `wgpu` (adapter 0) or
    /// `wgpu:N`, case-insensitively.
    fn from_str(s: &str) -> Result<Self> {
        let t = s.trim().to_ascii_lowercase();
        let bad = || GpuError::InvalidDevice(s.to_string());
        match t.as_str() {
            "cpu" => Ok(Device::Cpu),
            "cuda" | "gpu" => Ok(Device::Cuda(0)),
            "wgpu" => Ok(Device::Wgpu(0)),
            _ if t.starts_with("wgpu:") => t["wgpu:".len()..]
                .parse::<usize>()
                .map(Device::Wgpu)
                .map_err(|_| bad()),
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
            Device::Wgpu(i) => write!(f, "wgpu:{i}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_round_trip() {
        for s in ["cpu", "cuda:0", "cuda:3", "wgpu:0", "wgpu:2"] {
            assert_eq!(s.parse::<Device>().unwrap().to_string(), s);
        }
        assert_eq!("CUDA".parse::<Device>().unwrap(), Device::Cuda(0));
        assert_eq!("gpu:1".parse::<Device>().unwrap(), Device::Cuda(1));
        assert_eq!("WGPU".parse::<Device>().unwrap(), Device::Wgpu(0));
        assert_eq!(" wgpu:1 ".parse::<Device>().unwrap(), Device::Wgpu(1));
        for bad in [
            "", "tpu", "cuda:", "cuda:-1", "cuda:x", "cuda0", "wgpu:", "wgpu:x", "wgpu0", "wgpu:-1",
        ] {
            assert!(matches!(
                bad.parse::<Device>(),
                Err(GpuError::InvalidDevice(_))
            ));
        }
    }

    #[test]
    fn auto_order_is_cuda_then_hardware_wgpu_then_cpu() {
        let a = |name: &str, software| probe::AdapterSummary {
            name: name.into(),
            driver: "test".into(),
            software,
        };
        let lavapipe = [a("llvmpipe", true)];
        let both = [a("llvmpipe", true), a("radv", false)];
        assert_eq!(Device::choose(true, Some(&both)), Device::Cuda(0));
        assert_eq!(Device::choose(false, Some(&both)), Device::Wgpu(1));
        assert_eq!(Device::choose(false, Some(&lavapipe)), Device::Cpu);
        assert_eq!(Device::choose(false, None), Device::Cpu);
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
        // No wgpu probe is registered in gpu-core's own tests: a typed error, no panic.
        assert!(matches!(
            Device::Wgpu(0).check_present(),
            Err(GpuError::WgpuUnavailable(_))
        ));
    }
}
