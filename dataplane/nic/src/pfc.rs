//! The receiving side of priority flow control: a transmitter (a NIC's
//! TX pipe, a switch's egress port) held by PAUSE frames from the link's
//! far end. A PAUSE holds it for the time it names, a later PAUSE while
//! held extends the same pause, a RESUME (time 0) ends it. The state also
//! keeps how long it has been held in all and the longest single pause
//! (a stuck receiver shows as one pause that never ends).

/// When a transmitter is held, and for how long it has been.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct PauseState {
    /// The pause last set: [from, until).
    from: u64,
    until: u64,
    /// Pauses before it.
    closed_ns: u64,
    longest_ns: u64,
}

impl PauseState {
    pub fn is_paused(&self, now: u64) -> bool {
        now < self.until
    }

    /// When the pause last set ends (in the past when not held).
    pub fn until(&self) -> u64 {
        self.until
    }

    /// Time held up to `now`, all pauses together.
    pub fn paused_ns(&self, now: u64) -> u64 {
        self.closed_ns + self.current(now)
    }

    /// The longest single pause up to `now`.
    pub fn longest_ns(&self, now: u64) -> u64 {
        self.longest_ns.max(self.current(now))
    }

    fn current(&self, now: u64) -> u64 {
        now.min(self.until).saturating_sub(self.from)
    }

    /// Held from `now` for `ns` (a PAUSE received while held extends the
    /// same pause).
    pub fn pause(&mut self, now: u64, ns: u64) {
        if now >= self.until {
            let last = self.until.saturating_sub(self.from);
            self.closed_ns += last;
            self.longest_ns = self.longest_ns.max(last);
            self.from = now;
        }
        self.until = now.saturating_add(ns);
    }

    /// A RESUME: free from `now`.
    pub fn resume(&mut self, now: u64) {
        self.until = self.until.min(now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pauses_extend_end_and_add_up() {
        let mut p = PauseState::default();
        assert!(!p.is_paused(0));
        p.pause(100, 50);
        assert!(p.is_paused(149) && !p.is_paused(150));
        // Refreshed while held: one pause of 100..230.
        p.pause(130, 100);
        assert_eq!(p.longest_ns(1_000), 130);
        // Ended early by a RESUME.
        p.resume(200);
        assert!(!p.is_paused(200));
        assert_eq!(p.paused_ns(1_000), 100);
        // A second pause, still running.
        p.pause(500, 1_000);
        assert_eq!(p.paused_ns(600), 200);
        assert_eq!(p.longest_ns(600), 100);
        assert_eq!(p.longest_ns(900), 400);
    }
}
