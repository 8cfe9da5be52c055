//! CUDA graphs (`gpu_cuda::graph`): a capture records without running, a replay runs what was
//! recorded on the buffers' current contents, a failed capture leaves the stream usable, and
//! other threads' work for the same device never lands in a graph being captured (the capture
//! gate). Tests named `gpu_*` skip with a printed reason without a GPU.

mod common;

use common::*;
use gpu_core::{Backend, GpuError};
use gpu_cuda::CudaBackend;
use rand::{rngs::StdRng, Rng, SeedableRng};

/// `c = b·b` (column-major n × n) after `b = a`: the sequence the tests capture.
fn queue(
    gpu: &CudaBackend,
    n: usize,
    bufs: (
        &gpu_cuda::CudaBuffer,
        &mut gpu_cuda::CudaBuffer,
        &mut gpu_cuda::CudaBuffer,
    ),
) -> gpu_core::Result<()> {
    let (a, b, c) = bufs;
    gpu.copy_buffer(a, b)?;
    gpu.gemm_cm(
        (false, false),
        (n, n, n),
        (1.0, 0.0),
        (b, n),
        (b, n),
        (c, n),
    )
}

#[test]
fn gpu_captured_graphs_replay_what_they_recorded() {
    let (gpu, mut r) = skip_unless!(gpu_and_rng("gpu_captured_graphs_replay_what_they_recorded"));
    let n = 48;
    let a = up(&gpu, &random_vec(&mut r, n * n, 1.0));
    let mut b = up(&gpu, &vec![f32::NAN; n * n]);
    let mut c = up(&gpu, &vec![f32::NAN; n * n]);
    let graph = gpu.capture(|g| queue(g, n, (&a, &mut b, &mut c))).unwrap();
    // Recorded, not run.
    assert!(down(&gpu, &c).iter().all(|v| v.is_nan()));
    // The same sequence issued eagerly into other buffers is the reference.
    let (mut b2, mut c2) = (up(&gpu, &vec![0.0; n * n]), up(&gpu, &vec![0.0; n * n]));
    queue(&gpu, n, (&a, &mut b2, &mut c2)).unwrap();
    gpu.launch_graph(&graph).unwrap();
    assert_eq!(down(&gpu, &c), down(&gpu, &c2));
    // A replay reads the buffers' contents at replay time.
    let a_new = random_vec(&mut r, n * n, 2.0);
    let mut a_buf = a;
    gpu.copy_to_device(&a_new, &mut a_buf).unwrap();
    gpu.launch_graph(&graph).unwrap();
    gpu.launch_graph(&graph).unwrap();
    queue(&gpu, n, (&a_buf, &mut b2, &mut c2)).unwrap();
    assert_eq!(down(&gpu, &c), down(&gpu, &c2));
    // Another backend instance refuses the graph.
    let other = CudaBackend::new(0).unwrap();
    assert!(other.launch_graph(&graph).is_err());
}

#[test]
fn gpu_failed_captures_are_typed_errors_and_leave_the_stream_usable() {
    let (gpu, mut r) = skip_unless!(gpu_and_rng(
        "gpu_failed_captures_are_typed_errors_and_leave_the_stream_usable"
    ));
    let x = random_vec(&mut r, 1000, 1.0);
    let a = up(&gpu, &x);
    let mut b = up(&gpu, &vec![0.0; 1000]);
    // The closure's own error comes back.
    let e = gpu
        .capture(|g| {
            g.copy_buffer(&a, &mut b)?;
            Err(GpuError::invalid("test", "stop here"))
        })
        .unwrap_err();
    assert!(e.to_string().contains("stop here"), "{e}");
    // An empty capture is an error too.
    assert!(gpu.capture(|_| Ok(())).is_err());
    // So is an upload inside one (a recorded copy would read freed host memory at replay).
    let e = gpu
        .capture(|g| {
            g.copy_buffer(&a, &mut b)?;
            g.copy_to_device(&x, &mut b)
        })
        .unwrap_err();
    assert!(e.to_string().contains("host-to-device"), "{e}");
    // Nothing of the above ran, and the stream works.
    assert!(down(&gpu, &b).iter().all(|&v| v == 0.0));
    gpu.copy_buffer(&a, &mut b).unwrap();
    assert_eq!(down(&gpu, &b), x);
}

#[test]
fn gpu_other_threads_work_waits_while_a_graph_is_captured() {
    let test = "gpu_other_threads_work_waits_while_a_graph_is_captured";
    let (gpu, mut r) = skip_unless!(gpu_and_rng(test));
    let n = 64;
    let a = up(&gpu, &random_vec(&mut r, n * n, 1.0));
    let mut b = up(&gpu, &vec![0.0; n * n]);
    let mut c = up(&gpu, &vec![0.0; n * n]);
    let worker_seed: u64 = r.random();
    let stop = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        // Another thread copies and reads back all along: each of its round trips must see
        // its own data (none of its copies swallowed by a graph, no read-back refused).
        let worker = s.spawn(|| {
            let mut rounds = 0u32;
            let mut local = StdRng::seed_from_u64(worker_seed);
            // Every tenth round on a fresh backend instance of the same device: its context's
            // new stream and its pool's frees at drop must not break the capture either.
            while rounds < 100_000
                && (!stop.load(std::sync::atomic::Ordering::Relaxed) || rounds < 20)
            {
                let fresh = (rounds % 10 == 9).then(|| CudaBackend::new(0).unwrap());
                let b = fresh.as_ref().unwrap_or(&gpu);
                let x = random_vec(&mut local, 4096, 1.0);
                let src = up(b, &x);
                let mut dst = up(b, &vec![0.0; 4096]);
                b.copy_buffer(&src, &mut dst).unwrap();
                assert_eq!(down(b, &dst), x, "round {rounds}");
                rounds += 1;
            }
            rounds
        });
        // Errors are collected, not unwrapped, so that the worker is always told to stop.
        let mut failures = Vec::new();
        for _ in 0..30 {
            let captured = gpu.capture(|g| {
                for _ in 0..8 {
                    queue(g, n, (&a, &mut b, &mut c))?;
                }
                Ok(())
            });
            match captured.and_then(|graph| gpu.launch_graph(&graph)) {
                Ok(()) => {}
                Err(e) => failures.push(e.to_string()),
            }
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let rounds = worker.join().unwrap();
        eprintln!("{test}: the other thread made {rounds} round trips");
        assert!(failures.is_empty(), "captures failed: {failures:?}");
    });
    let (mut b2, mut c2) = (up(&gpu, &vec![0.0; n * n]), up(&gpu, &vec![0.0; n * n]));
    queue(&gpu, n, (&a, &mut b2, &mut c2)).unwrap();
    assert_eq!(down(&gpu, &c), down(&gpu, &c2));
}

/// Memory touched by a capture belongs to the graph: a buffer made and dropped inside it (the
/// step's temporaries), a cached block it took over, and a buffer made before and dropped during
/// it are never handed out again while the graph lives, so eager work after the capture cannot
/// overwrite what a replay reads. The replay still computes the recorded sequence after that
/// eager work ran over freshly allocated buffers of every size involved.
#[test]
fn gpu_memory_of_a_capture_is_reserved_for_its_graph() {
    let (gpu, mut r) = skip_unless!(gpu_and_rng(
        "gpu_memory_of_a_capture_is_reserved_for_its_graph"
    ));
    let n = 40;
    let a = up(&gpu, &random_vec(&mut r, n * n, 1.0));
    let mut c = up(&gpu, &vec![0.0; n * n]);
    let early_out = up(&gpu, &vec![0.0; n * n]);
    let mut early_in = Some(up(&gpu, &vec![0.0; n * n]));
    // A cached block of the temporaries' size, for the capture to take over.
    drop(up(&gpu, &vec![0.0; n * n]));
    let mut inside = Vec::new();
    let graph = gpu
        .capture(|g| {
            let mut t = g.allocate(gpu_core::DType::F32, n * n)?;
            inside.push(t.device_ptr());
            queue(g, n, (&a, &mut t, &mut c))?;
            drop(t);
            if let Some(e) = early_in.take() {
                inside.push(e.device_ptr());
            }
            // Freed inside, allocated again inside: still the graph's blocks.
            let mut t2 = g.allocate(gpu_core::DType::F32, n * n)?;
            inside.push(t2.device_ptr());
            g.copy_buffer(&c, &mut t2)?;
            let mut t3 = g.allocate(gpu_core::DType::F32, n * n)?;
            inside.push(t3.device_ptr());
            queue(g, n, (&t2, &mut t3, &mut c))
        })
        .unwrap();
    let early_ptr = early_out.device_ptr();
    drop(early_out); // after the capture: still the shared pool's
    let reserved = graph.memory_stats();
    assert!(reserved.bytes_cached > 0, "{reserved:?}");
    // Eager allocations of the same size after the capture: none at a graph address; the block
    // freed after the capture ended is served again.
    let after: Vec<_> = (0..16).map(|_| up(&gpu, &vec![f32::NAN; n * n])).collect();
    for b in &after {
        assert!(
            !inside.contains(&b.device_ptr()),
            "{:#x} reused",
            b.device_ptr()
        );
    }
    assert!(after.iter().any(|b| b.device_ptr() == early_ptr));
    // The replay against the same sequence run eagerly.
    gpu.launch_graph(&graph).unwrap();
    let got = down(&gpu, &c);
    let (mut t, mut c2) = (up(&gpu, &vec![0.0; n * n]), up(&gpu, &vec![0.0; n * n]));
    queue(&gpu, n, (&a, &mut t, &mut c2)).unwrap();
    let mut t2 = up(&gpu, &vec![0.0; n * n]);
    gpu.copy_buffer(&c2, &mut t2).unwrap();
    let mut t3 = up(&gpu, &vec![0.0; n * n]);
    queue(&gpu, n, (&t2, &mut t3, &mut c2)).unwrap();
    assert_eq!(got, down(&gpu, &c2));
    assert!(after
        .iter()
        .all(|b| down(&gpu, b).iter().all(|v| v.is_nan())));
}
