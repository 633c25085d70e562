//! No congestion control: a fixed window and a fixed rate (line rate).

/// A fixed window (bytes in flight) and rate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fixed {
    pub window_bytes: u64,
    pub rate_bps: u64,
}

impl Fixed {
    /// Line rate, unlimited window.
    pub fn line_rate(rate_bps: u64) -> Self {
        Fixed {
            window_bytes: u64::MAX,
            rate_bps,
        }
    }
}
