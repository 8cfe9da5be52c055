//! The world model on the CPU: shapes of the issue's default model, configurable decoder
//! width, reproducible training, bootstrap masks, free bits, checkpoints, and typed errors for
//! every kind of bad input (an untrained or empty ensemble, wrong widths, NaN or Inf, ...).

mod common;

use common::{small_config, System};
use rand::{rngs::StdRng, SeedableRng};
use rssm::{LossBreakdown, Rssm, RssmConfig, RssmError, SequenceBatch};
use tensor_ops::{Device, Tensor};

const CPU: Device = Device::Cpu;

fn tiny(seed: u64) -> RssmConfig {
    RssmConfig {
        embed_dim: 16,
        hidden_dim: 16,
        latent_dim: 4,
        head_dim: 16,
        ensemble: 3,
        ..small_config(seed)
    }
}

fn batch(seed: u64, b: usize, t: usize) -> Tensor {
    System::new(1).batch(&mut StdRng::seed_from_u64(seed), b, t)
}

fn train(cfg: RssmConfig, steps: usize) -> (Rssm, Vec<LossBreakdown>) {
    let mut m = Rssm::new(cfg, CPU).unwrap();
    let losses = (0..steps)
        .map(|i| {
            m.train_step(&SequenceBatch::new(batch(i as u64, 4, 5)), 1e-3)
                .unwrap()
        })
        .collect();
    (m, losses)
}

#[test]
fn the_default_model_has_the_issues_sizes_and_runs() {
    let cfg = RssmConfig::default();
    assert_eq!(
        (cfg.feature_dim, cfg.embed_dim, cfg.hidden_dim, cfg.ensemble),
        (64, 128, 256, 5)
    );
    let mut m = Rssm::new(cfg, CPU).unwrap();
    assert_eq!(m.ensemble_size(), 5);
    let names = m.parameter_names();
    assert!(names.contains(&"encoder.fc.weight".to_string()));
    assert!(names.contains(&"member.4.gru.weight_hh".to_string()));
    let x = batch(0, 2, 3);
    let e = m.encode(&x, tensor_ops::nn::Mode::Eval).unwrap();
    assert_eq!(e.shape(), &[2, 3, 128]);
    assert!(e.to_vec().unwrap().iter().all(|v| *v >= 0.0), "ReLU output");
    let l = m.train_step(&SequenceBatch::new(x.clone()), 1e-4).unwrap();
    assert!(l.total.is_finite() && l.total > 0.0);
    let p = m.predict(&x, 4).unwrap();
    assert_eq!(p.members.shape(), &[5, 2, 4, 64]);
    assert_eq!(p.mean.shape(), &[2, 4, 64]);
    assert_eq!(p.disagreement.shape(), &[2, 4]);
    assert!(p.disagreement.to_vec().unwrap().iter().all(|v| *v > 0.0));
}

#[test]
fn the_decoder_width_is_configurable_with_targets() {
    let cfg = RssmConfig {
        output_dim: 64 + 8,
        ..tiny(5)
    };
    let mut m = Rssm::new(cfg, CPU).unwrap();
    let x = batch(1, 3, 4);
    let extra = Tensor::full(0.25, &[3, 4, 8], CPU).unwrap();
    let y = Tensor::cat(&[&x, &extra], 2).unwrap();
    m.train_step(&SequenceBatch::with_targets(x.clone(), y), 1e-3)
        .unwrap();
    assert_eq!(m.predict(&x, 2).unwrap().mean.shape(), &[3, 2, 72]);
    // Without targets the decoder has nothing of its width to learn.
    match m.train_step(&SequenceBatch::new(x.clone()), 1e-3) {
        Err(RssmError::InvalidArgument {
            what: "targets", ..
        }) => {}
        other => panic!("{other:?}"),
    }
    // Targets of another width, or another batch / length.
    let bad = Tensor::zeros(&[3, 4, 70], CPU).unwrap();
    assert!(matches!(
        m.train_step(&SequenceBatch::with_targets(x.clone(), bad), 1e-3),
        Err(RssmError::FeatureWidth {
            what: "targets",
            expected: 72,
            got: 70
        })
    ));
    let short = Tensor::zeros(&[3, 3, 72], CPU).unwrap();
    assert!(matches!(
        m.train_step(&SequenceBatch::with_targets(x, short), 1e-3),
        Err(RssmError::Shape {
            what: "targets",
            ..
        })
    ));
}

#[test]
fn training_is_reproducible_from_the_seed_and_members_get_their_own_bootstrap() {
    let (a, la) = train(tiny(9), 3);
    let (b, lb) = train(tiny(9), 3);
    assert_eq!(
        la, lb,
        "same seed, same batches: the same losses bit for bit"
    );
    assert_eq!(a.to_bytes().unwrap(), b.to_bytes().unwrap());
    let (_, lc) = train(tiny(10), 3);
    assert_ne!(la[0].total, lc[0].total, "another seed, other weights");
    for l in &la {
        assert_eq!(l.bootstrap.len(), 3);
        for counts in &l.bootstrap {
            assert_eq!(counts.len(), 4);
            assert_eq!(counts.iter().sum::<u32>(), 4, "B draws with replacement");
        }
        assert_eq!(l.member_totals.len(), 3);
        let mean = l.member_totals.iter().sum::<f32>() / 3.0;
        assert!((mean - l.total).abs() <= 1e-5 * l.total.abs());
    }
    // Over a few steps the members' resamples differ (P(all equal) is negligible: 3 members of
    // 4^4 = 256 possible draws each, over 3 steps).
    let differ = la
        .iter()
        .any(|l| l.bootstrap.windows(2).any(|w| w[0] != w[1]));
    assert!(differ);
    assert_eq!(a.steps(), 3);
    assert_eq!(la.iter().map(|l| l.step).collect::<Vec<_>>(), [0, 1, 2]);
}

#[test]
fn the_loss_terms_add_up_and_free_bits_floor_the_kl() {
    let cfg = RssmConfig {
        free_nats: 1e3,
        ..tiny(11)
    };
    let (_, l) = train(cfg, 1);
    let l = &l[0];
    assert_eq!(l.kl_dyn, 1e3, "every step's KL is far below the floor");
    assert_eq!(l.kl_rep, 1e3);
    assert!(l.kl >= 0.0 && l.kl < 1e3);
    let want = cfg.recon_scale * l.recon
        + cfg.pred_scale * l.pred
        + cfg.dyn_scale * l.kl_dyn
        + cfg.rep_scale * l.kl_rep;
    assert!(
        (l.total - want).abs() <= 1e-5 * want,
        "{} vs {want}",
        l.total
    );
    let no_floor = RssmConfig {
        free_nats: 0.0,
        ..tiny(11)
    };
    let (_, l) = train(no_floor, 1);
    assert!((l[0].kl_dyn - l[0].kl).abs() <= 1e-6 * l[0].kl.max(1.0));
    assert!((l[0].kl_rep - l[0].kl).abs() <= 1e-6 * l[0].kl.max(1.0));
}

#[test]
fn a_checkpoint_carries_the_weights_and_the_step_count() {
    let (a, _) = train(tiny(12), 2);
    let mut b = Rssm::new(tiny(99), CPU).unwrap();
    assert!(!b.is_trained());
    b.load_bytes(&a.to_bytes().unwrap()).unwrap();
    assert_eq!(b.steps(), 2);
    let x = batch(7, 2, 3);
    let (pa, pb) = (a.predict(&x, 3).unwrap(), b.predict(&x, 3).unwrap());
    assert_eq!(pa.members.to_vec().unwrap(), pb.members.to_vec().unwrap());
    let copy = a.to_device(CPU).unwrap();
    assert_eq!(copy.to_bytes().unwrap(), a.to_bytes().unwrap());
    // Another layout is a typed error and leaves the model as it was.
    let mut other = Rssm::new(small_config(1), CPU).unwrap();
    let before = other.to_bytes().unwrap();
    assert!(matches!(
        other.load_bytes(&a.to_bytes().unwrap()),
        Err(RssmError::Tensor(_))
    ));
    assert_eq!(other.to_bytes().unwrap(), before);
    assert!(!other.is_trained());
}

#[test]
fn an_untrained_or_empty_ensemble_is_a_typed_error() {
    let m = Rssm::new(tiny(1), CPU).unwrap();
    let e = m.predict(&batch(0, 2, 3), 2).unwrap_err();
    assert!(matches!(e, RssmError::Untrained), "{e}");
    assert!(e.to_string().contains("untrained"));
    let empty = RssmConfig {
        ensemble: 0,
        ..tiny(1)
    };
    assert!(matches!(
        Rssm::new(empty, CPU),
        Err(RssmError::EmptyEnsemble)
    ));
    let single = RssmConfig {
        ensemble: 1,
        ..tiny(1)
    };
    assert!(matches!(
        Rssm::new(single, CPU),
        Err(RssmError::InvalidConfig {
            field: "ensemble",
            ..
        })
    ));
}

#[test]
fn bad_configs_are_typed_errors_naming_the_field() {
    let base = tiny(1);
    let cases: Vec<(&str, RssmConfig)> = vec![
        (
            "feature_dim",
            RssmConfig {
                feature_dim: 0,
                ..base
            },
        ),
        (
            "hidden_dim",
            RssmConfig {
                hidden_dim: 0,
                ..base
            },
        ),
        (
            "output_dim",
            RssmConfig {
                output_dim: 0,
                ..base
            },
        ),
        (
            "dropout",
            RssmConfig {
                dropout: 1.0,
                ..base
            },
        ),
        (
            "dropout",
            RssmConfig {
                dropout: f32::NAN,
                ..base
            },
        ),
        (
            "layer_norm_eps",
            RssmConfig {
                layer_norm_eps: 0.0,
                ..base
            },
        ),
        (
            "min_std/max_std",
            RssmConfig {
                min_std: 0.0,
                ..base
            },
        ),
        (
            "min_std/max_std",
            RssmConfig {
                min_std: 3.0,
                max_std: 2.0,
                ..base
            },
        ),
        (
            "free_nats",
            RssmConfig {
                free_nats: -1.0,
                ..base
            },
        ),
        (
            "dyn_scale",
            RssmConfig {
                dyn_scale: f32::INFINITY,
                ..base
            },
        ),
        (
            "adamw",
            RssmConfig {
                adamw: tensor_ops::optim::AdamWParams {
                    beta1: 1.0,
                    ..base.adamw
                },
                ..base
            },
        ),
    ];
    for (field, cfg) in cases {
        match Rssm::new(cfg, CPU) {
            Err(RssmError::InvalidConfig { field: f, .. }) => assert_eq!(f, field),
            other => panic!("{field}: {other:?}"),
        }
    }
}

#[test]
fn bad_input_is_a_typed_error_and_changes_nothing() {
    let (mut m, _) = train(tiny(13), 1);
    let before = m.to_bytes().unwrap();
    let step = |m: &mut Rssm, x: Tensor| m.train_step(&SequenceBatch::new(x), 1e-3);
    // Wrong feature width.
    let e = step(&mut m, Tensor::zeros(&[2, 3, 63], CPU).unwrap()).unwrap_err();
    assert!(
        matches!(
            e,
            RssmError::FeatureWidth {
                what: "features",
                expected: 64,
                got: 63
            }
        ),
        "{e}"
    );
    assert!(e.to_string().contains("expected width 64, got 63"));
    // Wrong rank, empty batch, empty sequence.
    assert!(matches!(
        step(&mut m, Tensor::zeros(&[3, 64], CPU).unwrap()),
        Err(RssmError::Shape { .. })
    ));
    for s in [[0, 3, 64], [2, 0, 64]] {
        assert!(matches!(
            step(&mut m, Tensor::zeros(&s, CPU).unwrap()),
            Err(RssmError::Empty { .. })
        ));
    }
    // NaN or Inf anywhere.
    for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
        let mut v = batch(3, 2, 3).to_vec().unwrap();
        v[77] = bad;
        let x = Tensor::from_vec(v, &[2, 3, 64], CPU).unwrap();
        let e = step(&mut m, x.clone()).unwrap_err();
        assert!(
            matches!(e, RssmError::NonFinite { what: "features" }),
            "{bad}: {e}"
        );
        assert!(matches!(
            m.predict(&x, 2),
            Err(RssmError::NonFinite { what: "context" })
        ));
    }
    // A finite input whose loss overflows f32: the update is refused, not applied.
    let huge = Tensor::full(1e30, &[2, 3, 64], CPU).unwrap();
    assert!(matches!(
        step(&mut m, huge),
        Err(RssmError::NonFinite { what: "the loss" })
    ));
    // Bad learning rates.
    for lr in [f32::NAN, -1.0, f32::INFINITY] {
        assert!(matches!(
            m.train_step(&SequenceBatch::new(batch(1, 2, 3)), lr),
            Err(RssmError::InvalidArgument {
                what: "learning rate",
                ..
            })
        ));
    }
    // A zero-step rollout, a context of the wrong width.
    assert!(matches!(
        m.predict(&batch(1, 2, 3), 0),
        Err(RssmError::Empty { .. })
    ));
    assert!(matches!(
        m.predict(&Tensor::zeros(&[2, 3, 65], CPU).unwrap(), 2),
        Err(RssmError::FeatureWidth { .. })
    ));
    assert!(matches!(
        m.encode(
            &Tensor::zeros(&[2, 65], CPU).unwrap(),
            tensor_ops::nn::Mode::Eval
        ),
        Err(RssmError::FeatureWidth { .. })
    ));
    // Start states that do not fit.
    let states = m.observe(&batch(1, 2, 3)).unwrap();
    assert!(matches!(
        m.imagine(&states[..1], 2),
        Err(RssmError::InvalidArgument { .. })
    ));
    assert_eq!(
        m.to_bytes().unwrap(),
        before,
        "no failed call changed a weight"
    );
    assert_eq!(m.steps(), 1);
}
