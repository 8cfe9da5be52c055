//! `hybrid-trainer parity-dump --model gru`: a `GruCell` unrolled over a few steps on fixed
//! inputs, forward and backward, written with its weights to a safetensors file that
//! `scripts/torch_gru_parity.py` replays with `torch.nn.GRUCell`.
//!
//! The file holds the cell's parameters under PyTorch's names (`weight_ih`, `weight_hh`,
//! `bias_ih`, `bias_hh`), the inputs `in.x` `[T, B, in]`, `in.h0` `[B, H]` and the loss weights
//! `in.dh` `[T, B, H]`, the hidden states `out.h` `[T, B, H]`, the loss
//! `out.loss` = Σₜ ⟨hₜ, dhₜ⟩, and the gradients `grad.<param>`, `grad.x`, `grad.h0`.

use anyhow::{Context, Result};
use gpu_core::Device;
use rand::{Rng, SeedableRng};
use safetensors::tensor::{Dtype, TensorView};
use std::collections::HashMap;
use std::path::Path;
use tensor_ops::nn::ParamStore;
use tensor_ops::Tensor;

/// Sizes of the dumped cell and sequence.
const INPUT: usize = 24;
const HIDDEN: usize = 32;
const BATCH: usize = 4;
const STEPS: usize = 5;

fn bytes(t: &Tensor) -> Result<Vec<u8>> {
    Ok(t.to_vec()?.iter().flat_map(|v| v.to_le_bytes()).collect())
}

/// Uniform values on `[-k, k)` from `rng`, as a leaf with gradients on `device`.
fn leaf(rng: &mut rand::rngs::StdRng, shape: &[usize], k: f32, device: Device) -> Result<Tensor> {
    let n = shape.iter().product();
    let v: Vec<f32> = (0..n).map(|_| rng.random_range(-k..k)).collect();
    Ok(Tensor::from_vec(v, shape, device)?.requires_grad_()?)
}

/// Writes the dump to `out`; returns the loss.
pub fn dump(device: Device, out: &Path) -> Result<f32> {
    let store = ParamStore::new(device, 2024);
    let cell = store.root().gru_cell(INPUT, HIDDEN)?;
    let mut rng = rand::rngs::StdRng::seed_from_u64(99);
    let x = leaf(&mut rng, &[STEPS, BATCH, INPUT], 2.0, device)?;
    let h0 = leaf(&mut rng, &[BATCH, HIDDEN], 1.0, device)?;
    let dh = leaf(&mut rng, &[STEPS, BATCH, HIDDEN], 1.0, device)?.detach();
    let mut h = h0.clone();
    let mut states = Vec::with_capacity(STEPS);
    for t in 0..STEPS {
        let xt = x.narrow(0, t, 1)?.reshape(&[BATCH, INPUT])?;
        h = cell.forward(&xt, &h)?;
        states.push(h.reshape(&[1, BATCH, HIDDEN])?);
    }
    let hs = Tensor::cat(&states.iter().collect::<Vec<_>>(), 0)?;
    let loss = hs.mul(&dh)?.sum_all()?;
    let grads = loss.backward()?;
    let grad = |t: &Tensor, what: &str| {
        grads
            .get(t)
            .with_context(|| format!("no gradient for {what}"))
    };
    let mut entries: Vec<(String, Vec<usize>, Vec<u8>)> = Vec::new();
    for p in store.params() {
        let (name, t) = (p.name(), p.tensor());
        entries.push((name.to_string(), t.shape().to_vec(), bytes(t)?));
        entries.push((
            format!("grad.{name}"),
            t.shape().to_vec(),
            bytes(grad(t, name)?)?,
        ));
    }
    for (name, t) in [("in.x", &x), ("in.h0", &h0), ("in.dh", &dh), ("out.h", &hs)] {
        entries.push((name.to_string(), t.shape().to_vec(), bytes(t)?));
    }
    entries.push(("grad.x".into(), x.shape().to_vec(), bytes(grad(&x, "x")?)?));
    entries.push((
        "grad.h0".into(),
        h0.shape().to_vec(),
        bytes(grad(&h0, "h0")?)?,
    ));
    let l = loss.item()?;
    entries.push(("out.loss".into(), vec![1], l.to_le_bytes().to_vec()));
    let views: Vec<(String, TensorView<'_>)> = entries
        .iter()
        .map(|(n, s, b)| Ok((n.clone(), TensorView::new(Dtype::F32, s.clone(), b)?)))
        .collect::<Result<_>>()?;
    let config = serde_json::json!({
        "model": "gru",
        "input_size": INPUT,
        "hidden_size": HIDDEN,
        "batch": BATCH,
        "steps": STEPS,
        "bias": true,
        "device": device.to_string(),
    });
    let meta = HashMap::from([("config".to_string(), config.to_string())]);
    std::fs::write(out, safetensors::serialize(views, &Some(meta))?)?;
    println!(
        "parity dump: GRU cell (in {INPUT}, hidden {HIDDEN}, batch {BATCH}, {STEPS} steps) on \
         {device}, loss {l:.6}, {} tensors -> {}",
        entries.len(),
        out.display()
    );
    Ok(l)
}

#[cfg(test)]
mod tests {
    use super::*;
    use safetensors::SafeTensors;

    fn f32s(st: &SafeTensors<'_>, name: &str) -> Vec<f64> {
        let v = st.tensor(name).unwrap();
        assert_eq!(v.dtype(), Dtype::F32, "{name}");
        v.data()
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]) as f64)
            .collect()
    }

    /// The dump's hidden states and loss follow from its own weights and inputs by PyTorch's
    /// GRUCell equations (host, f64): the file is self-consistent for the Python replay.
    #[test]
    fn gru_dump_replays_on_the_host() {
        let path =
            std::env::temp_dir().join(format!("gru-dump-{}.safetensors", std::process::id()));
        let loss = dump(Device::Cpu, &path).unwrap();
        let data = std::fs::read(&path).unwrap();
        std::fs::remove_file(&path).ok();
        let st = SafeTensors::deserialize(&data).unwrap();
        let mut names = st.names();
        names.sort();
        let want = [
            "bias_hh",
            "bias_ih",
            "grad.bias_hh",
            "grad.bias_ih",
            "grad.h0",
            "grad.weight_hh",
            "grad.weight_ih",
            "grad.x",
            "in.dh",
            "in.h0",
            "in.x",
            "out.h",
            "out.loss",
            "weight_hh",
            "weight_ih",
        ];
        assert_eq!(names, want);
        let (wi, wh) = (f32s(&st, "weight_ih"), f32s(&st, "weight_hh"));
        let (bi, bh) = (f32s(&st, "bias_ih"), f32s(&st, "bias_hh"));
        let (x, mut h, dh) = (f32s(&st, "in.x"), f32s(&st, "in.h0"), f32s(&st, "in.dh"));
        let out = f32s(&st, "out.h");
        let (inp, hid) = (INPUT, HIDDEN);
        let sig = |v: f64| 1.0 / (1.0 + (-v).exp());
        let mut total = 0.0;
        for t in 0..STEPS {
            let mut next = vec![0.0; BATCH * hid];
            for b in 0..BATCH {
                let xb = &x[(t * BATCH + b) * inp..][..inp];
                let hb = &h[b * hid..][..hid];
                let gi =
                    |row: usize| bi[row] + (0..inp).map(|j| wi[row * inp + j] * xb[j]).sum::<f64>();
                let gh =
                    |row: usize| bh[row] + (0..hid).map(|j| wh[row * hid + j] * hb[j]).sum::<f64>();
                for k in 0..hid {
                    let r = sig(gi(k) + gh(k));
                    let z = sig(gi(hid + k) + gh(hid + k));
                    let n = (gi(2 * hid + k) + r * gh(2 * hid + k)).tanh();
                    next[b * hid + k] = (1.0 - z) * n + z * hb[k];
                }
            }
            h = next;
            for (i, v) in h.iter().enumerate() {
                let ours = out[t * BATCH * hid + i];
                assert!((ours - v).abs() < 1e-5, "step {t} [{i}]: {ours} vs {v}");
                total += v * dh[t * BATCH * hid + i];
            }
        }
        assert!(
            (loss as f64 - total).abs() < 1e-4 * total.abs().max(1.0),
            "loss {loss} vs {total}"
        );
        assert_eq!(f32s(&st, "out.loss"), [loss as f64]);
    }
}
