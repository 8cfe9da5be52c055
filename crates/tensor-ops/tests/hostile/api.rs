//! Arguments that used to be accepted and fail later or silently: `requires_grad_` on a
//! non-leaf, `randn` with a bad standard deviation, GPT configs the kernels cannot run.

use super::devices;
use tensor_ops::{no_grad, Device, GpuError, Tensor};

fn invalid<T: std::fmt::Debug>(what: &str, r: tensor_ops::Result<T>) {
    match r {
        Err(GpuError::InvalidArgument { .. }) => {}
        other => panic!("{what}: expected InvalidArgument, got {other:?}"),
    }
}

/// `requires_grad_()` on the result of an op made it a new leaf and silently cut the graph
/// behind it (the real parameter got no gradient): now an error; `detach()` says it on purpose.
#[test]
fn requires_grad_on_a_non_leaf_is_an_error_on_every_device() {
    for dev in devices("requires_grad_on_a_non_leaf_is_an_error_on_every_device") {
        let x = Tensor::from_vec(vec![1.0f32, 2.0], &[2], dev)
            .unwrap()
            .requires_grad_()
            .unwrap();
        let y = x.mul_scalar(3.0).unwrap();
        invalid("a non-leaf", y.clone().requires_grad_());
        // The graph through y still reaches x.
        let g = y.sum_all().unwrap().backward().unwrap();
        assert_eq!(g.get(&x).unwrap().to_vec().unwrap(), [3.0, 3.0]);
        // A deliberate new leaf, and leaves made without a graph, are fine.
        let leaf = y.detach().requires_grad_().unwrap();
        assert!(leaf.requires_grad() && leaf.op_name().is_none());
        let plain = Tensor::ones(&[2], dev).unwrap().mul_scalar(2.0).unwrap();
        assert!(plain.requires_grad_().unwrap().requires_grad());
        let untracked = no_grad(|| x.mul_scalar(2.0)).unwrap();
        assert!(untracked.requires_grad_().is_ok());
        // Marking twice is harmless.
        assert!(x.clone().requires_grad_().is_ok());
        // Indices cannot require gradients.
        let ids = Tensor::from_vec(vec![0u32, 1], &[2], dev).unwrap();
        invalid("u32", ids.requires_grad_());
    }
}

/// A negative standard deviation was accepted (rand_distr only rejects non-finite ones); every
/// bad one is now a typed error, checked before anything is drawn or allocated.
#[test]
fn randn_rejects_a_negative_or_non_finite_std_on_every_device() {
    for dev in devices("randn_rejects_a_negative_or_non_finite_std_on_every_device") {
        for std in [
            -1.0f32,
            -f32::MIN_POSITIVE,
            f32::NAN,
            f32::INFINITY,
            f32::NEG_INFINITY,
        ] {
            invalid(
                &format!("{dev}: std {std}"),
                Tensor::randn(&[4], std, 1, dev),
            );
            invalid(
                &format!("{dev}: std {std}, huge"),
                Tensor::randn(&[1 << 40], std, 1, dev),
            );
        }
        let zero = Tensor::randn(&[3], 0.0, 1, dev).unwrap();
        assert_eq!(zero.to_vec().unwrap(), [0.0; 3]);
        assert_eq!(Tensor::randn(&[5], 0.02, 1, dev).unwrap().shape(), [5]);
    }
}

/// A config whose head width the attention kernels cannot take (a multiple of 4 in 4..=128)
/// was accepted and failed only in `forward`; so were other impossible configs. All are now
/// rejected when the model is built.
#[test]
fn gpt_configs_the_kernels_cannot_run_are_rejected_when_the_model_is_built() {
    use tensor_ops::gpt::{Gpt, GptConfig, Variant};
    let ok = GptConfig {
        variant: Variant::Gpt2,
        vocab_size: 11,
        block_size: 8,
        n_layer: 1,
        n_head: 2,
        n_embd: 16,
        dropout: 0.0,
        bias: true,
    };
    let bad = [
        ("head width 6", GptConfig { n_embd: 12, ..ok }),
        ("head width 2", GptConfig { n_embd: 4, ..ok }),
        ("head width 132", GptConfig { n_embd: 264, ..ok }),
        ("heads do not divide", GptConfig { n_head: 3, ..ok }),
        ("no layers", GptConfig { n_layer: 0, ..ok }),
        ("no heads", GptConfig { n_head: 0, ..ok }),
        (
            "no vocabulary",
            GptConfig {
                vocab_size: 0,
                ..ok
            },
        ),
        (
            "no context",
            GptConfig {
                block_size: 0,
                ..ok
            },
        ),
        ("no width", GptConfig { n_embd: 0, ..ok }),
        (
            "context past 2^30",
            GptConfig {
                block_size: (1 << 30) + 1,
                ..ok
            },
        ),
        (
            "width overflowing the MLP",
            GptConfig {
                n_embd: usize::MAX / 4 / 128 * 128,
                n_head: usize::MAX / 4 / 128,
                ..ok
            },
        ),
        (
            "vocabulary table overflow",
            GptConfig {
                vocab_size: usize::MAX / 4,
                ..ok
            },
        ),
        (
            "dropout NaN",
            GptConfig {
                dropout: f32::NAN,
                ..ok
            },
        ),
        ("dropout 1", GptConfig { dropout: 1.0, ..ok }),
    ];
    for variant in [Variant::Gpt2, Variant::Llama] {
        assert!(Gpt::new(GptConfig { variant, ..ok }, 0, Device::Cpu).is_ok());
        for (what, cfg) in bad {
            let cfg = GptConfig { variant, ..cfg };
            invalid(&format!("{variant:?}: {what}"), cfg.validate());
            invalid(
                &format!("{variant:?}: {what}"),
                Gpt::new(cfg, 0, Device::Cpu).map(|_| ()),
            );
        }
    }
}
