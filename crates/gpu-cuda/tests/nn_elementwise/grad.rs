//! The CPU backward passes against central finite differences of the CPU forward passes.

use super::*;
use rand::seq::SliceRandom;

/// Every activation's backward against `(f(x + h) − f(x − h)) / 2h` with h = 1e-3, the forward
/// in f32. Tolerance `1e-3·|dy|·(1 + |f(x)| + |f'(x)|)`: the f32 rounding of the forward costs
/// about `2^-24·|f|/h ≈ 3e-5·|f|` and the truncation `h²·|f'''|/6` stays below 1e-4·|f'| on
/// these inputs (|x| <= 3, and x >= 0.1 for Log).
#[test]
fn activation_bwd_matches_finite_differences() {
    let (mut rng, _) = rng("activation_bwd_matches_finite_differences");
    let h = 1e-3f32;
    for &op in Activation::ALL {
        let x: Vec<f32> = random_vec(&mut rng, 512, 3.0)
            .into_iter()
            .map(|v| match op {
                Activation::Log => v.abs() + 0.1,
                Activation::Relu if v.abs() < 0.01 => 0.5, // away from the kink
                _ => v,
            })
            .collect();
        let dy = random_vec(&mut rng, x.len(), 1.0);
        let y = act_fwd(&CPU, op, &x);
        let dx = act_bwd(&CPU, op, &x, &y, &dy);
        // Activations act elementwise, so one shifted pass gives every partial derivative.
        let xp: Vec<f32> = x.iter().map(|v| v + h).collect();
        let xm: Vec<f32> = x.iter().map(|v| v - h).collect();
        let (fp, fm) = (act_fwd(&CPU, op, &xp), act_fwd(&CPU, op, &xm));
        for i in 0..x.len() {
            let slope = (fp[i] as f64 - fm[i] as f64) / (xp[i] as f64 - xm[i] as f64);
            let fd = slope * dy[i] as f64;
            let tol = 1e-3 * (dy[i].abs() as f64) * (1.0 + y[i].abs() as f64 + slope.abs());
            assert!(
                (fd - dx[i] as f64).abs() <= tol,
                "{op:?} at x = {}: finite difference {fd:e}, backward {:e}",
                x[i],
                dx[i]
            );
        }
    }
}

/// Max backward against finite differences of `L(x) = Σ dy · max_axis(x)`, on values at least
/// 0.01 apart so a step of 1e-3 never changes which element is the maximum; L is then exactly
/// linear in each element and the difference quotient must match to rounding (1e-6).
#[test]
fn max_axis_bwd_matches_finite_differences() {
    let (mut rng, _) = rng("max_axis_bwd_matches_finite_differences");
    let h = 1e-3f32;
    for shape in [(2, 5, 3), (3, 7, 1), (1, 4, 6), (2, 1, 2), (1, 40, 1)] {
        let (outer, n, inner) = shape;
        let mut x: Vec<f32> = (0..outer * n * inner)
            .map(|k| k as f32 * 0.01 - 0.5 + rng.random_range(0.0..0.002))
            .collect();
        x.shuffle(&mut rng);
        let dy = random_vec(&mut rng, outer * inner, 1.0);
        let loss = |v: &[f32]| -> f64 {
            let m = reduce(&CPU, ReduceKind::Max, v, shape);
            m.iter().zip(&dy).map(|(&a, &g)| a as f64 * g as f64).sum()
        };
        let y = reduce(&CPU, ReduceKind::Max, &x, shape);
        let dx = max_bwd(&CPU, &x, &y, &dy, shape);
        for k in 0..x.len() {
            let (mut xp, mut xm) = (x.clone(), x.clone());
            xp[k] += h;
            xm[k] -= h;
            let fd = (loss(&xp) - loss(&xm)) / (xp[k] as f64 - xm[k] as f64);
            assert!(
                (fd - dx[k] as f64).abs() <= 1e-6,
                "{shape:?}[{k}]: finite difference {fd}, backward {}",
                dx[k]
            );
        }
    }
}

/// Ties go to the first maximum along the axis, NaN wins, and each column gets exactly one
/// gradient.
#[test]
fn max_axis_bwd_picks_the_first_maximum() {
    // [1, 4, 2]: columns (3, 1, 3, 2), (5, 5, NaN, 5).
    let x = [3.0, 5.0, 1.0, 5.0, 3.0, f32::NAN, 2.0, 5.0];
    let shape = (1, 4, 2);
    let y = reduce(&CPU, ReduceKind::Max, &x, shape);
    assert_eq!(y[0], 3.0);
    assert!(y[1].is_nan());
    let dx = max_bwd(&CPU, &x, &y, &[10.0, 20.0], shape);
    assert_eq!(dx, [10.0, 0.0, 0.0, 0.0, 0.0, 20.0, 0.0, 0.0]);
}
