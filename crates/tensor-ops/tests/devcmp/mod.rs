//! Shared by the GPU test files: run a function on CPU and CUDA leaves built from the same data
//! and compare outputs; the gradients compared are those of ⟨f(x), R⟩ for a fixed R. Also what
//! the module tests on the CPU and on CUDA share: the GRU's leaves and cell, a store's Σ‖p‖².
#![allow(dead_code)]

use gpu_cuda::testing::rel_err;
use tensor_ops::nn::{GruCell, ParamStore};
use tensor_ops::{Device, Result, Tensor};

/// One gradient per leaf (`None` where no gradient flows).
pub type Grads = Vec<Option<Vec<f32>>>;

/// The weights R of the loss ⟨f(x), R⟩: dL/d out.
pub fn loss_weights(n: usize) -> Vec<f32> {
    (0..n)
        .map(|i| ((i * 7919 % 13) as f32 - 6.0) / 6.0)
        .collect()
}

/// The inputs (`(values, shape)`) as leaves on device `d` that require gradients.
pub fn leaves(d: Device, inputs: &[(Vec<f32>, Vec<usize>)]) -> Vec<Tensor> {
    inputs
        .iter()
        .map(|(v, s)| {
            Tensor::from_vec(v.clone(), s, d)
                .unwrap()
                .requires_grad_()
                .unwrap()
        })
        .collect()
}

/// `f`'s output and the gradient of ⟨f(x), R⟩ for each leaf (`None` where no gradient flows) on
/// device `d`.
pub fn run_on(
    d: Device,
    inputs: &[(Vec<f32>, Vec<usize>)],
    f: &dyn Fn(&[Tensor]) -> Result<Tensor>,
) -> (Vec<f32>, Grads) {
    let leaves = leaves(d, inputs);
    let out = f(&leaves).unwrap();
    let r = loss_weights(out.numel());
    let loss = out
        .mul(&Tensor::from_vec(r, out.shape(), d).unwrap())
        .unwrap()
        .sum_all()
        .unwrap();
    let g = loss.backward().unwrap();
    let grads = leaves
        .iter()
        .map(|l| g.get(l).map(|t| t.to_vec().unwrap()))
        .collect();
    (out.to_vec().unwrap(), grads)
}

/// Runs `f` on the CPU and on `dev`, asserts the forward within norm-wise `tol`, and returns the
/// gradients `(gpu, cpu)`.
pub fn compare_forward(
    name: &str,
    dev: Device,
    inputs: &[(Vec<f32>, Vec<usize>)],
    tol: f64,
    f: &dyn Fn(&[Tensor]) -> Result<Tensor>,
) -> (Grads, Grads) {
    let (oc, gc) = run_on(Device::Cpu, inputs, f);
    let (og, gg) = run_on(dev, inputs, f);
    let e = rel_err(&og, &oc);
    assert!(e < tol, "{name}: forward rel err {e:e}");
    (gg, gc)
}

/// The GRU tests' six leaves for `batch` rows of `inp` inputs and `hid` units: the input
/// `[batch, inp]`, the state `[batch, hid]`, `w_ih`, `w_hh`, `b_ih`, `b_hh`, in that order, each
/// drawn by `u(shape, scale)` with the scale of its kind (`x`, `h`, weights `w`, biases `b`).
pub fn gru_leaves(
    mut u: impl FnMut(&[usize], f32) -> (Vec<f32>, Vec<usize>),
    (batch, inp, hid): (usize, usize, usize),
    (x, h, w, b): (f32, f32, f32, f32),
) -> Vec<(Vec<f32>, Vec<usize>)> {
    vec![
        u(&[batch, inp], x),
        u(&[batch, hid], h),
        u(&[3 * hid, inp], w),
        u(&[3 * hid, hid], w),
        u(&[3 * hid], b),
        u(&[3 * hid], b),
    ]
}

/// The GRU cell of the GRU tests' leaves `t[2..6]` (`w_ih`, `w_hh`, `b_ih`, `b_hh`; `t[0]` is
/// the input, `t[1]` the state).
pub fn gru_cell(t: &[Tensor]) -> Result<GruCell> {
    GruCell::from_tensors(
        t[2].clone(),
        t[3].clone(),
        Some(t[4].clone()),
        Some(t[5].clone()),
    )
}

/// The loss Σ‖p‖² over `store`'s parameters (a sum of per-parameter sums, in the store's
/// order): what the snapshot tests step an optimiser with.
pub fn sum_of_squares(store: &ParamStore) -> Tensor {
    store
        .params()
        .iter()
        .map(|p| p.tensor().mul(p.tensor()).unwrap().sum_all().unwrap())
        .reduce(|a, b| a.add(&b).unwrap())
        .unwrap()
}

/// The unary ops the device tests compare (`log` wants positive inputs).
pub const UNARY: [&str; 7] = ["relu", "gelu", "silu", "sigmoid", "tanh", "exp", "log"];

/// Unary op `op` of [`UNARY`] on `x`.
pub fn unary(op: &str, x: &Tensor) -> Result<Tensor> {
    match op {
        "relu" => x.relu(),
        "gelu" => x.gelu(),
        "silu" => x.silu(),
        "sigmoid" => x.sigmoid(),
        "tanh" => x.tanh(),
        "exp" => x.exp(),
        _ => x.log(),
    }
}
