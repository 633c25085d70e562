//! Address handles of one engine (ibverbs' `ibv_ah`): where a UD QP's
//! datagrams go — the destination's IPv4 address, its MAC (the zero MAC
//! while the neighbour table has none: the pipeline resolves such frames
//! or drops and counts them, never sends them), the DSCP — kept with the
//! outer headers built once, so that a datagram copies them as a
//! connected QP's packets copy its template. An AH belongs to a
//! protection domain; only that PD's QPs may use it.

use std::net::Ipv4Addr;

use super::types::{AhId, RcError};
use super::EngineConfig;
use crate::mr::Pd;
use crate::wire::{EthernetRepr, FrameTemplate, Ipv4Repr, MacAddr, UdpRepr};

/// Address handles per engine.
pub const MAX_AHS: usize = 1 << 16;

/// What an address handle names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AhAttr {
    pub pd: Pd,
    pub dest_ip: Ipv4Addr,
    /// The zero MAC: not known yet (see the module doc).
    pub dest_mac: MacAddr,
    /// The GRH traffic class's top six bits; `None`: the engine's.
    pub dscp: Option<u8>,
    /// The destination speaks our telemetry: datagrams to it sample the
    /// path with TLM blocks and are paced by HPCC++ per destination
    /// (`ud_cc`); to any other, none is ever sent.
    pub telemetry: bool,
}

#[derive(Debug, Clone, Copy)]
struct Ah {
    attr: AhAttr,
    template: FrameTemplate,
}

/// The engine's address handles, by [`AhId`].
#[derive(Debug, Default)]
pub struct AhTable {
    ahs: Vec<Option<Ah>>,
    live: usize,
}

/// The outer headers of datagrams from this engine to `a`'s destination
/// (UDP source port 0: the sender puts its own in, `with_src_port`).
pub(crate) fn template(a: &AhAttr, cfg: &EngineConfig) -> FrameTemplate {
    let eth = EthernetRepr {
        src: cfg.mac,
        dst: a.dest_mac,
        vlan: cfg.vlan,
    };
    let ip = Ipv4Repr {
        src: cfg.ip,
        dst: a.dest_ip,
        dscp: a.dscp.unwrap_or(cfg.dscp),
        // Not-ECT: nothing of ours reacts to a mark on a datagram.
        ecn: 0,
        ..Ipv4Repr::default()
    };
    // The sending QP puts its own source port in (`with_src_port`).
    FrameTemplate::new(&eth, &ip, &UdpRepr { src_port: 0 })
}

impl AhTable {
    /// A new address handle.
    pub fn create(&mut self, attr: AhAttr, cfg: &EngineConfig) -> Result<AhId, RcError> {
        if let Some(d) = attr.dscp.filter(|&d| d > 63) {
            return Err(RcError::OutOfRange {
                what: "dscp",
                value: u64::from(d),
                max: 63,
            });
        }
        let i = match self.ahs.iter().position(Option::is_none) {
            Some(i) => i,
            None if self.ahs.len() < MAX_AHS => {
                self.ahs.push(None);
                self.ahs.len() - 1
            }
            None => return Err(RcError::TooManyAhs(MAX_AHS)),
        };
        self.ahs[i] = Some(Ah {
            attr,
            template: template(&attr, cfg),
        });
        self.live += 1;
        Ok(i as AhId)
    }

    /// Destroys an address handle of `pd`.
    pub fn destroy(&mut self, id: AhId, pd: Pd) -> Result<(), RcError> {
        match self.ahs.get_mut(id as usize) {
            Some(slot) if slot.is_some_and(|a| a.attr.pd == pd) => {
                *slot = None;
                self.live -= 1;
                Ok(())
            }
            _ => Err(RcError::NoSuchAh(id)),
        }
    }

    /// The attributes of an AH of `pd`.
    pub fn get(&self, id: AhId, pd: Pd) -> Option<AhAttr> {
        self.ahs
            .get(id as usize)
            .copied()
            .flatten()
            .map(|a| a.attr)
            .filter(|a| a.pd == pd)
    }

    /// The outer headers of datagrams to the AH (of `pd`).
    pub fn template(&self, id: AhId, pd: Pd) -> Option<FrameTemplate> {
        match self.ahs.get(id as usize) {
            Some(Some(a)) if a.attr.pd == pd => Some(a.template),
            _ => None,
        }
    }

    /// Address handles alive.
    pub fn len(&self) -> usize {
        self.live
    }

    /// The MAC of `ip` is `mac`: AHs to it send there from now on.
    pub fn set_neighbour(&mut self, ip: Ipv4Addr, mac: MacAddr, cfg: &EngineConfig) {
        for a in self.ahs.iter_mut().flatten() {
            if a.attr.dest_ip == ip && a.attr.dest_mac != mac {
                a.attr.dest_mac = mac;
                a.template = template(&a.attr, cfg);
            }
        }
    }
}
