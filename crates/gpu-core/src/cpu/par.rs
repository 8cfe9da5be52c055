//! Data parallelism for the CPU backend. Work is split only into independent items (elements,
//! rows, sequences, columns of a reduction) and every item is computed exactly as the sequential
//! loop computes it, so no floating-point reduction changes order and the results do not depend
//! on the thread count.

use rayon::prelude::*;

/// Runs `f` on a worker of the pool that the CPU backend's ops run on (rayon's global pool) and
/// returns what it returns; the calling thread waits. Ops called on a worker start their
/// parallel loops there and share them with the other workers directly. Called from any other
/// thread, each op instead hands its whole loop over to the pool and sleeps until a worker
/// wakes it: two thread switches per op (the tiny GPT's CPU training step ran 6 % faster in the
/// median on the pool, 2 cores: `docs/cpu-speed.md`). Training loops on the CPU run inside
/// this.
///
/// Results are the same bits either way (the work is split as always). The caller's
/// [`crate::cpu::with_mode`] override goes along; other thread-local state (tensor-ops'
/// `no_grad`, autocast) does not, so enter the pool outside it. On a worker already, `f` just
/// runs. A panic in `f` resumes on the caller.
///
/// Worker threads get rayon's default stack (2 MiB) unless [`init_pool_stack`] ran first:
/// binaries that move deep work here (graphs are dropped recursively) call it at start-up.
pub fn on_pool<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    if rayon::current_thread_index().is_some() {
        return f();
    }
    let mode = super::fast::mode_override();
    rayon::scope(move |_| match mode {
        Some(m) => super::fast::with_mode(m, f),
        None => f(),
    })
}

/// Roughly the elements one task should cover: below this, splitting costs more than it saves.
pub(crate) const GRAIN: usize = 1 << 13;

/// The least rows of `cols` elements one task should take.
pub(crate) fn min_rows(cols: usize) -> usize {
    (GRAIN / cols.max(1)).max(1)
}

/// Builds the CPU pool (rayon's global pool, default thread count) with worker stacks of
/// `bytes`, e.g. a main thread's 8 MiB, for work moved there by [`on_pool`]. Returns false, and
/// changes nothing, when the pool exists already (any op or an earlier call built it).
pub fn init_pool_stack(bytes: usize) -> bool {
    rayon::ThreadPoolBuilder::new()
        .stack_size(bytes)
        .build_global()
        .is_ok()
}

/// Calls `f(offset, chunk)` on consecutive chunks of `out`, in parallel; `offset` is the index of
/// the chunk's first element.
pub(crate) fn for_chunks<T: Send>(out: &mut [T], f: impl Fn(usize, &mut [T]) + Sync) {
    out.par_chunks_mut(GRAIN)
        .enumerate()
        .for_each(|(i, c)| f(i * GRAIN, c));
}

/// Calls `f(row, out_row)` on every row of `cols` elements of `out`, in parallel.
pub(crate) fn for_rows<T: Send>(out: &mut [T], cols: usize, f: impl Fn(usize, &mut [T]) + Sync) {
    out.par_chunks_exact_mut(cols)
        .with_min_len(min_rows(cols))
        .enumerate()
        .for_each(|(r, o)| f(r, o));
}

/// A row-major shape with two strided views (element strides, 0 along broadcast dims), with
/// adjacent dims merged wherever both views stay linear across them.
pub(crate) struct Strided {
    shape: Vec<usize>,
    sa: Vec<usize>,
    sb: Vec<usize>,
}

impl Strided {
    pub(crate) fn new(shape: &[usize], sa: &[usize], sb: &[usize]) -> Self {
        let (mut s, mut a, mut b) = (Vec::new(), Vec::new(), Vec::new());
        for k in 0..shape.len() {
            if shape[k] == 1 {
                continue;
            }
            let last = s.len().wrapping_sub(1);
            if !s.is_empty() && a[last] == sa[k] * shape[k] && b[last] == sb[k] * shape[k] {
                s[last] *= shape[k];
                (a[last], b[last]) = (sa[k], sb[k]);
            } else {
                s.push(shape[k]);
                a.push(sa[k]);
                b.push(sb[k]);
            }
        }
        if s.is_empty() {
            (s, a, b) = (vec![1], vec![0], vec![0]);
        }
        Self {
            shape: s,
            sa: a,
            sb: b,
        }
    }

    /// Calls `f(out_row, ia, ib, step_a, step_b)` on each innermost row of `out` (row-major over
    /// the shape), in parallel: `ia`, `ib` are the offsets of the row's first element in the two
    /// views and `step_a`, `step_b` their strides along the row. Lets a caller copy or combine
    /// whole contiguous rows.
    pub(crate) fn fill_rows(
        &self,
        out: &mut [f32],
        f: impl Fn(&mut [f32], usize, usize, usize, usize) + Sync,
    ) {
        let inner = *self.shape.last().expect("at least one dim");
        if out.is_empty() {
            return;
        }
        let (sa, sb) = (self.sa[self.sa.len() - 1], self.sb[self.sb.len() - 1]);
        let outer = self.shape.len() - 1;
        let per_task = min_rows(inner);
        out.par_chunks_mut(per_task * inner)
            .enumerate()
            .for_each(|(task, chunk)| {
                // The first row's multi-index by division, then an odometer over the outer dims
                // (no division per row).
                let r0 = task * per_task;
                let mut idx = vec![0usize; outer];
                let mut rest = r0;
                for k in (0..outer).rev() {
                    idx[k] = rest % self.shape[k];
                    rest /= self.shape[k];
                }
                let (mut ia, mut ib) = self.row_offsets(r0);
                for o in chunk.chunks_exact_mut(inner) {
                    f(o, ia, ib, sa, sb);
                    for k in (0..outer).rev() {
                        idx[k] += 1;
                        ia += self.sa[k];
                        ib += self.sb[k];
                        if idx[k] < self.shape[k] {
                            break;
                        }
                        ia -= self.shape[k] * self.sa[k];
                        ib -= self.shape[k] * self.sb[k];
                        idx[k] = 0;
                    }
                }
            });
    }

    /// The offsets in both views of the first element of innermost row `r`.
    fn row_offsets(&self, mut r: usize) -> (usize, usize) {
        let (mut ia, mut ib) = (0, 0);
        for k in (0..self.shape.len() - 1).rev() {
            let i = r % self.shape[k];
            r /= self.shape[k];
            ia += i * self.sa[k];
            ib += i * self.sb[k];
        }
        (ia, ib)
    }
}

/// Sets `out[i] = Σ_r f(r, i)` for every column `i`, each sum accumulated in f64 from 0 over
/// `r = 0..rows` in order and rounded once; in parallel over blocks of columns.
pub(crate) fn column_sums(out: &mut [f32], rows: usize, f: impl Fn(usize, usize) -> f64 + Sync) {
    const BLOCK: usize = 32;
    out.par_chunks_mut(BLOCK).enumerate().for_each(|(b, o)| {
        let mut acc = [0.0f64; BLOCK];
        for r in 0..rows {
            for (j, a) in acc[..o.len()].iter_mut().enumerate() {
                *a += f(r, b * BLOCK + j);
            }
        }
        for (o, a) in o.iter_mut().zip(acc) {
            *o = a as f32;
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The merged, parallel walk visits the same offsets as a plain multi-index walk.
    #[test]
    fn strided_fill_matches_a_plain_walk() {
        let cases: [(&[usize], &[usize], &[usize]); 4] = [
            (&[3, 1, 4, 5], &[20, 0, 5, 1], &[0, 0, 1, 0]),
            (&[2, 3, 4, 5], &[60, 5, 15, 1], &[0, 0, 0, 1]),
            (&[1, 1], &[0, 0], &[0, 0]),
            (&[70, 300], &[300, 1], &[1, 0]),
        ];
        for (shape, sa, sb) in cases {
            let total: usize = shape.iter().product();
            let mut want = Vec::with_capacity(total);
            for flat in 0..total {
                let (mut rest, mut ia, mut ib) = (flat, 0, 0);
                for k in (0..shape.len()).rev() {
                    ia += rest % shape[k] * sa[k];
                    ib += rest % shape[k] * sb[k];
                    rest /= shape[k];
                }
                want.push((ia * 1000 + ib) as f32);
            }
            let mut got = vec![0.0; total];
            Strided::new(shape, sa, sb).fill_rows(&mut got, |o, ia, ib, step_a, step_b| {
                for (e, o) in o.iter_mut().enumerate() {
                    *o = ((ia + e * step_a) * 1000 + ib + e * step_b) as f32;
                }
            });
            assert_eq!(got, want, "shape {shape:?}");
        }
    }
}
