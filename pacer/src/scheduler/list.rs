//! Intrusive doubly linked lists of flow indices: the links live in one
//! array indexed by flow, so moving a flow between lists is O(1) and never
//! allocates.

pub(crate) const NIL: u32 = u32::MAX;

/// Previous and next flow of each flow in whatever list holds it.
#[derive(Debug, Default)]
pub(crate) struct Links {
    prev: Vec<u32>,
    next: Vec<u32>,
}

/// Head and tail of one list.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct List {
    head: u32,
    tail: u32,
}

impl Default for List {
    fn default() -> Self {
        List {
            head: NIL,
            tail: NIL,
        }
    }
}

impl Links {
    /// Makes room for flow index `i`.
    pub(crate) fn ensure(&mut self, i: u32) {
        let n = i as usize + 1;
        if self.prev.len() < n {
            self.prev.resize(n, NIL);
            self.next.resize(n, NIL);
        }
    }

    pub(crate) fn push_back(&mut self, list: &mut List, i: u32) {
        let iu = i as usize;
        self.prev[iu] = list.tail;
        self.next[iu] = NIL;
        if list.tail == NIL {
            list.head = i;
        } else {
            self.next[list.tail as usize] = i;
        }
        list.tail = i;
    }

    pub(crate) fn unlink(&mut self, list: &mut List, i: u32) {
        let iu = i as usize;
        let (p, n) = (self.prev[iu], self.next[iu]);
        if p == NIL {
            list.head = n;
        } else {
            self.next[p as usize] = n;
        }
        if n == NIL {
            list.tail = p;
        } else {
            self.prev[n as usize] = p;
        }
        self.prev[iu] = NIL;
        self.next[iu] = NIL;
    }

    pub(crate) fn pop_front(&mut self, list: &mut List) -> Option<u32> {
        let h = list.head;
        if h == NIL {
            return None;
        }
        self.unlink(list, h);
        Some(h)
    }

    /// Moves every element of `from` to the back of `to`, calling `each`
    /// on each moved index.
    pub(crate) fn append(&mut self, to: &mut List, from: &mut List, mut each: impl FnMut(u32)) {
        let mut i = from.head;
        while i != NIL {
            each(i);
            i = self.next[i as usize];
        }
        if from.head == NIL {
            return;
        }
        if to.tail == NIL {
            to.head = from.head;
        } else {
            self.next[to.tail as usize] = from.head;
            self.prev[from.head as usize] = to.tail;
        }
        to.tail = from.tail;
        *from = List::default();
    }
}

impl List {
    pub(crate) fn is_empty(&self) -> bool {
        self.head == NIL
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn collect(links: &mut Links, mut l: List) -> Vec<u32> {
        let mut v = vec![];
        while let Some(i) = links.pop_front(&mut l) {
            v.push(i);
        }
        v
    }

    #[test]
    fn push_unlink_append() {
        let mut links = Links::default();
        links.ensure(9);
        let (mut a, mut b) = (List::default(), List::default());
        for i in 0..5 {
            links.push_back(&mut a, i);
        }
        for i in 5..8 {
            links.push_back(&mut b, i);
        }
        links.unlink(&mut a, 0);
        links.unlink(&mut a, 2);
        links.unlink(&mut a, 4);
        let mut moved = vec![];
        links.append(&mut a, &mut b, |i| moved.push(i));
        assert_eq!(moved, [5, 6, 7]);
        assert!(b.is_empty());
        assert_eq!(collect(&mut links, a), [1, 3, 5, 6, 7]);
    }
}
