//! The captured loss on fixed batches (`GraphedLoss`): a replay gives the eager measurement's
//! bits on both GPT variants in fp32 and bf16, reads the weights as they are at the replay
//! (changed in place between replays), and refuses another model, no batches, batches on
//! another device and the CPU with typed errors. Tests named `gpu_*` skip with a printed reason
//! where no GPU exists.

mod graph_common;

use graph_common::{config, cpu_model, gpu_dataset, gpu_setup};
use models::gpt::{Dataset, Gpt, GraphedLoss, Variant};
use tensor_ops::optim::lerp_tensors;
use tensor_ops::{Device, Precision, Tensor};

fn batches(ds: &Dataset, n: usize, seed: u64, dev: Device) -> Vec<(Tensor, Tensor)> {
    let mut rng = Dataset::rng(seed);
    (0..n)
        .map(|_| ds.batch(false, 3, 16, &mut rng, dev).unwrap())
        .collect()
}

#[test]
fn gpu_graphed_loss_gives_the_eager_bits_and_sees_changed_weights() {
    let test = "gpu_graphed_loss_gives_the_eager_bits_and_sees_changed_weights";
    let Some((dev, seed, ds, vocab)) = gpu_setup(test) else {
        return;
    };
    for variant in [Variant::Gpt2, Variant::Llama] {
        for (precision, width) in [(Precision::Fp32, 32), (Precision::Bf16, 128)] {
            let what = format!("{variant:?} {precision} (seed {seed})");
            let mut model = Gpt::new(config(variant, vocab, width), seed, dev).unwrap();
            model.set_precision(precision).unwrap();
            let b = batches(&ds, 3, seed ^ 7, dev);
            let g = GraphedLoss::capture(&model, &b).unwrap();
            assert_eq!(g.batches(), 3);
            let eager = GraphedLoss::eager(&model, &b).unwrap();
            assert!(eager.is_finite(), "{what}: {eager}");
            assert_eq!(g.loss(&model).unwrap().to_bits(), eager.to_bits(), "{what}");
            // Weights changed in place between replays: the replay sees the new ones.
            let other = Gpt::new(config(variant, vocab, width), seed ^ 99, dev).unwrap();
            let params: Vec<Tensor> = model.parameters().into_iter().map(|p| p.1).collect();
            let ends: Vec<Tensor> = other.parameters().into_iter().map(|p| p.1).collect();
            lerp_tensors(&params, &ends, 0.7).unwrap();
            let moved = GraphedLoss::eager(&model, &b).unwrap();
            assert_ne!(
                moved.to_bits(),
                eager.to_bits(),
                "{what}: the lerp moved nothing"
            );
            assert_eq!(g.loss(&model).unwrap().to_bits(), moved.to_bits(), "{what}");
            // Another model (the same shapes, other storage) is refused and runs nothing.
            let e = g.loss(&other).unwrap_err();
            assert!(e.to_string().contains("not the one captured"), "{e}");
            assert_eq!(g.loss(&model).unwrap().to_bits(), moved.to_bits(), "{what}");
        }
    }
}

#[test]
fn gpu_graphed_loss_refuses_bad_batches() {
    let Some((dev, ds, vocab)) = gpu_dataset("gpu_graphed_loss_refuses_bad_batches") else {
        return;
    };
    let model = Gpt::new(config(Variant::Gpt2, vocab, 32), 1, dev).unwrap();
    let e = GraphedLoss::capture(&model, &[]).unwrap_err();
    assert!(e.to_string().contains("no batches"), "{e}");
    let on_cpu = batches(&ds, 2, 3, Device::Cpu);
    let e = GraphedLoss::capture(&model, &on_cpu).unwrap_err();
    assert!(e.to_string().contains("cpu"), "{e}");
    // The model still measures after the refusals.
    let b = batches(&ds, 2, 3, dev);
    let g = GraphedLoss::capture(&model, &b).unwrap();
    assert_eq!(
        g.loss(&model).unwrap().to_bits(),
        GraphedLoss::eager(&model, &b).unwrap().to_bits()
    );
}

#[test]
fn graphed_loss_is_refused_on_the_cpu_and_eager_measures_there() {
    let (ds, model) = cpu_model(Variant::Llama);
    let b = batches(&ds, 2, 5, Device::Cpu);
    let e = GraphedLoss::capture(&model, &b).unwrap_err();
    assert!(e.to_string().contains("CUDA"), "{e}");
    let e = GraphedLoss::eager(&model, &[]).unwrap_err();
    assert!(e.to_string().contains("no batches"), "{e}");
    // The eager measurement is the mean of the batches' losses.
    let each: Vec<f32> = b
        .iter()
        .map(|(x, y)| model.loss(x, y, None).unwrap().item().unwrap())
        .collect();
    let mean = GraphedLoss::eager(&model, &b).unwrap();
    let want = (each[0] + each[1]) / 2.0;
    // One f32 addition and one division by 2 (exact): the sum's rounding, half an ulp.
    assert!(
        (mean - want).abs() <= want.abs() * f32::EPSILON,
        "{mean} vs {want}"
    );
}
