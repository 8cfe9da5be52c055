//! Host fallbacks: the operands copied to the host, the CPU reference run on them, the
//! results copied back (bit-exact against the CPU backend). The defaults of the ops that are
//! not yet composed from primitives use these.

use crate::backend::{Backend, BufferInfo};
use crate::cpu::CpuStorage;
use crate::dtype::DType;
use crate::error::Result;
use crate::nn::optim::StepScalars;

/// A host copy of `x`.
pub fn down<B: Backend + ?Sized>(b: &B, x: &B::Buffer) -> Result<CpuStorage> {
    Ok(match x.dtype() {
        DType::F32 => CpuStorage::F32(b.download(x)?),
        DType::F16 => CpuStorage::F16(b.download(x)?),
        DType::BF16 => CpuStorage::BF16(b.download(x)?),
        DType::U32 => CpuStorage::U32(b.download(x)?),
    })
}

/// Host copies of every buffer of `xs`.
pub fn downs<B: Backend + ?Sized>(b: &B, xs: &[&B::Buffer]) -> Result<Vec<CpuStorage>> {
    xs.iter().map(|x| down(b, x)).collect()
}

/// Host copies of a fixed number of buffers, as an array to destructure.
pub fn downs_n<B: Backend + ?Sized, const N: usize>(
    b: &B,
    xs: [&B::Buffer; N],
) -> Result<[CpuStorage; N]> {
    let hs = downs(b, &xs)?;
    Ok(hs
        .try_into()
        .unwrap_or_else(|_| unreachable!("one host copy per buffer")))
}

/// Host copies of every buffer of `xs` (mutable lists).
pub fn downs_mut<B: Backend + ?Sized>(b: &B, xs: &[&mut B::Buffer]) -> Result<Vec<CpuStorage>> {
    xs.iter().map(|x| down(b, x)).collect()
}

/// Copies `h` back into `dst` (same dtype and length).
pub fn up<B: Backend + ?Sized>(b: &B, h: &CpuStorage, dst: &mut B::Buffer) -> Result<()> {
    match h {
        CpuStorage::F32(v) => b.copy_to_device(v, dst),
        CpuStorage::F16(v) => b.copy_to_device(v, dst),
        CpuStorage::BF16(v) => b.copy_to_device(v, dst),
        CpuStorage::U32(v) => b.copy_to_device(v, dst),
    }
}

/// Copies each of `hs` back into the matching buffer of `dst`.
pub fn ups<B: Backend + ?Sized>(
    b: &B,
    hs: &[CpuStorage],
    dst: &mut [&mut B::Buffer],
) -> Result<()> {
    hs.iter()
        .zip(dst.iter_mut())
        .try_for_each(|(h, d)| up(b, h, d))
}

/// Host copies of `N` lists of buffers (a list op's state, updated in place), one `Vec` a
/// list; [`ups_lists`] copies them back.
pub fn downs_lists<B: Backend + ?Sized, const N: usize>(
    b: &B,
    lists: [&[&mut B::Buffer]; N],
) -> Result<[Vec<CpuStorage>; N]> {
    let hs: Vec<_> = lists
        .iter()
        .map(|l| downs_mut(b, l))
        .collect::<Result<_>>()?;
    Ok(hs
        .try_into()
        .unwrap_or_else(|_| unreachable!("one host list per list")))
}

/// Copies each host list of [`downs_lists`] back into its list (same dtypes and lengths).
pub fn ups_lists<B: Backend + ?Sized, const N: usize>(
    b: &B,
    hs: &[Vec<CpuStorage>; N],
    lists: [&mut [&mut B::Buffer]; N],
) -> Result<()> {
    hs.iter().zip(lists).try_for_each(|(h, l)| ups(b, h, l))
}

/// Mutable references to each of `v`, the form the list ops take.
pub fn refs_mut(v: &mut [CpuStorage]) -> Vec<&mut CpuStorage> {
    v.iter_mut().collect()
}

/// A host copy of an optional buffer.
pub fn down_opt<B: Backend + ?Sized>(b: &B, x: Option<&B::Buffer>) -> Result<Option<CpuStorage>> {
    x.map(|x| down(b, x)).transpose()
}

/// The host form of step scalars: host values stay, a device buffer is copied into `held`.
pub fn scalars<'a, B: Backend + ?Sized>(
    b: &B,
    s: StepScalars<'a, B::Buffer>,
    held: &'a mut Option<CpuStorage>,
) -> Result<StepScalars<'a, CpuStorage>> {
    Ok(match s {
        StepScalars::Host(v) => StepScalars::Host(v),
        StepScalars::Device(x) => StepScalars::Device(held.insert(down(b, x)?)),
    })
}
