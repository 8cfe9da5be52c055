//! `hybrid-trainer launch`: a torchrun-like launcher. It starts one process of this binary per
//! GPU with the `torch.distributed` environment (`RANK`, `WORLD_SIZE`, `LOCAL_RANK`,
//! `LOCAL_WORLD_SIZE`, `MASTER_ADDR`, `MASTER_PORT`), NVLink multicast off
//! (`NCCL_NVLS_ENABLE=0`) and, when `libnccl` is not on the loader's path, the pip wheel's
//! copy on `LD_LIBRARY_PATH`; then it supervises them: when one fails, the others get a grace
//! period to notice (through the rendezvous's liveness channel) and exit, and whatever still
//! runs after it is killed. The launcher itself never touches CUDA.

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};
use tensor_ops::dist::DistEnv;

/// Set on the children, so that a `launch` inside a launched process is refused.
pub const LAUNCHED_ENV: &str = "HYBRID_TRAINER_LAUNCHED";
/// The exit code of a process that aborts because another rank was lost (the NCCL group's
/// `tensor_ops::dist::EXIT_DIST_FAILURE` is the same number). Such a failure is a consequence:
/// when several processes fail within one poll, the launcher reports and returns the others'.
pub const EXIT_PEER_LOST: i32 = tensor_ops::dist::EXIT_DIST_FAILURE;
/// How often the launcher polls its children.
const POLL: Duration = Duration::from_millis(100);

/// The flags of `hybrid-trainer launch`.
#[derive(clap::Args, Debug, Clone)]
pub struct LaunchArgs {
    /// Processes to start on this node: one per GPU.
    #[arg(long = "nproc-per-node", visible_alias = "nproc",
          value_parser = clap::value_parser!(u32).range(1..))]
    pub nproc_per_node: u32,
    /// Nodes taking part (each runs its own launcher with the same flags but --node-rank).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    pub nnodes: u32,
    /// This node's index in 0..nnodes.
    #[arg(long, default_value_t = 0)]
    pub node_rank: u32,
    /// Where rank 0 (on node 0) listens for the rendezvous.
    #[arg(long, default_value = "127.0.0.1")]
    pub master_addr: String,
    /// The rendezvous's TCP port.
    #[arg(long, default_value_t = 29500, value_parser = clap::value_parser!(u16).range(1..))]
    pub master_port: u16,
    /// Seconds the other processes get to exit on their own after one has failed, before they
    /// are killed.
    #[arg(long, default_value_t = 30)]
    pub grace_secs: u64,
    /// The subcommand of hybrid-trainer (and its flags) that every process runs, after `--`.
    #[arg(last = true, required = true)]
    pub command: Vec<String>,
}

/// What is wrong with a launch.
#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    /// The flags do not describe a valid launch.
    #[error("launch: {0}")]
    Args(String),
    /// A child process could not be started.
    #[error("launch: cannot start rank {rank} ({exe}): {source}")]
    Spawn {
        rank: usize,
        exe: String,
        source: std::io::Error,
    },
    /// The path of this binary is unknown.
    #[error("launch: cannot find this executable: {0}")]
    Exe(std::io::Error),
}

/// The environment of every child but the rank-dependent variables, checked.
struct Plan {
    nproc: usize,
    first_rank: usize,
    world: usize,
    grace: Duration,
}

/// Checks the flags: counts, node rank, world size, the command (non-empty, not `launch`),
/// and the rendezvous address, as the children will read it.
fn plan(a: &LaunchArgs) -> Result<Plan, LaunchError> {
    let bad = |m: String| Err(LaunchError::Args(m));
    if std::env::var_os(LAUNCHED_ENV).is_some() {
        return bad(format!(
            "this process was started by a launcher ({LAUNCHED_ENV} is set): launches do not nest"
        ));
    }
    if a.nproc_per_node == 0 {
        return bad("--nproc-per-node must be at least 1".into());
    }
    if a.nnodes == 0 {
        return bad("--nnodes must be at least 1".into());
    }
    if a.node_rank >= a.nnodes {
        return bad(format!(
            "--node-rank {} is not below --nnodes {}",
            a.node_rank, a.nnodes
        ));
    }
    let nproc = a.nproc_per_node as usize;
    let Some(world) = nproc
        .checked_mul(a.nnodes as usize)
        .filter(|&w| u32::try_from(w).is_ok())
    else {
        return bad(format!(
            "--nproc-per-node {} times --nnodes {} is too many processes",
            a.nproc_per_node, a.nnodes
        ));
    };
    if a.command.is_empty() {
        return bad("no command: give the hybrid-trainer subcommand after `--`".into());
    }
    if a.command.first().is_some_and(|t| t == "launch") {
        return bad(format!(
            "the command {:?} runs `launch` again: give the training subcommand itself",
            a.command
        ));
    }
    if a.grace_secs > 24 * 3600 {
        return bad(format!("--grace-secs {} is more than a day", a.grace_secs));
    }
    let first_rank = a.node_rank as usize * nproc;
    // The children's environment must read back as what we mean.
    let vars = child_vars(a, first_rank, 0, world);
    DistEnv::from_lookup(|k| {
        vars.iter()
            .find(|(name, _)| *name == k)
            .map(|(_, v)| v.clone())
    })
    .map_err(|e| LaunchError::Args(format!("the children's environment would be invalid: {e}")))?;
    Ok(Plan {
        nproc,
        first_rank,
        world,
        grace: Duration::from_secs(a.grace_secs),
    })
}

/// The `torch.distributed` variables of local process `i`.
fn child_vars(
    a: &LaunchArgs,
    first_rank: usize,
    i: usize,
    world: usize,
) -> Vec<(&'static str, String)> {
    vec![
        ("RANK", (first_rank + i).to_string()),
        ("WORLD_SIZE", world.to_string()),
        ("LOCAL_RANK", i.to_string()),
        ("LOCAL_WORLD_SIZE", a.nproc_per_node.to_string()),
        ("MASTER_ADDR", a.master_addr.clone()),
        ("MASTER_PORT", a.master_port.to_string()),
    ]
}

/// True when NCCL loads as cudarc loads it (by the names `libnccl.so`, `libnccl.so.13`, …:
/// not `libnccl.so.2`, the only name the pip wheel ships).
fn nccl_loadable() -> bool {
    gpu_cuda::nccl::available().is_ok()
}

/// The `lib` directory of the `nvidia-nccl` pip wheel, when it holds `libnccl.so.2`.
fn pip_nccl_dir() -> Option<PathBuf> {
    let out = Command::new("python3")
        .args([
            "-c",
            "import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], 'lib'))",
        ])
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    let dir = PathBuf::from(String::from_utf8(out.stdout).ok()?.trim());
    dir.join("libnccl.so.2").is_file().then_some(dir)
}

/// A directory holding `libnccl.so`, a link to `lib` (made once, replaced atomically). It is
/// this user's own (mode 0700, checked: in a shared temporary directory another user could
/// make it first and swap the link), else `None`.
fn link_dir(lib: &std::path::Path) -> Option<PathBuf> {
    use std::hash::{Hash, Hasher};
    use std::os::unix::fs::{DirBuilderExt, MetadataExt};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    lib.hash(&mut h);
    // SAFETY: `getuid` has no preconditions.
    let uid = unsafe { libc::getuid() };
    let dir = std::env::temp_dir().join(format!("hybrid-trainer-nccl-{uid}-{:016x}", h.finish()));
    let _ = std::fs::DirBuilder::new().mode(0o700).create(&dir);
    let meta = std::fs::symlink_metadata(&dir).ok()?;
    if !meta.is_dir() || meta.uid() != uid || meta.mode() & 0o077 != 0 {
        eprintln!(
            "launch: {} is not a directory of this user's alone; not linking NCCL there",
            dir.display()
        );
        return None;
    }
    let link = dir.join("libnccl.so");
    if std::fs::read_link(&link).ok().as_deref() != Some(lib) {
        let tmp = dir.join(format!("libnccl.so.{}", std::process::id()));
        let _ = std::fs::remove_file(&tmp);
        std::os::unix::fs::symlink(lib, &tmp).ok()?;
        std::fs::rename(&tmp, &link).ok()?;
    }
    Some(dir)
}

/// The `LD_LIBRARY_PATH` that lets a process of this binary load NCCL, when the current one
/// does not: the pip wheel's `libnccl.so.2` behind a `libnccl.so` link, then the current path.
/// `None` when NCCL loads already or no wheel is found (the processes then report it).
pub fn nccl_library_path() -> Option<OsString> {
    wheel_library_path().map(|(p, _)| p)
}

/// [`nccl_library_path`] and the wheel's library it links.
fn wheel_library_path() -> Option<(OsString, PathBuf)> {
    if nccl_loadable() {
        return None;
    }
    let dir = pip_nccl_dir()?;
    let lib = dir.join("libnccl.so.2");
    let links = link_dir(&lib)?;
    let mut p = OsString::from(links.as_os_str());
    p.push(":");
    p.push(dir.as_os_str());
    if let Some(old) = std::env::var_os("LD_LIBRARY_PATH").filter(|v| !v.is_empty()) {
        p.push(":");
        p.push(old);
    }
    Some((p, lib))
}

/// The children's `LD_LIBRARY_PATH`, when it must change so that they find `libnccl`.
fn library_path() -> Option<OsString> {
    let (p, lib) = wheel_library_path()?;
    eprintln!(
        "launch: libnccl.so is not on the loader's path; the processes get the pip wheel's {} \
         (behind a libnccl.so link) first in LD_LIBRARY_PATH",
        lib.display()
    );
    Some(p)
}

/// Makes the child get SIGTERM when the launcher dies (killed, crashed), as torchrun's agent
/// takes its workers down with it: a job is never left running without its supervisor.
fn die_with_parent(cmd: &mut Command) {
    use std::os::unix::process::CommandExt;
    // SAFETY: `getpid` has no preconditions.
    let parent = unsafe { libc::getpid() };
    // SAFETY: the closure runs in the forked child before `exec` and calls only
    // async-signal-safe functions (`prctl`, `getppid`, `_exit`), allocating nothing.
    unsafe {
        cmd.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // The launcher may have died before the prctl: then no signal will come.
            if libc::getppid() != parent {
                libc::_exit(1);
            }
            Ok(())
        });
    }
}

/// How a child ended.
enum End {
    Exited(ExitStatus),
    Killed,
    Lost(String),
}

impl End {
    /// The exit code, when the process exited by itself with one.
    fn code(&self) -> Option<i32> {
        match self {
            End::Exited(s) => s.code(),
            _ => None,
        }
    }

    fn describe(&self) -> String {
        match self {
            End::Exited(s) => describe(*s),
            End::Killed => "killed after the grace period".into(),
            End::Lost(e) => format!("unknown ({e})"),
        }
    }
}

/// `exit code N` or `signal N`.
fn describe(s: ExitStatus) -> String {
    if let Some(c) = s.code() {
        return format!("exit code {c}");
    }
    #[cfg(unix)]
    {
        use std::os::unix::process::ExitStatusExt;
        if let Some(sig) = s.signal() {
            let core = if s.core_dumped() { ", core dumped" } else { "" };
            return format!("signal {sig}{core}");
        }
    }
    s.to_string()
}

struct Proc {
    rank: usize,
    child: Child,
    end: Option<End>,
}

/// Kills and reaps the children still running.
fn kill_all(procs: &mut [Proc]) {
    for p in procs.iter_mut().filter(|p| p.end.is_none()) {
        let _ = p.child.kill();
        let _ = p.child.wait();
        p.end = Some(End::Killed);
    }
}

/// Starts the processes and supervises them (see the module's documentation). Returns the
/// launch's exit code: 0 when every process exits with 0, else the first failure's exit code
/// (1 when it has none, e.g. killed by a signal).
pub fn run(a: &LaunchArgs) -> anyhow::Result<i32> {
    let plan = plan(a)?;
    let exe = std::env::current_exe().map_err(LaunchError::Exe)?;
    let ld_path = library_path();
    let last = plan.first_rank + plan.nproc - 1;
    eprintln!(
        "launch: ranks {}..={last} of {} on this node, rendezvous at {}:{}: {}",
        plan.first_rank,
        plan.world,
        a.master_addr,
        a.master_port,
        a.command.join(" ")
    );
    let mut procs: Vec<Proc> = Vec::with_capacity(plan.nproc);
    for i in 0..plan.nproc {
        let rank = plan.first_rank + i;
        let mut cmd = Command::new(&exe);
        cmd.args(&a.command)
            .envs(child_vars(a, plan.first_rank, i, plan.world))
            .env("NCCL_NVLS_ENABLE", "0")
            .env(LAUNCHED_ENV, "1")
            .stdin(Stdio::null());
        if let Some(p) = &ld_path {
            cmd.env("LD_LIBRARY_PATH", p);
        }
        die_with_parent(&mut cmd);
        match cmd.spawn() {
            Ok(child) => procs.push(Proc {
                rank,
                child,
                end: None,
            }),
            Err(source) => {
                kill_all(&mut procs);
                return Err(LaunchError::Spawn {
                    rank,
                    exe: exe.display().to_string(),
                    source,
                }
                .into());
            }
        }
    }
    let code = supervise(&mut procs, plan.grace);
    let summary: Vec<String> = procs
        .iter()
        .map(|p| {
            let end = p
                .end
                .as_ref()
                .map_or_else(|| "unknown".into(), End::describe);
            format!("rank {}: {end}", p.rank)
        })
        .collect();
    eprintln!("launch: {}", summary.join(", "));
    Ok(code)
}

/// Polls the children until all have exited, or until the grace period after the first
/// failure has run out (then kills the rest). Returns the launch's exit code: the first
/// failure's, where a failure with [`EXIT_PEER_LOST`] gives way to a later one without it.
fn supervise(procs: &mut [Proc], grace: Duration) -> i32 {
    // The first failure: its rank, its exit code, and when the grace period ends.
    let mut failure: Option<(usize, i32, Instant)> = None;
    loop {
        // This round's exits, the consequential failures last.
        let mut round: Vec<(usize, End, bool)> = Vec::new();
        for (i, p) in procs
            .iter_mut()
            .enumerate()
            .filter(|(_, p)| p.end.is_none())
        {
            match p.child.try_wait() {
                Ok(None) => {}
                Ok(Some(s)) => round.push((i, End::Exited(s), s.success())),
                Err(e) => {
                    let _ = p.child.kill();
                    let _ = p.child.wait();
                    round.push((i, End::Lost(e.to_string()), false));
                }
            }
        }
        round.sort_by_key(|(_, end, _)| end.code() == Some(EXIT_PEER_LOST));
        for (i, end, ok) in round {
            let rank = procs[i].rank;
            if !ok || failure.is_some() {
                eprintln!("launch: rank {rank} exited with {}", end.describe());
            }
            if !ok {
                let code = end.code().filter(|&c| c != 0).unwrap_or(1);
                match failure {
                    None => {
                        eprintln!(
                            "launch: the other ranks get {} s to exit on their own",
                            grace.as_secs()
                        );
                        failure = Some((rank, code, Instant::now() + grace));
                    }
                    Some((_, first, deadline)) if first == EXIT_PEER_LOST && code != first => {
                        failure = Some((rank, code, deadline));
                    }
                    Some(_) => {}
                }
            }
            procs[i].end = Some(end);
        }
        if procs.iter().all(|p| p.end.is_some()) {
            return failure.map_or(0, |(_, code, _)| code);
        }
        if let Some((rank, code, deadline)) = failure {
            if Instant::now() >= deadline {
                for p in procs.iter().filter(|p| p.end.is_none()) {
                    eprintln!(
                        "launch: rank {} still runs {} s after rank {rank} failed; killing it",
                        p.rank,
                        grace.as_secs()
                    );
                }
                kill_all(procs);
                return code;
            }
        }
        std::thread::sleep(POLL);
    }
}
