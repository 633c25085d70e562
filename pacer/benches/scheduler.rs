//! Cost of one PktSend decision (next_send + the caller's set_next_packet)
//! against the number of active flows, and with many idle flows beside a
//! few active ones. Virtual time advances one 1 KiB packet time of a
//! 100 Gb/s link per decision; each flow is paced at 1.25x its fair share,
//! so flows move between the ready FIFO and the timing wheel as they would
//! under load.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use pacer::scheduler::{FlowScheduler, SchedulerConfig};

const LINK_BPS: u64 = 100_000_000_000;
const PKT: u32 = 1024;
const PKT_NS: u64 = PKT as u64 * 8_000_000_000 / LINK_BPS;

fn loaded(active: usize, idle: usize) -> (FlowScheduler, u64) {
    let mut s = FlowScheduler::new(SchedulerConfig::default(), 0);
    let rate = LINK_BPS * 5 / 4 / active as u64;
    for _ in 0..idle {
        s.add_flow(rate, u64::MAX, 0);
    }
    for _ in 0..active {
        let f = s.add_flow(rate, u64::MAX, 0);
        s.set_next_packet(f, Some(PKT), 0);
    }
    // Warm up into steady state.
    let mut now = 0;
    for _ in 0..(4 * active).max(100_000) {
        now += PKT_NS;
        if let Some(p) = s.next_send(now) {
            s.set_next_packet(p.flow, Some(PKT), now);
        }
    }
    (s, now)
}

fn decisions(c: &mut Criterion) {
    let mut g = c.benchmark_group("pktsend_decision");
    g.throughput(Throughput::Elements(1));
    for (active, idle) in [
        (10, 0),
        (100, 0),
        (1_000, 0),
        (10_000, 0),
        (100_000, 0),
        (10, 100_000),
    ] {
        let (mut s, mut now) = loaded(active, idle);
        g.bench_function(
            BenchmarkId::from_parameter(format!("active={active},idle={idle}")),
            |b| {
                b.iter(|| {
                    now += PKT_NS;
                    if let Some(p) = s.next_send(now) {
                        s.set_next_packet(p.flow, Some(PKT), now);
                    }
                })
            },
        );
    }
    g.finish();
}

criterion_group!(benches, decisions);
criterion_main!(benches);
