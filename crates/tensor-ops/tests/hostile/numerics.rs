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
