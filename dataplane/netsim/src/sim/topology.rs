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

    /// Every node's tier: 0 for hosts, then the least number of links to
    /// a host (1 for a ToR, 2 for an aggregation switch, 3 for a core);
    /// `usize::MAX` for a node no host reaches.
    pub fn tiers(&self) -> Vec<usize> {
        let mut tier = vec![usize::MAX; self.nodes.len()];
        let mut q: VecDeque<usize> = self.hosts().into();
        for &h in &q {
            tier[h] = 0;
        }
        while let Some(n) = q.pop_front() {
            for port in 0..self.ports[n].len() {
                let (e, _) = self.peer(n, port);
                if tier[e.node] == usize::MAX {
                    tier[e.node] = tier[n] + 1;
                    q.push_back(e.node);
                }
            }
        }
        tier
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
    #[error("k = {0}: a k-ary fat tree needs an even k >= 2")]
    FatTreeK(usize),
    #[error(
        "oversubscription = {0}: must be at least 1 (1 = every ToR's uplinks carry all its hosts)"
    )]
    Oversubscription(f64),
    #[error("kind = {0:?} is unknown (star, dumbbell, leaf-spine, fat-tree)")]
    Kind(String),
    #[error("hot_link_gbps = {0}: must be positive")]
    HotLink(f64),
    #[error("hot_link_gbps: a {0} has no link between two switch tiers")]
    NoHotLink(String),
}

/// Topology settings read from TOML (`configs/sim/*.toml`).
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct TopologySpec {
    /// `star` (every host on one switch), `dumbbell` (two switches, the
    /// bottleneck between them), `leaf-spine`, or `fat-tree` (without `k`
    /// the HPCC paper's, wired as the authors' ns-3 `fat.txt`: 5 pods of 4
    /// ToRs and 4 aggregation switches, 16 cores, 16 hosts per ToR; with
    /// `k` a k-ary fat tree).
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
    /// fat-tree: a k-ary fat tree (k pods of k/2 ToRs and k/2 aggregation
    /// switches, (k/2)^2 cores) instead of the paper's.
    #[serde(default)]
    pub k: Option<usize>,
    /// fat-tree: hosts per ToR over what its uplinks carry at line rate
    /// (1 = none; 2 = twice as many hosts).
    #[serde(default = "default_one")]
    pub oversubscription: f64,
    /// The first link between the two top tiers (a fat tree's first
    /// aggregation switch and its first core; a leaf-spine's leaf 0 and
    /// spine 0) runs at this rate instead: a hot link that ECMP still
    /// spreads flows onto (HPCC++ 2023 s9.4's case for path choice).
    #[serde(default)]
    pub hot_link_gbps: Option<f64>,
}

fn default_one() -> f64 {
    1.0
}

/// The shape of a fat tree: pods of ToRs and aggregation switches, each
/// ToR linked to every aggregation switch of its pod, aggregation switch
/// `j` of every pod linked to cores `j * c .. (j + 1) * c` where `c` is
/// cores per aggregation switch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FatTree {
    pub pods: usize,
    pub tors_per_pod: usize,
    pub aggs_per_pod: usize,
    pub cores: usize,
    pub hosts_per_tor: usize,
}

impl FatTree {
    /// The HPCC paper's (the authors' `simulation/mix/fat.txt`): 320
    /// hosts, 20 ToRs, 20 aggregation switches, 16 cores.
    pub const PAPER: FatTree = FatTree {
        pods: 5,
        tors_per_pod: 4,
        aggs_per_pod: 4,
        cores: 16,
        hosts_per_tor: 16,
    };

    /// Adds the tree to `t`, numbered as `fat.txt` numbers it: hosts
    /// first, then ToRs, aggregation switches and cores.
    fn build(&self, t: &mut Topology, host_bps: u64, fabric_bps: u64, delay_ns: u64) {
        let tors = self.pods * self.tors_per_pod;
        let aggs = self.pods * self.aggs_per_pod;
        let hosts: Vec<usize> = (0..tors * self.hosts_per_tor)
            .map(|_| t.add(NodeKind::Host))
            .collect();
        let tor: Vec<usize> = (0..tors).map(|_| t.add(NodeKind::Switch)).collect();
        let agg: Vec<usize> = (0..aggs).map(|_| t.add(NodeKind::Switch)).collect();
        let core: Vec<usize> = (0..self.cores).map(|_| t.add(NodeKind::Switch)).collect();
        for (i, &h) in hosts.iter().enumerate() {
            t.connect(h, tor[i / self.hosts_per_tor], host_bps, delay_ns);
        }
        for (i, &x) in tor.iter().enumerate() {
            let pod = i / self.tors_per_pod;
            for &a in &agg[pod * self.aggs_per_pod..(pod + 1) * self.aggs_per_pod] {
                t.connect(x, a, fabric_bps, delay_ns);
            }
        }
        let per_agg = (self.cores / self.aggs_per_pod).max(1);
        for (i, &a) in agg.iter().enumerate() {
            let j = i % self.aggs_per_pod;
            for &c in core.iter().skip(j * per_agg).take(per_agg) {
                t.connect(a, c, fabric_bps, delay_ns);
            }
        }
    }
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
                if self.oversubscription.is_nan() || self.oversubscription < 1.0 {
                    return Err(TopologyError::Oversubscription(self.oversubscription));
                }
                let shape = match self.k {
                    None => FatTree::PAPER,
                    Some(k) if k < 2 || k % 2 != 0 => return Err(TopologyError::FatTreeK(k)),
                    Some(k) => FatTree {
                        pods: k,
                        tors_per_pod: k / 2,
                        aggs_per_pod: k / 2,
                        cores: k * k / 4,
                        hosts_per_tor: k / 2,
                    },
                };
                // Hosts per ToR: what its uplinks carry at line rate, times
                // the oversubscription.
                let line_rate = shape.aggs_per_pod as f64 * self.fabric_gbps / self.host_gbps;
                let hosts_per_tor = (line_rate * self.oversubscription).round().max(1.0) as usize;
                FatTree {
                    hosts_per_tor,
                    ..shape
                }
                .build(&mut t, h, f, d);
            }
            other => return Err(TopologyError::Kind(other.into())),
        }
        if let Some(g) = self.hot_link_gbps {
            let rate = (g * 1e9) as u64;
            if rate == 0 {
                return Err(TopologyError::HotLink(g));
            }
            let tier = t.tiers();
            let top = tier
                .iter()
                .copied()
                .filter(|&x| x != usize::MAX)
                .max()
                .unwrap_or(0);
            let hot = t.links.iter_mut().find(|l| {
                let (a, b) = (tier[l.a.node], tier[l.b.node]);
                a.max(b) == top && a.min(b) + 1 == top && top >= 2
            });
            match hot {
                Some(l) => l.rate_bps = rate,
                None => return Err(TopologyError::NoHotLink(self.kind.clone())),
            }
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
    fn a_hot_link_is_the_first_between_the_top_two_tiers() {
        let t: Topology =
            toml::from_str::<TopologySpec>("kind = \"fat-tree\"\nk = 4\nhot_link_gbps = 10")
                .unwrap()
                .build()
                .unwrap();
        let tier = t.tiers();
        let slow: Vec<&Link> = t
            .links
            .iter()
            .filter(|l| l.rate_bps == 10_000_000_000)
            .collect();
        assert_eq!(slow.len(), 1);
        let mut ends = [tier[slow[0].a.node], tier[slow[0].b.node]];
        ends.sort_unstable();
        assert_eq!(ends, [2, 3], "aggregation to core");
        let star = toml::from_str::<TopologySpec>("kind = \"star\"\nhot_link_gbps = 10").unwrap();
        assert_eq!(
            star.build().err(),
            Some(TopologyError::NoHotLink("star".into()))
        );
    }

    #[test]
    fn star_routes_every_host_through_its_port() {
        let t = spec("star", 4).build().unwrap();
        let r = t.routes();
        assert_eq!(r[4][2], vec![2], "the switch reaches host 2 on port 2");
        assert_eq!(r[0][3], vec![0], "host 0 reaches host 3 through its NIC");
    }

    #[test]
    fn fat_tree_is_wired_as_the_authors_fat_txt() {
        let t: Topology = toml::from_str::<TopologySpec>(
            "kind = \"fat-tree\"\nhost_gbps = 100\nfabric_gbps = 400",
        )
        .unwrap()
        .build()
        .unwrap();
        assert_eq!(t.hosts().len(), 320);
        assert_eq!(t.nodes.len(), 376);
        assert_eq!(t.links.len(), 480, "fat.txt's link count");
        let linked = |a: usize, b: usize| {
            t.links
                .iter()
                .any(|l| (l.a.node, l.b.node) == (a, b) || (l.a.node, l.b.node) == (b, a))
        };
        // Host 17 on ToR 321; ToR 325 (pod 1) on aggregation 344..347;
        // aggregation 357 (the second of pod 4) on cores 364..367.
        assert!(linked(17, 321) && !linked(17, 320));
        assert!((344..348).all(|a| linked(325, a)) && !linked(325, 340));
        assert!((364..368).all(|c| linked(357, c)) && !linked(357, 360));
        let tiers = t.tiers();
        assert_eq!((tiers[0], tiers[320], tiers[340], tiers[375]), (0, 1, 2, 3));
        // No oversubscription: 16 x 100G down, 4 x 400G up per ToR.
        let tor = &t.ports[320];
        assert_eq!(tor.len(), 20);
        let r = t.routes();
        // A ToR reaching a host in another pod has four choices, an
        // aggregation switch four cores.
        assert_eq!(r[320][319].len(), 4);
        assert_eq!(r[340][319].len(), 4);
        assert!(r[0]
            .iter()
            .enumerate()
            .all(|(i, p)| i == 0 || !p.is_empty()));
    }

    #[test]
    fn k_ary_fat_tree_and_its_oversubscription() {
        let tree = |extra: &str| {
            toml::from_str::<TopologySpec>(&format!("kind = \"fat-tree\"\nk = 4\n{extra}"))
                .unwrap()
                .build()
        };
        let t = tree("").unwrap();
        // k = 4: 4 pods x (2 ToRs x 2 hosts), 8 ToRs, 8 aggs, 4 cores.
        assert_eq!(t.hosts().len(), 16);
        assert_eq!(t.nodes.len(), 16 + 8 + 8 + 4);
        let t2 = tree("oversubscription = 2.0").unwrap();
        assert_eq!(t2.hosts().len(), 32, "4 hosts per ToR on 2 uplinks");
        let bad = toml::from_str::<TopologySpec>("kind = \"fat-tree\"\nk = 3").unwrap();
        assert!(bad.build().unwrap_err().to_string().contains("k = 3"));
        let bad =
            toml::from_str::<TopologySpec>("kind = \"fat-tree\"\noversubscription = 0.5").unwrap();
        assert!(bad.build().unwrap_err().to_string().contains("0.5"));
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
