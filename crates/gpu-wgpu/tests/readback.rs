//! Asynchronous read-back (`WgpuBackend::read_async`): the values a download gives, in program
//! order (work queued after the read does not reach it), for every dtype at odd lengths and
//! empty; a wrong dtype refused; an index check of earlier work reported by `wait`; a read
//! dropped unwaited harms nothing. Without an adapter it prints `SKIP` and returns (fails with
//! `HYBRID_REQUIRE_WGPU=1`).

mod common;

use common::{randn, rng};
use gpu_core::nn::{IdRows, Primitives};
use gpu_core::{Backend, DType, GpuError};
use gpu_wgpu::testing::backend_or_skip;
use half::bf16;

#[test]
fn read_async_gives_a_downloads_values_in_program_order() {
    let Some(b) = backend_or_skip("read_async_gives_a_downloads_values_in_program_order") else {
        return;
    };
    let mut r = rng("read_async");
    for n in [0usize, 1, 3, 257, 4099] {
        let x = randn(&mut r, n, 3.0);
        let mut d = b.upload(&x).unwrap();
        let pending = b.read_async::<f32>(&d).unwrap();
        // Queued after the read: the read must not see it.
        b.fill(&mut d, 9.0).unwrap();
        assert_eq!(pending.wait().unwrap(), x, "f32 × {n}");
        let h: Vec<bf16> = x.iter().map(|&v| bf16::from_f32(v)).collect();
        let hb = b.upload(&h).unwrap();
        assert_eq!(b.read_async::<bf16>(&hb).unwrap().wait().unwrap(), h);
        let u: Vec<u32> = (0..n as u32).map(|i| i.wrapping_mul(2654435761)).collect();
        let mut ub = b.upload(&u).unwrap();
        let mut p = b.read_async::<u32>(&ub).unwrap();
        b.fill(&mut ub, 0.0).unwrap();
        while !p.is_ready() {
            std::thread::yield_now();
        }
        assert_eq!(p.wait().unwrap(), u);
    }
    // A wrong dtype or length is refused before anything is queued.
    let f = b.upload(&[1.0f32, 2.0]).unwrap();
    assert!(matches!(
        b.read_async::<u32>(&f),
        Err(GpuError::DTypeMismatch { .. })
    ));
    // Dropped without waiting: nothing breaks, later reads are right.
    drop(b.read_async::<f32>(&f).unwrap());
    assert_eq!(b.download::<f32>(&f).unwrap(), [1.0, 2.0]);
}

#[test]
fn wait_reports_the_index_checks_of_earlier_work() {
    let Some(b) = backend_or_skip("wait_reports_the_index_checks_of_earlier_work") else {
        return;
    };
    let table = b.upload(&[1.0f32; 4]).unwrap();
    let ids = b.upload(&[3u32]).unwrap();
    let mut out = b.allocate(DType::F32, 2).unwrap();
    b.gather_rows(IdRows::new(&ids, &table, 2), &mut out)
        .unwrap();
    let e = b.read_async::<f32>(&out).unwrap().wait().unwrap_err();
    assert!(
        matches!(
            e,
            GpuError::IndexOutOfRange {
                value: 3,
                bound: 2,
                ..
            }
        ),
        "{e}"
    );
    b.synchronize().unwrap();
}

/// One backend shared by two threads: a bad id goes to the thread that queued it, at its own
/// next wait, even when the other thread's wait read it first; the other thread gets none.
#[test]
fn a_bad_id_is_reported_to_the_thread_that_queued_it() {
    let Some(b) = backend_or_skip("a_bad_id_is_reported_to_the_thread_that_queued_it") else {
        return;
    };
    for _ in 0..20 {
        let queued = std::sync::Barrier::new(2);
        let read = std::sync::Barrier::new(2);
        std::thread::scope(|s| {
            let t = s.spawn(|| {
                let table = b.upload(&[1.0f32; 4]).unwrap();
                let ids = b.upload(&[0u32, 5]).unwrap();
                let mut out = b.allocate(DType::F32, 4).unwrap();
                b.gather_rows(IdRows::new(&ids, &table, 2), &mut out)
                    .unwrap();
                queued.wait();
                read.wait();
                b.synchronize()
            });
            queued.wait();
            // This thread's wait runs the other's launch and reads its slot: not its error.
            let mine = b.synchronize();
            read.wait();
            let theirs = t.join().unwrap();
            assert!(mine.is_ok(), "{mine:?}");
            assert!(
                matches!(theirs, Err(GpuError::IndexOutOfRange { value: 5, .. })),
                "{theirs:?}"
            );
        });
    }
}
