//! Which ranks share a host, and the schedule of the two-level all-to-all: plain data, no
//! MPI, so the schedule is tested by simulation on machines without OpenMPI.
//!
//! A flat all-to-all over a group of k ranks sends k(k-1) messages, so with h hosts of p
//! ranks, h·p·(h-1)·p of them cross between hosts. The two-level schedule sends exactly one
//! message from each host to each other host, h(h-1) in all, carrying the same bytes:
//!
//! 1. within each host, every rank hands each local peer its own block for that peer, and
//!    hands the host's *sender* towards each remote host H' its blocks for all of H's ranks;
//! 2. each sender passes one message per remote host, to that host's *receiver* for this
//!    host, holding the blocks of all its local ranks for all the remote host's ranks;
//! 3. within each host, each receiver hands every local rank its blocks.
//!
//! The sender from host A towards host B is A's local rank `B mod |A|`, and the receiver on
//! B is B's local rank `A mod |B|` (hosts numbered in order of their first rank), so the
//! work of relaying spreads over a host's ranks. The schedule is a pure function of the
//! group's host layout, computed alike by every rank, which is what keeps senders and
//! receivers agreeing on the order of the blocks in each message.

use std::fmt;

/// A host, numbered in order of its lowest rank.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct HostId(pub usize);

impl fmt::Display for HostId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "host {}", self.0)
    }
}

/// How the ranks are grouped into hosts.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum HostLayout {
    /// Ranks reporting the same processor name (`MPI_Get_processor_name`) share a host.
    #[default]
    ByName,
    /// This many hosts of consecutive ranks, equally many on each (the rank count must be a
    /// multiple); checked against the processor names, which it may only split further.
    Blocks(usize),
}

/// How an all-to-all whose group spans hosts moves its blocks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum AllToAllAlgo {
    /// Every rank sends one message to every other rank.
    #[default]
    Flat,
    /// Within hosts, then one message per pair of hosts, then within hosts again.
    TwoLevel,
}

/// The host of each rank, from the ranks' processor names (`names[r]` is rank r's) and the
/// layout asked for; an error (one line) when the layout does not fit the ranks.
pub fn assign_hosts(names: &[String], layout: &HostLayout) -> Result<Vec<HostId>, String> {
    let by_name = {
        let mut seen: Vec<&str> = Vec::new();
        names
            .iter()
            .map(|n| match seen.iter().position(|s| s == n) {
                Some(i) => HostId(i),
                None => {
                    seen.push(n);
                    HostId(seen.len() - 1)
                }
            })
            .collect::<Vec<_>>()
    };
    match *layout {
        HostLayout::ByName => Ok(by_name),
        HostLayout::Blocks(h) => {
            let n = names.len();
            if h == 0 || !n.is_multiple_of(h) {
                return Err(format!(
                    "--hosts {h} does not split the {n} MPI ranks into equal hosts; give a host count that divides {n}, or leave --hosts out to group ranks by their machines' names"
                ));
            }
            let per = n / h;
            let hosts: Vec<HostId> = (0..n).map(|r| HostId(r / per)).collect();
            // A declared host may not span two machines: its ranks could not share memory.
            for r in 1..n {
                if hosts[r] == hosts[r - 1] && by_name[r] != by_name[r - 1] {
                    return Err(format!(
                        "--hosts {h} puts ranks {} and {r} on one host, but they run on different machines ({} and {}); leave --hosts out to group ranks by their machines' names",
                        r - 1,
                        names[r - 1],
                        names[r]
                    ));
                }
            }
            Ok(hosts)
        }
    }
}

/// One block of an all-to-all: what group rank `src` holds for group rank `dst`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Block {
    pub src: usize,
    pub dst: usize,
}

/// The three steps of the two-level schedule for one group.
#[derive(Clone, Debug)]
pub struct TwoLevel {
    /// Each group rank's host, renumbered 0.. in order of first appearance.
    host: Vec<usize>,
    /// The group ranks of each host, ascending.
    members: Vec<Vec<usize>>,
}

/// A step of the schedule: 0 (gather to senders), 1 (between hosts), 2 (to the owners).
pub const STEPS: usize = 3;

impl TwoLevel {
    /// The schedule for a group whose rank j runs on `hosts[j]`.
    pub fn new(hosts: &[HostId]) -> TwoLevel {
        let mut ids: Vec<HostId> = Vec::new();
        let mut host = Vec::with_capacity(hosts.len());
        let mut members: Vec<Vec<usize>> = Vec::new();
        for (j, h) in hosts.iter().enumerate() {
            let i = match ids.iter().position(|x| x == h) {
                Some(i) => i,
                None => {
                    ids.push(*h);
                    members.push(Vec::new());
                    ids.len() - 1
                }
            };
            host.push(i);
            members[i].push(j);
        }
        TwoLevel { host, members }
    }

    /// Number of hosts the group spans.
    pub fn hosts(&self) -> usize {
        self.members.len()
    }

    /// Whether the schedule differs from a flat exchange: the group spans hosts and some
    /// host runs more than one of its ranks.
    pub fn helps(&self) -> bool {
        self.hosts() > 1 && self.members.iter().any(|m| m.len() > 1)
    }

    /// Whether group ranks `a` and `b` are on different hosts.
    pub fn remote(&self, a: usize, b: usize) -> bool {
        self.host[a] != self.host[b]
    }

    /// The rank of host `from` that sends its message towards host `to`.
    fn sender(&self, from: usize, to: usize) -> usize {
        let m = &self.members[from];
        m[to % m.len()]
    }

    /// The rank of host `to` that receives the message from host `from`.
    fn receiver(&self, from: usize, to: usize) -> usize {
        let m = &self.members[to];
        m[from % m.len()]
    }

    /// The blocks group rank `a` sends to group rank `b` in `step`, in message order (empty
    /// when it sends nothing; never called with `a == b`).
    pub fn message(&self, step: usize, a: usize, b: usize) -> Vec<Block> {
        let (ha, hb) = (self.host[a], self.host[b]);
        let mut out = Vec::new();
        match step {
            0 if ha == hb => {
                out.push(Block { src: a, dst: b });
                for to in (0..self.hosts()).filter(|&t| t != ha) {
                    if self.sender(ha, to) == b {
                        out.extend(self.members[to].iter().map(|&d| Block { src: a, dst: d }));
                    }
                }
            }
            1 if ha != hb && self.sender(ha, hb) == a && self.receiver(ha, hb) == b => {
                for &s in &self.members[ha] {
                    out.extend(self.members[hb].iter().map(|&d| Block { src: s, dst: d }));
                }
            }
            2 if ha == hb => {
                for from in (0..self.hosts()).filter(|&f| f != hb) {
                    if self.receiver(from, hb) == a {
                        out.extend(self.members[from].iter().map(|&s| Block { src: s, dst: b }));
                    }
                }
            }
            _ => {}
        }
        out
    }

    /// What group rank `me` sends in `step`: (peer, blocks) for each non-empty
    /// message, peers ascending.
    pub fn sends(&self, step: usize, me: usize) -> Vec<(usize, Vec<Block>)> {
        (0..self.host.len())
            .filter(|&b| b != me)
            .map(|b| (b, self.message(step, me, b)))
            .filter(|(_, m)| !m.is_empty())
            .collect()
    }

    /// What rank `me` receives in `step`: (peer, blocks) for each non-empty message.
    pub fn recvs(&self, step: usize, me: usize) -> Vec<(usize, Vec<Block>)> {
        (0..self.host.len())
            .filter(|&a| a != me)
            .map(|a| (a, self.message(step, a, me)))
            .filter(|(_, m)| !m.is_empty())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    /// Runs the schedule on simulated ranks (each holding a set of blocks): every message
    /// must carry only blocks its sender holds, and at the end each rank must hold every
    /// block addressed to it. Returns the number of messages between hosts.
    fn simulate(hosts: &[usize]) -> usize {
        let ids: Vec<HostId> = hosts.iter().map(|&h| HostId(h)).collect();
        let plan = TwoLevel::new(&ids);
        let k = hosts.len();
        let mut held: Vec<HashSet<Block>> = (0..k)
            .map(|s| (0..k).map(|d| Block { src: s, dst: d }).collect())
            .collect();
        let mut remote = 0;
        for step in 0..STEPS {
            let before = held.clone();
            for (a, had) in before.iter().enumerate() {
                for (b, blocks) in plan.sends(step, a) {
                    assert_eq!(
                        plan.recvs(step, b).iter().filter(|(p, _)| *p == a).count(),
                        1
                    );
                    if plan.remote(a, b) {
                        remote += 1;
                        assert_eq!(step, 1, "only step 1 crosses hosts");
                    }
                    for blk in blocks {
                        assert!(had.contains(&blk), "{a} sends {blk:?} it lacks");
                        held[b].insert(blk);
                    }
                }
            }
        }
        for (d, h) in held.iter().enumerate() {
            for s in 0..k {
                assert!(h.contains(&Block { src: s, dst: d }), "{d} lacks from {s}");
            }
        }
        remote
    }

    #[test]
    fn every_block_arrives_with_one_message_per_host_pair() {
        for (hosts, h) in [
            (vec![0, 0, 1, 1], 2),
            (vec![0, 0, 0, 0, 1, 1, 1, 1], 2),
            (vec![0, 0, 1, 1, 2, 2], 3),
            (vec![0, 1, 0, 1], 2),
            (vec![0, 0, 0, 1], 2),
            (vec![0, 1, 1, 2, 2, 2, 2], 3),
            (vec![0, 1, 2], 3),
            (vec![0, 0, 0], 1),
        ] {
            assert_eq!(simulate(&hosts), h * (h - 1), "{hosts:?}");
        }
    }

    #[test]
    fn flat_would_send_ranks_times_remote_ranks() {
        let plan = TwoLevel::new(&[HostId(0), HostId(0), HostId(1), HostId(1)]);
        let flat = (0..4)
            .flat_map(|a| (0..4).map(move |b| (a, b)))
            .filter(|&(a, b)| plan.remote(a, b))
            .count();
        assert_eq!(flat, 2 * 2 * 2);
        assert!(plan.helps());
        assert!(!TwoLevel::new(&[HostId(0), HostId(1)]).helps());
        assert!(!TwoLevel::new(&[HostId(3), HostId(3)]).helps());
    }

    #[test]
    fn host_layouts() {
        let same = vec!["m".to_string(); 4];
        assert_eq!(
            assign_hosts(&same, &HostLayout::Blocks(2)).unwrap(),
            vec![HostId(0), HostId(0), HostId(1), HostId(1)]
        );
        assert_eq!(
            assign_hosts(&same, &HostLayout::ByName).unwrap(),
            vec![HostId(0); 4]
        );
        let two: Vec<String> = ["b", "a", "b", "a"].iter().map(|s| s.to_string()).collect();
        assert_eq!(
            assign_hosts(&two, &HostLayout::ByName).unwrap(),
            vec![HostId(0), HostId(1), HostId(0), HostId(1)]
        );
        let e = assign_hosts(&same, &HostLayout::Blocks(3)).unwrap_err();
        assert!(e.contains("--hosts 3") && e.contains("divides 4"), "{e}");
        let e = assign_hosts(&two, &HostLayout::Blocks(2)).unwrap_err();
        assert!(e.contains("different machines"), "{e}");
        assert!(!e.contains('\n'));
        assert!(assign_hosts(&same, &HostLayout::Blocks(0)).is_err());
    }
}
