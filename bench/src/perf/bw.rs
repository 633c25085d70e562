//! Bandwidth, as perftest measures it: the client keeps `-t` WRITEs (or
//! READs, at most `-o` outstanding per QP in the engine) in flight,
//! posting in batches of up to 16 behind one doorbell, round robin over
//! the QPs, until `-n` messages complete (or `-D` seconds pass). The
//! server end is passive.

use std::time::{Duration, Instant};

use verbs::{LocalBuf, WorkRequest, WrOp};

use super::args::{PerfArgs, Test};
use super::conn::Conn;
use super::lat::drain;

/// One size's bandwidth.
pub struct BwResult {
    pub size: u32,
    pub iters: u64,
    /// Best rate over a twentieth of the run, b/s of payload.
    pub peak_bps: f64,
    pub avg_bps: f64,
    /// Messages per second.
    pub msg_rate: f64,
}

/// WRs per doorbell.
const BATCH: usize = 16;

pub fn run(
    test: Test,
    a: &PerfArgs,
    conn: &mut Conn,
    size: u32,
    iters: u64,
    started: Instant,
) -> Result<BwResult, String> {
    let (deadline, iters) = conn.begin_size(a, size, iters, started)?;
    let Some(c) = conn.client.as_ref() else {
        // The server end only waits.
        conn.sync("size done")?;
        return Ok(BwResult {
            size,
            iters: 0,
            peak_bps: 0.0,
            avg_bps: 0.0,
            msg_rate: 0.0,
        });
    };
    let op = if test.is_read() {
        WrOp::Read
    } else {
        WrOp::Write
    };
    let depth = u64::from(a.tx_depth);
    let mark_every = (iters / 20).clamp(1, 1 << 20);
    let mut marks: Vec<(u64, Instant)> = Vec::new();
    let mut buf = [verbs::empty_completion(); 64];
    let mut batch: Vec<WorkRequest> = Vec::with_capacity(BATCH);
    let (mut posted, mut done) = (0u64, 0u64);
    let mut qp = 0usize;
    let mut last_progress = Instant::now();
    let t0 = Instant::now();
    marks.push((0, t0));
    loop {
        let stop = deadline.is_some_and(|d| Instant::now() >= d);
        if done >= iters || (stop && posted == done) {
            break;
        }
        while !stop && posted < iters && posted - done < depth {
            let room = (depth - (posted - done))
                .min(iters - posted)
                .min(BATCH as u64);
            batch.clear();
            for k in 0..room {
                batch.push(WorkRequest {
                    wr_id: posted + k,
                    op,
                    local: LocalBuf {
                        lkey: c.mr.lkey,
                        va: c.mr.va + c.half,
                        len: size,
                    },
                    remote_va: c.remote.va,
                    rkey: c.remote.rkey,
                    signaled: true,
                    fence: false,
                    payload: verbs::Payload::Local,
                });
            }
            match c.qps[qp].post(&batch) {
                Ok(()) => {
                    posted += room;
                    qp = (qp + 1) % c.qps.len();
                }
                Err(verbs::VerbsError::SendQueueFull { .. }) => break,
                Err(e) => return Err(e.to_string()),
            }
        }
        let n = drain(&c.cq, &mut buf)? as u64;
        if n > 0 {
            let before = done;
            done += n;
            if done / mark_every != before / mark_every {
                marks.push((done, Instant::now()));
            }
        }
        if started.elapsed() > Duration::from_secs(2)
            && last_progress.elapsed() >= Duration::from_secs(1)
        {
            last_progress = Instant::now();
            eprintln!(
                " progress: {size} B, {done} messages, {:.1} s",
                started.elapsed().as_secs_f64()
            );
        }
        if t0.elapsed() > Duration::from_secs(600) {
            return Err(format!("{size} B: {done} of {iters} done after 600 s"));
        }
    }
    let secs = t0.elapsed().as_secs_f64().max(1e-9);
    let bits = |msgs: u64| msgs as f64 * f64::from(size) * 8.0;
    let peak = marks
        .windows(2)
        .map(|w| {
            let dt = (w[1].1 - w[0].1).as_secs_f64();
            if dt > 0.0 {
                bits(w[1].0 - w[0].0) / dt
            } else {
                0.0
            }
        })
        .fold(0.0, f64::max);
    drop(batch);
    if conn.session.is_some() {
        conn.sync("size done")?;
    }
    Ok(BwResult {
        size,
        iters: done,
        peak_bps: peak.max(bits(done) / secs),
        avg_bps: bits(done) / secs,
        msg_rate: done as f64 / secs,
    })
}
