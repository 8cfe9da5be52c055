//! Sliding-window attention in `config.json`: which layers slide, and how wide the window is.
//!
//! Kept as the rule the config states, not as one entry a layer: a config claiming 10^9 layers
//! must cost nothing here (its tensors are checked against the checkpoint before anything is
//! allocated). Only `layer_types`, whose length the file itself bounds, is stored per layer.

use serde_json::Value;

use super::{bad, opt_bool, opt_usize, req_usize, unsupported, Architecture, ConfigError, Obj};

/// Each layer's sliding window `W` (`None` from [`LayerWindows::get`]: full causal attention):
/// a query at position `q` sees keys `q − W < k ≤ q`, as `transformers`'
/// `sliding_window_overlay`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LayerWindows {
    /// No layer slides.
    None,
    /// Layers `from..` slide with `window` (Mistral: every layer; Qwen2 with
    /// `use_sliding_window`: from `max_window_layers` on).
    From { from: usize, window: usize },
    /// `layer_types`: whether each layer slides, all with `window`.
    PerLayer { sliding: Vec<bool>, window: usize },
}

impl LayerWindows {
    /// Layer `layer`'s window (0-based), `None` for full causal attention.
    pub fn get(&self, layer: usize) -> Option<usize> {
        match self {
            Self::None => None,
            Self::From { from, window } => (layer >= *from).then_some(*window),
            Self::PerLayer { sliding, window } => sliding
                .get(layer)
                .copied()
                .unwrap_or(false)
                .then_some(*window),
        }
    }

    /// The windows of the first `layers` layers (for tests and reports of small models).
    pub fn first(&self, layers: usize) -> Vec<Option<usize>> {
        (0..layers).map(|l| self.get(l)).collect()
    }
}

/// The windows of a Llama-family config: from `layer_types` when given, else Mistral's
/// `sliding_window` (every layer) or Qwen2's (`use_sliding_window`: layers from
/// `max_window_layers` on). A window of 0 or a non-integer one, a window on Llama (which has
/// none), malformed `layer_types`, and a sliding layer with no window are refused by name.
pub(super) fn parse(obj: &Obj, arch: Architecture) -> Result<LayerWindows, ConfigError> {
    let layers = req_usize(obj, "num_hidden_layers")?;
    let window = match opt_usize(obj, "sliding_window") {
        Ok(Some(0)) => return bad("sliding_window", "a window of 0 sees no key".into()),
        Ok(w) => w,
        Err(_) => {
            let v = &obj["sliding_window"];
            return bad("sliding_window", format!("{v} is not a positive integer"));
        }
    };
    let window = match arch {
        // transformers' Qwen2Config drops the window unless use_sliding_window.
        Architecture::Qwen2 if !opt_bool(obj, "use_sliding_window", false)? => None,
        Architecture::Llama => match window {
            None => None,
            Some(w) => {
                let reason = "LlamaForCausalLM has no sliding-window attention";
                return unsupported("sliding_window", &Value::from(w), reason);
            }
        },
        _ => window,
    };
    match obj.get("layer_types") {
        None | Some(Value::Null) => Ok(match window {
            None => LayerWindows::None,
            Some(window) => {
                let from = match arch {
                    Architecture::Qwen2 => opt_usize(obj, "max_window_layers")?.unwrap_or(28),
                    _ => 0,
                };
                LayerWindows::From { from, window }
            }
        }),
        Some(v) => {
            let sliding = layer_types(v, layers)?;
            match window {
                Some(window) => Ok(LayerWindows::PerLayer { sliding, window }),
                None if sliding.contains(&true) => bad(
                    "layer_types",
                    "a sliding_attention layer with no sliding window (sliding_window null, \
                     or Qwen2's use_sliding_window false)"
                        .into(),
                ),
                None => Ok(LayerWindows::None),
            }
        }
    }
}

/// `layer_types`: one `"full_attention"` or `"sliding_attention"` per layer; whether each
/// slides. The length is checked before anything is collected.
fn layer_types(v: &Value, layers: usize) -> Result<Vec<bool>, ConfigError> {
    let Some(list) = v.as_array() else {
        return bad("layer_types", format!("{v} is not a list"));
    };
    if list.len() != layers {
        let reason = format!("{} entries for {layers} layers", list.len());
        return bad("layer_types", reason);
    }
    list.iter()
        .map(|t| match t.as_str() {
            Some("full_attention") => Ok(false),
            Some("sliding_attention") => Ok(true),
            _ => unsupported(
                "layer_types",
                t,
                "entries must be full_attention or sliding_attention",
            ),
        })
        .collect()
}
