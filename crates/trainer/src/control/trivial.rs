//! The trivial predictors of `s*` that the world model must beat (issue 41, bar part iv):
//! the same controller and gate with a predictor that learns nothing. Each reads the decisions
//! so far (`world::FEATURES` per decision: feature `SCALE` of decision `i + 1` is decision
//! `i`'s `ln s*`, scaled by `1/ln(max_change)`, and the feature after it says whether that one
//! was measured) and answers in the same scaled units, with a spread the gate compares with its
//! trust bound.

use super::world::{ScalePredictor, FEATURES, SCALE};
use clap::ValueEnum;
use serde::{Deserialize, Serialize};

/// The feature that says whether the previous decision's `s*` was measured.
const MEASURED: usize = SCALE + 1;
/// The feature holding the run's progress (step / steps).
const PROGRESS: usize = 0;

/// Which predictor of `s*` the hybrid's gate may trust (`--predictor`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Predictor {
    /// The RSSM ensemble (`world::StepSizeModel`), its spread the ensemble's.
    #[default]
    Rssm,
    /// Control: the last measured `s*` again, spread 0.
    Last,
    /// Control: a power law of the run's progress, `s* = a·tᵇ`, fit by least squares to the
    /// measured `ln s*` against `ln t` (at least 3); spread the fit's RMS residual.
    PowerLaw,
}

/// The measured `(progress, scaled ln s*)` pairs of the decisions so far: decision `i`'s
/// progress is in state `i`, its `s*` and whether it was measured in state `i + 1`.
fn measured(states: &[[f32; FEATURES]]) -> Vec<(f32, f32)> {
    states
        .windows(2)
        .filter(|w| w[1][MEASURED] == 1.0)
        .map(|w| (w[0][PROGRESS], w[1][SCALE]))
        .collect()
}

/// "Repeat the last measurement".
#[derive(Debug, Default)]
pub struct LastMeasured;

impl ScalePredictor for LastMeasured {
    fn predict(&mut self, states: &[[f32; FEATURES]]) -> anyhow::Result<Option<(f32, f32)>> {
        Ok(measured(states).last().map(|&(_, y)| (y, 0.0)))
    }

    fn learn(&mut self, _states: &[[f32; FEATURES]]) -> anyhow::Result<()> {
        Ok(())
    }
}

/// A power law of the progress fit to the measured `s*` (see [`Predictor::PowerLaw`]).
#[derive(Debug, Default)]
pub struct PowerLaw;

/// The smallest progress the fit takes a logarithm of (the first decision's is ~0).
const MIN_PROGRESS: f32 = 1e-3;

impl ScalePredictor for PowerLaw {
    fn predict(&mut self, states: &[[f32; FEATURES]]) -> anyhow::Result<Option<(f32, f32)>> {
        let pts = measured(states);
        let Some(now) = states.last() else {
            return Ok(None);
        };
        if pts.len() < 3 {
            return Ok(None);
        }
        let lt = |t: f32| f64::from(t.max(MIN_PROGRESS)).ln();
        let n = pts.len() as f64;
        let mx = pts.iter().map(|p| lt(p.0)).sum::<f64>() / n;
        let my = pts.iter().map(|p| f64::from(p.1)).sum::<f64>() / n;
        let sxx: f64 = pts.iter().map(|p| (lt(p.0) - mx).powi(2)).sum();
        let sxy: f64 = pts
            .iter()
            .map(|p| (lt(p.0) - mx) * (f64::from(p.1) - my))
            .sum();
        // All at one progress (no slope to fit): the mean.
        let b = if sxx > 0.0 { sxy / sxx } else { 0.0 };
        let a = my - b * mx;
        let rss: f64 = pts
            .iter()
            .map(|p| (f64::from(p.1) - (a + b * lt(p.0))).powi(2))
            .sum();
        let pred = a + b * lt(now[PROGRESS]);
        let spread = (rss / n).sqrt();
        Ok((pred.is_finite() && spread.is_finite()).then_some((pred as f32, spread as f32)))
    }

    fn learn(&mut self, _states: &[[f32; FEATURES]]) -> anyhow::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A state at `progress` recording the previous decision's scaled `ln s*` `prev` and
    /// whether it was measured.
    fn state(progress: f32, prev: f32, was_measured: bool) -> [f32; FEATURES] {
        let mut s = [0.0; FEATURES];
        s[PROGRESS] = progress;
        s[SCALE] = prev;
        s[MEASURED] = if was_measured { 1.0 } else { 0.0 };
        s
    }

    #[test]
    fn last_measured_repeats_the_latest_measurement_and_skips_predicted_ones() {
        let mut p = LastMeasured;
        assert_eq!(p.predict(&[state(0.0, 0.0, false)]).unwrap(), None);
        let states = [
            state(0.1, 0.0, false),
            state(0.2, 0.4, true),  // decision 0 measured 0.4
            state(0.3, -0.2, true), // decision 1 measured -0.2
            state(0.4, 0.9, false), // decision 2 was predicted: not a measurement
        ];
        assert_eq!(p.predict(&states).unwrap(), Some((-0.2, 0.0)));
    }

    #[test]
    fn the_power_law_recovers_an_exact_power_law_and_extrapolates_it() {
        // s* = 2·t^-0.5 in scaled units y = ln s*/ln 2: y = 1 − 0.5·log2(t).
        let y = |t: f32| 1.0 - 0.5 * t.log2();
        let ts = [0.05f32, 0.1, 0.2, 0.3, 0.4];
        let mut states = vec![state(ts[0], 0.0, false)];
        for w in ts.windows(2) {
            states.push(state(w[1], y(w[0]), true));
        }
        // Not enough measurements yet with three states.
        assert_eq!(PowerLaw.predict(&states[..3]).unwrap(), None);
        let (pred, spread) = PowerLaw.predict(&states).unwrap().unwrap();
        assert!((pred - y(0.4)).abs() < 1e-5, "{pred} against {}", y(0.4));
        assert!(spread < 1e-5, "{spread}");
        // Noise shows as spread.
        states[2][SCALE] += 0.3;
        let (_, spread) = PowerLaw.predict(&states).unwrap().unwrap();
        assert!(spread > 0.05, "{spread}");
    }

    #[test]
    fn the_power_law_survives_a_zero_progress_and_equal_progresses() {
        let states = [
            state(0.0, 0.0, false),
            state(0.0, 0.5, true),
            state(0.0, 0.7, true),
            state(0.0, 0.3, true),
        ];
        let (pred, spread) = PowerLaw.predict(&states).unwrap().unwrap();
        assert!(
            (pred - 0.5).abs() < 1e-6 && spread.is_finite(),
            "{pred} {spread}"
        );
    }
}
