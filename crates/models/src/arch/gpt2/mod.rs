//! GPT-2: the f32 reference forward ([`reference`], for [`crate::CausalLm`]) and the fast
//! forward with its transposed, fused weights ([`Gpt2Fast`], a [`crate::arch::DecoderModel`]
//! for [`crate::Engine`]). Both read the same `transformers` names and learned positions, and
//! the same GELU (tanh or exact) from the config.

pub mod fast;
pub(crate) mod reference;

pub use fast::Gpt2Fast;
pub(crate) use reference::Gpt2Reference;
