//! Optional wall-clock totals per CPU-backend op, for profiling a workload (`cpu-bench
//! --profile`). Off by default: an op then pays one relaxed atomic load. When on, every op of
//! the CPU backend adds its call count and elapsed time under its name; [`take`] returns and
//! clears the totals. Ops of the CPU backend do not call each other, so the totals do not
//! overlap.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::Instant;

static ENABLED: AtomicBool = AtomicBool::new(false);
static TOTALS: Mutex<Option<HashMap<&'static str, (u64, f64)>>> = Mutex::new(None);

/// Turns the op timer on or off (process-wide).
pub fn enable(on: bool) {
    ENABLED.store(on, Ordering::Relaxed);
}

/// One op's totals.
#[derive(Debug, Clone, PartialEq)]
pub struct OpTime {
    pub name: &'static str,
    pub calls: u64,
    pub seconds: f64,
}

/// The totals since the last call, longest first; clears them.
pub fn take() -> Vec<OpTime> {
    let map = TOTALS
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .take()
        .unwrap_or_default();
    let mut v: Vec<OpTime> = map
        .into_iter()
        .map(|(name, (calls, seconds))| OpTime {
            name,
            calls,
            seconds,
        })
        .collect();
    v.sort_by(|a, b| b.seconds.total_cmp(&a.seconds));
    v
}

/// Times the enclosing op while alive (when the timer is on).
pub(crate) struct Scope(Option<(&'static str, Instant)>);

/// Starts timing op `name`.
#[inline]
pub(crate) fn scope(name: &'static str) -> Scope {
    if ENABLED.load(Ordering::Relaxed) {
        Scope(Some((name, Instant::now())))
    } else {
        Scope(None)
    }
}

impl Drop for Scope {
    fn drop(&mut self) {
        if let Some((name, t0)) = self.0 {
            let dt = t0.elapsed().as_secs_f64();
            let mut g = TOTALS.lock().unwrap_or_else(|p| p.into_inner());
            let e = g.get_or_insert_with(HashMap::new).entry(name).or_default();
            e.0 += 1;
            e.1 += dt;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Scopes add up under their names while on, and nothing while off. (The only test that
    /// turns the timer on, so the totals are this test's.)
    #[test]
    fn scopes_add_up_only_while_enabled() {
        drop(scope("profile_test_off"));
        enable(true);
        drop(scope("profile_test_op"));
        drop(scope("profile_test_op"));
        enable(false);
        drop(scope("profile_test_op"));
        let t = take();
        let op = t.iter().find(|o| o.name == "profile_test_op").unwrap();
        assert_eq!(op.calls, 2);
        assert!(op.seconds >= 0.0);
        assert!(t.iter().all(|o| o.name != "profile_test_off"));
        assert!(take().iter().all(|o| o.name != "profile_test_op"));
    }
}
