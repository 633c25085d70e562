//! How a dataplane lcore gives its CPU away and is woken: the polling
//! policy (`[service] poll`), the lcore's wake-up descriptors, the test
//! that tells whether it shares its core, and its counters (time spent
//! working, spinning and sleeping, wake-ups by cause, wake-up latency).
//!
//! An lcore that sleeps waits in `ppoll` on two eventfds: the *bell*, which
//! applications write after ringing a doorbell while the lcore said in
//! their segment that it sleeps (`shm::abi::Doorbells::take_asleep`), and
//! the *nudge*, which the control thread writes after every request it
//! routes to the lcore and other lcores write after passing it frames. The
//! timeout is the lcore's next timer (nanosecond resolution, with the
//! thread's timer slack set to [`TIMER_SLACK_NS`]); ports whose frames
//! can come from outside the daemon and that have no wake-up of their own
//! are looked at again after a nap ([`Nap`]).

use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};

use hdrhistogram::Histogram;
use nix::poll::{PollFd, PollFlags};
use nix::sys::eventfd::{EfdFlags, EventFd};
use nix::sys::time::TimeSpec;
use serde::{Deserialize, Serialize};

/// What an idle lcore does (`[service] poll`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PollPolicy {
    /// Polls; after a long idle stretch, short sleeps between passes (an
    /// lcore with a core of its own).
    Spin,
    /// Spins while work keeps coming and it has its core to itself;
    /// sleeps until woken as soon as it is idle while it shares its core,
    /// and after [`ADAPTIVE_SPIN_NS`] of idleness otherwise.
    #[default]
    Adaptive,
    /// Sleeps until woken as soon as a pass finds nothing to do.
    Event,
}

impl std::str::FromStr for PollPolicy {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "spin" => Ok(PollPolicy::Spin),
            "adaptive" => Ok(PollPolicy::Adaptive),
            "event" => Ok(PollPolicy::Event),
            _ => Err("one of spin, adaptive, event".into()),
        }
    }
}

impl std::fmt::Display for PollPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            PollPolicy::Spin => "spin",
            PollPolicy::Adaptive => "adaptive",
            PollPolicy::Event => "event",
        })
    }
}

/// Idleness after which an adaptive lcore that has its core to itself
/// sleeps: long enough that a request-response application's next
/// message (tens of microseconds apart) finds it awake, short enough that
/// an idle daemon costs nothing.
pub const ADAPTIVE_SPIN_NS: u64 = 200_000;

/// The timer slack of a sleeping lcore's thread: how late the kernel may
/// wake it for a timer (Linux's default is 50 us).
pub const TIMER_SLACK_NS: u64 = 1_000;

/// The EEVDF slice a sleeping lcore asks for (the kernel's least, 0.1 ms)
/// when it may not be real-time: woken while applications spin on its
/// CPU, it preempts them sooner (not always: a few wake-ups in a thousand
/// still wait for the scheduler's tick, 4 ms, on the machine of
/// docs/sharing.md).
pub const LCORE_SLICE_NS: u64 = 100_000;

/// The SCHED_FIFO priority of a sleeping lcore that may have one: the
/// lowest, above every normal thread.
pub const LCORE_RT_PRIORITY: i32 = 1;

/// Work without a sleep after which a real-time lcore goes back to the
/// normal class until its next sleep, so that a busy lcore never holds
/// its CPU from the applications beside it for longer.
pub const RT_BUDGET_NS: u64 = 2_000_000;

/// The scheduling class of an lcore that sleeps (`poll` adaptive or
/// event). Woken while applications spin on its CPU, a normal thread
/// waits until the kernel preempts one of them, which on the 2-CPU
/// machine of docs/sharing.md took a scheduler tick (4 ms) for about 3 in
/// 1000 wake-ups: the 99th percentile of `ib_send_lat` moved between 40
/// and 440 us from run to run. A SCHED_FIFO lcore runs as soon as it is
/// woken, as a kernel's interrupt thread does (36-54 us). So the lcore
/// is real-time when the system lets it (CAP_SYS_NICE or RLIMIT_RTPRIO)
/// while it sleeps as soon as it is idle (`event`, and `adaptive` while it
/// shares its core), and normal while it spins when idle (`adaptive` with
/// a core to itself: an application it wakes on its CPU must be able to
/// preempt it, which a real-time spinner would hold off for its 200 us of
/// idle spinning). After [`RT_BUDGET_NS`] of work without a sleep it is
/// normal again until it next sleeps. Without the permission it is normal
/// with a short slice ([`LCORE_SLICE_NS`]).
#[derive(Debug, Default)]
pub struct LcoreClass {
    /// The system lets the thread be real-time.
    permitted: bool,
    /// Its policy wants it real-time now (it sleeps as soon as it is
    /// idle).
    wanted: bool,
    /// It is now.
    realtime: bool,
    /// Times it went back to normal for working past the budget.
    pub demotions: u64,
}

impl LcoreClass {
    /// Sets up the calling lcore thread for `poll`: nothing for `spin`.
    pub fn start(poll: PollPolicy) -> LcoreClass {
        if poll == PollPolicy::Spin {
            return LcoreClass::default();
        }
        tighten_timer_slack();
        let _ = crate::dpdk::request_thread_slice(LCORE_SLICE_NS);
        // Whether the system lets it: asked once, and normal again.
        let permitted = crate::dpdk::request_thread_fifo(LCORE_RT_PRIORITY).is_ok();
        let mut class = LcoreClass {
            permitted,
            wanted: true,
            realtime: permitted,
            demotions: 0,
        };
        class.want(poll == PollPolicy::Event);
        class
    }

    pub fn permitted(&self) -> bool {
        self.permitted
    }

    /// Whether its policy wants it real-time from now on (it sleeps as
    /// soon as it is idle); normal at once when not.
    pub fn want(&mut self, realtime: bool) {
        self.wanted = realtime;
        if !realtime && self.realtime {
            self.normal();
        }
    }

    /// Before a sleep: real-time again if it may be and is wanted so.
    pub fn before_sleep(&mut self) {
        if self.permitted && self.wanted && !self.realtime {
            self.realtime = crate::dpdk::request_thread_fifo(LCORE_RT_PRIORITY).is_ok();
        }
    }

    /// After a pass, `busy_ns` since it last woke: normal again past the
    /// budget.
    pub fn worked(&mut self, busy_ns: u64) {
        if self.realtime && busy_ns > RT_BUDGET_NS {
            self.demotions += 1;
            self.normal();
        }
    }

    fn normal(&mut self) {
        self.realtime = false;
        let _ = crate::dpdk::request_thread_fifo(0);
        let _ = crate::dpdk::request_thread_slice(LCORE_SLICE_NS);
    }
}

/// The longest sleep: the lcore looks at its stop flag and reports at
/// least this often.
pub const MAX_SLEEP_NS: u64 = 100_000_000;

/// The sleep of an lcore whose CQs hold completions back (their rings
/// were full): an application's reads of its CQ do not wake the lcore.
pub const BACKLOG_NAP_NS: u64 = 50_000;

/// An lcore's wake-up descriptors, shared with the control thread (which
/// nudges it after each request), the other lcores (which nudge it after
/// passing it frames while it sleeps) and, through a duplicate of the
/// bell, the applications.
#[derive(Debug)]
pub struct LcoreWake {
    /// The lcore sleeps, or is about to.
    asleep: AtomicBool,
    bell: EventFd,
    nudge: EventFd,
}

impl LcoreWake {
    pub fn new() -> std::io::Result<LcoreWake> {
        let flags = EfdFlags::EFD_CLOEXEC | EfdFlags::EFD_NONBLOCK;
        Ok(LcoreWake {
            asleep: AtomicBool::new(false),
            bell: EventFd::from_flags(flags)?,
            nudge: EventFd::from_flags(flags)?,
        })
    }

    /// A duplicate of the bell, for an application.
    pub fn bell_for_app(&self) -> std::io::Result<OwnedFd> {
        self.bell.as_fd().try_clone_to_owned()
    }

    /// Wakes the lcore if it sleeps, and makes its next sleep return at
    /// once if it is about to (the control thread, after a request).
    pub fn nudge(&self) {
        let _ = self.nudge.write(1);
    }

    /// Wakes the lcore only if it sleeps or is about to: for another
    /// lcore after a pass that may have passed it frames. The fence
    /// orders the caller's frames before the look at the flag, the mirror
    /// of the sleeper's [`LcoreWake::set_asleep`].
    pub fn nudge_if_asleep(&self) {
        std::sync::atomic::fence(Ordering::SeqCst);
        if self.asleep.load(Ordering::Relaxed) {
            self.nudge();
        }
    }

    /// The lcore is about to sleep: it looks at its inputs once more
    /// after this.
    pub fn set_asleep(&self) {
        self.asleep.store(true, Ordering::SeqCst);
        std::sync::atomic::fence(Ordering::SeqCst);
    }

    pub fn set_awake(&self) {
        self.asleep.store(false, Ordering::Relaxed);
    }

    /// Sleeps until the bell or the nudge is written, an RX interrupt's
    /// descriptor of `rx` is readable, or `timeout_ns` passes; empties the
    /// eventfds that fired. What woke it.
    pub fn wait(&self, rx: &[std::os::fd::BorrowedFd<'_>], timeout_ns: u64) -> Woken {
        let mut fds = Vec::with_capacity(2 + rx.len());
        fds.push(PollFd::new(self.bell.as_fd(), PollFlags::POLLIN));
        fds.push(PollFd::new(self.nudge.as_fd(), PollFlags::POLLIN));
        fds.extend(rx.iter().map(|f| PollFd::new(*f, PollFlags::POLLIN)));
        let timeout = TimeSpec::from_duration(std::time::Duration::from_nanos(timeout_ns));
        let n = match nix::poll::ppoll(&mut fds, Some(timeout), None) {
            Ok(n) => n,
            // A signal (the daemon stopping): the loop looks at its flag.
            Err(_) => return Woken::default(),
        };
        let ready = |f: &PollFd<'_>| f.revents().is_some_and(|r| !r.is_empty());
        let woken = Woken {
            bell: ready(&fds[0]),
            nudge: ready(&fds[1]),
            rx: fds[2..].iter().any(ready),
            timeout: n == 0,
        };
        if woken.bell {
            let _ = self.bell.read();
        }
        if woken.nudge {
            let _ = self.nudge.read();
        }
        woken
    }
}

/// What ended a sleep (several at once, or none after a signal).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Woken {
    pub bell: bool,
    pub nudge: bool,
    pub rx: bool,
    pub timeout: bool,
}

/// Sets the calling thread's timer slack to [`TIMER_SLACK_NS`] (an lcore
/// that sleeps until its next timer).
fn tighten_timer_slack() {
    let _ = nix::sys::prctl::set_timerslack(TIMER_SLACK_NS);
}

/// The time of `CLOCK_MONOTONIC`, ns: the clock an application stamps its
/// wake-ups with (`shm::abi::Doorbells::stamp_rung`).
pub fn monotonic_ns() -> u64 {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC)
        .map(|t| t.tv_sec() as u64 * 1_000_000_000 + t.tv_nsec() as u64)
        .unwrap_or(0)
}

/// The nap of an lcore whose port has frames it would not be woken for:
/// short after a nap that found work, doubling up to `max_ns` while naps
/// find nothing.
#[derive(Debug, Clone, Copy)]
pub struct Nap {
    now_ns: u64,
    max_ns: u64,
}

/// The first nap after work.
pub const NAP_MIN_NS: u64 = 20_000;

impl Nap {
    pub fn new(max_ns: u64) -> Nap {
        Nap {
            now_ns: NAP_MIN_NS.min(max_ns),
            max_ns,
        }
    }

    /// The next nap's length.
    pub fn length_ns(&self) -> u64 {
        self.now_ns
    }

    /// After a nap: `found` whether the pass after it had work.
    pub fn after(&mut self, found: bool) {
        self.now_ns = if found {
            NAP_MIN_NS.min(self.max_ns)
        } else {
            (self.now_ns * 2).min(self.max_ns)
        };
    }
}

/// Whether an lcore shares its core: more threads runnable in the
/// machine than CPUs the daemon may use (the lcore's own included) while
/// one of its applications polls (one of its threads runnable), in at least
/// [`SHARING_OF_LOOKS`] of its last 8 looks, one every
/// [`SHARING_LOOK_NS`] at most. The runnable count alone over-counts on
/// Linux 6.18: with `ibv_rc_pingpong -e`, whose processes sleep between
/// messages, the lcore counted more runnable threads than CPUs in 65-80%
/// of its looks (a task that just blocked may stay queued), and slept at
/// once, four wake-ups per round trip. Measured on the 2-CPU machine of
/// docs/performance.md: two polling perftest processes and the lcore
/// make 3 runnable in every look; applications that sleep in
/// `ibv_get_cq_event` leave the lcore a core of its own, where spinning
/// answers their next post without a wake-up (which costs tens of
/// microseconds there). The lcore's involuntary context switches are no
/// sign: an application it wakes preempts it as often when the core is
/// otherwise free.
#[derive(Debug)]
pub struct Sharing {
    cpus: usize,
    last_look: u64,
    /// One bit per look, the latest lowest: whether it found the machine
    /// crowded.
    recent: u8,
    /// Looks that found the machine crowded, and all looks.
    pub found: u64,
    pub looks: u64,
}

pub const SHARING_LOOK_NS: u64 = 1_000_000;
pub const SHARING_OF_LOOKS: u32 = 7;

impl Sharing {
    /// For an lcore of a process that may run on `cpus` CPUs.
    pub fn new(cpus: usize) -> Sharing {
        Sharing {
            cpus: cpus.max(1),
            last_look: 0,
            recent: 0,
            found: 0,
            looks: 0,
        }
    }

    /// Whether the lcore shares its core at `now` (ns of its clock), with
    /// its applications' process ids (`pids`, asked for only when it
    /// looks).
    pub fn shared(&mut self, now: u64, pids: impl FnOnce() -> Vec<u32>) -> bool {
        if now.saturating_sub(self.last_look) >= SHARING_LOOK_NS {
            self.last_look = now;
            let crowded = runnable_threads().is_some_and(|r| r > self.cpus)
                && pids().into_iter().any(running);
            self.note(crowded);
        }
        self.recent.count_ones() >= SHARING_OF_LOOKS
    }

    fn note(&mut self, crowded: bool) {
        self.looks += 1;
        self.found += u64::from(crowded);
        self.recent = self.recent << 1 | u8::from(crowded);
    }
}

/// Threads of an application looked at, at most, for one that polls.
const THREADS_LOOKED_AT: usize = 64;

/// Whether one of process `pid`'s threads is running or runnable (state
/// `R` in `/proc/PID/task/TID/stat`): an application that polls, on any
/// of its threads, not one asleep in `ibv_get_cq_event`.
fn running(pid: u32) -> bool {
    if pid == 0 {
        return false;
    }
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return false;
    };
    tasks.flatten().take(THREADS_LOOKED_AT).any(|t| {
        std::fs::read_to_string(t.path().join("stat"))
            .ok()
            .and_then(|s| parse_state(&s))
            == Some('R')
    })
}

/// The state field of a `/proc/PID/stat` line (after the command's
/// closing parenthesis: the command may hold spaces and parentheses).
fn parse_state(stat: &str) -> Option<char> {
    stat.rsplit_once(')')?.1.trim_start().chars().next()
}

/// Threads runnable in the machine now (the fourth field of
/// /proc/loadavg, `running/total`), the caller included.
fn runnable_threads() -> Option<usize> {
    let s = std::fs::read_to_string("/proc/loadavg").ok()?;
    parse_runnable(&s)
}

fn parse_runnable(loadavg: &str) -> Option<usize> {
    loadavg
        .split_whitespace()
        .nth(3)?
        .split('/')
        .next()?
        .parse()
        .ok()
}

/// Counters of one lcore's loop.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct LcoreCounters {
    /// The lcore (0: the daemon's main thread).
    pub lcore: usize,
    /// Its polling policy.
    pub poll: String,
    /// Time in passes that moved something, in passes that did not, and
    /// asleep, ns.
    pub working_ns: u64,
    pub spinning_ns: u64,
    pub sleeping_ns: u64,
    /// Sleeps begun, and those given up because the last look before
    /// sleeping found work.
    pub sleeps: u64,
    pub sleeps_aborted: u64,
    /// Wake-ups by cause: an application's bell, a nudge (a control
    /// request or another lcore's frames), an RX interrupt, the next
    /// timer, a nap's end (a port without wake-ups, or CQEs held back).
    pub woken_bell: u64,
    pub woken_nudge: u64,
    pub woken_rx: u64,
    pub woken_timer: u64,
    pub woken_nap: u64,
    /// Sleeps that ended at [`MAX_SLEEP_NS`] with nothing to do (an idle
    /// lcore looking at its stop flag; work found then was a lost wake-up).
    #[serde(default)]
    pub woken_limit: u64,
    /// Looks at whether the core is shared, and those that found it so.
    pub sharing_looks: u64,
    pub sharing_found: u64,
    /// Whether the lcore may be real-time while it sleeps when idle
    /// ([`LcoreClass`]), and the times it went back to normal for working
    /// past [`RT_BUDGET_NS`] without a sleep.
    #[serde(default)]
    pub realtime: bool,
    #[serde(default)]
    pub realtime_demotions: u64,
    /// From an application's bell to the lcore running, ns: (upper bound
    /// of a bucket, wake-ups in it), buckets doubling from 1 us.
    pub bell_latency: Vec<(u64, u64)>,
    /// Percentiles of the same: 50, 99 and the largest.
    pub bell_latency_p50_ns: u64,
    pub bell_latency_p99_ns: u64,
    pub bell_latency_max_ns: u64,
    /// How late a sleep that ended for a timer ended, ns: 50th, 99th
    /// percentile and the largest.
    pub timer_late_p50_ns: u64,
    pub timer_late_p99_ns: u64,
    pub timer_late_max_ns: u64,
}

/// An lcore's sleep accounting (kept by its loop; turned into
/// [`LcoreCounters`] by a snapshot).
#[derive(Debug)]
pub struct SleepStats {
    pub counters: LcoreCounters,
    bell: Histogram<u64>,
    timer_late: Histogram<u64>,
}

impl SleepStats {
    pub fn new(lcore: usize, poll: PollPolicy) -> SleepStats {
        let hist =
            || Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 2).expect("valid bounds");
        SleepStats {
            counters: LcoreCounters {
                lcore,
                poll: poll.to_string(),
                ..Default::default()
            },
            bell: hist(),
            timer_late: hist(),
        }
    }

    /// A wake-up `ns` after an application rang.
    pub fn bell_latency(&mut self, ns: u64) {
        let _ = self.bell.record(ns.max(1));
    }

    /// A timer's sleep that ended `ns` after the timer.
    pub fn timer_late(&mut self, ns: u64) {
        let _ = self.timer_late.record(ns.max(1));
    }

    pub fn snapshot(&self, sharing: &Sharing, class: &LcoreClass) -> LcoreCounters {
        let mut c = self.counters.clone();
        c.realtime = class.permitted();
        c.realtime_demotions = class.demotions;
        c.sharing_looks = sharing.looks;
        c.sharing_found = sharing.found;
        c.bell_latency = self
            .bell
            .iter_log(1_000, 2.0)
            .map(|v| (v.value_iterated_to(), v.count_since_last_iteration()))
            .filter(|&(_, n)| n > 0)
            .collect();
        c.bell_latency_p50_ns = self.bell.value_at_quantile(0.5);
        c.bell_latency_p99_ns = self.bell.value_at_quantile(0.99);
        c.bell_latency_max_ns = self.bell.max();
        c.timer_late_p50_ns = self.timer_late.value_at_quantile(0.5);
        c.timer_late_p99_ns = self.timer_late.value_at_quantile(0.99);
        c.timer_late_max_ns = self.timer_late.max();
        c
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_policy_is_one_of_three_names() {
        for p in [PollPolicy::Spin, PollPolicy::Adaptive, PollPolicy::Event] {
            assert_eq!(p.to_string().parse::<PollPolicy>(), Ok(p));
        }
        assert!("busy".parse::<PollPolicy>().is_err());
        assert_eq!(PollPolicy::default(), PollPolicy::Adaptive);
    }

    #[test]
    fn runnable_threads_are_the_fourth_field_of_loadavg() {
        assert_eq!(parse_runnable("0.50 0.40 0.30 3/150 12345\n"), Some(3));
        assert_eq!(parse_runnable("0.50 0.40"), None);
        assert_eq!(parse_runnable("a b c x/1 2"), None);
    }

    #[test]
    fn the_core_is_shared_while_half_the_last_eight_looks_found_it_crowded() {
        let mut s = Sharing::new(2);
        for _ in 0..3 {
            s.note(true);
        }
        s.last_look = u64::MAX;
        assert!(!s.shared(u64::MAX, Vec::new), "three of eight: not yet");
        for _ in 0..4 {
            s.note(true);
        }
        assert!(s.shared(u64::MAX, Vec::new));
        s.note(false);
        s.note(false);
        assert!(!s.shared(u64::MAX, Vec::new), "six of the last eight");
        assert_eq!((s.found, s.looks), (7, 9));
    }

    #[test]
    fn a_process_state_is_read_after_its_command() {
        assert_eq!(parse_state("42 (ib_write_lat) R 1 42"), Some('R'));
        assert_eq!(parse_state("42 (a) b) S 1"), Some('S'));
        assert_eq!(parse_state("garbage"), None);
        assert!(!running(0), "no application");
        assert!(!running(u32::MAX), "no such process");
        // This thread runs: the test harness's process has a thread in R.
        assert!(running(std::process::id()), "this test's own thread");
    }

    #[test]
    fn a_nap_doubles_while_it_finds_nothing_and_is_short_after_work() {
        let mut n = Nap::new(1_000_000);
        assert_eq!(n.length_ns(), NAP_MIN_NS);
        for _ in 0..20 {
            n.after(false);
        }
        assert_eq!(n.length_ns(), 1_000_000);
        n.after(true);
        assert_eq!(n.length_ns(), NAP_MIN_NS);
    }

    #[test]
    fn a_bell_written_before_the_sleep_ends_it_at_once() {
        let w = LcoreWake::new().unwrap();
        let app = w.bell_for_app().unwrap();
        nix::unistd::write(&app, &1u64.to_ne_bytes()).unwrap();
        let woken = w.wait(&[], 10_000_000_000);
        assert!(woken.bell && !woken.timeout, "{woken:?}");
        // Emptied: the next sleep times out.
        let woken = w.wait(&[], 1_000);
        assert!(woken.timeout && !woken.bell, "{woken:?}");
        w.nudge();
        assert!(w.wait(&[], 10_000_000_000).nudge);
    }
}
