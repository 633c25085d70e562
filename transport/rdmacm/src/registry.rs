//! The process's live ids by the name the daemon's events give them, and
//! the channel each is on. Event processing borrows an id through
//! [`hold`]; `rdma_destroy_id` removes the id first and then waits until
//! no borrow is left and every delivered event is acked, so an event
//! never reaches a freed id. A connection request's new id is *pending*
//! from the request's arrival until it is made: its early events wait
//! beside the request instead of being dropped as an unknown id's.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex};

use shm::cma::{CmEventMsg, CmEventType, CmId, DAEMON_ID};

use crate::channel::{Queued, Shared};
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
    /// The channel the id's events go to now.
    channel: Arc<Shared>,
    /// The daemon channel they physically arrive on (`channel` itself,
    /// or for a local channel the one forwarding to it).
    source: Arc<Shared>,
}

#[derive(Default)]
struct Table {
    ids: HashMap<Key, Entry>,
    /// The ids of CONNECT_REQUESTs queued but not yet taken, and the
    /// channel each request went to (their early events wait there).
    pending: HashMap<Key, Arc<Shared>>,
}

static IDS: LazyLock<Mutex<Table>> = LazyLock::new(Default::default);

fn table() -> std::sync::MutexGuard<'static, Table> {
    IDS.lock().unwrap_or_else(|p| p.into_inner())
}

pub fn insert(key: Key, id: *const Id, channel: Arc<Shared>, source: Arc<Shared>) {
    table().ids.insert(
        key,
        Entry {
            id: id as usize,
            channel,
            source,
        },
    );
}

pub fn remove(key: Key) {
    table().ids.remove(&key);
}

/// The id's events go to `channel` from now on, arriving on `source`.
pub fn set_channel(key: Key, channel: Arc<Shared>, source: Arc<Shared>) {
    if let Some(e) = table().ids.get_mut(&key) {
        e.channel = channel;
        e.source = source;
    }
}

/// The channel the id is on now.
#[cfg(test)]
pub fn channel_of(key: Key) -> Option<Arc<Shared>> {
    table().ids.get(&key).map(|e| e.channel.clone())
}

/// The channel whose daemon connection the id's events arrive on.
pub fn source_of(key: Key) -> Option<Arc<Shared>> {
    table().ids.get(&key).map(|e| e.source.clone())
}

/// The ids whose events arrive on `source`, with the channel each is on.
pub fn fed_by(source: &Arc<Shared>) -> Vec<(Key, Arc<Shared>)> {
    table()
        .ids
        .iter()
        .filter(|(_, e)| Arc::ptr_eq(&e.source, source))
        .map(|(k, e)| (*k, e.channel.clone()))
        .collect()
}

/// Queues a daemon event on the channel its id is on now (a
/// CONNECT_REQUEST on its listener's, its new id then pending; an event
/// of a pending id beside its request), with the table locked so that
/// the id cannot move meanwhile. Gives the event back when its id is
/// gone (or was never known).
pub fn deliver(m: Box<CmEventMsg>) -> Result<(), Box<CmEventMsg>> {
    let mut t = table();
    let item = Queued::Daemon(m);
    let target = item.target();
    let to = match t.ids.get(&target) {
        Some(e) => e.channel.clone(),
        None => match t.pending.get(&target) {
            Some(ch) => ch.clone(),
            None => {
                let Queued::Daemon(m) = item else {
                    unreachable!("made above")
                };
                return Err(m);
            }
        },
    };
    if let Queued::Daemon(m) = &item {
        if m.event == CmEventType::ConnectRequest && m.listener.is_some() {
            t.pending.insert(key(m.session, m.id), to.clone());
        }
    }
    to.push(item);
    Ok(())
}

/// The pending id `key` was made or refused: the channel its early
/// events wait on.
pub fn settled(key: Key) -> Option<Arc<Shared>> {
    table().pending.remove(&key)
}

/// Whether `key` is a connection request's id not made yet.
pub fn is_pending(key: Key) -> bool {
    table().pending.contains_key(&key)
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
    let t = table();
    let e = t.ids.get(&key)?;
    let id = e.id as *const Id;
    // SAFETY: in the table, so not yet destroyed; counted before the
    // table lock is let go.
    unsafe { &*id }.begin_borrow();
    Some(Held { id })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(session: u64, id: CmId, listener: Option<CmId>, event: CmEventType) -> Box<CmEventMsg> {
        Box::new(CmEventMsg {
            session,
            id,
            listener,
            event,
            status: 0,
            private_data: Vec::new(),
            conn: Default::default(),
            path: None,
        })
    }

    #[test]
    fn an_unknown_id_s_event_is_given_back_not_queued() {
        let m = ev(9, 0x7000_0010, None, CmEventType::Established);
        assert!(deliver(m).is_err());
    }

    #[test]
    fn a_request_s_id_is_pending_and_its_early_events_wait_beside_it() {
        let ch = Shared::new_local_for_tests();
        let listener = (0, 0x7000_0011);
        insert(listener, std::ptr::null(), ch.clone(), ch.clone());
        let child = DAEMON_ID | 0x7000_0012;
        deliver(ev(9, child, Some(listener.1), CmEventType::ConnectRequest)).unwrap();
        assert!(is_pending((9, child)));
        deliver(ev(9, child, None, CmEventType::Rejected)).unwrap();
        let was = settled((9, child)).unwrap();
        assert!(Arc::ptr_eq(&was, &ch));
        assert!(!is_pending((9, child)));
        assert!(deliver(ev(9, child, None, CmEventType::Disconnected)).is_err());
        remove(listener);
        let got: Vec<Key> = std::iter::from_fn(|| ch.take(None, false).ok())
            .map(|q| q.target())
            .collect();
        assert_eq!(got, vec![listener, (9, child)]);
    }
}
