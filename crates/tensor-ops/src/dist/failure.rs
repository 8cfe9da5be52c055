//! How a rank leaves a failed job: NCCL's abort, bounded in time, and the exit status that
//! tells the launcher another rank was the cause.

use gpu_cuda::nccl::AbortHandle;
use std::time::Duration;

/// The exit status of a rank that gave up because another rank died or hung (the launcher's
/// `EXIT_PEER_LOST` is the same number: it reports another rank's status first).
pub const EXIT_DIST_FAILURE: i32 = 75;

/// Reports a failure of the job and leaves: NCCL's abort path (pending collectives return),
/// then the process ends at once with [`EXIT_DIST_FAILURE`]. Called from watcher threads while
/// the main thread may be blocked in the device (or still queueing work), so the abort runs
/// on its own thread and gets [`ABORT_WAIT`], and the process ends with `_exit`: exit handlers
/// and destructors (NCCL's and the driver's included) would wait for the blocked work.
pub(super) fn fail(rank: usize, abort: &AbortHandle, why: &str) -> ! {
    eprintln!("rank {rank}: {why}; aborting the NCCL communicator and exiting");
    abort_within(rank, abort);
    use std::io::Write;
    let _ = std::io::stdout().flush();
    let _ = std::io::stderr().flush();
    // SAFETY: `_exit` ends the process without running exit handlers or destructors; nothing
    // after this point relies on them (output is flushed above).
    unsafe { libc::_exit(EXIT_DIST_FAILURE) }
}

/// NCCL's abort on its own thread, waited for at most [`ABORT_WAIT`] (a busy communicator, or
/// one that a CUDA graph still uses, can keep `ncclCommAbort` from returning). Returns whether
/// the call returned; says on stderr what went wrong.
pub(super) fn abort_within(rank: usize, abort: &AbortHandle) -> bool {
    let (tx, rx) = std::sync::mpsc::channel();
    let handle = abort.clone();
    std::thread::spawn(move || {
        let _ = tx.send(handle.abort(ABORT_WAIT / 2));
    });
    match rx.recv_timeout(ABORT_WAIT) {
        Ok(true) => true,
        Ok(false) => {
            eprintln!("rank {rank}: the communicator was busy or already gone");
            true
        }
        Err(_) => {
            eprintln!(
                "rank {rank}: ncclCommAbort did not return within {} s",
                ABORT_WAIT.as_secs()
            );
            false
        }
    }
}

/// How long a failing rank waits for NCCL's abort before it exits anyway.
pub const ABORT_WAIT: Duration = Duration::from_secs(3);
