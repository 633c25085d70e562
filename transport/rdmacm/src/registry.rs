//! The process's live ids by the name the daemon's events give them, and
//! the channel each is on. Event processing borrows an id through
//! [`hold`]; `rdma_destroy_id` removes the id first and then waits until
//! no borrow is left and every delivered event is acked, so an event
//! never reaches a freed id.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex};

use shm::cma::{CmId, DAEMON_ID};

use crate::channel::Shared;
use crate::id::Id;

/// An id's name: (0, number) for the ids the library numbers (unique in
/// the process), (session, number) for those a daemon session numbered.
pub type Key = (u64, CmId);

/// The key of id `id` of session `session`.
pub fn key(session: u64, id: CmId) -> Key {
    if id & DAEMON_ID != 0 {
        (session, id)
    } else {
        (0, id)
    }
}

struct Entry {
    id: usize,
    channel: Arc<Shared>,
}

static IDS: LazyLock<Mutex<HashMap<Key, Entry>>> = LazyLock::new(Default::default);

fn ids() -> std::sync::MutexGuard<'static, HashMap<Key, Entry>> {
    IDS.lock().unwrap_or_else(|p| p.into_inner())
}

pub fn insert(key: Key, id: *const Id, channel: Arc<Shared>) {
    ids().insert(
        key,
        Entry {
            id: id as usize,
            channel,
        },
    );
}

pub fn remove(key: Key) {
    ids().remove(&key);
}

pub fn set_channel(key: Key, channel: Arc<Shared>) {
    if let Some(e) = ids().get_mut(&key) {
        e.channel = channel;
    }
}

/// The channel the id is on now.
pub fn channel_of(key: Key) -> Option<Arc<Shared>> {
    ids().get(&key).map(|e| e.channel.clone())
}

/// The ids on `channel`.
pub fn keys_on(channel: &Arc<Shared>) -> Vec<Key> {
    ids()
        .iter()
        .filter(|(_, e)| Arc::ptr_eq(&e.channel, channel))
        .map(|(k, _)| *k)
        .collect()
}

/// A borrowed live id (it cannot be freed until the borrow ends).
pub struct Held {
    id: *const Id,
}

impl std::ops::Deref for Held {
    type Target = Id;
    fn deref(&self) -> &Id {
        // SAFETY: hold() counted the borrow while the id was in the table;
        // rdma_destroy_id frees it only after the count is back at zero.
        unsafe { &*self.id }
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        self.end_borrow();
    }
}

/// Borrows the live id named `key`.
pub fn hold(key: Key) -> Option<Held> {
    let t = ids();
    let e = t.get(&key)?;
    let id = e.id as *const Id;
    // SAFETY: in the table, so not yet destroyed; counted before the
    // table lock is let go.
    unsafe { &*id }.begin_borrow();
    Some(Held { id })
}
