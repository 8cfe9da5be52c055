//! Extreme values: huge equal logits, infinities through activations.

use super::devices;
use tensor_ops::Tensor;

/// Equal logits `c` give log-softmax `−ln n` and cross-entropy `ln n` for any finite `c`; the
/// CPU once lost `ln n` to the rounding of `c` (`v − (max + ln Σ)`).
#[test]
fn log_softmax_and_cross_entropy_of_equal_huge_logits_on_every_device() {
    for dev in devices("log_softmax_and_cross_entropy_of_equal_huge_logits_on_every_device") {
        for c in [1e12f32, -1e12, 1e15, -1e15, 1e16, -1e16, 1e30, -1e30, 3e38] {
            let x = Tensor::from_vec(vec![c; 8], &[2, 4], dev).unwrap();
            let got = x.log_softmax().unwrap().to_vec().unwrap();
            let want = -(4.0f64).ln() as f32;
            assert_eq!(got, vec![want; 8], "{dev}: log_softmax of [{c:e}; 4]");

            let logits = Tensor::from_vec(vec![c; 6], &[2, 3], dev).unwrap();
            let targets = Tensor::from_vec(vec![0u32, 2], &[2], dev).unwrap();
            let loss = logits.cross_entropy(&targets).unwrap().item().unwrap();
            let want = (3.0f64).ln() as f32;
            assert!(
                (loss - want).abs() <= 1e-6,
                "{dev}: cross-entropy of [{c:e}; 3] = {loss}, want {want}"
            );
        }
    }
}

/// `gelu(−inf)` and `silu(−inf)` were NaN (`−inf·0`), and so were their gradients at ±inf. The
/// limits: 0 at −inf and +inf at +inf; derivatives 0 at −inf and 1 at +inf. (The CUDA kernels
/// get the same fix separately; until then this test fails on CUDA.)
#[test]
fn gelu_and_silu_at_infinities_take_their_limits_on_every_device() {
    let (inf, ninf) = (f32::INFINITY, f32::NEG_INFINITY);
    for dev in devices("gelu_and_silu_at_infinities_take_their_limits_on_every_device") {
        for name in ["gelu", "silu"] {
            let x = Tensor::from_vec(vec![ninf, inf, -1e30, 1e30, 0.0], &[5], dev)
                .unwrap()
                .requires_grad_()
                .unwrap();
            let y = match name {
                "gelu" => x.gelu(),
                _ => x.silu(),
            }
            .unwrap();
            assert_eq!(
                y.to_vec().unwrap(),
                [0.0, inf, 0.0, 1e30, 0.0],
                "{dev}: {name}"
            );
            let g = y.sum_all().unwrap().backward().unwrap();
            let dx = g.get(&x).unwrap().to_vec().unwrap();
            let d0 = 0.5; // gelu'(0) = silu'(0) = 1/2
            assert_eq!(dx, [0.0, 1.0, 0.0, 1.0, d0], "{dev}: {name}'");
        }
    }
}
