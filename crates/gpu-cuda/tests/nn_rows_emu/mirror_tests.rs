//! The CPU-only tests of the bounds on the f32 mirror of the kernels: the mirror stays within
//! the bounds on random shapes, and wrong mirrors fall outside them.

use super::tests::{replay_softmax, LOGGED_CROSS_ENTROPY_FWD, LOGGED_SOFTMAX_BWD, SHAPES};
use crate::common::{random_vec, CPU};
use crate::nn_rows_emu::{self as mirror, Bug, BUGS};
use crate::nn_rows_util::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Every op's mirror on random inputs (`nn_rows`' generators) stays within its bound; the
/// largest `diff/bound` of each op is printed.
#[test]
fn mirrored_kernels_are_within_the_bounds() {
    let (mut rng, _) = crate::common::rng("mirrored_kernels_are_within_the_bounds");
    let mut worst: std::collections::BTreeMap<&str, (f64, String)> = Default::default();
    let mut note = |op: &'static str, got: &[f32], want: &[f32], bound: &[f64], what: &str| {
        check_bounded(&format!("{what} {op}"), got, want, bound);
        let r = bound_ratio(got, want, bound);
        let e = worst.entry(op).or_insert((0.0, String::new()));
        if r > e.0 {
            *e = (r, what.to_string());
        }
    };
    let mut shapes = SHAPES.to_vec();
    for _ in 0..12 {
        let cols = rng.random_range(1..14_000);
        shapes.push((rng.random_range(1..6).min(200_000 / cols).max(1), cols));
    }
    for &(rows, cols) in &shapes {
        let what = format!("{rows}x{cols}");
        let (x, dy) = crate::softmax_inputs(&mut rng, rows, cols);
        let y = softmax(&CPU, &x, cols);
        let got = mirror::softmax_fwd(&x, cols, Bug::None);
        note("softmax", &got, &y, &softmax_fwd_bound(&x, cols), &what);
        let want = softmax_bwd(&CPU, &y, &dy, cols);
        let got = mirror::softmax_bwd(&y, &dy, cols, Bug::None);
        note(
            "softmax_bwd",
            &got,
            &want,
            &softmax_bwd_bound(&y, &dy, cols),
            &what,
        );
        let ly = log_softmax(&CPU, &x, cols);
        let got = mirror::log_softmax_fwd(&x, cols, Bug::None);
        note(
            "log_softmax",
            &got,
            &ly,
            &log_softmax_fwd_bound(&x, cols),
            &what,
        );
        let want = log_softmax_bwd(&CPU, &ly, &dy, cols);
        let got = mirror::log_softmax_bwd(&ly, &dy, cols, Bug::None);
        let bound = log_softmax_bwd_bound(&ly, &dy, cols);
        note("log_softmax_bwd", &got, &want, &bound, &what);

        let (x, t, dl) = crate::cross_entropy_inputs(&mut rng, rows, cols);
        let want = ce_fwd(&CPU, &x, &t, cols);
        let got = mirror::cross_entropy_fwd(&x, &t, cols, Bug::None);
        note(
            "cross_entropy",
            &got,
            &want,
            &cross_entropy_fwd_bound(&x, &t, cols),
            &what,
        );
        let want = ce_bwd(&CPU, &x, &t, &dl, cols);
        let got = mirror::cross_entropy_bwd(&x, &t, &dl, cols, Bug::None);
        let bound = cross_entropy_bwd_bound(&x, &t, &dl, cols);
        note("cross_entropy_bwd", &got, &want, &bound, &what);

        let x: Vec<f32> = random_vec(&mut rng, rows * cols, 3.0)
            .iter()
            .map(|v| v + 5.0)
            .collect();
        norm_mirror(&mut rng, &x, cols, &what, &mut note);
    }
    // The extreme rows of `nn_rows_extreme`.
    for cols in [7, 64, 1025, 6020, 20_000] {
        for c in [1e20f32, -1e20, 3e38, -3e38, 1e-40, 0.0, 7.0] {
            let x = vec![c; 3 * cols];
            norm_mirror(
                &mut rng,
                &x,
                cols,
                &format!("const {c:e} x{cols}"),
                &mut note,
            );
        }
        let mut x: Vec<f32> = (0..3 * cols)
            .map(|i| [1e20, -5e19, 2.5][i / cols])
            .collect();
        x[2 * cols] = -2.5;
        norm_mirror(&mut rng, &x, cols, &format!("mixed x{cols}"), &mut note);
        for (scale, offset) in [(3e20f32, 0.0f32), (3e37, 0.0), (1.7e38, 0.0), (1e19, 1e20)] {
            let x: Vec<f32> = random_vec(&mut rng, 2 * cols, 1.0)
                .iter()
                .map(|v| v * scale + offset)
                .collect();
            norm_mirror(
                &mut rng,
                &x,
                cols,
                &format!("{scale:e}·U+{offset:e}"),
                &mut note,
            );
        }
        let mut outlier = random_vec(&mut rng, 2 * cols, 1.0);
        outlier[0] = 1e4;
        outlier[cols] = -3e6;
        norm_mirror(&mut rng, &outlier, cols, "outlier", &mut note);
        let mut spike = vec![0.0f32; cols];
        spike[0] = 5e3;
        norm_mirror(&mut rng, &spike, cols, "spike", &mut note);
        let tiny: Vec<f32> = (0..2 * cols)
            .map(|_| rng.random_range(-1e-39..1e-39))
            .collect();
        norm_mirror(&mut rng, &tiny, cols, "denormal", &mut note);
        let mut wild = random_vec(&mut rng, cols, 1.0);
        wild[0] = f32::MAX;
        wild[cols - 1] = -f32::MAX;
        norm_mirror(&mut rng, &wild, cols, "±FLT_MAX", &mut note);
    }
    for (op, (r, what)) in &worst {
        println!("{op}: largest diff/bound {r:.3} ({what})");
    }
}

type Note<'a> = dyn FnMut(&'static str, &[f32], &[f32], &[f64], &str) + 'a;

/// LayerNorm and RMSNorm mirrored as `norm_check` runs them (the backward on the reference's
/// statistics), on GPUs of 132 (an H200), 8 and 1 multiprocessors for the column sums.
fn norm_mirror(rng: &mut StdRng, x: &[f32], cols: usize, what: &str, note: &mut Note) {
    let eps = 1e-5;
    let (w, b) = (random_vec(rng, cols, 2.0), random_vec(rng, cols, 1.0));
    let dy = random_vec(rng, x.len(), 1.0);
    let rows = x.len() / cols;
    let (y, mean, rstd) = ln_fwd(&CPU, x, &w, &b, cols, eps);
    let (gy, gm, gr) = mirror::layernorm_fwd(x, &w, &b, cols, eps, Bug::None);
    let bd = layernorm_fwd_bounds(x, &w, &b, cols, eps);
    note("layernorm y", &gy, &y, &bd.y, what);
    note("layernorm mean", &gm, &mean, &bd.mean, what);
    note("layernorm rstd", &gr, &rstd, &bd.rstd, what);
    let (ry, rr) = rms_fwd(&CPU, x, &w, cols, eps);
    let (gy, gr) = mirror::rmsnorm_fwd(x, &w, cols, eps, Bug::None);
    let bd = rmsnorm_fwd_bounds(x, &w, cols, eps);
    note("rmsnorm y", &gy, &ry, &bd.y, what);
    note("rmsnorm rstd", &gr, &rr, &bd.rstd, what);
    let ln = NormBwd::layernorm((x, &w), (&mean, &rstd), &dy, cols);
    let rms = NormBwd::rmsnorm((x, &w), &rr, &dy, cols);
    let (dx, dw, db) = ln_bwd(&CPU, ln);
    let (rdx, rdw) = rms_bwd(&CPU, rms);
    for sms in [132, 8, 1] {
        let cd = col_depth(rows, cols, Some(sms));
        let (gdx, gdw, gdb) = mirror::layernorm_bwd(ln, sms, Bug::None);
        let bd = layernorm_bwd_bounds(ln, cd);
        note("layernorm dx", &gdx, &dx, &bd.dx, what);
        note("layernorm dw", &gdw, &dw, &bd.dw, what);
        note("layernorm db", &gdb, &db, &bd.db, what);
        let (gdx, gdw) = mirror::rmsnorm_bwd(rms, sms, Bug::None);
        let bd = rmsnorm_bwd_bounds(rms, cd);
        note("rmsnorm dx", &gdx, &rdx, &bd.dx, what);
        note("rmsnorm dw", &gdw, &rdw, &bd.dw, what);
    }
}

/// Every op's mirror made wrong in each way that applies to it fails its bound: on the replayed
/// cancelling rows (where the result is tiny and the bound is that of the terms) and on random
/// shapes of several rows.
#[test]
fn wrong_kernels_fail_the_bounds() {
    let (mut rng, _) = crate::common::rng("wrong_kernels_fail_the_bounds");
    let rejects = |op: &str, bug: Bug, got: &[f32], want: &[f32], bound: &[f64], what: &str| {
        assert!(
            bound_violation(got, want, bound).is_some(),
            "{what} {op} with {bug:?}: a wrong result passes its bound"
        );
    };
    // The replayed cancelling rows (one row: no other row to take statistics from).
    for &(seed, cols, ..) in LOGGED_SOFTMAX_BWD {
        let (y, dy) = replay_softmax(seed, cols);
        let want = softmax_bwd(&CPU, &y, &dy, cols);
        let bound = softmax_bwd_bound(&y, &dy, cols);
        for bug in [Bug::DropTerm, Bug::FlipSign] {
            let got = mirror::softmax_bwd(&y, &dy, cols, bug);
            rejects(
                "softmax_bwd",
                bug,
                &got,
                &want,
                &bound,
                &format!("seed {seed}"),
            );
        }
    }
    for &(seed, cols, ..) in LOGGED_CROSS_ENTROPY_FWD {
        let mut rng = StdRng::seed_from_u64(seed);
        let _ = crate::softmax_inputs(&mut rng, 1, cols);
        let (x, t, dl) = crate::cross_entropy_inputs(&mut rng, 1, cols);
        let (want, bound) = (
            ce_fwd(&CPU, &x, &t, cols),
            cross_entropy_fwd_bound(&x, &t, cols),
        );
        let (bwant, bbound) = (
            ce_bwd(&CPU, &x, &t, &dl, cols),
            cross_entropy_bwd_bound(&x, &t, &dl, cols),
        );
        for bug in [Bug::DropTerm, Bug::FlipSign, Bug::OffByOne] {
            let what = format!("seed {seed}");
            let got = mirror::cross_entropy_fwd(&x, &t, cols, bug);
            rejects("cross_entropy", bug, &got, &want, &bound, &what);
            let got = mirror::cross_entropy_bwd(&x, &t, &dl, cols, bug);
            rejects("cross_entropy_bwd", bug, &got, &bwant, &bbound, &what);
        }
    }
    let shapes = [
        (3, 3),
        (2, 4),
        (5, 31),
        (4, 65),
        (3, 1024),
        (3, 1025),
        (2, 5001),
        (2, 13_001),
    ];
    for (rows, cols) in shapes {
        let what = format!("{rows}x{cols}");
        let (x, dy) = crate::softmax_inputs(&mut rng, rows, cols);
        let y = softmax(&CPU, &x, cols);
        let ly = log_softmax(&CPU, &x, cols);
        let (sw, sb) = (
            softmax_bwd(&CPU, &y, &dy, cols),
            softmax_bwd_bound(&y, &dy, cols),
        );
        let (lw, lb) = (
            log_softmax_bwd(&CPU, &ly, &dy, cols),
            log_softmax_bwd_bound(&ly, &dy, cols),
        );
        for bug in [Bug::DropTerm, Bug::NextRow] {
            let got = mirror::softmax_fwd(&x, cols, bug);
            rejects(
                "softmax",
                bug,
                &got,
                &y,
                &softmax_fwd_bound(&x, cols),
                &what,
            );
        }
        for bug in [Bug::DropTerm, Bug::FlipSign, Bug::NextRow] {
            let got = mirror::softmax_bwd(&y, &dy, cols, bug);
            rejects("softmax_bwd", bug, &got, &sw, &sb, &what);
            let got = mirror::log_softmax_fwd(&x, cols, bug);
            rejects(
                "log_softmax",
                bug,
                &got,
                &ly,
                &log_softmax_fwd_bound(&x, cols),
                &what,
            );
            let got = mirror::log_softmax_bwd(&ly, &dy, cols, bug);
            rejects("log_softmax_bwd", bug, &got, &lw, &lb, &what);
        }
        let (x, t, dl) = crate::cross_entropy_inputs(&mut rng, rows, cols);
        let (fw, fb) = (
            ce_fwd(&CPU, &x, &t, cols),
            cross_entropy_fwd_bound(&x, &t, cols),
        );
        let (bw, bb) = (
            ce_bwd(&CPU, &x, &t, &dl, cols),
            cross_entropy_bwd_bound(&x, &t, &dl, cols),
        );
        for bug in BUGS {
            let got = mirror::cross_entropy_fwd(&x, &t, cols, bug);
            rejects("cross_entropy", bug, &got, &fw, &fb, &what);
            let got = mirror::cross_entropy_bwd(&x, &t, &dl, cols, bug);
            rejects("cross_entropy_bwd", bug, &got, &bw, &bb, &what);
        }

        let eps = 1e-5;
        let x: Vec<f32> = random_vec(&mut rng, rows * cols, 3.0)
            .iter()
            .map(|v| v + 5.0)
            .collect();
        let (w, b) = (
            random_vec(&mut rng, cols, 2.0),
            random_vec(&mut rng, cols, 1.0),
        );
        let dy = random_vec(&mut rng, x.len(), 1.0);
        let (y, mean, rstd) = ln_fwd(&CPU, &x, &w, &b, cols, eps);
        let bd = layernorm_fwd_bounds(&x, &w, &b, cols, eps);
        let (ry, rr) = rms_fwd(&CPU, &x, &w, cols, eps);
        let rbd = rmsnorm_fwd_bounds(&x, &w, cols, eps);
        for bug in [Bug::DropTerm, Bug::FlipSign, Bug::NextRow] {
            let (gy, ..) = mirror::layernorm_fwd(&x, &w, &b, cols, eps, bug);
            rejects("layernorm y", bug, &gy, &y, &bd.y, &what);
            let (gy, _) = mirror::rmsnorm_fwd(&x, &w, cols, eps, bug);
            rejects("rmsnorm y", bug, &gy, &ry, &rbd.y, &what);
        }
        let (_, gm, _) = mirror::layernorm_fwd(&x, &w, &b, cols, eps, Bug::DropTerm);
        rejects("layernorm mean", Bug::DropTerm, &gm, &mean, &bd.mean, &what);
        let (_, gr) = mirror::rmsnorm_fwd(&x, &w, cols, eps, Bug::DropTerm);
        rejects("rmsnorm rstd", Bug::DropTerm, &gr, &rr, &rbd.rstd, &what);

        let sms = 132;
        let cd = col_depth(rows, cols, Some(sms));
        let ln = NormBwd::layernorm((&x, &w), (&mean, &rstd), &dy, cols);
        let rms = NormBwd::rmsnorm((&x, &w), &rr, &dy, cols);
        let (dx, dw, db) = ln_bwd(&CPU, ln);
        let bd = layernorm_bwd_bounds(ln, cd);
        let (rdx, rdw) = rms_bwd(&CPU, rms);
        let rbd = rmsnorm_bwd_bounds(rms, cd);
        for bug in [Bug::DropTerm, Bug::FlipSign, Bug::NextRow] {
            let (gdx, ..) = mirror::layernorm_bwd(ln, sms, bug);
            rejects("layernorm dx", bug, &gdx, &dx, &bd.dx, &what);
            let (gdx, _) = mirror::rmsnorm_bwd(rms, sms, bug);
            rejects("rmsnorm dx", bug, &gdx, &rdx, &rbd.dx, &what);
        }
        let bug = Bug::OffByOne;
        let (_, gdw, gdb) = mirror::layernorm_bwd(ln, sms, bug);
        rejects("layernorm dw", bug, &gdw, &dw, &bd.dw, &what);
        rejects("layernorm db", bug, &gdb, &db, &bd.db, &what);
        let (_, gdw) = mirror::rmsnorm_bwd(rms, sms, bug);
        rejects("rmsnorm dw", bug, &gdw, &rdw, &rbd.dw, &what);
    }
}
