//! `GraphedStep` with Schedule-Free AdamW and Prodigy (through `&mut dyn Optimizer`): replays
//! give the eager steps' bits (loss, gradient norm, parameters, every state tensor and scalar)
//! over several steps with clipping and a changing learning rate. Prodigy's step (its sums and
//! `d` on the device) is inside the captured graph. Skips with a printed reason without a GPU.

mod graph_common;

use graph_common::{assert_same_parameters, at_most_twice, bits, config, gpu_setup, step_twins};
use models::gpt::{Gpt, GraphedStep, Variant};
use rand::{rngs::StdRng, Rng, SeedableRng};
use tensor_ops::optim::{Optimizer, ProdigyParams, ScheduleFreeParams};

fn optimiser(which: &str, model: &Gpt) -> Box<dyn Optimizer> {
    let store = model.store();
    match which {
        "schedule_free" => Box::new(
            store
                .schedule_free_adamw(ScheduleFreeParams {
                    weight_decay: 0.1,
                    warmup_steps: 2,
                    max_grad_norm: Some(0.5),
                    ..Default::default()
                })
                .unwrap(),
        ),
        _ => Box::new(
            store
                .prodigy(ProdigyParams {
                    weight_decay: 0.1,
                    max_grad_norm: Some(0.5),
                    ..Default::default()
                })
                .unwrap(),
        ),
    }
}

#[test]
fn gpu_graphed_steps_with_schedule_free_and_prodigy_give_the_eager_bits() {
    let test = "gpu_graphed_steps_with_schedule_free_and_prodigy_give_the_eager_bits";
    let Some((dev, seed, _, vocab)) = gpu_setup(test) else {
        return;
    };
    let cfg = config(Variant::Gpt2, vocab, 32);
    let (batch, block) = (3, 16);
    for which in ["schedule_free", "prodigy"] {
        let eager = Gpt::new(cfg, seed, dev).unwrap();
        let graphed = Gpt::new(cfg, seed, dev).unwrap();
        let (mut opt_e, mut opt_g) = (optimiser(which, &eager), optimiser(which, &graphed));
        let step = GraphedStep::capture(&graphed, &mut *opt_g, batch, block).unwrap();
        assert_eq!(opt_g.steps(), 0);
        let mut r = StdRng::seed_from_u64(seed ^ 7);
        for it in 0..5u32 {
            let (x, y) = at_most_twice(&mut r, vocab, batch * block);
            let lr = if which == "prodigy" {
                1.0 - 0.1 * it as f32
            } else {
                1e-3 * (1.0 + it as f32)
            };
            let drop_seed: u64 = r.random();
            step_twins(
                (&eager, &mut *opt_e),
                (&step, &mut *opt_g),
                (&x, &y, [batch, block]),
                (drop_seed, lr),
                &format!("{which} step {it} (seed {seed})"),
            );
        }
        assert_eq!(opt_e.steps(), opt_g.steps());
        assert_same_parameters(&eager, &graphed, which, seed);
        let (se, sg) = (opt_e.state().unwrap(), opt_g.state().unwrap());
        for ((n, a), (_, b)) in se.tensors.iter().zip(&sg.tensors) {
            assert_eq!(bits(a), bits(b), "{which} state {n}");
        }
        assert_eq!(se.scalars, sg.scalars, "{which} host scalars");
    }
}
