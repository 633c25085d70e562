//! Latency, as perftest measures it. WRITE: ping-pong — the client WRITEs
//! into the server's buffer, the server spins on the buffer's last byte
//! and WRITEs back, the client spins on its own; half the round trip is
//! reported. READ: the client READs the server's buffer and polls its CQ;
//! the full round trip is reported. With `--loopback` one thread drives
//! both ends. Each sample reads the clock twice, before and after, and
//! never while it waits ([`super::patience`]), as every floor does.

use std::time::{Duration, Instant};

use dataplane::dpdk::rdtsc;
use hdrhistogram::Histogram;
use verbs::{Completion, Cq, WcStatus, WorkRequest, WrOp};

use super::args::{PerfArgs, Test};
use super::conn::{Conn, Side};
use super::patience::{self, Patience};

/// One size's latencies (ns of the reported latency).
pub struct LatResult {
    pub size: u32,
    pub iters: u64,
    pub hist: Histogram<u64>,
    /// WRITE: half a round trip; READ: a whole one.
    pub halved: bool,
    pub avg_ns: f64,
    pub stdev_ns: f64,
}

impl LatResult {
    /// The median round trip (for the baseline ratios).
    pub fn typical_rtt_ns(&self) -> f64 {
        let t = self.hist.value_at_quantile(0.5) as f64;
        if self.halved {
            2.0 * t
        } else {
            t
        }
    }
}

/// Drains a CQ; every completion must be a success.
pub fn drain(cq: &Cq, buf: &mut [Completion]) -> Result<usize, String> {
    let n = cq.poll(buf).map_err(|e| e.to_string())?;
    for c in &buf[..n] {
        if c.status != WcStatus::Success {
            return Err(format!(
                "{:?} of WR {} on QP {:#x} completed with {:?}",
                c.opcode, c.wr_id, c.qpn, c.status
            ));
        }
    }
    Ok(n)
}

/// Spins until byte `off` of `side`'s region reads `want`, draining the
/// CQ meanwhile; gives up after [`patience::GIVE_UP`] (a lost peer, not a
/// speed bound) without reading the clock per poll.
fn spin_byte(side: &Side, off: usize, want: u8, buf: &mut [Completion]) -> Result<(), String> {
    let mut p = Patience::new();
    while side.mr.poll_byte(off) != want {
        if !p.go_on() {
            return Err(format!(
                "no WRITE landed at byte {off} in {:?}",
                patience::GIVE_UP
            ));
        }
        if p.polls() % 1024 == 0 {
            drain(&side.cq, buf)?;
        }
    }
    drain(&side.cq, buf)?;
    Ok(())
}

/// Spins until one completion arrives on `side`'s CQ (gives up as
/// [`spin_byte`] does).
fn spin_cq(side: &Side, buf: &mut [Completion]) -> Result<(), String> {
    let mut p = Patience::new();
    while drain(&side.cq, &mut buf[..1])? == 0 {
        if !p.go_on() {
            return Err(format!("no completion in {:?}", patience::GIVE_UP));
        }
    }
    Ok(())
}

/// Posts the WRITE of the side's send buffer, inline when the message
/// is at most `inline` bytes (perftest's `-I`), signaled when `signaled`
/// (every `-Q`-th WR).
fn post_write(
    from: &Side,
    qp: usize,
    size: u32,
    wr_id: u64,
    inline: u32,
    signaled: bool,
) -> Result<(), String> {
    let q = &from.qps[qp];
    if size > 0 && size <= inline {
        let at = from.half as usize;
        let data = &from.mr.as_slice()[at..at + size as usize];
        let mut wr =
            WorkRequest::inline(wr_id, WrOp::Write, data, from.remote.va, from.remote.rkey)
                .map_err(|e| e.to_string())?;
        wr.signaled = signaled;
        return q.post(&[wr]).map_err(|e| e.to_string());
    }
    q.post_write(from.send_buf(size), &from.remote, 0, wr_id, signaled)
        .map_err(|e| e.to_string())
}

fn set_marker(side: &mut Side, size: u32, marker: u8) {
    let half = side.half as usize;
    side.mr.as_mut_slice()[half + size as usize - 1] = marker;
}

/// The application's TSC stamps of one traced round trip (`--breakdown`).
/// WRITE: the client posts, the server sees the data, the server posts,
/// the client sees the data. READ: the client posts, the client sees the
/// completion (the last two are 0).
pub type AppStamps = [u64; 4];

/// Runs `iters` (or `-D` seconds of) round trips at `size`; with `app`,
/// stamps each one there (WR ids are the iteration's number either way).
pub fn run(
    test: Test,
    a: &PerfArgs,
    conn: &mut Conn,
    size: u32,
    iters: u64,
    started: Instant,
    mut app: Option<&mut Vec<AppStamps>>,
) -> Result<LatResult, String> {
    let (deadline, iters) = conn.begin_size(a, size, iters, started)?;
    let mut hist = Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3).expect("bounds");
    let mut buf = [verbs::empty_completion(); 64];
    let (mut sum, mut sum2, mut n) = (0f64, 0f64, 0u64);
    let mut last_progress = Instant::now();
    let q = a.qps as usize;
    let last = size.max(1) as usize - 1;
    let server_only = conn.client.is_none();
    let inline = a.inline_size(test);
    // Every `-Q`-th WR of a QP is signaled, and the last.
    let cq_mod = u64::from(a.cq_mod(test));
    let signaled = |i: u64| (i / q as u64 + 1) % cq_mod == 0 || i + 1 == iters;
    if server_only {
        let s = conn.server.as_mut().expect("a side");
        if test == Test::WriteLat {
            for i in 0..iters {
                let marker = (i % 255) as u8 + 1;
                spin_byte(s, last, marker, &mut buf)?;
                set_marker(s, size, marker);
                post_write(s, i as usize % q, size, i, inline, signaled(i))?;
            }
        }
        conn.sync("size done")?;
        return Ok(LatResult {
            size,
            iters: 0,
            hist,
            halved: test == Test::WriteLat,
            avg_ns: 0.0,
            stdev_ns: 0.0,
        });
    }
    let mut i = 0u64;
    while i < iters && deadline.is_none_or(|d| Instant::now() < d) {
        let qp = i as usize % q;
        let marker = (i % 255) as u8 + 1;
        let stamp = |on: bool| if on { rdtsc() } else { 0 };
        let traced = app.is_some();
        let mut st: AppStamps = [0; 4];
        let t0 = Instant::now();
        match test {
            Test::WriteLat => {
                let c = conn.client.as_mut().expect("client");
                set_marker(c, size, marker);
                st[0] = stamp(traced);
                post_write(c, qp, size, i, inline, signaled(i))?;
                if let Some(s) = conn.server.as_mut() {
                    spin_byte(s, last, marker, &mut buf)?;
                    st[1] = stamp(traced);
                    set_marker(s, size, marker);
                    st[2] = stamp(traced);
                    post_write(s, qp, size, i, inline, signaled(i))?;
                }
                let c = conn.client.as_ref().expect("client");
                spin_byte(c, last, marker, &mut buf)?;
                st[3] = stamp(traced);
            }
            _ => {
                let c = conn.client.as_ref().expect("client");
                st[0] = stamp(traced);
                c.qps[qp]
                    .post_read(c.send_buf(size), &c.remote, 0, i, true)
                    .map_err(|e| e.to_string())?;
                spin_cq(c, &mut buf)?;
                st[1] = stamp(traced);
            }
        }
        if let Some(v) = app.as_deref_mut() {
            v.push(st);
        }
        let rtt = t0.elapsed().as_nanos() as u64;
        let v = if test == Test::WriteLat { rtt / 2 } else { rtt };
        hist.record(v.max(1)).map_err(|e| e.to_string())?;
        let f = v as f64;
        sum += f;
        sum2 += f * f;
        n += 1;
        i += 1;
        if started.elapsed() > Duration::from_secs(2)
            && last_progress.elapsed() >= Duration::from_secs(1)
        {
            last_progress = Instant::now();
            eprintln!(
                " progress: {size} B, {n} iterations, {:.1} s",
                started.elapsed().as_secs_f64()
            );
        }
    }
    if conn.session.is_some() {
        conn.sync("size done")?;
    }
    let avg = sum / n.max(1) as f64;
    let var = (sum2 / n.max(1) as f64 - avg * avg).max(0.0);
    Ok(LatResult {
        size,
        iters: n,
        hist,
        halved: test == Test::WriteLat,
        avg_ns: avg,
        stdev_ns: var.sqrt(),
    })
}
