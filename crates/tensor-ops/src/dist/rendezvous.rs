//! The TCP rendezvous of a process group (std::net only): rank 0 listens at
//! `MASTER_ADDR:MASTER_PORT`, every other rank connects to it, and the star of connections then
//! carries the NCCL unique id, small all-gathers and barriers, and finally becomes the group's
//! liveness channel ([`Rendezvous::watch`]).
//!
//! Wire format: frames of a 1-byte tag, a little-endian u32 payload length and the payload.
//! A peer opens with `Hello` (magic, protocol version, rank, world size); rank 0 answers `Ack`
//! once the whole group has joined, or `Error` with the reason. Every read and write has a
//! deadline, so nothing blocks forever.

mod liveness;
mod wire;

pub use liveness::{Liveness, DEFAULT_HEARTBEAT_TIMEOUT};

use super::{DistEnv, DistError};
use std::io;
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};
use wire::{hello, notify, read_frame, u64_at, write_frame, Fail, Tag, HELLO_LEN, MAGIC, VERSION};

/// The size of an `ncclUniqueId`.
pub use gpu_cuda::nccl::ID_BYTES;

/// How long rank 0 waits for the hello of a connection it accepted.
const HELLO_WAIT: Duration = Duration::from_secs(5);

/// A connection to another rank.
struct Link {
    peer: usize,
    stream: TcpStream,
}

/// The connected process group: on rank 0 one connection per peer, elsewhere one to rank 0.
pub struct Rendezvous {
    rank: usize,
    world: usize,
    addr: String,
    /// Rank 0: the peers 1..world in rank order; others: rank 0 alone.
    links: Vec<Link>,
}

impl Rendezvous {
    /// Rank 0 binds `MASTER_ADDR:MASTER_PORT` and accepts `world_size - 1` peers within
    /// `timeout`; every other rank connects, retrying every 100 ms until `timeout` (rank 0 may
    /// start later). Each peer sends a magic, the protocol version, its rank and the world
    /// size; rank 0 checks them (right world size, rank in range, no rank twice, else a
    /// [`DistError::Rendezvous`] that is also sent to the peers so they fail clearly too) and
    /// acknowledges once the whole group has joined, so `connect` returns when every rank is
    /// there. `world_size == 1` opens no sockets at all.
    pub fn connect(env: &DistEnv, timeout: Duration) -> Result<Rendezvous, DistError> {
        let addr = env.master();
        if env.rank >= env.world_size || env.world_size == 0 {
            return Err(DistError::Rendezvous {
                addr,
                reason: format!(
                    "rank {} is not below world size {}",
                    env.rank, env.world_size
                ),
            });
        }
        let mut rv = Rendezvous {
            rank: env.rank,
            world: env.world_size,
            addr,
            links: Vec::new(),
        };
        if rv.world == 1 {
            return Ok(rv);
        }
        let deadline = Instant::now() + timeout;
        if rv.rank == 0 {
            rv.host(env, deadline, timeout)?;
        } else {
            rv.join(env, deadline, timeout)?;
        }
        Ok(rv)
    }

    /// This process's rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// The number of processes in the group.
    pub fn world_size(&self) -> usize {
        self.world
    }

    fn rz_err(&self, reason: impl Into<String>) -> DistError {
        DistError::Rendezvous {
            addr: self.addr.clone(),
            reason: reason.into(),
        }
    }

    /// Turns a failed read or write with `peer` during `what` into a [`DistError`].
    fn fail(&self, f: Fail, peer: usize, what: &str, timeout: Duration) -> DistError {
        match f {
            Fail::Timeout => DistError::Timeout {
                what: format!("rank {} waiting for rank {peer}: {what}", self.rank),
                secs: timeout.as_secs_f64(),
            },
            Fail::Closed => DistError::PeerLost {
                rank: peer,
                reason: format!("connection closed during {what}"),
            },
            Fail::Io(e) => DistError::PeerLost {
                rank: peer,
                reason: format!("{what}: {e}"),
            },
            Fail::Protocol(p) => self.rz_err(format!("rank {peer} during {what}: {p}")),
        }
    }

    /// Rank 0: tells every peer that the group failed (best effort).
    fn abort_peers(links: &mut [Link], reason: &str) {
        for l in links {
            notify(&mut l.stream, Tag::Error, reason.as_bytes());
        }
    }

    fn host(
        &mut self,
        env: &DistEnv,
        deadline: Instant,
        timeout: Duration,
    ) -> Result<(), DistError> {
        let addrs: Vec<SocketAddr> = (env.master_addr.as_str(), env.master_port)
            .to_socket_addrs()
            .map_err(|e| self.rz_err(format!("cannot resolve MASTER_ADDR: {e}")))?
            .collect();
        let listener = TcpListener::bind(&addrs[..]).map_err(|e| {
            let hint = if e.kind() == io::ErrorKind::AddrInUse {
                " (another process, perhaps an earlier run, listens there: pick another MASTER_PORT)"
            } else {
                ""
            };
            self.rz_err(format!("rank 0 cannot listen on {}: {e}{hint}", self.addr))
        })?;
        listener
            .set_nonblocking(true)
            .map_err(|e| self.rz_err(format!("listener: {e}")))?;
        let mut slots: Vec<Option<(TcpStream, SocketAddr)>> =
            (0..self.world).map(|_| None).collect();
        let mut joined = 0;
        while joined < self.world - 1 {
            let (stream, from) = match listener.accept() {
                Ok(x) => x,
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock
                            | io::ErrorKind::Interrupted
                            | io::ErrorKind::ConnectionAborted
                    ) =>
                {
                    if Instant::now() >= deadline {
                        let missing: Vec<usize> =
                            (1..self.world).filter(|&r| slots[r].is_none()).collect();
                        let what = format!(
                            "rank 0 at {} waiting for ranks {missing:?} to join ({joined} of {} joined)",
                            self.addr,
                            self.world - 1
                        );
                        let mut links = take_links(&mut slots);
                        Self::abort_peers(&mut links, &format!("timed out: {what}"));
                        return Err(DistError::Timeout {
                            what,
                            secs: timeout.as_secs_f64(),
                        });
                    }
                    std::thread::sleep(Duration::from_millis(10));
                    continue;
                }
                Err(e) => {
                    let reason = format!("accept failed: {e}");
                    Self::abort_peers(&mut take_links(&mut slots), &reason);
                    return Err(self.rz_err(reason));
                }
            };
            match self.check_hello(stream, from, &slots, deadline) {
                Ok(None) => {} // closed or silent before its hello: not a peer.
                Ok(Some((rank, stream))) => {
                    slots[rank] = Some((stream, from));
                    joined += 1;
                }
                Err((reason, stream)) => {
                    let mut links = take_links(&mut slots);
                    if let Some(mut s) = stream {
                        notify(&mut s, Tag::Error, reason.as_bytes());
                    }
                    Self::abort_peers(&mut links, &format!("the group failed: {reason}"));
                    return Err(self.rz_err(reason));
                }
            }
        }
        self.links = take_links(&mut slots);
        for i in 0..self.links.len() {
            let peer = self.links[i].peer;
            if let Err(f) = write_frame(&mut self.links[i].stream, Tag::Ack, &[], deadline) {
                let err = self.fail(f, peer, "the handshake's acknowledgement", timeout);
                Self::abort_peers(&mut self.links, &err.to_string());
                return Err(err);
            }
        }
        Ok(())
    }

    /// Rank 0: reads and checks an accepted connection's hello. `Ok(None)`: it closed or stayed
    /// silent (not a peer); `Err`: the reason the group fails, with the stream to tell.
    #[allow(clippy::type_complexity)]
    fn check_hello(
        &self,
        mut s: TcpStream,
        from: SocketAddr,
        slots: &[Option<(TcpStream, SocketAddr)>],
        deadline: Instant,
    ) -> Result<Option<(usize, TcpStream)>, (String, Option<TcpStream>)> {
        let setup = s.set_nonblocking(false).and_then(|_| s.set_nodelay(true));
        if let Err(e) = setup {
            return Err((format!("connection from {from}: {e}"), None));
        }
        let (tag, p) = match read_frame(&mut s, deadline.min(Instant::now() + HELLO_WAIT)) {
            Ok(x) => x,
            Err(Fail::Closed | Fail::Timeout | Fail::Io(_)) => return Ok(None),
            Err(Fail::Protocol(p)) => {
                return Err((
                    format!("a connection from {from} is not a rendezvous peer: {p}"),
                    Some(s),
                ))
            }
        };
        if tag != Tag::Hello || p.len() != HELLO_LEN || p[..8] != MAGIC {
            return Err((
                format!("a connection from {from} is not a hybrid-trainer rendezvous peer"),
                Some(s),
            ));
        }
        let version = u32::from_le_bytes([p[8], p[9], p[10], p[11]]);
        let rank = u64_at(&p, 12);
        let world = u64_at(&p, 20);
        let reason = if version != VERSION {
            format!("rank {rank} from {from} speaks rendezvous protocol {version}, rank 0 speaks {VERSION}")
        } else if world != self.world as u64 {
            format!(
                "rank {rank} from {from} has WORLD_SIZE={world}, but rank 0 has WORLD_SIZE={}",
                self.world
            )
        } else if rank == 0 {
            format!("two processes have RANK=0 (rank 0 here and another from {from})")
        } else if rank >= self.world as u64 {
            format!(
                "a peer from {from} has RANK={rank}, not below WORLD_SIZE={}",
                self.world
            )
        } else if let Some((_, first)) = &slots[rank as usize] {
            format!("two processes have RANK={rank} (from {first} and from {from})")
        } else {
            return Ok(Some((rank as usize, s)));
        };
        Err((reason, Some(s)))
    }

    fn join(
        &mut self,
        env: &DistEnv,
        deadline: Instant,
        timeout: Duration,
    ) -> Result<(), DistError> {
        let mut last = String::from("no attempt");
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(DistError::Timeout {
                    what: format!(
                        "rank {} connecting to rank 0 at {} (last error: {last})",
                        self.rank, self.addr
                    ),
                    secs: timeout.as_secs_f64(),
                });
            }
            match (env.master_addr.as_str(), env.master_port).to_socket_addrs() {
                Ok(addrs) => {
                    for a in addrs {
                        let try_for = left.min(Duration::from_secs(1));
                        match TcpStream::connect_timeout(&a, try_for) {
                            Ok(s) => return self.handshake(s, deadline, timeout),
                            Err(e) => last = format!("{a}: {e}"),
                        }
                    }
                }
                Err(e) => last = format!("cannot resolve MASTER_ADDR: {e}"),
            }
            let left = deadline.saturating_duration_since(Instant::now());
            std::thread::sleep(left.min(Duration::from_millis(100)));
        }
    }

    /// A peer: sends its hello and waits for rank 0's acknowledgement.
    fn handshake(
        &mut self,
        mut s: TcpStream,
        deadline: Instant,
        timeout: Duration,
    ) -> Result<(), DistError> {
        s.set_nodelay(true)
            .map_err(|e| self.rz_err(format!("TCP_NODELAY: {e}")))?;
        let hello = hello(self.rank, self.world);
        let what = "the handshake (have all ranks started?)";
        write_frame(&mut s, Tag::Hello, &hello, deadline)
            .map_err(|f| self.fail(f, 0, what, timeout))?;
        match read_frame(&mut s, deadline) {
            Ok((Tag::Ack, _)) => {
                self.links.push(Link { peer: 0, stream: s });
                Ok(())
            }
            Ok((Tag::Error, msg)) => Err(self.rz_err(format!(
                "rank 0 failed rank {}'s handshake: {}",
                self.rank,
                String::from_utf8_lossy(&msg)
            ))),
            Ok((t, _)) => Err(self.rz_err(format!("rank 0 answered the hello with {t:?}"))),
            Err(Fail::Closed) => Err(self.rz_err(format!(
                "rank 0 closed the connection during rank {}'s handshake",
                self.rank
            ))),
            Err(f) => Err(self.fail(f, 0, what, timeout)),
        }
    }
}

/// The joined peers of `slots`, in rank order.
fn take_links(slots: &mut [Option<(TcpStream, SocketAddr)>]) -> Vec<Link> {
    slots
        .iter_mut()
        .enumerate()
        .filter_map(|(peer, s)| s.take().map(|(stream, _)| Link { peer, stream }))
        .collect()
}

impl Rendezvous {
    /// Rank 0 passes `Some(id)` and sends it to every peer; the others pass `None` and receive
    /// it. Either rank passing the other kind of argument is a [`DistError::Rendezvous`].
    pub fn broadcast_id(
        &mut self,
        id: Option<[u8; ID_BYTES]>,
        timeout: Duration,
    ) -> Result<[u8; ID_BYTES], DistError> {
        let what = "the NCCL id broadcast";
        match (self.rank, id) {
            (0, Some(id)) => {
                let deadline = Instant::now() + timeout;
                for i in 0..self.links.len() {
                    let peer = self.links[i].peer;
                    if let Err(f) = write_frame(&mut self.links[i].stream, Tag::Id, &id, deadline) {
                        let err = self.fail(f, peer, what, timeout);
                        Self::abort_peers(&mut self.links, &err.to_string());
                        return Err(err);
                    }
                }
                Ok(id)
            }
            (0, None) => Err(self.rz_err("broadcast_id: rank 0 must pass the id")),
            (r, Some(_)) => Err(self.rz_err(format!("broadcast_id: rank {r} must pass None"))),
            (_, None) => {
                let p = self.receive(Tag::Id, what, timeout)?;
                <[u8; ID_BYTES]>::try_from(p.as_slice()).map_err(|_| {
                    self.rz_err(format!("{what}: {} bytes instead of {ID_BYTES}", p.len()))
                })
            }
        }
    }

    /// Every rank's `v` in rank order, gathered at rank 0 and sent back to all (for small
    /// checks such as parameter checksums, or "every rank agrees on X").
    pub fn all_gather_u64(&mut self, v: u64, timeout: Duration) -> Result<Vec<u64>, DistError> {
        let all = self.exchange(
            Tag::Gather,
            &v.to_le_bytes(),
            Tag::Gathered,
            "all_gather_u64",
            timeout,
        )?;
        Ok((0..self.world).map(|r| u64_at(&all, 8 * r)).collect())
    }

    /// A barrier: returns once every rank has called it (an all-gather of nothing).
    pub fn barrier(&mut self, timeout: Duration) -> Result<(), DistError> {
        self.exchange(Tag::Barrier, &[], Tag::BarrierDone, "barrier", timeout)
            .map(|_| ())
    }

    /// Rank 0 reads `up` (as long as `mine`) from every peer in rank order and sends the
    /// concatenation, its own part first, to all as `down`; the peers send `mine` and receive
    /// it. A failure at rank 0 is sent to the peers, so that they fail at once too.
    fn exchange(
        &mut self,
        up: Tag,
        mine: &[u8],
        down: Tag,
        what: &str,
        timeout: Duration,
    ) -> Result<Vec<u8>, DistError> {
        let deadline = Instant::now() + timeout;
        if self.rank != 0 {
            if self.links.is_empty() {
                return Err(self.rz_err("no connection to rank 0"));
            }
            write_frame(&mut self.links[0].stream, up, mine, deadline)
                .map_err(|f| self.fail(f, 0, what, timeout))?;
            let all = self.receive(down, what, timeout)?;
            if all.len() != mine.len() * self.world {
                return Err(self.rz_err(format!("{what}: rank 0 sent {} bytes", all.len())));
            }
            return Ok(all);
        }
        let mut all = mine.to_vec();
        let mut failure = None;
        for i in 0..self.links.len() {
            let peer = self.links[i].peer;
            match read_frame(&mut self.links[i].stream, deadline) {
                Ok((t, p)) if t == up && p.len() == mine.len() => all.extend_from_slice(&p),
                Ok((t, p)) => {
                    failure = Some(self.rz_err(format!(
                        "rank {peer} sent {t:?} of {} bytes during {what} (do all ranks run the same program?)",
                        p.len()
                    )));
                }
                Err(f) => failure = Some(self.fail(f, peer, what, timeout)),
            }
            if failure.is_some() {
                break;
            }
        }
        if failure.is_none() {
            for i in 0..self.links.len() {
                let peer = self.links[i].peer;
                if let Err(f) = write_frame(&mut self.links[i].stream, down, &all, deadline) {
                    failure = Some(self.fail(f, peer, what, timeout));
                    break;
                }
            }
        }
        match failure {
            None => Ok(all),
            Some(err) => {
                Self::abort_peers(&mut self.links, &err.to_string());
                Err(err)
            }
        }
    }

    /// A peer: the next frame from rank 0, which must be `tag` (an `Error` is rank 0's failure).
    fn receive(&mut self, tag: Tag, what: &str, timeout: Duration) -> Result<Vec<u8>, DistError> {
        let deadline = Instant::now() + timeout;
        let Some(link) = self.links.first_mut() else {
            return Err(self.rz_err("no connection to rank 0"));
        };
        match read_frame(&mut link.stream, deadline) {
            Ok((t, p)) if t == tag => Ok(p),
            Ok((Tag::Error, msg)) => Err(self.rz_err(format!(
                "rank 0 failed during {what}: {}",
                String::from_utf8_lossy(&msg)
            ))),
            Ok((t, _)) => Err(self.rz_err(format!(
                "rank 0 sent {t:?} during {what} (do all ranks run the same program?)"
            ))),
            Err(f) => Err(self.fail(f, 0, what, timeout)),
        }
    }
}

#[cfg(test)]
mod tests;
