//! Ports for tests that listen on 127.0.0.1: `tensor-ops`' rendezvous tests, and
//! `hybrid-trainer`'s launcher tests (which include this file by path), each in a range of its
//! own.

use std::net::TcpListener;
use std::sync::atomic::{AtomicU16, Ordering};

/// A port that is free now in `base..base + span` (below Linux's ephemeral range, so outgoing
/// connections never take it), with an offset of `stride` ports per process so that concurrent
/// test binaries rarely try the same ones. Prints the port.
pub fn free_port_in(base: u16, span: u16, stride: u16) -> u16 {
    static NEXT: AtomicU16 = AtomicU16::new(0);
    let offset = (std::process::id() % 500) as u16 * stride;
    loop {
        let n = NEXT.fetch_add(1, Ordering::SeqCst);
        let port = base + (offset + n) % span;
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            println!("port {port}");
            return port;
        }
    }
}
