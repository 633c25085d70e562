//! Recovery of the lost responses of one READ (the oldest incomplete one of
//! a QP): which of its response packets have landed, and when to ask again.
//!
//! A READ request asked again from response `k` is answered with every
//! response from `k` to the end (rxe does so, and so does our responder).
//! Taking responses only in order would cost the rest of the message per
//! lost response, about N * N * p / 2 packets for N responses at loss p
//! (8 MiB at MTU 1024 and 1% loss: 330 000 packets for 8 192). Responses
//! land where their PSN says, in order or not, so each replay fills every
//! hole it passes and a READ needs a few streams of N packets instead.
//!
//! The responder answers requests one after another: a request asked again
//! waits until the stream in progress ends. A *stream* is one answer: it
//! starts where a request asked and its PSNs rise. The first missing
//! response is asked for again once the stream in progress has gone past
//! it, and only once per stream, so that no request queues a replay
//! nobody needs.

/// Responses that may overtake each other on the way (reordering) before a
/// missing one counts as lost (TCP's three duplicate ACKs).
pub const REORDER_SLACK: u32 = 3;

/// A replay whose first responses are lost begins up to this many after
/// the response asked for; a drop back to there from further beyond than
/// this starts a new stream.
pub const NEW_STREAM_DROP: u32 = 8;

#[derive(Debug, Default)]
pub(crate) struct ReadRecovery {
    /// First PSN of the READ this is about (`None`: none yet).
    read_psn: Option<u32>,
    /// Bit `k`: response `k` landed (meaningful beyond the in-order count).
    landed: Vec<u64>,
    /// Offset (response number) of the previous response of this READ.
    prev: Option<u32>,
    /// A request went out again from this offset and no stream answering
    /// it has begun.
    asked: Option<u32>,
}

/// What a response of the tracked READ is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Seen {
    /// Not landed before: its data is to be placed.
    pub fresh: bool,
    /// The stream went past the first missing response: ask again from it.
    pub ask_again: bool,
}

impl ReadRecovery {
    /// Starts over when `read_psn` is another READ than the one tracked.
    fn track(&mut self, read_psn: u32) {
        if self.read_psn != Some(read_psn) {
            self.clear();
            self.read_psn = Some(read_psn);
        }
    }

    /// The READ starting at `read_psn` is done (or the QP flushed).
    pub fn clear(&mut self) {
        self.read_psn = None;
        self.landed.clear();
        self.prev = None;
        self.asked = None;
    }

    /// Response `k` landed out of order.
    fn bit(&self, k: u32) -> bool {
        self.landed
            .get(k as usize / 64)
            .is_some_and(|w| w >> (k % 64) & 1 == 1)
    }

    /// A request of the READ at `read_psn` went out again, asking from
    /// response `k`. Go-back-N asks later READs again too: only the
    /// tracked READ (or the first asked when none is) counts.
    pub fn asked(&mut self, read_psn: u32, k: u32) {
        if self.read_psn.is_some_and(|p| p != read_psn) {
            return;
        }
        self.read_psn = Some(read_psn);
        self.asked = Some(k);
    }

    /// Whether a request asked again for this READ waits for its stream.
    pub fn waiting(&self, read_psn: u32) -> bool {
        self.read_psn == Some(read_psn) && self.asked.is_some()
    }

    /// Response `k` of the READ at `read_psn` (of `npsn` responses, the
    /// first `got` of which landed in order) arrived; `k >= npsn`: a later
    /// READ's response, so this READ's stream is over.
    pub fn response(&mut self, read_psn: u32, k: u32, got: u32, npsn: u32) -> Seen {
        self.track(read_psn);
        if k >= npsn {
            return Seen {
                fresh: false,
                ask_again: self.passed_missing(npsn, got, npsn),
            };
        }
        // Only a request starts a stream, so only a drop back to where one
        // asked from is a new stream; a response that comes late (however
        // late: a reordering link may hold one for dozens of packets) is
        // not, or each would ask again and queue a replay of the rest of
        // the READ behind the one coming.
        let new_stream = match self.prev {
            None => true,
            Some(p) => {
                k < p
                    && self.asked.is_some_and(|a| {
                        k <= a || (k <= a + NEW_STREAM_DROP && k + NEW_STREAM_DROP < p)
                    })
            }
        };
        if new_stream {
            self.asked = None;
        }
        self.prev = Some(k);
        let fresh = k >= got && !self.bit(k);
        Seen {
            fresh,
            ask_again: self.passed_missing(k, got, npsn),
        }
    }

    /// The stream, now at response `k`, went past the first missing one
    /// (`got`) and nobody asked for it since the stream began.
    fn passed_missing(&mut self, k: u32, got: u32, npsn: u32) -> bool {
        let passed = got < npsn && k > got && (k > got + REORDER_SLACK || k + 1 >= npsn);
        if passed && self.asked.is_none() {
            self.asked = Some(got);
            return true;
        }
        false
    }

    /// Response `k` (fresh) landed; returns how many landed in order now,
    /// `got` before.
    pub fn land(&mut self, k: u32, got: u32, npsn: u32) -> u32 {
        if k != got {
            let words = (npsn as usize).div_ceil(64);
            if self.landed.len() < words {
                self.landed.resize(words, 0);
            }
            if let Some(w) = self.landed.get_mut(k as usize / 64) {
                *w |= 1 << (k % 64);
            }
            return got;
        }
        let mut got = got + 1;
        while got < npsn && self.bit(got) {
            got += 1;
        }
        got
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds responses `ks` of a READ of `npsn` packets; returns the
    /// offsets a request went out again from, and the in-order count.
    fn feed(r: &mut ReadRecovery, got: &mut u32, npsn: u32, ks: &[u32]) -> Vec<u32> {
        let mut asks = Vec::new();
        for &k in ks {
            let s = r.response(7, k, *got, npsn);
            if s.ask_again {
                asks.push(*got);
            }
            if s.fresh {
                *got = r.land(k, *got, npsn);
            }
        }
        asks
    }

    #[test]
    fn one_replay_fills_every_hole_it_passes() {
        let mut r = ReadRecovery::default();
        let mut got = 0;
        let first: Vec<u32> = (0..100).filter(|k| ![10, 40, 41, 90].contains(k)).collect();
        assert_eq!(feed(&mut r, &mut got, 100, &first), [10]);
        assert_eq!(got, 10);
        r.asked(7, 10);
        let replay: Vec<u32> = (10..100).collect();
        assert_eq!(feed(&mut r, &mut got, 100, &replay), Vec::<u32>::new());
        assert_eq!(got, 100);
    }

    #[test]
    fn a_hole_lost_again_is_asked_once_more_when_the_replay_passes_it() {
        let mut r = ReadRecovery::default();
        let mut got = 0;
        let first: Vec<u32> = (0..50).filter(|&k| k != 5 && k != 20).collect();
        assert_eq!(feed(&mut r, &mut got, 50, &first), [5]);
        r.asked(7, 5);
        let replay: Vec<u32> = (5..50).filter(|&k| k != 20).collect();
        assert_eq!(feed(&mut r, &mut got, 50, &replay), [20]);
        assert_eq!(got, 20);
    }

    #[test]
    fn a_reordered_pair_asks_nothing() {
        let mut r = ReadRecovery::default();
        let mut got = 0;
        let ks = [0, 1, 3, 2, 4, 5, 6, 7];
        assert_eq!(feed(&mut r, &mut got, 8, &ks), Vec::<u32>::new());
        assert_eq!(got, 8);
    }

    #[test]
    fn a_late_response_of_the_stream_does_not_look_like_a_new_stream() {
        let mut r = ReadRecovery::default();
        let mut got = 0;
        let first: Vec<u32> = (0..30).filter(|&k| k != 10).collect();
        assert_eq!(feed(&mut r, &mut got, 40, &first), [10]);
        // 30 comes two places late; the stream goes on.
        let rest: Vec<u32> = [31, 32, 30].into_iter().chain(33..40).collect();
        assert_eq!(feed(&mut r, &mut got, 40, &rest), Vec::<u32>::new());
        assert_eq!(got, 10, "10 still missing, asked once");
    }

    #[test]
    fn a_response_reordered_far_after_an_ask_is_not_a_new_stream() {
        let mut r = ReadRecovery::default();
        let mut got = 0;
        let first: Vec<u32> = (0..300).filter(|&k| k != 60 && k != 250).collect();
        assert_eq!(feed(&mut r, &mut got, 400, &first), [60]);
        r.asked(7, 60);
        // 250 arrives 50 packets late, long after the ask went out: the
        // stream goes on and nothing more is asked before the replay.
        let rest: Vec<u32> = [250].into_iter().chain(300..400).collect();
        assert_eq!(feed(&mut r, &mut got, 400, &rest), Vec::<u32>::new());
        assert!(r.waiting(7));
        let replay: Vec<u32> = (60..400).collect();
        assert_eq!(feed(&mut r, &mut got, 400, &replay), Vec::<u32>::new());
        assert_eq!(got, 400);
    }

    #[test]
    fn the_first_response_of_a_replay_lost_is_asked_again() {
        let mut r = ReadRecovery::default();
        let mut got = 0;
        let first: Vec<u32> = (0..30).filter(|&k| k != 12).collect();
        assert_eq!(feed(&mut r, &mut got, 30, &first), [12]);
        r.asked(7, 12);
        // The replay's 12 is lost too: once its stream passes 12 again.
        let replay: Vec<u32> = (13..30).collect();
        assert_eq!(feed(&mut r, &mut got, 30, &replay), [12]);
    }

    #[test]
    fn a_later_reads_response_ends_the_stream() {
        let mut r = ReadRecovery::default();
        let mut got = 0;
        assert_eq!(feed(&mut r, &mut got, 3, &[0, 1]), Vec::<u32>::new());
        assert!(r.response(7, 3, got, 3).ask_again);
        assert!(!r.response(7, 4, got, 3).ask_again, "once per stream");
        assert!(r.waiting(7));
        assert!(!r.waiting(8));
    }
}
