//! Adapter discovery: once per process, bounded in time, never a panic.

use crate::error::WgpuError;
use gpu_core::probe::AdapterSummary;
use std::sync::mpsc;
use std::sync::OnceLock;
use std::time::Duration;

/// How long adapter enumeration may take before it counts as "no adapter" (a broken driver can
/// block in its initialisation).
const ENUMERATE_TIMEOUT: Duration = Duration::from_secs(30);

pub(crate) struct Discovered {
    pub _instance: wgpu::Instance,
    pub adapters: Vec<wgpu::Adapter>,
}

/// The instance and its adapters, enumerated once; the failure is kept and reported once (to
/// stderr) the first time it is found.
pub(crate) fn discovered() -> Result<&'static Discovered, WgpuError> {
    static FOUND: OnceLock<Result<Discovered, String>> = OnceLock::new();
    FOUND
        .get_or_init(|| {
            let r = enumerate();
            if let Err(e) = &r {
                eprintln!("wgpu: no adapter ({e})");
            }
            r
        })
        .as_ref()
        .map_err(|e| WgpuError::NoAdapter(e.clone()))
}

fn enumerate() -> Result<Discovered, String> {
    let (tx, rx) = mpsc::channel();
    // On a thread, so a driver that blocks cannot hang the caller (the thread is abandoned).
    std::thread::Builder::new()
        .name("wgpu-enumerate".into())
        .spawn(move || {
            let r = std::panic::catch_unwind(|| {
                let desc = wgpu::InstanceDescriptor {
                    backends: wgpu::Backends::VULKAN | wgpu::Backends::METAL | wgpu::Backends::DX12,
                    ..wgpu::InstanceDescriptor::new_without_display_handle()
                };
                let instance = wgpu::Instance::new(desc);
                let adapters =
                    pollster::block_on(instance.enumerate_adapters(wgpu::Backends::all()));
                Discovered {
                    _instance: instance,
                    adapters,
                }
            });
            let _ = tx.send(r.map_err(|_| "adapter enumeration panicked".to_string()));
        })
        .map_err(|e| format!("spawning the enumeration thread failed: {e}"))?;
    let found = rx
        .recv_timeout(ENUMERATE_TIMEOUT)
        .map_err(|_| format!("adapter enumeration did not finish in {ENUMERATE_TIMEOUT:?}"))??;
    if found.adapters.is_empty() {
        return Err(
            "no Vulkan, Metal or DX12 adapter found (is a driver such as Mesa's \
                    lavapipe, mesa-vulkan-drivers, installed?)"
                .into(),
        );
    }
    Ok(found)
}

/// The adapters present, as `gpu_core` summarises them (index `n` is `Device::Wgpu(n)`).
pub fn adapters() -> Result<Vec<AdapterSummary>, WgpuError> {
    Ok(discovered()?
        .adapters
        .iter()
        .map(|a| summarize(&a.get_info()))
        .collect())
}

pub(crate) fn summarize(info: &wgpu::AdapterInfo) -> AdapterSummary {
    AdapterSummary {
        name: info.name.clone(),
        driver: format!("{:?}, {} {}", info.backend, info.driver, info.driver_info)
            .trim()
            .to_string(),
        software: info.device_type == wgpu::DeviceType::Cpu,
    }
}

/// Registers [`adapters`] as `gpu_core`'s wgpu probe, so `Device::auto` and
/// `Device::check_present` see wgpu adapters. Returns false when a probe was registered before.
///
/// Call it from a program whose work runs on wgpu (`tensor_ops::register_wgpu_probe` re-exports
/// it; `hybrid-trainer` calls it when `--device` or `HYBRID_DEVICE` names a wgpu device, so
/// `Device::auto` does not pick a device that a command such as the world model's would refuse).
pub fn register_device_probe() -> bool {
    gpu_core::probe::register_wgpu_probe(|| adapters().map_err(|e| e.to_string()))
}
