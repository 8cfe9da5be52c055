//! The liveness channel: the rendezvous's connections, watched by detached threads once
//! the group is set up.

use super::wire::{notify, read_frame, u64_at, write_frame, Fail, Tag};
use super::{DistError, Rendezvous};
use std::net::{Shutdown, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How long [`Rendezvous::watch`] waits for a peer's heartbeat before declaring it lost.
pub const DEFAULT_HEARTBEAT_TIMEOUT: Duration = Duration::from_secs(30);

impl Rendezvous {
    /// [`Rendezvous::watch_with_timeout`] with [`DEFAULT_HEARTBEAT_TIMEOUT`].
    pub fn watch(self, on_lost: impl Fn(DistError) + Send + Sync + 'static) -> Liveness {
        self.watch_with_timeout(DEFAULT_HEARTBEAT_TIMEOUT, on_lost)
    }

    /// Hands the connections to detached watcher threads: from now on they are liveness
    /// channels, with a heartbeat every `heartbeat_timeout / 4` (at most 1 s). When a peer's
    /// connection closes or fails without that peer's goodbye, or its heartbeat stops for
    /// longer than `heartbeat_timeout`, `on_lost(DistError::PeerLost { rank, reason })` is
    /// called exactly once, from a watcher thread. Rank 0 watches every peer, the others watch
    /// rank 0. When rank 0 learns that a peer is lost, it tells the other peers which rank
    /// (before calling `on_lost`, so the news gets out even if `on_lost` exits the process),
    /// calls `on_lost`, then closes every connection, so each rank learns of the loss within
    /// the same short time. The watchers never keep the process alive.
    pub fn watch_with_timeout(
        self,
        heartbeat_timeout: Duration,
        on_lost: impl Fn(DistError) + Send + Sync + 'static,
    ) -> Liveness {
        if self.links.is_empty() {
            return Liveness { shared: None };
        }
        let heartbeat_timeout = heartbeat_timeout.max(Duration::from_millis(40));
        let mut readers = Vec::new();
        let mut links = Vec::new();
        for l in self.links {
            readers.push(l.stream.try_clone());
            links.push(Watched {
                peer: l.peer,
                writer: Mutex::new(l.stream),
                done: AtomicBool::new(false),
            });
        }
        let shared = Arc::new(Shared {
            rank: self.rank,
            links,
            stopping: AtomicBool::new(false),
            reported: AtomicBool::new(false),
            on_lost: Box::new(on_lost),
        });
        for (i, reader) in readers.into_iter().enumerate() {
            let sh = Arc::clone(&shared);
            let spawned = match reader {
                Ok(r) => std::thread::Builder::new()
                    .name(format!("dist-watch-{}", sh.links[i].peer))
                    .spawn(move || sh.watch_link(i, r, heartbeat_timeout))
                    .map(|_| ())
                    .map_err(|e| e.to_string()),
                Err(e) => Err(e.to_string()),
            };
            if let Err(e) = spawned {
                let peer = shared.links[i].peer;
                shared.lost(i, peer, format!("cannot watch the connection: {e}"));
            }
        }
        let interval = (heartbeat_timeout / 4).min(Duration::from_secs(1));
        let sh = Arc::clone(&shared);
        let hb = std::thread::Builder::new()
            .name("dist-heartbeat".into())
            .spawn(move || sh.heartbeat(interval));
        if let Err(e) = hb {
            let peer = shared.links[0].peer;
            shared.lost(0, peer, format!("cannot start the heartbeat: {e}"));
        }
        Liveness {
            shared: Some(shared),
        }
    }
}

/// A watched connection: its writing half (shared by the heartbeat, loss notices and
/// goodbye) and whether the peer said goodbye.
struct Watched {
    peer: usize,
    writer: Mutex<TcpStream>,
    done: AtomicBool,
}

struct Shared {
    rank: usize,
    links: Vec<Watched>,
    /// Set by goodbye, drop or a reported loss: connection errors from now on are ours.
    stopping: AtomicBool,
    reported: AtomicBool,
    on_lost: Box<dyn Fn(DistError) + Send + Sync>,
}

impl Shared {
    /// A watcher thread: reads link `i` until goodbye, loss or shutdown.
    fn watch_link(&self, i: usize, mut s: TcpStream, timeout: Duration) {
        let peer = self.links[i].peer;
        loop {
            match read_frame(&mut s, Instant::now() + timeout) {
                Ok((Tag::Heartbeat, _)) => {}
                Ok((Tag::Goodbye, _)) => {
                    self.links[i].done.store(true, Ordering::SeqCst);
                    return;
                }
                Ok((Tag::PeerLost, p)) if self.rank != 0 && p.len() < 8 => {
                    return self.lost(i, peer, "a loss notice without a rank".into())
                }
                Ok((Tag::PeerLost, p)) if self.rank != 0 => {
                    let lost = usize::try_from(u64_at(&p, 0)).unwrap_or(usize::MAX);
                    let why = String::from_utf8_lossy(p.get(8..).unwrap_or_default());
                    return self.lost(i, lost, format!("{why} (reported by rank 0)"));
                }
                Ok((t, _)) => return self.lost(i, peer, format!("unexpected {t:?} message")),
                Err(Fail::Closed) => {
                    return self.lost(i, peer, "connection closed without goodbye".into())
                }
                Err(Fail::Timeout) => {
                    let secs = timeout.as_secs_f64();
                    return self.lost(i, peer, format!("no heartbeat for {secs:.1} s"));
                }
                Err(Fail::Io(e)) => return self.lost(i, peer, format!("connection error: {e}")),
                Err(Fail::Protocol(p)) => return self.lost(i, peer, p),
            }
        }
    }

    /// Reports rank `lost` (learnt on link `via`) once, unless this rank is leaving anyway.
    fn lost(&self, via: usize, lost: usize, reason: String) {
        if self.stopping.load(Ordering::SeqCst) || self.reported.swap(true, Ordering::SeqCst) {
            return;
        }
        if self.rank == 0 {
            let mut notice = (lost as u64).to_le_bytes().to_vec();
            notice.extend_from_slice(reason.as_bytes());
            for (j, l) in self.links.iter().enumerate() {
                if j != via && !l.done.load(Ordering::SeqCst) {
                    if let Ok(mut w) = l.writer.lock() {
                        notify(&mut w, Tag::PeerLost, &notice);
                    }
                }
            }
        }
        (self.on_lost)(DistError::PeerLost { rank: lost, reason });
        self.close(false);
    }

    fn heartbeat(&self, interval: Duration) {
        while !self.stopping.load(Ordering::SeqCst) {
            std::thread::sleep(interval);
            for l in &self.links {
                if self.stopping.load(Ordering::SeqCst) {
                    return;
                }
                if !l.done.load(Ordering::SeqCst) {
                    if let Ok(mut w) = l.writer.lock() {
                        let _ = write_frame(&mut w, Tag::Heartbeat, &[], Instant::now() + interval);
                    }
                }
            }
        }
    }

    /// Stops watching (once): optionally says goodbye, then shuts every connection down.
    fn close(&self, goodbye: bool) {
        if self.stopping.swap(true, Ordering::SeqCst) {
            return;
        }
        for l in &self.links {
            if let Ok(mut w) = l.writer.lock() {
                if goodbye && !l.done.load(Ordering::SeqCst) {
                    notify(&mut w, Tag::Goodbye, &[]);
                }
                let _ = w.shutdown(Shutdown::Both);
            }
        }
    }
}

/// The watched connections of a process group (see [`Rendezvous::watch`]). Dropping it
/// without [`Liveness::goodbye`] closes the connections as a crash would: the peers report
/// this rank lost.
pub struct Liveness {
    shared: Option<Arc<Shared>>,
}

impl Liveness {
    /// Clean shutdown: tells the peers that this rank leaves on purpose (so they do not report
    /// it lost) and stops watching.
    pub fn goodbye(self) {
        if let Some(s) = &self.shared {
            s.close(true);
        }
    }

    /// Whether a loss has been reported (and `on_lost` called).
    pub fn is_lost(&self) -> bool {
        self.shared
            .as_ref()
            .is_some_and(|s| s.reported.load(Ordering::SeqCst))
    }
}

impl Drop for Liveness {
    fn drop(&mut self) {
        if let Some(s) = &self.shared {
            s.close(false);
        }
    }
}
