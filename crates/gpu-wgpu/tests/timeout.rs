//! A wait that times out (`HYBRID_WGPU_TIMEOUT_MS`, set here before the backend is made, in a
//! test binary of its own) is a typed `Timeout` error that changes nothing: the index checks
//! of the launches before it stay pending, and the first wait that completes reports them.
//! Without an adapter it prints `SKIP` and returns (fails with `HYBRID_REQUIRE_WGPU=1`).
//!
//! On a CPU adapter the read must time out: the bound is 10 ms and the products queued before
//! it are 11 GFLOP (48 of 384³): ~0.35 s at the ~30 GFLOP/s lavapipe gave on this project's
//! 2-core machine, a ~35× margin (it did the old 12 in under 100 ms, the old bound).

use gpu_core::nn::{IdRows, Primitives};
use gpu_core::{Backend, DType, GpuError, MatmulOps, MatmulSpec};
use gpu_wgpu::testing::wgpu_required;
use gpu_wgpu::{WgpuBackend, POLL_TIMEOUT_ENV};
use std::time::{Duration, Instant};

fn is_timeout(e: &GpuError) -> bool {
    matches!(e, GpuError::Timeout { .. })
}

#[test]
fn a_timed_out_read_keeps_the_index_checks_for_the_next_wait() {
    std::env::set_var(POLL_TIMEOUT_ENV, "10");
    let b = match WgpuBackend::new(0) {
        Ok(b) => b,
        Err(e) => {
            assert!(!wgpu_required(), "no wgpu adapter: {e}");
            eprintln!("SKIP a_timed_out_read_keeps_the_index_checks_for_the_next_wait: {e}");
            return;
        }
    };
    let cpu = b.info().adapter.device_type == wgpu::DeviceType::Cpu;
    // A bad id (3 >= 2 rows), then far more than 10 ms of products on any device.
    let table = b.upload(&[1.0f32; 4]).unwrap();
    let ids = b.upload(&[3u32]).unwrap();
    let mut out = b.allocate(DType::F32, 2).unwrap();
    b.gather_rows(IdRows::new(&ids, &table, 2), &mut out)
        .unwrap();
    let (n, reps) = if cpu { (384, 48) } else { (4096, 80) };
    let x = b.upload(&vec![0.5f32; n * n]).unwrap();
    let mut y = b.allocate(DType::F32, n * n).unwrap();
    for _ in 0..reps {
        b.matmul(MatmulSpec::new(n, n, n), &x, &x, &mut y).unwrap();
    }
    let first = b.download::<f32>(&out);
    let timed_out = first.as_ref().is_err_and(is_timeout);
    eprintln!("first read: {first:?} (timed out: {timed_out})");
    if cpu {
        assert!(
            timed_out,
            "the products were meant to outlast the 10 ms bound"
        );
    }
    // Wait on, one bounded wait at a time, for at most two minutes of wall-clock.
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut last = first.map(drop);
    while last.as_ref().is_err_and(is_timeout) && Instant::now() < deadline {
        last = b.synchronize();
    }
    assert!(
        matches!(
            last,
            Err(GpuError::IndexOutOfRange {
                value: 3,
                bound: 2,
                ..
            })
        ),
        "the bad id queued before the timed-out read must be reported: {last:?}"
    );
    // Reported once; the backend works on.
    b.synchronize().unwrap();
    assert_eq!(b.download::<f32>(&table).unwrap(), [1.0; 4]);
}
