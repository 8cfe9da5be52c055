//! `hybrid-trainer parity-dump`: one forward/backward of a small GPT on a fixed batch, written
//! with its weights to a safetensors file that `scripts/torch_parity.py` replays in PyTorch.

use anyhow::{Context, Result};
use gpu_core::Device;
use models::gpt::{Dataset, Gpt, GptConfig, Variant};
use safetensors::tensor::{Dtype, TensorView};
use std::collections::HashMap;
use std::path::Path;
use tensor_ops::{Precision, Tensor};

const TEXT: &str = include_str!("parity_text.txt");

/// Writes weights, batch, logits, loss and every gradient (dropout off) to `out`, the model
/// running in `precision` (recorded in the file's metadata).
pub fn dump(device: Device, variant: Variant, precision: Precision, out: &Path) -> Result<f32> {
    let ds = Dataset::from_text(TEXT, 0.9)?;
    let cfg = GptConfig {
        variant,
        vocab_size: ds.tokenizer.vocab_size(),
        block_size: 64,
        n_layer: 2,
        n_head: 2, // head dimension 64: the bf16 tensor-core attention's
        n_embd: 128,
        dropout: 0.0,
        bias: variant == Variant::Gpt2,
    };
    let mut model = Gpt::new(cfg, 2024, device)?;
    model.set_precision(precision)?;
    let (x, y) = ds.batch(false, 4, 64, &mut Dataset::rng(99), device)?;
    let logits = model.forward(&x, None)?;
    let (b, t) = (4, 64);
    let loss = logits
        .reshape(&[b * t, cfg.vocab_size])?
        .cross_entropy(&y.reshape(&[b * t])?)?;
    let grads = loss.backward()?;
    let mut entries: Vec<(String, Dtype, Vec<usize>, Vec<u8>)> = Vec::new();
    // Written as f32 (bf16 logits widen exactly).
    let f32s = |t: &Tensor| -> Result<Vec<u8>> {
        Ok(t.to_vec()?.iter().flat_map(|v| v.to_le_bytes()).collect())
    };
    for param in model.store().params() {
        let (name, p) = (param.name(), param.tensor());
        entries.push((name.to_string(), Dtype::F32, p.shape().to_vec(), f32s(p)?));
        let g = grads
            .get(p)
            .with_context(|| format!("no gradient for {name}"))?;
        entries.push((
            format!("grad.{name}"),
            Dtype::F32,
            p.shape().to_vec(),
            f32s(g)?,
        ));
    }
    let u32s = |t: &Tensor| -> Result<Vec<u8>> {
        Ok(t.to_vec_u32()?
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect())
    };
    entries.push(("batch.x".into(), Dtype::U32, vec![b, t], u32s(&x)?));
    entries.push(("batch.y".into(), Dtype::U32, vec![b, t], u32s(&y)?));
    entries.push((
        "out.logits".into(),
        Dtype::F32,
        logits.shape().to_vec(),
        f32s(&logits)?,
    ));
    let l = loss.item()?;
    entries.push((
        "out.loss".into(),
        Dtype::F32,
        vec![1],
        l.to_le_bytes().to_vec(),
    ));
    let views: Vec<(String, TensorView<'_>)> = entries
        .iter()
        .map(|(n, d, s, bytes)| Ok((n.clone(), TensorView::new(*d, s.clone(), bytes)?)))
        .collect::<Result<_>>()?;
    let meta = HashMap::from([
        ("config".to_string(), serde_json::to_string(&cfg)?),
        ("precision".to_string(), precision.to_string()),
    ]);
    std::fs::write(out, safetensors::serialize(views, &Some(meta))?)?;
    println!(
        "parity dump: {variant:?} on {device}, loss {l:.6}, {} tensors -> {}",
        entries.len(),
        out.display()
    );
    Ok(l)
}
