//! Property tests of the shared-memory rings (`transport::abi`): under any
//! interleaving of batched writes, publishes and pops, after any amount of
//! earlier use (the index wrap itself is a unit test of the module), the
//! consumer gets exactly
//! what was written, in order (an entry is visible from its stamp once
//! written, published or not); the producer never sees more room than
//! there is, and sees all of it when it asks for it.

use proptest::prelude::*;
use shm::abi::{Consumer, Cqe, HeapSegment, Producer, RingLayout};

#[derive(Debug, Clone)]
enum Op {
    /// Write up to this many entries (as many as `free(want)` allows),
    /// then publish (or not).
    Post(u32, bool),
    /// Pop up to this many entries.
    Pop(u32),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (1u32..40, any::<bool>()).prop_map(|(k, publish)| Op::Post(k, publish)),
        (1u32..40).prop_map(Op::Pop)
    ]
}

fn entry(i: u64) -> Cqe {
    Cqe {
        wr_id: i,
        ..bytemuck::Zeroable::zeroed()
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(500))]

    #[test]
    fn what_is_published_is_consumed_in_order(
        cap_log in 0u32..6,
        warm in 0u32..300,
        ops in prop::collection::vec(op(), 1..200),
    ) {
        let cap = 1u32 << cap_log;
        let layout = RingLayout::new(0, cap, 32).unwrap();
        let seg = HeapSegment::new(RingLayout::bytes(cap, 32));
        let mut p = Producer::<Cqe>::new(layout);
        let mut c = Consumer::<Cqe>::new(layout);
        for _ in 0..warm {
            // Move both indices along by real use, so the caches are warm.
            prop_assert!(p.push(&seg, &entry(u64::MAX)).unwrap());
            prop_assert!(c.pop(&seg).unwrap().is_some());
        }
        let (mut written, mut read, mut published) = (0u64, 0u64, 0u64);
        for o in ops {
            match o {
                Op::Post(k, publish) => {
                    let in_ring = (written - read) as u32;
                    let free = p.free(&seg, k).unwrap();
                    prop_assert!(free <= cap - in_ring, "free {} with {} in a ring of {}", free, in_ring, cap);
                    if cap - in_ring >= k {
                        prop_assert!(free >= k, "room for {} exists, free says {}", k, free);
                    }
                    for _ in 0..k.min(free) {
                        p.write(&seg, &entry(written));
                        written += 1;
                    }
                    // A producer publishes at least once a lap.
                    if publish || written - published >= u64::from(cap) {
                        p.publish(&seg);
                        published = written;
                    }
                }
                Op::Pop(k) => {
                    for _ in 0..k {
                        match c.pop(&seg).unwrap() {
                            Some(e) => {
                                prop_assert_eq!(e.wr_id, read);
                                read += 1;
                            }
                            None => {
                                prop_assert_eq!(read, written, "entries left unseen");
                                break;
                            }
                        }
                    }
                }
            }
        }
        while let Some(e) = c.pop(&seg).unwrap() {
            prop_assert_eq!(e.wr_id, read);
            read += 1;
        }
        prop_assert_eq!(read, written);
    }
}
