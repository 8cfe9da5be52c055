//! Tensor semantics: devices, errors, transfers, the optimiser (the tiny GPT training run is
//! `models`' `gpt.rs`).

use tensor_ops::optim::{AdamW, AdamWParams};
use tensor_ops::{transfer_stats, Device, GpuError, Tensor};

#[test]
fn shapes_and_errors_are_typed() {
    let a = Tensor::from_vec(vec![1.0f32; 6], &[2, 3], Device::Cpu).unwrap();
    assert_eq!(a.strides(), vec![3, 1]);
    assert!(matches!(
        Tensor::from_vec(vec![1.0f32; 5], &[2, 3], Device::Cpu),
        Err(GpuError::ShapeMismatch { .. })
    ));
    let b = Tensor::from_vec(vec![1.0f32; 4], &[4], Device::Cpu).unwrap();
    assert!(a.add(&b).is_err());
    assert!(a.matmul(&a).is_err());
    assert!(a.reshape(&[4, 2]).is_err());
    assert!(a.narrow(1, 2, 2).is_err());
    assert!(a.permute(&[0, 0]).is_err());
    assert!(a.dropout(1.0, 0, true).is_err());
    let ids = Tensor::from_vec(vec![0u32, 1], &[2], Device::Cpu).unwrap();
    assert!(matches!(a.add(&ids), Err(GpuError::DTypeMismatch { .. })));
    assert!(a.backward().is_err(), "a non-scalar loss");
    match Tensor::zeros(&[1], Device::Cuda(999)) {
        Err(GpuError::InvalidOrdinal { .. } | GpuError::CudaUnavailable(_)) => {}
        other => panic!("expected a missing-device error, got {other:?}"),
    }
}

#[test]
fn gpu_mixing_devices_is_an_error_not_a_copy() {
    let Some(gpu) = gpu_cuda::testing::backend_or_skip("gpu_mixing_devices_is_an_error_not_a_copy")
    else {
        return;
    };
    let dev = Device::Cuda(gpu.info().ordinal);
    let a = Tensor::ones(&[3], Device::Cpu).unwrap();
    let b = Tensor::ones(&[3], dev).unwrap();
    let before = transfer_stats();
    assert!(matches!(a.add(&b), Err(GpuError::DeviceMismatch { .. })));
    assert_eq!(transfer_stats(), before, "no silent copy");
    let c = a.to(dev).unwrap().add(&b).unwrap();
    assert_eq!(c.device(), dev);
    assert_eq!(c.to_vec().unwrap(), vec![2.0; 3]);
    let after = transfer_stats();
    assert_eq!(after.host_to_device - before.host_to_device, 1);
    assert_eq!(after.device_to_host - before.device_to_host, 1);
}

#[test]
fn adamw_matches_a_hand_computed_step() {
    let p = Tensor::from_vec(vec![1.0f32, -2.0], &[2], Device::Cpu)
        .unwrap()
        .requires_grad_()
        .unwrap();
    let mut opt = AdamW::new(
        vec![(p.clone(), true)],
        AdamWParams {
            weight_decay: 0.1,
            ..Default::default()
        },
    )
    .unwrap();
    // loss = sum(3·p) → grad 3 everywhere.
    let g = p
        .mul_scalar(3.0)
        .unwrap()
        .sum_all()
        .unwrap()
        .backward()
        .unwrap();
    opt.step(&g, 0.1).unwrap();
    // Step 1: m̂ = g, v̂ = g², update = lr·g/(|g| + eps) = 0.1; decay: p·(1 − 0.1·0.1).
    let got = p.to_vec().unwrap();
    let want = [1.0 * 0.99 - 0.1, -2.0 * 0.99 - 0.1];
    for (a, b) in got.iter().zip(want) {
        assert!((a - b).abs() < 1e-6, "{got:?} vs {want:?}");
    }
}
