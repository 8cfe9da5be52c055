//! Arguments that used to be accepted and fail later or silently: `requires_grad_` on a
//! non-leaf, `randn` with a bad standard deviation (GPT configs the kernels cannot run: `models`'
//! `gpt.rs`).

use super::devices;
use tensor_ops::{no_grad, GpuError, Tensor};

expect_error!(invalid, InvalidArgument);

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
