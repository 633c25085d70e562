//! Bandwidth, as perftest measures it: the client keeps `-t` WRITEs (or
//! READs, at most `-o` outstanding per QP in the engine) in flight,
//! posting in batches of up to 16 behind one doorbell, round robin over
//! the QPs, until `-n` messages complete (or `-D` seconds pass). As
//! perftest's `-Q`, only every `cq_mod`-th WR of a QP (and its last) asks
//! for a completion, which stands for the WRs before it (RC completes a
//! QP's WRs in order). The server end is passive.

use std::collections::VecDeque;
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

/// Turns of the posting loop between two clock reads.
const CLOCK_EVERY: u32 = 64;

/// Which WRs ask for a completion (perftest's `-Q`), and how many
/// messages each completion stands for.
struct Signals {
    every: u64,
    /// Each QP's index by its QPN (a completion names the QPN).
    index: std::collections::HashMap<u32, usize>,
    /// Per QP: WRs still to post, WRs posted since its last signaled
    /// one, and the sizes of its signaled groups not completed yet.
    left: Vec<u64>,
    since: Vec<u64>,
    groups: Vec<VecDeque<u64>>,
}

impl Signals {
    /// `iters` WRs over the QPs `qpns` (as evenly as they divide), every
    /// `every`-th of a QP signaled.
    fn new(every: u64, iters: u64, qpns: Vec<u32>) -> Signals {
        let n = qpns.len().max(1) as u64;
        let left = (0..n)
            .map(|i| iters / n + u64::from(i < iters % n))
            .collect();
        Signals {
            every: every.max(1),
            left,
            since: vec![0; qpns.len()],
            groups: vec![VecDeque::new(); qpns.len()],
            index: qpns.iter().enumerate().map(|(i, &q)| (q, i)).collect(),
        }
    }

    /// Books the next WR of QP `q`; whether it asks for a completion.
    fn next(&mut self, q: usize) -> bool {
        self.left[q] = self.left[q].saturating_sub(1);
        self.since[q] += 1;
        if self.since[q] < self.every && self.left[q] > 0 {
            return false;
        }
        self.groups[q].push_back(self.since[q]);
        self.since[q] = 0;
        true
    }

    /// QP `q`'s booking, to undo a batch the send queue refused.
    fn save(&self, q: usize) -> (u64, u64, usize) {
        (self.left[q], self.since[q], self.groups[q].len())
    }

    fn restore(&mut self, q: usize, (left, since, groups): (u64, u64, usize)) {
        self.left[q] = left;
        self.since[q] = since;
        self.groups[q].truncate(groups);
    }

    /// The messages a completion of QP `qpn` stands for.
    fn completed(&mut self, qpn: u32) -> u64 {
        let q = self.index.get(&qpn);
        q.and_then(|&q| self.groups[q].pop_front()).unwrap_or(1)
    }

    /// The next QP from `q` on with WRs left to post.
    fn next_qp(&self, q: usize) -> Option<usize> {
        let n = self.left.len();
        (0..n).map(|k| (q + k) % n).find(|&i| self.left[i] > 0)
    }
}

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
    // A run of -D seconds ends at an unknown WR: every WR is signaled.
    let every = if deadline.is_some() {
        1
    } else {
        u64::from(a.cq_mod(test))
    };
    let mut signals = Signals::new(every, iters, c.qps.iter().map(|q| q.qpn()).collect());
    let mut last_progress = Instant::now();
    let t0 = Instant::now();
    marks.push((0, t0));
    // The clock is read every CLOCK_EVERY turns of the loop, not every
    // turn: a clock read costs as much as a post, and a loop that waits
    // for completions would spend most of its time (and, on a core shared
    // with the daemon's hyperthread, the daemon's) reading it.
    let mut turns = 0u32;
    let mut now = t0;
    loop {
        turns = turns.wrapping_add(1);
        if turns % CLOCK_EVERY == 0 {
            now = Instant::now();
        }
        let stop = deadline.is_some_and(|d| now >= d);
        if done >= iters || (stop && posted == done) {
            break;
        }
        while !stop && posted < iters && posted - done < depth {
            let Some(q) = signals.next_qp(qp) else {
                break;
            };
            qp = q;
            let room = (depth - (posted - done))
                .min(signals.left[qp])
                .min(u64::from(c.sq_depth))
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
                    signaled: false,
                    fence: false,
                    solicited: false,
                    payload: verbs::Payload::Local,
                });
            }
            let saved = signals.save(qp);
            for w in batch.iter_mut() {
                w.signaled = signals.next(qp);
            }
            match c.qps[qp].post(&batch) {
                Ok(()) => {
                    posted += room;
                    qp = (qp + 1) % c.qps.len();
                }
                Err(verbs::VerbsError::SendQueueFull { .. }) => {
                    // Nothing was posted: the batch goes again later.
                    signals.restore(qp, saved);
                    break;
                }
                Err(e) => return Err(e.to_string()),
            }
        }
        let mut n = drain(&c.cq, &mut buf)?;
        if n == 0 && a.events && (posted == iters || posted - done >= depth || stop) {
            // Nothing to post until a completion comes: sleep on it.
            c.cq.wait(Duration::from_millis(100))
                .map_err(|e| e.to_string())?;
            n = drain(&c.cq, &mut buf)?;
        }
        if n > 0 {
            let before = done;
            for w in &buf[..n] {
                done += signals.completed(w.qpn);
            }
            if done / mark_every != before / mark_every {
                marks.push((done, Instant::now()));
            }
        } else {
            std::hint::spin_loop();
        }
        if turns % CLOCK_EVERY != 0 {
            continue;
        }
        if now.saturating_duration_since(started) > Duration::from_secs(2)
            && now.saturating_duration_since(last_progress) >= Duration::from_secs(1)
        {
            last_progress = now;
            eprintln!(
                " progress: {size} B, {done} messages, {:.1} s",
                now.saturating_duration_since(started).as_secs_f64()
            );
        }
        if now.saturating_duration_since(t0) > Duration::from_secs(600) {
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Every WR is accounted for by exactly one completion: every
    /// `every`-th of a QP and each QP's last are signaled, and a refused
    /// batch leaves the booking as it was.
    #[test]
    fn completions_stand_for_every_wr_once() {
        for (every, iters, qps) in [(100, 1000, 1), (16, 1001, 8), (7, 3, 5), (1, 50, 2)] {
            let qpns: Vec<u32> = (0..qps).map(|q| 0x11 + q).collect();
            let mut s = Signals::new(every, iters, qpns.clone());
            let mut signaled = Vec::new();
            let mut q = 0;
            while let Some(next) = s.next_qp(q) {
                let saved = s.save(next);
                s.next(next);
                s.restore(next, saved); // a refused post, then the real one
                if s.next(next) {
                    signaled.push(qpns[next]);
                }
                q = (next + 1) % qpns.len();
            }
            let total: u64 = signaled.iter().map(|&qpn| s.completed(qpn)).sum();
            assert_eq!(total, iters, "every {every}, {iters} WRs over {qps} QPs");
            assert!(s.groups.iter().all(VecDeque::is_empty));
            assert!(s.groups.len() == qpns.len());
        }
    }
}
