//! The CUDA runtime around the kernels: device errors, the memory pool, both launchers, NVRTC
//! user kernels, module images, cuBLAS modes and timing. Tests named `gpu_*` need a GPU and skip
//! with a printed reason without one; the others run everywhere.

mod common;

use common::*;
use gpu_core::nn::{Activation, BinaryKind, Primitives, RowOps};
use gpu_core::{Backend, BufferInfo, DType, GpuError, MatmulOps, MatmulSpec};
use gpu_cuda::testing::backend_or_skip;
use gpu_cuda::{CudaBackend, GpuTimer, ImageKind, KernelArg, LaunchConfig, LaunchPath};
use half::{bf16, f16};

#[test]
fn opening_a_device_never_panics() {
    match CudaBackend::new(0) {
        Ok(b) => println!("CUDA device 0: {:?}", b.info()),
        Err(e) => assert!(
            matches!(e, GpuError::CudaUnavailable(_)),
            "unexpected error {e}"
        ),
    }
    let e = CudaBackend::new(4096).unwrap_err();
    assert!(matches!(
        e,
        GpuError::InvalidOrdinal { ordinal: 4096, .. } | GpuError::CudaUnavailable(_)
    ));
}

#[test]
fn gpu_device_info_and_memory_round_trip() {
    let gpu = skip_unless!(backend_or_skip("gpu_device_info_and_memory_round_trip"));
    let info = gpu.info();
    assert!(info.multiprocessors > 0 && info.total_memory > 0 && info.compute_capability.0 >= 7);
    assert!(gpu.memory_available().unwrap() > 0);
    let (mut rng, _) = rng("round trip");
    for &n in SIZES {
        let x = random_vec(&mut rng, n, 100.0);
        assert_eq!(gpu.download::<f32>(&gpu.upload(&x).unwrap()).unwrap(), x);
        let h: Vec<f16> = x.iter().map(|&v| f16::from_f32(v)).collect();
        assert_eq!(gpu.download::<f16>(&gpu.upload(&h).unwrap()).unwrap(), h);
        let b: Vec<bf16> = x.iter().map(|&v| bf16::from_f32(v)).collect();
        assert_eq!(gpu.download::<bf16>(&gpu.upload(&b).unwrap()).unwrap(), b);
    }
    let mut buf = gpu.allocate(DType::F32, 8).unwrap();
    assert!(matches!(
        gpu.copy_to_device(&[1.0f32; 7], &mut buf),
        Err(GpuError::ShapeMismatch { .. })
    ));
    assert!(matches!(
        gpu.copy_to_device(&[f16::ONE; 8], &mut buf),
        Err(GpuError::DTypeMismatch { .. })
    ));
}

#[test]
fn gpu_out_of_memory_is_a_typed_error() {
    let gpu = skip_unless!(backend_or_skip("gpu_out_of_memory_is_a_typed_error"));
    // 64 TiB: more than any GPU has.
    match gpu.allocate(DType::F32, 1 << 44) {
        Err(GpuError::OutOfMemory { requested, free }) => {
            assert_eq!(requested, 1 << 46);
            assert!(free > 0);
        }
        other => panic!("expected OutOfMemory, got {other:?}"),
    }
    // The backend still works afterwards.
    let x = gpu.upload(&[1.0f32, 2.0]).unwrap();
    assert_eq!(gpu.download::<f32>(&x).unwrap(), vec![1.0, 2.0]);
}

#[test]
fn gpu_memory_pool_reuses_blocks_and_counts() {
    let gpu = skip_unless!(backend_or_skip("gpu_memory_pool_reuses_blocks_and_counts"));
    let before = gpu.pool_stats();
    let a = gpu.allocate(DType::F32, 1000).unwrap();
    let s1 = gpu.pool_stats();
    assert_eq!(s1.misses, before.misses + 1);
    assert_eq!(s1.live_buffers, before.live_buffers + 1);
    assert!(s1.bytes_in_use >= before.bytes_in_use + 4000);
    let ptr = a.device_ptr();
    drop(a);
    let s2 = gpu.pool_stats();
    assert_eq!(s2.bytes_in_use, before.bytes_in_use);
    assert!(s2.bytes_cached >= 4000);
    let b = gpu.allocate(DType::F32, 1000).unwrap();
    let s3 = gpu.pool_stats();
    assert_eq!(
        s3.hits,
        s2.hits + 1,
        "same size class must come from the cache"
    );
    assert_eq!(b.device_ptr(), ptr);
    assert!(s3.peak_bytes_in_use >= s3.bytes_in_use);
    assert_eq!(b.device_ptr() % 256, 0, "pool blocks are 256-byte aligned");
    drop(b);
    gpu.empty_cache().unwrap();
    assert_eq!(gpu.pool_stats().bytes_cached, 0);
    let empty = gpu.allocate(DType::F32, 0).unwrap();
    assert!(empty.is_empty());
}

#[test]
fn gpu_launchers_and_images_agree_bitwise() {
    let gpu = skip_unless!(backend_or_skip("gpu_launchers_and_images_agree_bitwise"));
    let (mut rng, _) = rng("launchers");
    let x = random_vec(&mut rng, (1 << 16) + 5, 6.0);
    let xs = up(&gpu, &x);
    let mut results = Vec::new();
    for image in [ImageKind::Fatbin, ImageKind::Ptx] {
        for path in [LaunchPath::Cudarc, LaunchPath::RawDriver] {
            gpu.set_image_kind(image);
            gpu.set_launch_path(path);
            let mut o = poisoned(&gpu, x.len());
            gpu.activation_fwd(Activation::Tanh, &xs, &mut o).unwrap();
            let mut s = poisoned(&gpu, x.len());
            gpu.softmax_fwd(&xs, &mut s, x.len()).unwrap();
            results.push(((image, path), down(&gpu, &o), down(&gpu, &s)));
        }
    }
    // Same image: the launcher cannot change a bit.
    for pair in results.chunks(2) {
        assert_eq!(pair[0].1, pair[1].1, "{:?} vs {:?}", pair[0].0, pair[1].0);
        assert_eq!(pair[0].2, pair[1].2, "{:?} vs {:?}", pair[0].0, pair[1].0);
    }
    assert!(gpu.modules_loaded() >= 4);
    gpu.set_image_kind(ImageKind::Fatbin);
    gpu.set_launch_path(LaunchPath::Cudarc);
}

#[test]
fn gpu_every_embedded_kernel_loads_on_both_launchers() {
    let gpu = skip_unless!(backend_or_skip(
        "gpu_every_embedded_kernel_loads_on_both_launchers"
    ));
    // A launch with an impossible grid is refused before the driver, after the kernel resolves;
    // an unknown name is refused with its own error. Both launchers, both images.
    let bad = LaunchConfig {
        grid_dim: (0, 1, 1),
        block_dim: (1, 1, 1),
        shared_mem_bytes: 0,
    };
    for path in [LaunchPath::Cudarc, LaunchPath::RawDriver] {
        gpu.set_launch_path(path);
        for (_, kernel) in gpu_kernels::all_kernels() {
            // SAFETY: the config is rejected before any launch happens.
            let e = unsafe { gpu.launch(kernel, bad, &[]) }.unwrap_err();
            assert!(
                matches!(e, GpuError::InvalidArgument { .. }),
                "{kernel}: {e}"
            );
        }
        let ok = LaunchConfig::for_num_elems(1);
        // SAFETY: the kernel name is unknown, so nothing is launched.
        let e = unsafe { gpu.launch("no_such_kernel_f32", ok, &[]) }.unwrap_err();
        assert!(matches!(e, GpuError::UnknownKernel(_)), "{e}");
    }
    gpu.set_launch_path(LaunchPath::Cudarc);
}

const SEED_B_VECTOR_ADD: &str = r#"
extern "C" __global__ void vector_add(const float* a, const float* b, float* c, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) c[i] = a[i] + b[i];
}
"#;

#[test]
fn gpu_nvrtc_compiles_and_runs_user_kernels() {
    let gpu = skip_unless!(backend_or_skip("gpu_nvrtc_compiles_and_runs_user_kernels"));
    let k = gpu.compile_kernel("vector_add", SEED_B_VECTOR_ADD).unwrap();
    assert!(k.ptx().contains(".entry vector_add"));
    let (mut rng, _) = rng("nvrtc");
    for n in [1usize, 1000, 1 << 20] {
        let (a, b) = (random_vec(&mut rng, n, 1.0), random_vec(&mut rng, n, 1.0));
        let (da, db) = (up(&gpu, &a), up(&gpu, &b));
        let mut dc = poisoned(&gpu, n);
        let args = [
            KernelArg::from(&da),
            KernelArg::from(&db),
            KernelArg::from(&mut dc),
            KernelArg::I32(n as i32),
        ];
        // SAFETY: vector_add(const float*, const float*, float*, int n), buffers of n floats.
        unsafe { gpu.run_kernel(&k, LaunchConfig::for_num_elems(n as u32), &args) }.unwrap();
        let want: Vec<f32> = a.iter().zip(&b).map(|(x, y)| x + y).collect();
        assert_eq!(down(&gpu, &dc), want, "n={n}");
    }
    // The same PTX through the raw driver path.
    let raw = gpu
        .load_kernel_image(k.ptx().as_bytes(), "vector_add")
        .unwrap();
    let (da, db) = (up(&gpu, &[1.0, 2.0]), up(&gpu, &[3.0, 4.0]));
    let mut dc = poisoned(&gpu, 2);
    let args = [
        KernelArg::from(&da),
        KernelArg::from(&db),
        KernelArg::from(&mut dc),
        KernelArg::I32(2),
    ];
    // SAFETY: as above, buffers of 2 floats.
    unsafe { gpu.run_kernel(&raw, LaunchConfig::for_num_elems(2), &args) }.unwrap();
    assert_eq!(down(&gpu, &dc), vec![4.0, 6.0]);

    match gpu.compile_kernel(
        "broken",
        "extern \"C\" __global__ void broken() { this is not C; }",
    ) {
        Err(GpuError::Compile { name, log }) => {
            assert!(name == "broken" && log.contains("error"), "{log}")
        }
        other => panic!("expected a compile error, got {other:?}"),
    }
    assert!(matches!(
        gpu.compile_kernel("missing", SEED_B_VECTOR_ADD),
        Err(GpuError::UnknownKernel(_))
    ));
}

#[test]
fn gpu_corrupt_module_images_are_typed_errors() {
    let gpu = skip_unless!(backend_or_skip(
        "gpu_corrupt_module_images_are_typed_errors"
    ));
    // Bit flips inside a well-framed fatbin are not caught here: the driver trusts the payload
    // (embedded kernels are protected by their sha256 instead, see gpu_kernels::KernelModule).
    let real = gpu_kernels::module("nn_elementwise").unwrap();
    let garbage_ptx = ".version 9.0\n.target sm_80\n.address_size 64\n.visible .entry f( { garbage";
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("empty", vec![]),
        (
            "random bytes",
            (0..4096u32)
                .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
                .collect(),
        ),
        (
            "truncated fatbin",
            real.fatbin[..real.fatbin.len() / 3].to_vec(),
        ),
        ("bad PTX", garbage_ptx.as_bytes().to_vec()),
    ];
    for (what, image) in cases {
        match gpu.load_kernel_image(&image, "add_f32") {
            Err(GpuError::InvalidKernelImage { .. }) | Err(GpuError::UnknownKernel(_)) => {}
            other => panic!("{what}: expected InvalidKernelImage, got {other:?}"),
        }
    }
    // The backend is still usable.
    let k = gpu
        .load_kernel_image(real.fatbin, "act_fwd_relu_f32")
        .unwrap();
    assert_eq!(k.name(), "act_fwd_relu_f32");
    let x = up(&gpu, &[2.0, -3.0]);
    let mut o = poisoned(&gpu, 2);
    gpu.activation_fwd(Activation::Relu, &x, &mut o).unwrap();
    assert_eq!(down(&gpu, &o), vec![2.0, 0.0]);
}

#[test]
fn gpu_matmul_1024_fp32_and_tf32() {
    let gpu = skip_unless!(backend_or_skip("gpu_matmul_1024_fp32_and_tf32"));
    let (mut rng, _) = rng("matmul 1024");
    let n = 1024;
    let (a, b) = (
        random_vec(&mut rng, n * n, 1.0),
        random_vec(&mut rng, n * n, 1.0),
    );
    let s = MatmulSpec::new(n, n, n);
    let mut want = CPU.allocate(DType::F32, n * n).unwrap();
    CPU.matmul(s, &up(&CPU, &a), &up(&CPU, &b), &mut want)
        .unwrap();
    let want = down(&CPU, &want);
    let (da, db) = (up(&gpu, &a), up(&gpu, &b));
    for (tf32, rtol) in [(false, 1e-5), (true, 5e-3)] {
        gpu.set_tf32(tf32);
        let mut c = poisoned(&gpu, n * n);
        gpu.matmul(s, &da, &db, &mut c).unwrap();
        // TF32 keeps 10 mantissa bits: its bound is norm-wise 5e-3 (typically ~3e-4).
        assert_close(
            &format!("tf32={tf32}"),
            &down(&gpu, &c),
            &want,
            rtol,
            if tf32 { 0.1 } else { 1e-3 },
        );
    }
    gpu.set_tf32(false);
}

#[test]
fn gpu_shape_errors_match_the_cpu() {
    let gpu = skip_unless!(backend_or_skip("gpu_shape_errors_match_the_cpu"));
    let (a, b) = (up(&gpu, &[1.0; 6]), up(&gpu, &[1.0; 5]));
    let mut o = poisoned(&gpu, 6);
    assert!(matches!(
        gpu.broadcast_binary(BinaryKind::Add, &a, &[6], &b, &[6], &mut o),
        Err(GpuError::ShapeMismatch { .. })
    ));
    assert!(matches!(
        gpu.softmax_fwd(&a, &mut o, 4),
        Err(GpuError::ShapeMismatch { .. })
    ));
    assert!(matches!(
        gpu.softmax_fwd(&a, &mut o, 0),
        Err(GpuError::InvalidShape { .. })
    ));
    let g = up(&gpu, &[1.0; 3]);
    let (mut mean, mut rstd) = (poisoned(&gpu, 2), poisoned(&gpu, 2));
    assert!(gpu
        .layernorm_fwd((&a, &g, &g), (&mut o, &mut mean, &mut rstd), 3, -1.0)
        .is_err());
    assert!(gpu
        .matmul(MatmulSpec::new(2, 3, 2), &a, &a, &mut o)
        .is_err());
    let h = gpu.upload(&[f16::ONE; 6]).unwrap();
    assert!(matches!(
        gpu.activation_fwd(Activation::Relu, &h, &mut o),
        Err(GpuError::UnsupportedDType { .. })
    ));
}

#[test]
fn gpu_events_time_device_work() {
    let gpu = skip_unless!(backend_or_skip("gpu_events_time_device_work"));
    let x = gpu.allocate(DType::F32, 1 << 24).unwrap();
    let mut y = gpu.allocate(DType::F32, 1 << 24).unwrap();
    let timer = GpuTimer::new(&gpu).unwrap();
    let ms = timer
        .time(&gpu, || gpu.activation_fwd(Activation::Relu, &x, &mut y))
        .unwrap();
    assert!(ms > 0.0 && ms < 10_000.0, "{ms} ms");
}

#[test]
fn gpu_buffers_of_another_backend_instance_are_rejected() {
    let a = skip_unless!(backend_or_skip(
        "gpu_buffers_of_another_backend_instance_are_rejected"
    ));
    // A second instance on the same device: its own context handle, stream and pool.
    let b = gpu_cuda::CudaBackend::new(a.info().ordinal).unwrap();
    assert_ne!(a.id(), b.id());
    let x = up(&a, &[1.0, -2.0, 3.0, 4.0]);
    assert_eq!(x.owner(), a.id());
    let mut out_b = b.allocate(DType::F32, 4).unwrap();
    let foreign = |r: gpu_core::Result<()>, what: &str| {
        assert!(
            matches!(r, Err(GpuError::ForeignBuffer { .. })),
            "{what}: {r:?}"
        );
    };
    foreign(
        b.activation_fwd(Activation::Relu, &x, &mut out_b),
        "kernel launch",
    );
    let mut xa = up(&a, &[0.0; 4]);
    foreign(b.fill(&mut xa, 1.0), "fill");
    foreign(b.download::<f32>(&x).map(|_| ()), "download");
    foreign(b.copy_buffer(&x, &mut out_b), "copy");
    let s = MatmulSpec::new(2, 2, 2);
    foreign(b.matmul(s, &x, &x, &mut out_b), "matmul");
    // Nothing was written, and both instances still work.
    assert_eq!(down(&a, &x), vec![1.0, -2.0, 3.0, 4.0]);
    b.activation_fwd(
        Activation::Relu,
        &up(&b, &[-1.0, 2.0, -3.0, 4.0]),
        &mut out_b,
    )
    .unwrap();
    assert_eq!(down(&b, &out_b), vec![0.0, 2.0, 0.0, 4.0]);
}
