//! The mbuf wrapper's own field arithmetic (data, append, trim, tailroom
//! on single-segment mbufs) against DPDK's accessors: lengths agree after
//! every step, bytes written through `append` read back through `data`,
//! and an append past the tailroom or a trim past the data is refused
//! without changing the mbuf. One EAL per process (harness = false).

mod loopback_util;

use dataplane::dpdk::Mempool;

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
    drop(pool);
    drop(eal);
    println!("mbuf_fields: append, trim, data and tailroom agree with DPDK's accessors");
}
