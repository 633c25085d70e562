//! Network topologies for the simulator: hosts and switches joined by
//! links with a bandwidth and a propagation delay, and shortest-path ECMP
//! routes computed from them.

use std::collections::VecDeque;
use std::net::Ipv4Addr;

use serde::Deserialize;

/// A node: a host (NIC + RC engine) or a switch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeKind {
    Host,
    Switch,
}

/// One end of a link: node index and its port.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct End {
    pub node: usize,
    pub port: usize,
}

/// A full-duplex link.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Link {
    pub a: End,
    pub b: End,
    pub rate_bps: u64,
    pub delay_ns: u64,
}

/// Hosts, switches and links.
#[derive(Debug, Clone, Default)]
pub struct Topology {
    pub nodes: Vec<NodeKind>,
    pub links: Vec<Link>,
    /// Per node, per port: the link index.
    pub ports: Vec<Vec<usize>>,
}

impl Topology {
    pub fn add(&mut self, kind: NodeKind) -> usize {
        self.nodes.push(kind);
        self.ports.push(Vec::new());
        self.nodes.len() - 1
    }

    /// Joins `a` and `b` with a new port on each.
    pub fn connect(&mut self, a: usize, b: usize, rate_bps: u64, delay_ns: u64) {
        let ea = End {
            node: a,
            port: self.ports[a].len(),
        };
        let eb = End {
            node: b,
            port: self.ports[b].len(),
        };
        self.ports[a].push(self.links.len());
        self.ports[b].push(self.links.len());
        self.links.push(Link {
            a: ea,
            b: eb,
            rate_bps,
            delay_ns,
        });
    }

    /// The far end of `node`'s `port`, and the link.
    pub fn peer(&self, node: usize, port: usize) -> (End, &Link) {
        let l = &self.links[self.ports[node][port]];
        if l.a.node == node && l.a.port == port {
            (l.b, l)
        } else {
            (l.a, l)
        }
    }

    /// Host nodes in order; host `i` has address 10.x.y.z from its index.
    pub fn hosts(&self) -> Vec<usize> {
        (0..self.nodes.len())
            .filter(|&n| self.nodes[n] == NodeKind::Host)
            .collect()
    }

    /// For every node, for every host (by host index), the ports on a
    /// shortest path towards it (ECMP choices).
    pub fn routes(&self) -> Vec<Vec<Vec<usize>>> {
        let hosts = self.hosts();
        let mut out = vec![vec![Vec::new(); hosts.len()]; self.nodes.len()];
        for (hi, &h) in hosts.iter().enumerate() {
            // BFS distances from the host.
            let mut dist = vec![u32::MAX; self.nodes.len()];
            dist[h] = 0;
            let mut q = VecDeque::from([h]);
            while let Some(n) = q.pop_front() {
                for port in 0..self.ports[n].len() {
                    let (e, _) = self.peer(n, port);
                    if dist[e.node] == u32::MAX {
                        dist[e.node] = dist[n] + 1;
                        // Hosts do not forward.
                        if self.nodes[e.node] == NodeKind::Switch {
                            q.push_back(e.node);
                        }
                    }
                }
            }
            for n in 0..self.nodes.len() {
                if n == h || dist[n] == u32::MAX {
                    continue;
                }
                for port in 0..self.ports[n].len() {
                    let (e, _) = self.peer(n, port);
                    if dist[e.node].saturating_add(1) == dist[n] {
                        out[n][hi].push(port);
                    }
                }
            }
        }
        out
    }
}

/// Address of host `i`.
pub fn host_ip(i: usize) -> Ipv4Addr {
    let v = i + 1;
    Ipv4Addr::new(10, (v >> 16) as u8, (v >> 8) as u8, v as u8)
}

/// Host index of an address made by [`host_ip`] (`None` for the one
/// address no host has, x.0.0.0).
pub fn host_index(ip: Ipv4Addr) -> Option<usize> {
    let o = ip.octets();
    ((usize::from(o[1]) << 16) | (usize::from(o[2]) << 8) | usize::from(o[3])).checked_sub(1)
}

/// A topology that cannot be built, naming the bad values.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum TopologyError {
    #[error("host_gbps = {host_gbps}, fabric_gbps = {fabric_gbps}: link rates must be positive")]
    Rates { host_gbps: f64, fabric_gbps: f64 },
    #[error("hosts = {got}: {kind} needs at least 2 hosts")]
    Hosts { kind: &'static str, got: usize },
    #[error("leaves = {leaves}, spines = {spines}, hosts = {hosts}: leaf-spine needs leaves, spines >= 1 and hosts >= leaves")]
    LeafSpine {
        leaves: usize,
        spines: usize,
        hosts: usize,
    },
    #[error("kind = {0:?} is unknown (star, dumbbell, leaf-spine, fat-tree)")]
    Kind(String),
}

/// Topology settings read from TOML (`configs/sim/*.toml`).
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct TopologySpec {
    /// `star` (every host on one switch), `dumbbell` (two switches, the
    /// bottleneck between them), `leaf-spine`, or `fat-tree` (the HPCC
    /// paper's: 16 core, 20 agg, 20 ToR, 16 hosts per ToR).
    pub kind: String,
    /// Hosts (star, dumbbell: per side x 2 = total given).
    #[serde(default = "default_hosts")]
    pub hosts: usize,
    #[serde(default = "default_gbps")]
    pub host_gbps: f64,
    #[serde(default = "default_gbps")]
    pub fabric_gbps: f64,
    #[serde(default = "default_delay")]
    pub link_delay_ns: u64,
    /// Switch buffer per egress port, bytes.
    #[serde(default = "default_buffer")]
    pub buffer_bytes: u64,
    /// leaf-spine: leaves and spines.
    #[serde(default = "default_two")]
    pub leaves: usize,
    #[serde(default = "default_two")]
    pub spines: usize,
}

fn default_hosts() -> usize {
    17
}
fn default_gbps() -> f64 {
    100.0
}
fn default_delay() -> u64 {
    1_000
}
fn default_buffer() -> u64 {
    32 << 20
}
fn default_two() -> usize {
    2
}

impl TopologySpec {
    /// Builds the topology; the error names the bad field.
    pub fn build(&self) -> Result<Topology, TopologyError> {
        let h = (self.host_gbps * 1e9) as u64;
        let f = (self.fabric_gbps * 1e9) as u64;
        let d = self.link_delay_ns;
        if h == 0 || f == 0 {
            return Err(TopologyError::Rates {
                host_gbps: self.host_gbps,
                fabric_gbps: self.fabric_gbps,
            });
        }
        let mut t = Topology::default();
        match self.kind.as_str() {
            "star" => {
                if self.hosts < 2 {
                    return Err(TopologyError::Hosts {
                        kind: "star",
                        got: self.hosts,
                    });
                }
                let hosts: Vec<usize> = (0..self.hosts).map(|_| t.add(NodeKind::Host)).collect();
                let s = t.add(NodeKind::Switch);
                for hst in hosts {
                    t.connect(hst, s, h, d);
                }
            }
            "dumbbell" => {
                if self.hosts < 2 {
                    return Err(TopologyError::Hosts {
                        kind: "dumbbell",
                        got: self.hosts,
                    });
                }
                let hosts: Vec<usize> = (0..self.hosts).map(|_| t.add(NodeKind::Host)).collect();
                let (l, r) = (t.add(NodeKind::Switch), t.add(NodeKind::Switch));
                let half = self.hosts.div_ceil(2);
                for (i, &hst) in hosts.iter().enumerate() {
                    t.connect(hst, if i < half { l } else { r }, h, d);
                }
                t.connect(l, r, f, d);
            }
            "leaf-spine" => {
                if self.leaves == 0 || self.spines == 0 || self.hosts < self.leaves {
                    return Err(TopologyError::LeafSpine {
                        leaves: self.leaves,
                        spines: self.spines,
                        hosts: self.hosts,
                    });
                }
                let hosts: Vec<usize> = (0..self.hosts).map(|_| t.add(NodeKind::Host)).collect();
                let leaves: Vec<usize> =
                    (0..self.leaves).map(|_| t.add(NodeKind::Switch)).collect();
                let spines: Vec<usize> =
                    (0..self.spines).map(|_| t.add(NodeKind::Switch)).collect();
                for (i, &hst) in hosts.iter().enumerate() {
                    t.connect(hst, leaves[i * self.leaves / self.hosts], h, d);
                }
                for &l in &leaves {
                    for &s in &spines {
                        t.connect(l, s, f, d);
                    }
                }
            }
            "fat-tree" => {
                // The HPCC paper's fabric: 20 ToR x 16 hosts, 20 agg in 10
                // pods of 2, 16 core; each ToR to both aggs of its pod, each
                // agg to 8 cores.
                let hosts: Vec<usize> = (0..320).map(|_| t.add(NodeKind::Host)).collect();
                let tors: Vec<usize> = (0..20).map(|_| t.add(NodeKind::Switch)).collect();
                let aggs: Vec<usize> = (0..20).map(|_| t.add(NodeKind::Switch)).collect();
                let cores: Vec<usize> = (0..16).map(|_| t.add(NodeKind::Switch)).collect();
                for (i, &hst) in hosts.iter().enumerate() {
                    t.connect(hst, tors[i / 16], h, d);
                }
                for (i, &tor) in tors.iter().enumerate() {
                    let pod = i / 2;
                    t.connect(tor, aggs[2 * pod], f, d);
                    t.connect(tor, aggs[2 * pod + 1], f, d);
                }
                for (i, &agg) in aggs.iter().enumerate() {
                    let half = (i % 2) * 8;
                    for &c in &cores[half..half + 8] {
                        t.connect(agg, c, f, d);
                    }
                }
            }
            other => return Err(TopologyError::Kind(other.into())),
        }
        Ok(t)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(kind: &str, hosts: usize) -> TopologySpec {
        toml::from_str(&format!("kind = \"{kind}\"\nhosts = {hosts}")).unwrap()
    }

    #[test]
    fn star_routes_every_host_through_its_port() {
        let t = spec("star", 4).build().unwrap();
        let r = t.routes();
        assert_eq!(r[4][2], vec![2], "the switch reaches host 2 on port 2");
        assert_eq!(r[0][3], vec![0], "host 0 reaches host 3 through its NIC");
    }

    #[test]
    fn fat_tree_has_the_paper_shape_and_ecmp_choices() {
        let t = spec("fat-tree", 0).build().unwrap();
        assert_eq!(t.hosts().len(), 320);
        assert_eq!(t.nodes.len(), 320 + 56);
        let r = t.routes();
        // A ToR reaching a host in another pod has two agg choices.
        let tor0 = 320;
        assert_eq!(r[tor0][319].len(), 2);
        // Every host reaches every other host.
        assert!(r[0]
            .iter()
            .enumerate()
            .all(|(i, p)| i == 0 || !p.is_empty()));
    }

    #[test]
    fn bad_specs_are_named() {
        let e = |k, n| spec(k, n).build().unwrap_err().to_string();
        assert!(e("ring", 3).contains("\"ring\""));
        assert!(e("star", 1).contains("at least 2"));
        let e = toml::from_str::<TopologySpec>("kind = \"star\"\nhostz = 3").unwrap_err();
        assert!(e.to_string().contains("hostz"), "{e}");
    }

    #[test]
    fn host_addresses_round_trip() {
        for i in [0, 1, 255, 256, 319, 70_000] {
            assert_eq!(host_index(host_ip(i)), Some(i));
        }
    }
}
