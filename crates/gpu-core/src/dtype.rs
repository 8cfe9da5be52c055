//! Element types: f32, f16 and bf16 (through `half`).

use half::{bf16, f16};
use std::fmt;

/// The element types a buffer can hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DType {
    F32,
    F16,
    BF16,
    /// Unsigned 32-bit integers: token ids, class targets, indices.
    U32,
}

impl DType {
    /// Bytes per element.
    pub const fn size_in_bytes(self) -> usize {
        match self {
            DType::F32 | DType::U32 => 4,
            DType::F16 | DType::BF16 => 2,
        }
    }

    /// Short lowercase name, as used in kernel names (`add_f32`).
    pub const fn as_str(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::U32 => "u32",
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A Rust type that can live in a buffer.
pub trait Element: Copy + Send + Sync + fmt::Debug + Default + PartialEq + 'static {
    /// The dtype tag of this type.
    const DTYPE: DType;
    /// Convert to f32 (exact for the float types; integers above 2^24 round).
    fn to_f32(self) -> f32;
    /// Convert from f32 (round to nearest even; integers saturate and truncate).
    fn from_f32(v: f32) -> Self;
}

impl Element for f32 {
    const DTYPE: DType = DType::F32;
    fn to_f32(self) -> f32 {
        self
    }
    fn from_f32(v: f32) -> Self {
        v
    }
}

/// The half-precision floats, converted by `half`.
macro_rules! half_element {
    ($($t:ident => $d:ident),*) => {$(
        impl Element for $t {
            const DTYPE: DType = DType::$d;
            fn to_f32(self) -> f32 {
                $t::to_f32(self)
            }
            fn from_f32(v: f32) -> Self {
                $t::from_f32(v)
            }
        }
    )*};
}
half_element!(f16 => F16, bf16 => BF16);

impl Element for u32 {
    const DTYPE: DType = DType::U32;
    fn to_f32(self) -> f32 {
        self as f32
    }
    fn from_f32(v: f32) -> Self {
        v as u32
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_names() {
        assert_eq!(DType::F32.size_in_bytes(), 4);
        assert_eq!(DType::BF16.size_in_bytes(), 2);
        assert_eq!(<f16 as Element>::DTYPE.to_string(), "f16");
        assert_eq!(<bf16 as Element>::from_f32(1.5).to_f32(), 1.5);
    }
}
