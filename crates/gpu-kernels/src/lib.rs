//! `gpu-kernels`: the CUDA kernels of hybrid-trainer, compiled ahead of time.
//! `cargo xtask build-ptx` turns `kernels/*.cu` into PTX (compute_80, ISA <= 9.0) and fatbins
//! (sm_80 + sm_90 + PTX); both are committed and embedded here, so building needs no CUDA toolkit.

/// One entry of `generated.rs`: the module's name (which names its PTX and fatbin files in
/// `kernels/`), the sha256 of its source, PTX and fatbin, and its kernels.
macro_rules! module {
    ($name:literal, $source:literal, $ptx:literal, $fatbin:literal, [$($kernel:literal),*]) => {
        KernelModule {
            name: $name,
            ptx: include_str!(concat!("../kernels/", $name, ".ptx")),
            fatbin: include_bytes!(concat!("../kernels/", $name, ".fatbin")),
            source_sha256: $source,
            ptx_sha256: $ptx,
            fatbin_sha256: $fatbin,
            kernels: &[$($kernel),*],
        }
    };
}

#[rustfmt::skip]
mod generated;

pub use generated::MODULES;

/// One compiled `.cu` file.
#[derive(Debug, Clone, Copy)]
pub struct KernelModule {
    /// The source's file stem (`nn_rows` for `kernels/nn_rows.cu`).
    pub name: &'static str,
    /// PTX for compute_80, JIT-compiled by the driver for the GPU at hand.
    pub ptx: &'static str,
    /// Fatbin with sm_80 and sm_90 machine code and the compute_80 PTX.
    pub fatbin: &'static [u8],
    /// sha256 of the source and its headers at build time.
    pub source_sha256: &'static str,
    /// sha256 of `ptx` at build time.
    pub ptx_sha256: &'static str,
    /// sha256 of `fatbin` at build time.
    pub fatbin_sha256: &'static str,
    /// The `extern "C" __global__` entry points, sorted.
    pub kernels: &'static [&'static str],
}

/// sha256 of `bytes` in lowercase hex.
pub fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

impl KernelModule {
    /// Checks the embedded images against the hashes recorded when they were built, so a
    /// corrupted binary is reported instead of being handed to the driver (which trusts it).
    pub fn verify(&self) -> Result<(), String> {
        if sha256_hex(self.ptx.as_bytes()) != self.ptx_sha256 {
            return Err(format!(
                "{}.ptx does not match its recorded sha256",
                self.name
            ));
        }
        if sha256_hex(self.fatbin) != self.fatbin_sha256 {
            return Err(format!(
                "{}.fatbin does not match its recorded sha256",
                self.name
            ));
        }
        Ok(())
    }

    /// True when this module defines `kernel`.
    pub fn has_kernel(&self, kernel: &str) -> bool {
        self.kernels.binary_search(&kernel).is_ok()
    }
}

/// The module of that name.
pub fn module(name: &str) -> Option<&'static KernelModule> {
    MODULES.iter().find(|m| m.name == name)
}

/// The module that defines `kernel`.
pub fn module_of(kernel: &str) -> Option<&'static KernelModule> {
    MODULES.iter().find(|m| m.has_kernel(kernel))
}

/// Every kernel name with its module name.
pub fn all_kernels() -> impl Iterator<Item = (&'static str, &'static str)> {
    MODULES
        .iter()
        .flat_map(|m| m.kernels.iter().map(move |k| (m.name, *k)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn embedded_modules_are_well_formed() {
        assert!(!MODULES.is_empty());
        for m in MODULES {
            assert!(m.ptx.contains(".version "), "{} has no PTX header", m.name);
            assert!(
                m.ptx.contains(".target sm_80"),
                "{} PTX is not compute_80",
                m.name
            );
            assert!(!m.fatbin.is_empty());
            // Fatbin files start with the fatbin magic 0xBA55ED50 (little endian).
            assert_eq!(
                &m.fatbin[..4],
                &[0x50, 0xed, 0x55, 0xba],
                "{} fatbin magic",
                m.name
            );
            assert!(m.kernels.windows(2).all(|w| w[0] < w[1]), "kernels sorted");
            for k in m.kernels {
                assert!(m.ptx.contains(&format!(".entry {k}(")), "{k} not in PTX");
            }
        }
        for k in [
            "binary_same_add_f32",
            "act_fwd_relu_f32",
            "act_bwd_tanh_f32",
        ] {
            assert_eq!(module_of(k).map(|m| m.name), Some("nn_elementwise"));
        }
        assert_eq!(module_of("softmax_fwd_f32").unwrap().name, "nn_rows");
        assert_eq!(module_of("layernorm_fwd_f32").unwrap().name, "nn_rows");
        assert!(module_of("no_such_kernel").is_none());
        assert!(module("nn_rows").is_some());
        assert!(all_kernels().count() >= 8);
    }

    #[test]
    fn verify_catches_corrupted_images() {
        for m in MODULES {
            m.verify().unwrap();
        }
        let m = module("nn_elementwise").unwrap();
        let mut flipped = m.fatbin.to_vec();
        let mid = flipped.len() / 2;
        flipped[mid] ^= 0x01;
        let flipped: &'static [u8] = Box::leak(flipped.into_boxed_slice());
        let bad = KernelModule {
            fatbin: flipped,
            ..*m
        };
        assert!(bad.verify().unwrap_err().contains("fatbin"));
        let bad = KernelModule {
            ptx: "garbage",
            ..*m
        };
        assert!(bad.verify().unwrap_err().contains("ptx"));
    }
}
