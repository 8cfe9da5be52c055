//! The capture gate of a CUDA device: while one thread captures a CUDA graph on a backend's
//! stream ([`crate::CudaBackend::capture`]), work that other threads queue on the same stream
//! would silently become part of the graph, and anything that synchronises the device (a new
//! stream of a fresh context, `cuMemFree`) would invalidate the capture. So every entry point
//! of every backend instance on the device that queues work, waits, allocates, frees or takes
//! the cuBLAS/cuSOLVER handle passes the device's gate (a shared lock, uncontended except
//! during a capture), and a capture holds it exclusively. A thread that already holds the gate
//! (a nested entry point, or the capturing thread itself) passes freely, so nothing deadlocks
//! on itself.

use std::cell::RefCell;
use std::collections::HashMap;
use std::ops::{Deref, DerefMut};
use std::sync::{Arc, Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};

thread_local! {
    /// The devices (by ordinal) whose gate this thread holds, innermost last.
    static HELD: RefCell<Vec<usize>> = const { RefCell::new(Vec::new()) };
}

fn holds(id: usize) -> bool {
    HELD.with(|h| h.borrow().contains(&id))
}

fn push(id: usize) {
    HELD.with(|h| h.borrow_mut().push(id));
}

fn pop(id: usize) {
    HELD.with(|h| {
        let mut h = h.borrow_mut();
        if let Some(i) = h.iter().rposition(|&x| x == id) {
            h.remove(i);
        }
    });
}

/// One device's gate.
#[derive(Debug)]
pub(crate) struct Gate {
    lock: RwLock<()>,
    device: usize,
}

/// Shared passage through a gate (or none needed: this thread already holds it).
pub(crate) struct Pass<'a> {
    _read: Option<RwLockReadGuard<'a, ()>>,
    id: Option<usize>,
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
    id: usize,
}

impl Drop for Exclusive<'_> {
    fn drop(&mut self) {
        pop(self.id);
    }
}

impl Gate {
    /// The gate of device `ordinal`, shared by every backend instance on it.
    pub(crate) fn for_device(ordinal: usize) -> Arc<Gate> {
        static GATES: Mutex<Option<HashMap<usize, Arc<Gate>>>> = Mutex::new(None);
        let mut gates = GATES.lock().unwrap_or_else(|p| p.into_inner());
        gates
            .get_or_insert_with(HashMap::new)
            .entry(ordinal)
            .or_insert_with(|| {
                Arc::new(Gate {
                    lock: RwLock::new(()),
                    device: ordinal,
                })
            })
            .clone()
    }

    /// Passage for this thread's work on the device.
    pub(crate) fn pass(&self) -> Pass<'_> {
        if holds(self.device) {
            return Pass {
                _read: None,
                id: None,
            };
        }
        let read = self.lock.read().unwrap_or_else(|p| p.into_inner());
        push(self.device);
        Pass {
            _read: Some(read),
            id: Some(self.device),
        }
    }

    /// Exclusive passage for a capture (waits for the work other threads are queueing to be
    /// queued). Must not be taken by a thread that already passes the gate.
    pub(crate) fn exclusive(&self) -> Exclusive<'_> {
        let write = self.lock.write().unwrap_or_else(|p| p.into_inner());
        push(self.device);
        Exclusive {
            _write: write,
            id: self.device,
        }
    }

    /// Whether this thread holds the gate.
    pub(crate) fn held_here(&self) -> bool {
        holds(self.device)
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
