//! The stream gate of a [`crate::CudaBackend`]: while one thread captures a CUDA graph on the
//! backend's stream ([`crate::CudaBackend::capture`]), work that other threads queue on the same
//! stream would silently become part of the graph. Every entry point that queues work, waits on
//! the stream or takes the cuBLAS/cuSOLVER handle passes the gate (a shared lock, uncontended
//! except during a capture); a capture holds it exclusively. A thread that already holds the
//! gate of a backend (a nested entry point, or the capturing thread itself) passes freely, so
//! nothing deadlocks on itself.

use std::cell::RefCell;
use std::ops::{Deref, DerefMut};
use std::sync::{MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};

thread_local! {
    /// The backends (by id) whose gate this thread holds, innermost last.
    static HELD: RefCell<Vec<u64>> = const { RefCell::new(Vec::new()) };
}

fn holds(id: u64) -> bool {
    HELD.with(|h| h.borrow().contains(&id))
}

fn push(id: u64) {
    HELD.with(|h| h.borrow_mut().push(id));
}

fn pop(id: u64) {
    HELD.with(|h| {
        let mut h = h.borrow_mut();
        if let Some(i) = h.iter().rposition(|&x| x == id) {
            h.remove(i);
        }
    });
}

/// One backend's gate.
#[derive(Debug, Default)]
pub(crate) struct Gate(RwLock<()>);

/// Shared passage through a gate (or none needed: this thread already holds it).
pub(crate) struct Pass<'a> {
    _read: Option<RwLockReadGuard<'a, ()>>,
    id: Option<u64>,
}

impl Drop for Pass<'_> {
    fn drop(&mut self) {
        if let Some(id) = self.id {
            pop(id);
        }
    }
}

/// Exclusive passage: no other thread queues work on the backend while it lives.
pub(crate) struct Exclusive<'a> {
    _write: RwLockWriteGuard<'a, ()>,
    id: u64,
}

impl Drop for Exclusive<'_> {
    fn drop(&mut self) {
        pop(self.id);
    }
}

impl Gate {
    /// Passage for backend `id`'s work from this thread.
    pub(crate) fn pass(&self, id: u64) -> Pass<'_> {
        if holds(id) {
            return Pass {
                _read: None,
                id: None,
            };
        }
        let read = self.0.read().unwrap_or_else(|p| p.into_inner());
        push(id);
        Pass {
            _read: Some(read),
            id: Some(id),
        }
    }

    /// Exclusive passage for a capture on backend `id` (waits for the work other threads are
    /// queueing to be queued). Must not be taken by a thread that already passes the gate.
    pub(crate) fn exclusive(&self, id: u64) -> Exclusive<'_> {
        let write = self.0.write().unwrap_or_else(|p| p.into_inner());
        push(id);
        Exclusive { _write: write, id }
    }

    /// Whether this thread holds backend `id`'s gate.
    pub(crate) fn held_here(id: u64) -> bool {
        holds(id)
    }
}

/// A locked library handle with the gate passage it was taken under (the handle's lock is
/// released first).
pub(crate) struct Locked<'a, T> {
    guard: MutexGuard<'a, T>,
    _pass: Pass<'a>,
}

impl<'a, T> Locked<'a, T> {
    pub(crate) fn new(pass: Pass<'a>, guard: MutexGuard<'a, T>) -> Self {
        Locked { guard, _pass: pass }
    }
}

impl<T> Deref for Locked<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.guard
    }
}

impl<T> DerefMut for Locked<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        &mut self.guard
    }
}
