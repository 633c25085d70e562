//! A NIC's neighbour table: the MACs of its IPv4 peers, as hosts keep them
//! (RFC 826, and the states Linux's neighbour table goes through). Entries
//! come from the configuration (static, never expire) or from ARP the NIC
//! hears (learned, expire after `reachable_ns`). Resolving an unknown
//! address asks for it (the pipeline broadcasts an ARP request) at most
//! once per `retry_ns`; after `max_tries` unanswered requests the address
//! is marked failed for a while and frames to it are dropped and counted.
//!
//! No clock: time is passed in as nanoseconds.

use std::collections::HashMap;
use std::net::Ipv4Addr;

use transport::wire::MacAddr;

/// What the table knows of one address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Static(MacAddr),
    /// Learned from ARP; good until `until`.
    Reachable {
        mac: MacAddr,
        until: u64,
    },
    /// Requests sent, no answer yet; the next may go at `next_at`.
    Incomplete {
        tries: u32,
        next_at: u64,
    },
    /// No answer to `max_tries` requests; asked again after `until`.
    Failed {
        until: u64,
    },
}

/// The answer to [`NeighbourTable::resolve`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resolution {
    Known(MacAddr),
    /// Unknown: broadcast an ARP request for it now.
    Ask,
    /// A request is out; no answer yet.
    Waiting,
    /// The address did not answer `max_tries` requests.
    Failed,
}

/// What the table counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct NeighbourCounters {
    /// ARP requests the table asked for.
    pub requests: u64,
    /// Entries learned or refreshed from ARP.
    pub learned: u64,
    /// Learned entries that expired.
    pub expired: u64,
    /// Addresses given up on after `max_tries` requests.
    pub failed: u64,
}

/// Timing of resolution.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NeighbourConfig {
    /// How long a learned entry is used before it is asked again.
    pub reachable_ns: u64,
    /// Time between two requests for the same address.
    pub retry_ns: u64,
    /// Unanswered requests before the address is marked failed.
    pub max_tries: u32,
}

impl Default for NeighbourConfig {
    /// Linux-like: entries 60 s, a request a second, three tries.
    fn default() -> Self {
        NeighbourConfig {
            reachable_ns: 60_000_000_000,
            retry_ns: 1_000_000_000,
            max_tries: 3,
        }
    }
}

/// The neighbour table of one NIC.
#[derive(Debug, Default)]
pub struct NeighbourTable {
    cfg: NeighbourConfig,
    entries: HashMap<Ipv4Addr, State>,
    counters: NeighbourCounters,
}

impl NeighbourTable {
    pub fn new(cfg: NeighbourConfig) -> Self {
        NeighbourTable {
            cfg,
            ..NeighbourTable::default()
        }
    }

    pub fn counters(&self) -> &NeighbourCounters {
        &self.counters
    }

    /// A configured entry: never expires, never replaced by ARP.
    pub fn add_static(&mut self, ip: Ipv4Addr, mac: MacAddr) {
        self.entries.insert(ip, State::Static(mac));
    }

    /// What ARP told us at `now`; returns whether the MAC is new for this
    /// address (so that waiting users can be given it). Static entries
    /// stay as configured.
    pub fn learn(&mut self, ip: Ipv4Addr, mac: MacAddr, now: u64) -> bool {
        if ip.is_unspecified() || ip.is_broadcast() || mac == MacAddr::default() {
            return false;
        }
        let until = now.saturating_add(self.cfg.reachable_ns);
        let before = self.entries.get(&ip).copied();
        let changed = match before {
            Some(State::Static(_)) => return false,
            Some(State::Reachable { mac: m, .. }) => m != mac,
            _ => true,
        };
        self.entries.insert(ip, State::Reachable { mac, until });
        self.counters.learned += 1;
        changed
    }

    /// Whether the table holds (or is resolving) `ip`: ARP from an address
    /// we talk to refreshes it even when it was not addressed to us.
    pub fn knows(&self, ip: Ipv4Addr) -> bool {
        self.entries.contains_key(&ip)
    }

    /// The MAC of `ip` at `now`, without asking.
    pub fn lookup(&self, ip: Ipv4Addr, now: u64) -> Option<MacAddr> {
        match self.entries.get(&ip)? {
            State::Static(mac) => Some(*mac),
            State::Reachable { mac, until } if *until > now => Some(*mac),
            _ => None,
        }
    }

    /// The MAC of `ip` at `now`, or what to do to get it.
    pub fn resolve(&mut self, ip: Ipv4Addr, now: u64) -> Resolution {
        let cfg = self.cfg;
        let ask = |tries: u32| State::Incomplete {
            tries,
            next_at: now.saturating_add(cfg.retry_ns),
        };
        let state = self.entries.get(&ip).copied();
        let (next, answer) = match state {
            Some(State::Static(mac)) => return Resolution::Known(mac),
            Some(State::Reachable { mac, until }) if until > now => return Resolution::Known(mac),
            Some(State::Reachable { .. }) => {
                self.counters.expired += 1;
                (ask(1), Resolution::Ask)
            }
            None => (ask(1), Resolution::Ask),
            Some(State::Incomplete { next_at, .. }) if now < next_at => return Resolution::Waiting,
            Some(State::Incomplete { tries, .. }) if tries < cfg.max_tries => {
                (ask(tries + 1), Resolution::Ask)
            }
            Some(State::Incomplete { .. }) => {
                self.counters.failed += 1;
                let until =
                    now.saturating_add(cfg.retry_ns.saturating_mul(u64::from(cfg.max_tries)));
                (State::Failed { until }, Resolution::Failed)
            }
            Some(State::Failed { until }) if now < until => return Resolution::Failed,
            Some(State::Failed { .. }) => (ask(1), Resolution::Ask),
        };
        if answer == Resolution::Ask {
            self.counters.requests += 1;
        }
        self.entries.insert(ip, next);
        answer
    }

    /// Addresses given up on at `now` (for counters and messages).
    pub fn failed(&self, now: u64) -> impl Iterator<Item = Ipv4Addr> + '_ {
        self.entries.iter().filter_map(move |(ip, s)| match s {
            State::Failed { until } if *until > now => Some(*ip),
            _ => None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const IP: Ipv4Addr = Ipv4Addr::new(10, 77, 0, 2);
    const MAC: MacAddr = MacAddr([0x52, 0x54, 0, 0x77, 0, 2]);
    const S: u64 = 1_000_000_000;

    #[test]
    fn an_unknown_address_is_asked_once_a_second_then_given_up_on() {
        let mut t = NeighbourTable::new(NeighbourConfig::default());
        assert_eq!(t.resolve(IP, 0), Resolution::Ask);
        assert_eq!(t.resolve(IP, S / 2), Resolution::Waiting);
        assert_eq!(t.resolve(IP, S), Resolution::Ask);
        assert_eq!(t.resolve(IP, 2 * S), Resolution::Ask);
        assert_eq!(t.resolve(IP, 3 * S), Resolution::Failed);
        assert_eq!(t.failed(3 * S).collect::<Vec<_>>(), [IP]);
        assert_eq!(t.resolve(IP, 4 * S), Resolution::Failed);
        // After a while it is asked again.
        assert_eq!(t.resolve(IP, 6 * S), Resolution::Ask);
        let c = t.counters();
        assert_eq!((c.requests, c.failed), (4, 1));
    }

    #[test]
    fn a_learned_entry_answers_until_it_expires_then_is_asked_again() {
        let mut t = NeighbourTable::new(NeighbourConfig::default());
        assert_eq!(t.resolve(IP, 0), Resolution::Ask);
        assert!(t.learn(IP, MAC, S / 10));
        assert!(!t.learn(IP, MAC, S / 5), "the same MAC is no news");
        assert_eq!(t.resolve(IP, S), Resolution::Known(MAC));
        assert_eq!(t.lookup(IP, 59 * S), Some(MAC));
        assert_eq!(t.lookup(IP, 61 * S), None);
        assert_eq!(t.resolve(IP, 61 * S), Resolution::Ask);
        assert_eq!(t.counters().expired, 1);
    }

    #[test]
    fn static_entries_never_expire_and_arp_does_not_replace_them() {
        let mut t = NeighbourTable::new(NeighbourConfig::default());
        t.add_static(IP, MAC);
        assert!(!t.learn(IP, MacAddr([2, 0, 0, 0, 0, 9]), 0));
        assert_eq!(t.resolve(IP, u64::MAX), Resolution::Known(MAC));
        assert!(
            !t.learn(Ipv4Addr::UNSPECIFIED, MAC, 0),
            "ARP probes teach nothing"
        );
    }
}
