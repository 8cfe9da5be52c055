//! The Llama family (Llama 2 and 3, Qwen2, Mistral): the f32 reference forward
//! ([`reference`], for [`crate::CausalLm`]) and the fast forward with its fused weights
//! ([`LlamaFast`], a [`crate::arch::DecoderModel`] for [`crate::Engine`]). Both read the same
//! `transformers` names, rotate with the same frequencies (`crate::layers::inv_freq`) and
//! honour the config's sliding windows and attention scale.

pub mod fast;
pub(crate) mod reference;

pub use fast::LlamaFast;
pub(crate) use reference::LlamaReference;
