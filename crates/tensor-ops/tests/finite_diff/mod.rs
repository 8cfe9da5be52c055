//! The central-difference gradient check shared by the CPU gradient tests (`gradcheck.rs` for
//! the ops, `nn_layers.rs` for the module layer). It takes its leaves from [`super::devcmp`],
//! which the test file declares beside it.

use super::devcmp::leaves;
use rand::{rngs::StdRng, Rng, SeedableRng};
use tensor_ops::{no_grad, Device, Result, Tensor};

/// Checks d⟨f(x), R⟩/dx for every element of every input (`(values, shape)`, CPU leaves)
/// against central differences with step `h`, taken in f64 on the host; `R` is drawn in
/// `[-1, 1)` from a fixed seed. Each analytic derivative must lie within
/// `tol·max(|numeric|, 1)` of the numeric one, and every input must get a gradient.
pub fn gradcheck(
    name: &str,
    inputs: &[(Vec<f32>, Vec<usize>)],
    h: f32,
    tol: f64,
    f: impl Fn(&[Tensor]) -> Result<Tensor>,
) {
    const CPU: Device = Device::Cpu;
    let mut rng = StdRng::seed_from_u64(0xC0FFEE);
    let leaves = leaves(CPU, inputs);
    let out = f(&leaves).unwrap();
    let r: Vec<f32> = (0..out.numel())
        .map(|_| rng.random_range(-1.0..1.0))
        .collect();
    let rt = Tensor::from_vec(r.clone(), out.shape(), CPU).unwrap();
    let loss = out.mul(&rt).unwrap().sum_all().unwrap();
    let grads = loss.backward().unwrap();
    let objective = |vals: &[Vec<f32>]| -> f64 {
        no_grad(|| {
            let ts: Vec<Tensor> = vals
                .iter()
                .zip(inputs)
                .map(|(v, (_, s))| Tensor::from_vec(v.clone(), s, CPU).unwrap())
                .collect();
            let o = f(&ts).unwrap().to_vec().unwrap();
            o.iter().zip(&r).map(|(a, b)| *a as f64 * *b as f64).sum()
        })
    };
    let mut vals: Vec<Vec<f32>> = inputs.iter().map(|(v, _)| v.clone()).collect();
    for (i, leaf) in leaves.iter().enumerate() {
        let g = grads
            .get(leaf)
            .unwrap_or_else(|| panic!("{name}: no gradient for input {i}"))
            .to_vec()
            .unwrap();
        for j in 0..vals[i].len() {
            let x0 = vals[i][j];
            vals[i][j] = x0 + h;
            let up = objective(&vals);
            vals[i][j] = x0 - h;
            let down = objective(&vals);
            vals[i][j] = x0;
            let fd = (up - down) / (2.0 * h as f64);
            let diff = (g[j] as f64 - fd).abs();
            assert!(
                diff <= tol * fd.abs().max(1.0),
                "{name}: d/dx{i}[{j}] analytic {} vs numeric {fd} (diff {diff:e})",
                g[j]
            );
        }
    }
}
