//! The mbuf wrapper's own field arithmetic (data, append, trim, tailroom
//! on single-segment mbufs) against DPDK's accessors: lengths agree after
//! every step, bytes written through `append` read back through `data`,
//! and an append past the tailroom or a trim past the data is refused
//! without changing the mbuf. And a frame sent from where its payload
//! lies (zero-copy TX): a chain of headers, a segment pointing into
//! external memory and the tail, which reads back as the frame, keeps the
//! memory alive until the chain is freed, and joins into one buffer.
//! And mbufs fetched and freed in bulk: all or none from the pool, every
//! one back (chains with their external memory too), more than a bulk
//! call's worth at once.
//! One EAL per process (harness = false).

mod loopback_util;

use std::sync::Arc;

use dataplane::dpdk::{ExtMemory, Mbuf, Mempool, BULK};

fn main() {
    let eal = loopback_util::eal("mbuf-fields", &[]);
    let pool = Mempool::with_frames(&eal, "mbuf_fields", 63, 0, 4096 + 512).expect("pool");
    let mut m = pool.alloc().expect("an mbuf");
    let room = m.tailroom();
    assert_eq!(m.dpdk_lengths(), (0, 0, room), "a fresh mbuf");
    assert!(room >= 4096 + 512, "room {room}");
    let a = m.append(100).expect("100 bytes");
    for (i, b) in a.iter_mut().enumerate() {
        *b = i as u8;
    }
    assert_eq!(m.dpdk_lengths(), (100, 100, room - 100));
    assert_eq!(m.tailroom(), room - 100);
    let b = m.append(28).expect("28 more");
    b.fill(0xee);
    assert_eq!(m.data().len(), 128);
    assert!(m.data()[..100]
        .iter()
        .enumerate()
        .all(|(i, &b)| b == i as u8));
    assert!(m.data()[100..].iter().all(|&b| b == 0xee));
    assert!(m.trim(40));
    assert_eq!(m.dpdk_lengths(), (88, 88, room - 88));
    assert!(!m.trim(89), "past the data");
    assert_eq!(m.dpdk_lengths(), (88, 88, room - 88), "unchanged");
    assert!(m.append(room - 88 + 1).is_none(), "past the tailroom");
    assert_eq!(m.dpdk_lengths(), (88, 88, room - 88), "unchanged");
    assert_eq!(m.append(room - 88).map(|d| d.len()), Some(room - 88));
    assert_eq!(m.dpdk_lengths(), (room, room, 0));
    assert!(m.trim(room));
    assert_eq!(m.dpdk_lengths(), (0, 0, room));
    m.data_mut();
    drop(m);
    assert_eq!(pool.in_use(), 0, "the mbuf went back");
    external_payload(&pool);
    bulk(&pool);
    drop(pool);
    drop(eal);
    println!("mbuf_fields: append, trim, data and tailroom agree with DPDK's accessors");
}

/// Headers in an mbuf, a payload in memory the pool does not own, a tail.
fn external_payload(pool: &Mempool) {
    let memory: Arc<Vec<u8>> = Arc::new((0..3000u32).map(|i| (i * 7) as u8).collect());
    let alive = Arc::downgrade(&memory);
    let base = memory.as_ptr();
    // SAFETY: the Vec's bytes live as long as the Arc the ExtMemory keeps.
    let ext = unsafe { ExtMemory::new(base, memory.len(), memory.clone()) };
    let payload = &memory[1000..2024];
    let mut m = pool.alloc().expect("an mbuf");
    m.append(58).expect("headers").fill(0x11);
    assert!(m.rest().is_none(), "one segment");
    assert!(
        !m.chain_external(&ext, &[0u8; 4][..], b"tail"),
        "not inside the memory"
    );
    assert_eq!(pool.in_use(), 1, "nothing taken from the pool by a refusal");
    assert!(m.chain_external(&ext, payload, b"pad+icrc"));
    assert_eq!(m.segments(), 3);
    assert_eq!(m.dpdk_lengths().1, 58 + 1024 + 8, "the packet's length");
    let (p, t) = m.rest().expect("three segments");
    assert_eq!(p.as_ptr(), payload.as_ptr(), "the payload where it lies");
    assert_eq!(p, payload);
    assert_eq!(t, b"pad+icrc");
    assert_eq!(m.data(), &[0x11; 58][..], "the headers");
    assert!(!m.chain_external(&ext, payload, b"x"), "chained already");
    drop(memory);
    drop(ext);
    assert!(alive.upgrade().is_some(), "the chain keeps the memory");
    // Joined into one buffer: the same bytes, the memory let go.
    assert!(m.linearize());
    assert_eq!(m.segments(), 1);
    assert!(alive.upgrade().is_none(), "let go with the payload segment");
    assert_eq!(m.data().len(), 58 + 1024 + 8);
    assert_eq!(
        &m.data()[58..58 + 1024],
        &(1000..2024u32).map(|i| (i * 7) as u8).collect::<Vec<_>>()[..]
    );
    assert_eq!(&m.data()[58 + 1024..], b"pad+icrc");
    drop(m);
    assert_eq!(pool.in_use(), 0, "every segment went back");
    // Freed as a chain, the last reference frees the memory.
    let (m, alive) = chained(pool, 5);
    assert!(alive.upgrade().is_some());
    drop(m);
    assert!(alive.upgrade().is_none(), "freed with the chain");
    assert_eq!(pool.in_use(), 0);
}

/// `alloc_bulk` takes all it is asked for or nothing; `free_bulk` returns
/// every mbuf it is given, in calls of at most [`BULK`].
fn bulk(pool: &Mempool) {
    let mut v = Vec::new();
    assert!(pool.alloc_bulk(&mut v, BULK));
    assert_eq!(v.len(), BULK);
    assert_eq!(pool.in_use() as usize, BULK);
    assert!(v.iter().all(|m| m.dpdk_lengths().1 == 0), "fresh mbufs");
    let left = 63 - BULK;
    assert!(left < BULK, "the pool of 63 has fewer than a bulk left");
    assert!(!pool.alloc_bulk(&mut v, BULK), "all or none");
    assert_eq!(v.len(), BULK, "nothing added by a refusal");
    assert_eq!(pool.in_use() as usize, BULK, "nothing taken by a refusal");
    // More than one call's worth, a chain over external memory among them.
    for _ in 0..8 {
        v.push(pool.alloc().expect("an mbuf"));
    }
    let (m, alive) = chained(pool, 9);
    v.push(m);
    assert!(v.len() > BULK);
    Mbuf::free_bulk(&mut v);
    assert!(v.is_empty());
    assert_eq!(pool.in_use(), 0, "every mbuf and segment went back");
    assert!(alive.upgrade().is_none(), "the chain's memory let go");
}

/// An mbuf of 42 header bytes chained to 256 bytes of external memory
/// filled with `fill` and a tail, that memory's only owner now the chain,
/// and a weak reference that tells when the chain let it go.
fn chained(pool: &Mempool, fill: u8) -> (Mbuf, std::sync::Weak<Vec<u8>>) {
    let memory: Arc<Vec<u8>> = Arc::new(vec![fill; 512]);
    let alive = Arc::downgrade(&memory);
    // SAFETY: the Vec's bytes live as long as the Arc the ExtMemory keeps.
    let ext = unsafe { ExtMemory::new(memory.as_ptr(), 512, memory.clone()) };
    let mut m = pool.alloc().expect("an mbuf");
    m.append(42).expect("headers");
    assert!(m.chain_external(&ext, &memory[..256], b"icrc"));
    (m, alive)
}
