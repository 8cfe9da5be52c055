//! The wire format: frames of a 1-byte tag, a little-endian u32 payload length and the
//! payload, read and written against deadlines.

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

pub(super) const MAGIC: [u8; 8] = *b"HYBRDZV\0";
pub(super) const VERSION: u32 = 1;
pub(super) const HELLO_LEN: usize = 8 + 4 + 8 + 8;
/// The largest payload read from a peer (a gathered vector of 64 Ki ranks, or a message).
pub(super) const MAX_PAYLOAD: usize = 1 << 19;
/// The time allowed to best-effort messages (errors, goodbyes, loss notices).
pub(super) const NOTICE_WAIT: Duration = Duration::from_millis(500);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Tag {
    Hello = 1,
    Ack,
    Error,
    Id,
    Gather,
    Gathered,
    Barrier,
    BarrierDone,
    Heartbeat,
    Goodbye,
    PeerLost,
}

impl Tag {
    const ALL: [Tag; 11] = [
        Tag::Hello,
        Tag::Ack,
        Tag::Error,
        Tag::Id,
        Tag::Gather,
        Tag::Gathered,
        Tag::Barrier,
        Tag::BarrierDone,
        Tag::Heartbeat,
        Tag::Goodbye,
        Tag::PeerLost,
    ];

    pub(super) fn from_u8(b: u8) -> Option<Tag> {
        Tag::ALL.into_iter().find(|t| *t as u8 == b)
    }
}

/// Why a read or write did not complete.
#[derive(Debug)]
pub(super) enum Fail {
    Timeout,
    Closed,
    Io(io::Error),
    Protocol(String),
}

pub(super) fn read_full(s: &mut TcpStream, buf: &mut [u8], deadline: Instant) -> Result<(), Fail> {
    let mut got = 0;
    while got < buf.len() {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(Fail::Timeout);
        }
        s.set_read_timeout(Some(left)).map_err(Fail::Io)?;
        match s.read(&mut buf[got..]) {
            Ok(0) => return Err(Fail::Closed),
            Ok(n) => got += n,
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::Interrupted
                        | io::ErrorKind::WouldBlock
                        | io::ErrorKind::TimedOut
                ) => {}
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Err(Fail::Closed),
            Err(e) => return Err(Fail::Io(e)),
        }
    }
    Ok(())
}

pub(super) fn read_frame(s: &mut TcpStream, deadline: Instant) -> Result<(Tag, Vec<u8>), Fail> {
    let mut head = [0u8; 5];
    read_full(s, &mut head, deadline)?;
    let tag = Tag::from_u8(head[0])
        .ok_or_else(|| Fail::Protocol(format!("unknown message tag {}", head[0])))?;
    let len = u32::from_le_bytes([head[1], head[2], head[3], head[4]]) as usize;
    if len > MAX_PAYLOAD {
        return Err(Fail::Protocol(format!(
            "{tag:?} message of {len} bytes is too long"
        )));
    }
    let mut payload = vec![0u8; len];
    read_full(s, &mut payload, deadline)?;
    Ok((tag, payload))
}

pub(super) fn write_frame(
    s: &mut TcpStream,
    tag: Tag,
    payload: &[u8],
    deadline: Instant,
) -> Result<(), Fail> {
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return Err(Fail::Timeout);
    }
    let len = u32::try_from(payload.len())
        .map_err(|_| Fail::Protocol(format!("{tag:?} payload too long")))?;
    let mut buf = Vec::with_capacity(5 + payload.len());
    buf.push(tag as u8);
    buf.extend_from_slice(&len.to_le_bytes());
    buf.extend_from_slice(payload);
    s.set_write_timeout(Some(left)).map_err(Fail::Io)?;
    s.write_all(&buf).map_err(|e| match e.kind() {
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => Fail::Timeout,
        io::ErrorKind::BrokenPipe | io::ErrorKind::ConnectionReset => Fail::Closed,
        _ => Fail::Io(e),
    })
}

/// Best effort: a message that may not arrive (the peer may be gone already).
pub(super) fn notify(s: &mut TcpStream, tag: Tag, payload: &[u8]) {
    let _ = write_frame(s, tag, payload, Instant::now() + NOTICE_WAIT);
}

pub(super) fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    if let Some(s) = b.get(at..at + 8) {
        a.copy_from_slice(s);
    }
    u64::from_le_bytes(a)
}

/// A peer's hello: magic, protocol version, rank and world size.
pub(super) fn hello(rank: usize, world: usize) -> Vec<u8> {
    let mut h = Vec::with_capacity(HELLO_LEN);
    h.extend_from_slice(&MAGIC);
    h.extend_from_slice(&VERSION.to_le_bytes());
    h.extend_from_slice(&(rank as u64).to_le_bytes());
    h.extend_from_slice(&(world as u64).to_le_bytes());
    h
}
