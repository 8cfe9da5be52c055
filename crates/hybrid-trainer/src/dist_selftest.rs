//! `hybrid-trainer dist-selftest` (hidden): the launcher's and the rendezvous's end-to-end
//! check, without a GPU. Every process joins the rendezvous, receives rank 0's id, gathers
//! the ranks, prints `rank R of W ok [..]`, then watches the others. With
//! `HYBRID_DIST_SELFTEST=exit-rankK` rank K exits with code 3 as soon as the watch has started
//! (without goodbye), and the others wait up to 20 s for the loss, which they print as
//! `rank R: <error>` before exiting with [`EXIT_PEER_LOST`]; `exit-rankK-deaf` makes them print it but
//! keep running (for the launcher's grace period).

use crate::launch::EXIT_PEER_LOST;
use anyhow::{bail, ensure, Context, Result};
use std::time::{Duration, Instant};
use tensor_ops::dist::{DistEnv, Rendezvous, ID_BYTES};

/// The fault-injection variable.
pub const FAULT_ENV: &str = "HYBRID_DIST_SELFTEST";
/// How long every step may take.
const WAIT: Duration = Duration::from_secs(20);

/// The fault to inject: the rank that dies, and whether the others ignore the loss.
fn fault() -> Result<Option<(usize, bool)>> {
    let Ok(v) = std::env::var(FAULT_ENV) else {
        return Ok(None);
    };
    let v = v.trim();
    if v.is_empty() || v == "ok" {
        return Ok(None);
    }
    let (rest, deaf) = match v.strip_suffix("-deaf") {
        Some(r) => (r, true),
        None => (v, false),
    };
    match rest.strip_prefix("exit-rank").map(str::parse::<usize>) {
        Some(Ok(k)) => Ok(Some((k, deaf))),
        _ => bail!("{FAULT_ENV}={v:?}: expected ok, exit-rankK or exit-rankK-deaf"),
    }
}

/// Runs the self-test; returns the process's exit code.
pub fn run() -> Result<i32> {
    let Some(env) = DistEnv::from_env()? else {
        bail!("dist-selftest needs the torch.distributed environment: run it under `hybrid-trainer launch`");
    };
    let fault = fault()?;
    let (rank, world) = (env.rank, env.world_size);
    let mut rv = Rendezvous::connect(&env, WAIT).context("rendezvous")?;
    let id: [u8; ID_BYTES] = std::array::from_fn(|i| (i as u8).wrapping_mul(31).wrapping_add(7));
    let got = rv.broadcast_id(env.is_main().then_some(id), WAIT)?;
    ensure!(got == id, "rank {rank}: received a different id");
    let ranks = rv.all_gather_u64(rank as u64, WAIT)?;
    ensure!(
        ranks.iter().copied().eq(0..world as u64),
        "rank {rank}: gathered {ranks:?}"
    );
    rv.barrier(WAIT)?;
    let nvls = std::env::var("NCCL_NVLS_ENABLE").unwrap_or_else(|_| "unset".into());
    println!(
        "rank {rank} of {world} ok {ranks:?} (local rank {} of {}, NCCL_NVLS_ENABLE={nvls}, pid {})",
        env.local_rank,
        env.local_world_size,
        std::process::id()
    );
    let deaf = fault.is_some_and(|(_, d)| d);
    let live = rv.watch(move |e| {
        println!("rank {rank}: {e}");
        if !deaf {
            std::process::exit(EXIT_PEER_LOST);
        }
    });
    match fault {
        None => {
            live.goodbye();
            Ok(0)
        }
        Some((victim, _)) if victim == rank => std::process::exit(3),
        Some(_) => {
            let start = Instant::now();
            while start.elapsed() < WAIT {
                std::thread::sleep(Duration::from_millis(50));
            }
            if !live.is_lost() {
                println!("rank {rank}: no loss noticed in {} s", WAIT.as_secs());
            }
            Ok(1)
        }
    }
}
