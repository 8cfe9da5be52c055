//! The line search's measurements (`control::probe::ProbeSet`): the points
//! `start + s·(end − start)` are the weights measured, the model's weights are as they were
//! afterwards, and on CUDA the captured graph gives the eager measurements' bits. Tests named
//! `gpu_*` skip with a printed reason where no GPU exists.

use gpu_core::nn::optim_adaptive::lerp_f64;
use gpu_core::Device;
use models::gpt::{Dataset, Gpt, GptConfig, Variant};
use tensor_ops::Precision;
use trainer::control::probe::{ProbeDraw, ProbeSet, ProbeSplit, Weights};

fn dataset() -> Dataset {
    let text = trainer::corpus::default_corpus().unwrap();
    Dataset::from_text(&text[..20_000], 0.9).unwrap()
}

fn model(ds: &Dataset, seed: u64, dev: Device) -> Gpt {
    let cfg = GptConfig {
        variant: Variant::Gpt2,
        vocab_size: ds.tokenizer.vocab_size(),
        block_size: 32,
        n_layer: 2,
        n_head: 2,
        n_embd: 64,
        dropout: 0.1,
        bias: false,
    };
    Gpt::new(cfg, seed, dev).unwrap()
}

/// Two batches of 4 × 32 training tokens from seed 9.
fn draw() -> ProbeDraw {
    ProbeDraw {
        split: ProbeSplit::Train,
        n: 2,
        batch: 4,
        block: 32,
        seed: 9,
    }
}

fn bits(w: &Weights) -> Vec<Vec<u32>> {
    w.tensors()
        .iter()
        .map(|t| t.to_vec().unwrap().iter().map(|v| v.to_bits()).collect())
        .collect()
}

#[test]
fn points_along_a_line_are_measured_and_the_weights_restored() {
    let ds = dataset();
    let m = model(&ds, 3, Device::Cpu);
    let start = Weights::of(&model(&ds, 4, Device::Cpu)).unwrap();
    let end = Weights::of(&model(&ds, 5, Device::Cpu)).unwrap();
    let probes = ProbeSet::new(&ds, draw(), &m, true).unwrap();
    assert!(!probes.graphed(), "no graphs on the CPU");
    let before = Weights::of(&m).unwrap();
    let got = probes
        .losses_along(
            &m,
            &[
                (&start, Some(&end), 1.0),
                (&start, Some(&end), 2.0),
                (&start, None, 0.5),
            ],
        )
        .unwrap();
    assert_eq!(
        bits(&Weights::of(&m).unwrap()),
        bits(&before),
        "weights restored"
    );
    // Each point by hand: the same weights written element by element.
    for (i, (s, e)) in [(1.0, &end), (2.0, &end), (0.5, &before)]
        .into_iter()
        .enumerate()
    {
        let m2 = model(&ds, 3, Device::Cpu);
        let ts = start
            .tensors()
            .iter()
            .zip(e.tensors())
            .map(|(x, y)| {
                let (xv, yv) = (x.to_vec().unwrap(), y.to_vec().unwrap());
                // The fused lerp's CPU reference: PyTorch's formula in f64, rounded once.
                let v: Vec<f32> = if s == 1.0 {
                    yv
                } else {
                    xv.iter()
                        .zip(&yv)
                        .map(|(&x, &y)| lerp_f64(x as f64, y as f64, s) as f32)
                        .collect()
                };
                tensor_ops::Tensor::from_vec(v, x.shape(), Device::Cpu).unwrap()
            })
            .collect();
        Weights::from_tensors(ts).load_into(&m2).unwrap();
        let want = probes.loss(&m2).unwrap();
        assert_eq!(got[i].to_bits(), want.to_bits(), "point {i} (s = {s})");
    }
    assert!(got[0] != got[1], "the points are different weights");
    // Three points and three checks, two batches each, counted where they ran.
    assert_eq!(probes.forwards_run(), 12);
}

#[test]
fn gpu_graphed_probes_give_the_eager_bits() {
    let test = "gpu_graphed_probes_give_the_eager_bits";
    let Some(dev) = gpu_cuda::testing::gpu_device_or_skip(test) else {
        return;
    };
    let seed = gpu_cuda::testing::test_seed(test);
    let ds = dataset();
    for precision in [Precision::Fp32, Precision::Bf16] {
        let mut m = model(&ds, seed, dev);
        m.set_precision(precision).unwrap();
        let start = Weights::of(&model(&ds, seed ^ 1, dev)).unwrap();
        let end = Weights::of(&model(&ds, seed ^ 2, dev)).unwrap();
        let graphed = ProbeSet::new(&ds, draw(), &m, true).unwrap();
        let eager = ProbeSet::new(&ds, draw(), &m, false).unwrap();
        assert!(graphed.graphed() && !eager.graphed());
        let before = Weights::of(&m).unwrap();
        let points = [
            (&start, Some(&end), 1.0),
            (&start, Some(&end), 2.0),
            (&start, None, 0.5),
        ];
        let g = graphed.losses_along(&m, &points).unwrap();
        let e = eager.losses_along(&m, &points).unwrap();
        let what = format!("{precision} (seed {seed})");
        assert_eq!(
            g.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            e.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            "{what}: {g:?} against {e:?}"
        );
        assert_eq!(
            graphed.loss(&m).unwrap().to_bits(),
            eager.loss(&m).unwrap().to_bits(),
            "{what}"
        );
        assert_eq!(bits(&Weights::of(&m).unwrap()), bits(&before), "{what}");
    }
}

#[test]
fn a_point_that_fails_halfway_leaves_the_weights_as_they_were() {
    let ds = dataset();
    let m = model(&ds, 3, Device::Cpu);
    let good = Weights::of(&model(&ds, 4, Device::Cpu)).unwrap();
    // One tensor short, as the end of the second point (s = 1 writes the end, s = 2 lerps
    // towards it): refused when that point is written, after the first point was measured.
    let short = Weights::from_tensors(good.tensors()[1..].to_vec());
    let probes = ProbeSet::new(&ds, draw(), &m, false).unwrap();
    let before = bits(&Weights::of(&m).unwrap());
    for s in [1.0, 2.0] {
        let e = probes.losses_along(&m, &[(&good, None, 0.5), (&good, Some(&short), s)]);
        assert!(e.is_err(), "s = {s}");
        assert_eq!(
            bits(&Weights::of(&m).unwrap()),
            before,
            "s = {s}: weights changed"
        );
    }
    // A huge extrapolation (weights near ±1e30 and beyond) measures without a panic, and the
    // weights come back; an infinite one is refused by the lerp.
    probes.losses_along(&m, &[(&good, None, 1e30)]).unwrap();
    assert_eq!(bits(&Weights::of(&m).unwrap()), before);
    assert!(probes
        .losses_along(&m, &[(&good, None, f32::INFINITY)])
        .is_err());
    assert_eq!(bits(&Weights::of(&m).unwrap()), before);
}
