//! How a sample is timed ([`Samples`]), and how a wait inside it gives up
//! without reading the clock while it waits ([`Patience`]).
//!
//! Every sample of ours and of every floor is bounded by exactly two clock
//! reads (`Instant::now()` before, `elapsed()` after). The waits inside a
//! sample — for a message, a completion, a frame, a datagram — must still
//! give up on a lost peer (after 30 s: a broken run, not a speed bound),
//! but a clock read per poll would add its cost to the sample: more to
//! ours or to a floor depending on how many polls each makes. So a wait
//! counts its polls and looks at the clock only every [`CHECK_EVERY`]
//! polls: a sample shorter than that many polls (milliseconds of polling,
//! far above any round trip measured) reads the clock exactly twice.

use std::time::{Duration, Instant};

/// Samples timed as every floor's are: two clock reads around the work,
/// none inside it (ours, in `lat`, takes its samples the same way).
#[derive(Debug, Default)]
pub struct Samples(Vec<f64>);

impl Samples {
    pub fn with_capacity(n: u64) -> Samples {
        Samples(Vec::with_capacity(n as usize))
    }

    /// Times `work` as one sample.
    #[inline]
    pub fn time<T>(&mut self, work: impl FnOnce() -> Result<T, String>) -> Result<T, String> {
        let t0 = Instant::now();
        let r = work()?;
        self.0.push(t0.elapsed().as_nanos() as f64);
        Ok(r)
    }

    /// The median sample, ns (NaN when there is none).
    pub fn median(mut self) -> f64 {
        super::baseline::median(&mut self.0)
    }
}

/// How long a wait polls before it gives up.
pub const GIVE_UP: Duration = Duration::from_secs(30);

/// Polls between two looks at the clock.
pub const CHECK_EVERY: u64 = 1 << 20;

/// The patience of one wait.
#[derive(Debug, Default)]
pub struct Patience {
    polls: u64,
    /// When the first look at the clock happened.
    since: Option<Instant>,
}

impl Patience {
    pub fn new() -> Patience {
        Patience::default()
    }

    /// Counts one poll; false once the wait has lasted [`GIVE_UP`] past
    /// its first [`CHECK_EVERY`] polls (the clock is read on every
    /// `CHECK_EVERY`-th poll only).
    #[inline]
    pub fn go_on(&mut self) -> bool {
        self.polls += 1;
        if self.polls % CHECK_EVERY != 0 {
            return true;
        }
        let since = *self.since.get_or_insert_with(Instant::now);
        since.elapsed() < GIVE_UP
    }

    /// Polls counted so far.
    pub fn polls(&self) -> u64 {
        self.polls
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_short_wait_never_looks_at_the_clock() {
        let mut p = Patience::new();
        for _ in 0..CHECK_EVERY - 1 {
            assert!(p.go_on());
        }
        assert!(p.since.is_none(), "no clock read before CHECK_EVERY polls");
        assert!(p.go_on());
        assert!(p.since.is_some(), "the first look at the clock");
        assert_eq!(p.polls(), CHECK_EVERY);
    }

    #[test]
    fn a_wait_past_its_time_gives_up() {
        let mut p = Patience {
            polls: 0,
            since: Some(Instant::now() - GIVE_UP - Duration::from_secs(1)),
        };
        let mut n = 0u64;
        while p.go_on() {
            n += 1;
        }
        assert_eq!(n, CHECK_EVERY - 1, "it gives up at its next look");
    }
}
