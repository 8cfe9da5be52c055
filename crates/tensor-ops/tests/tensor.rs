//! Tensor semantics: devices, errors, transfers, optimiser, checkpoints, a tiny GPT training run.

use tensor_ops::gpt::{Dataset, Gpt, GptConfig, Variant};
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

fn corpus() -> String {
    let path = std::env::var("TINYSHAKESPEARE")
        .unwrap_or_else(|_| "../../../shared/data/tinyshakespeare.txt".into());
    std::fs::read_to_string(&path).unwrap_or_else(|_| {
        // A fallback corpus so the test runs anywhere: repetitive text a model can learn.
        "the quick brown fox jumps over the lazy dog. ".repeat(400)
    })
}

#[test]
fn tiny_gpt_learns_on_the_cpu_and_checkpoints_round_trip() {
    let text = corpus();
    let text = &text[..text.len().min(200_000)];
    let ds = Dataset::from_text(text, 0.9).unwrap();
    for variant in [Variant::Gpt2, Variant::Llama] {
        let cfg = GptConfig {
            variant,
            vocab_size: ds.tokenizer.vocab_size(),
            block_size: 16,
            n_layer: 2,
            n_head: 2,
            n_embd: 32,
            dropout: 0.0,
            bias: true,
        };
        let model = Gpt::new(cfg, 7, Device::Cpu).unwrap();
        let params = model
            .parameters()
            .into_iter()
            .map(|(_, t, d)| (t, d))
            .collect();
        let mut opt = AdamW::new(
            params,
            AdamWParams {
                max_grad_norm: Some(1.0),
                ..Default::default()
            },
        )
        .unwrap();
        let mut rng = Dataset::rng(3);
        let mut first = None;
        let mut last = 0.0;
        for _ in 0..60 {
            let (x, y) = ds.batch(false, 8, 16, &mut rng, Device::Cpu).unwrap();
            let loss = model.loss(&x, &y, None).unwrap();
            last = loss.item().unwrap();
            first.get_or_insert(last);
            let g = loss.backward().unwrap();
            opt.step(&g, 3e-3).unwrap();
        }
        let first = first.unwrap();
        assert!(last < first - 0.5, "{variant:?}: loss {first} -> {last}");
        let path = std::env::temp_dir().join(format!(
            "gpt-{variant:?}-{}.safetensors",
            std::process::id()
        ));
        model.save(&path).unwrap();
        let back = Gpt::load(&path, Device::Cpu).unwrap();
        for ((n1, a, _), (n2, b, _)) in model.parameters().iter().zip(back.parameters()) {
            assert_eq!(n1, &n2);
            assert_eq!(a.to_vec().unwrap(), b.to_vec().unwrap(), "{n1}");
        }
        let out = back.generate(&[1, 2, 3], 5, 1.0, Some(5), 1).unwrap();
        assert_eq!(out.len(), 8);
        std::fs::remove_file(path).ok();
    }
}
