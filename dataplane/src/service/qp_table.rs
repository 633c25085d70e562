//! The service's QPs of one host, indexed by QPN (the engine hands QPNs
//! out densely from `QPN_BASE`, or every N-th one for a QP shard of N,
//! still below `QPN_BASE + MAX_QPS`), so that routing a completion or polling
//! the send rings costs an index, not a hash.

use transport::rc::{Qpn, QPN_BASE};

#[derive(Debug)]
pub struct QpTable<T> {
    slots: Vec<Option<T>>,
    len: usize,
}

impl<T> Default for QpTable<T> {
    fn default() -> Self {
        QpTable {
            slots: Vec::new(),
            len: 0,
        }
    }
}

fn index(qpn: Qpn) -> Option<usize> {
    qpn.checked_sub(QPN_BASE).map(|i| i as usize)
}

impl<T> QpTable<T> {
    pub fn get(&self, qpn: &Qpn) -> Option<&T> {
        self.slots.get(index(*qpn)?)?.as_ref()
    }

    pub fn get_mut(&mut self, qpn: &Qpn) -> Option<&mut T> {
        self.slots.get_mut(index(*qpn)?)?.as_mut()
    }

    pub fn insert(&mut self, qpn: Qpn, v: T) {
        let Some(i) = index(qpn) else {
            return;
        };
        if self.slots.len() <= i {
            self.slots.resize_with(i + 1, || None);
        }
        if self.slots[i].replace(v).is_none() {
            self.len += 1;
        }
    }

    pub fn remove(&mut self, qpn: &Qpn) -> Option<T> {
        let v = self.slots.get_mut(index(*qpn)?)?.take();
        if v.is_some() {
            self.len -= 1;
        }
        v
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn iter(&self) -> impl Iterator<Item = (Qpn, &T)> {
        self.slots
            .iter()
            .enumerate()
            .filter_map(|(i, v)| v.as_ref().map(|v| (QPN_BASE + i as u32, v)))
    }

    pub fn values(&self) -> impl Iterator<Item = &T> {
        self.slots.iter().flatten()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_are_found_by_qpn_and_counted() {
        let mut t = QpTable::default();
        t.insert(QPN_BASE + 3, "a");
        t.insert(QPN_BASE, "b");
        assert_eq!(t.get(&(QPN_BASE + 3)), Some(&"a"));
        assert_eq!(t.get(&0), None, "below the base");
        assert_eq!(t.len(), 2);
        assert_eq!(
            t.iter().map(|(q, _)| q).collect::<Vec<_>>(),
            vec![QPN_BASE, QPN_BASE + 3]
        );
        assert_eq!(t.remove(&QPN_BASE), Some("b"));
        assert_eq!(t.remove(&QPN_BASE), None);
        assert_eq!(t.len(), 1);
    }
}
