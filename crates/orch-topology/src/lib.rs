//! The rule orch's built-in policies choose multi-GPU sets by, shared by the host and the
//! built-in Wasm policies: of the sets of `count` devices that fit, the one on the fewest NUMA
//! nodes (one, where the set fits on one), then with the most NVLinks between its members, then
//! with the closest PCIe paths (the worst pair first, then all pairs together), and among sets
//! equal by all three, the one the policy's own ranking prefers (the lowest sum of its members'
//! ranks, then the set holding the better-ranked devices). This is the order Slurm (one
//! socket first) and Kubernetes' go-gpuallocator (NVLinks, then PCIe levels) use.
//!
//! Design decision: the rule is a total order on sets ([`Score`], then the policy's ranking), and
//! [`choose`] finds its minimum exactly by trying every set while there are at most
//! [`EXACT_SETS`] of them (every box of up to 16 GPUs asking for any count, and far larger boxes
//! asking for two or three); beyond that it grows a set greedily from each device and keeps the
//! best. Where the box says nothing of its shape (no NUMA node, no link), every set scores the
//! same and the choice is the policy's own top `count`, exactly as without the rule, at the cost
//! of one check. No dependencies: the guest kit (`plugins/kit`) compiles this same source.

use std::cmp::Ordering;

/// The PCIe path between two GPUs, closest first, as `nvidia-smi topo -m` names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Pcie {
    /// At most one PCIe bridge (one switch).
    Pix,
    /// Several PCIe bridges, without the host bridge.
    Pxb,
    /// Through a PCIe host bridge (the CPU).
    Phb,
    /// Between host bridges within one NUMA node.
    Node,
    /// Between NUMA nodes (the sockets' link).
    Sys,
}

impl Pcie {
    /// `PIX`, `PXB`, `PHB`, `NODE`, `SYS`.
    pub fn as_str(self) -> &'static str {
        match self {
            Pcie::Pix => "PIX",
            Pcie::Pxb => "PXB",
            Pcie::Phb => "PHB",
            Pcie::Node => "NODE",
            Pcie::Sys => "SYS",
        }
    }
}

/// How two devices reach each other.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Link {
    /// Active NVLinks between the two; 0 when none.
    pub nvlinks: u32,
    /// The PCIe path, when known.
    pub pcie: Option<Pcie>,
}

impl Link {
    /// How far apart the pair is, for the PCIe rule: 0 over NVLink, 1 (`PIX`) to 5 (`SYS`), 6
    /// when unknown.
    fn distance(self) -> u32 {
        match (self.nvlinks, self.pcie) {
            (n, _) if n > 0 => 0,
            (_, Some(level)) => level as u32 + 1,
            (_, None) => 6,
        }
    }
}

/// The box as the rule sees it: devices by position (`0..len`), each one's NUMA node and the
/// link between every pair.
#[derive(Debug, Clone, Default)]
pub struct Shape {
    numa: Vec<Option<u32>>,
    /// `len × len`, row-major; the diagonal is unused. Empty until a link is known (a box of
    /// MIG slices has NUMA nodes and no links: no `len²` table to fill on every decision).
    links: Vec<Link>,
    known: bool,
}

impl Shape {
    /// A box of `numa.len()` devices, each on its NUMA node (`None`: unknown), with no link known
    /// yet.
    pub fn new(numa: Vec<Option<u32>>) -> Shape {
        let known = numa.iter().any(Option::is_some);
        Shape {
            numa,
            links: Vec::new(),
            known,
        }
    }

    /// The number of devices.
    pub fn len(&self) -> usize {
        self.numa.len()
    }

    /// True for a box of no devices.
    pub fn is_empty(&self) -> bool {
        self.numa.is_empty()
    }

    /// Records the link between devices `a` and `b` (both ways). Out-of-range positions and a
    /// device's link to itself are ignored.
    pub fn set_link(&mut self, a: usize, b: usize, link: Link) {
        let n = self.len();
        if a >= n || b >= n || a == b {
            return;
        }
        if link == Link::default() && self.links.is_empty() {
            return;
        }
        if self.links.is_empty() {
            self.links = vec![Link::default(); n * n];
        }
        self.links[a * n + b] = link;
        self.links[b * n + a] = link;
        self.known |= link != Link::default();
    }

    /// The link between `a` and `b` (nothing known: the default).
    pub fn link(&self, a: usize, b: usize) -> Link {
        let n = self.len();
        if a >= n || b >= n || self.links.is_empty() {
            return Link::default();
        }
        self.links[a * n + b]
    }

    /// True when some pair's link is known (beyond NUMA nodes).
    pub fn has_links(&self) -> bool {
        !self.links.is_empty()
    }

    /// The NUMA node of device `a`, when known.
    pub fn numa(&self, a: usize) -> Option<u32> {
        self.numa.get(a).copied().flatten()
    }

    /// True when the box says anything of its shape (a NUMA node or a link).
    pub fn is_known(&self) -> bool {
        self.known
    }

    /// How `set` (positions, distinct) scores under the rule.
    pub fn score(&self, set: &[usize]) -> Score {
        let mut score = Score {
            numa_nodes: 0,
            nvlinks: 0,
            worst: 0,
            distance: 0,
        };
        for (i, &a) in set.iter().enumerate() {
            let node = self.numa(a);
            let seen = node.is_some() && set[..i].iter().any(|&b| self.numa(b) == node);
            if !seen {
                score.numa_nodes += 1;
            }
            for &b in &set[..i] {
                score.add_pair(self.link(a, b));
            }
        }
        score
    }
}

/// A set's standing under the rule; smaller is better ([`Ord`]): fewer NUMA nodes, then more
/// NVLinks, then a closer worst pair, then closer pairs in all.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Score {
    /// The NUMA nodes the set spans (a device of unknown node counts as a node of its own).
    pub numa_nodes: u32,
    /// NVLinks between members, every pair counted once.
    pub nvlinks: u32,
    /// The farthest pair: 0 over NVLink, 1 (`PIX`) to 5 (`SYS`), 6 unknown.
    pub worst: u32,
    /// The sum of every pair's distance.
    pub distance: u32,
}

impl Score {
    fn add_pair(&mut self, link: Link) {
        let d = link.distance();
        self.nvlinks = self.nvlinks.saturating_add(link.nvlinks);
        self.worst = self.worst.max(d);
        self.distance += d;
    }
}

impl Ord for Score {
    fn cmp(&self, other: &Score) -> Ordering {
        self.numa_nodes
            .cmp(&other.numa_nodes)
            .then(other.nvlinks.cmp(&self.nvlinks))
            .then(self.worst.cmp(&other.worst))
            .then(self.distance.cmp(&other.distance))
    }
}

impl PartialOrd for Score {
    fn partial_cmp(&self, other: &Score) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

/// Which part of the rule made the choice differ from the policy's own top `count`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Decider {
    /// Fewer NUMA nodes.
    Numa,
    /// More NVLinks.
    NvLinks,
    /// Closer PCIe paths.
    Pcie,
    /// Nothing: the policy's own top `count` scores as well as any set.
    Order,
}

/// The chosen set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Choice {
    /// Positions in the shape, in the policy's rank order (best first).
    pub set: Vec<usize>,
    pub score: Score,
    pub decider: Decider,
}

/// Up to this many candidate sets, [`choose`] tries them all.
pub const EXACT_SETS: u64 = 20_000;

/// Chooses `count` devices of `ranked` (positions in `shape`, distinct, best first by the
/// policy's own criteria) by the rule; `None` when fewer than `count` are ranked. Without
/// anything known of the shape, or for fewer than two devices, the choice is `ranked[..count]`.
pub fn choose(shape: &Shape, ranked: &[usize], count: usize) -> Option<Choice> {
    if ranked.len() < count {
        return None;
    }
    let top = &ranked[..count];
    if count < 2 || !shape.is_known() {
        return Some(Choice {
            set: top.to_vec(),
            score: shape.score(top),
            decider: Decider::Order,
        });
    }
    // No link known (a box of MIG slices, a box whose inventory gives NUMA nodes only): every
    // pair scores alike, so the policy's own top `count` is the rule's choice whenever it spans
    // the fewest NUMA nodes possible (it has the lowest rank sum of all sets).
    if !shape.has_links() && shape.score(top).numa_nodes == fewest_nodes(shape, ranked, count) {
        return Some(Choice {
            set: top.to_vec(),
            score: shape.score(top),
            decider: Decider::Order,
        });
    }
    let ranks = if sets(ranked.len() as u64, count as u64) <= EXACT_SETS {
        exact(shape, ranked, count)
    } else {
        greedy(shape, ranked, count)
    };
    let set: Vec<usize> = ranks.iter().map(|&r| ranked[r]).collect();
    let score = shape.score(&set);
    let own = shape.score(top);
    let decider = if score == own {
        Decider::Order
    } else if score.numa_nodes != own.numa_nodes {
        Decider::Numa
    } else if score.nvlinks != own.nvlinks {
        Decider::NvLinks
    } else {
        Decider::Pcie
    };
    Some(Choice {
        set,
        score,
        decider,
    })
}

/// `n` choose `k`, saturating.
fn sets(n: u64, k: u64) -> u64 {
    let k = k.min(n.saturating_sub(k));
    let mut total: u64 = 1;
    for i in 0..k {
        total = total.saturating_mul(n - i) / (i + 1);
        if total > EXACT_SETS {
            return u64::MAX;
        }
    }
    total
}

/// Every `count`-subset of `0..ranked.len()` in lexicographic order, depth first with each
/// set's score built up member by member, skipping every set on more NUMA nodes than the fewest
/// possible; the first with the best score and the lowest rank sum wins, which among those is
/// the one holding the policy's better-ranked devices.
fn exact(shape: &Shape, ranked: &[usize], count: usize) -> Vec<usize> {
    let mut search = Search {
        shape,
        ranked,
        count,
        most_nodes: fewest_nodes(shape, ranked, count),
        ranks: Vec::with_capacity(count),
        best: None,
        best_ranks: Vec::with_capacity(count),
    };
    let empty = Score {
        numa_nodes: 0,
        nvlinks: 0,
        worst: 0,
        distance: 0,
    };
    search.extend(0, empty, 0);
    search.best_ranks
}

/// The fewest NUMA nodes `count` of `ranked` can span: the fullest nodes first (a device of
/// unknown node is a node of its own).
fn fewest_nodes(shape: &Shape, ranked: &[usize], count: usize) -> u32 {
    let mut nodes: Vec<Option<u32>> = ranked.iter().map(|&p| shape.numa(p)).collect();
    nodes.sort_unstable();
    let mut sizes: Vec<usize> = Vec::with_capacity(nodes.len());
    for (i, node) in nodes.iter().enumerate() {
        match node {
            Some(_) if i > 0 && nodes[i - 1] == *node => {
                if let Some(last) = sizes.last_mut() {
                    *last += 1;
                }
            }
            _ => sizes.push(1),
        }
    }
    sizes.sort_unstable_by(|a, b| b.cmp(a));
    let mut taken = 0;
    for (used, size) in sizes.iter().enumerate() {
        taken += size;
        if taken >= count {
            return used as u32 + 1;
        }
    }
    u32::MAX
}

/// The depth-first search of [`exact`].
struct Search<'a> {
    shape: &'a Shape,
    ranked: &'a [usize],
    count: usize,
    /// No set on more nodes than this can be best.
    most_nodes: u32,
    /// The ranks chosen so far.
    ranks: Vec<usize>,
    /// The best set's score and rank sum, and its ranks (copied, never reallocated).
    best: Option<(Score, usize)>,
    best_ranks: Vec<usize>,
}

impl Search<'_> {
    /// Adds each rank from `from` on to the set so far (scoring `score`, rank sum `sum`).
    fn extend(&mut self, from: usize, score: Score, sum: usize) {
        let depth = self.ranks.len();
        let last = self.ranked.len() - (self.count - depth);
        for r in from..=last {
            let a = self.ranked[r];
            let mut next = score;
            let node = self.shape.numa(a);
            let shared = node.is_some()
                && self
                    .ranks
                    .iter()
                    .any(|&q| self.shape.numa(self.ranked[q]) == node);
            if !shared {
                next.numa_nodes += 1;
                if next.numa_nodes > self.most_nodes {
                    continue;
                }
            }
            for &q in &self.ranks {
                next.add_pair(self.shape.link(a, self.ranked[q]));
            }
            self.ranks.push(r);
            if depth + 1 == self.count {
                let key = (next, sum + r);
                if self.best.is_none_or(|best| key < best) {
                    self.best = Some(key);
                    self.best_ranks.clear();
                    self.best_ranks.extend_from_slice(&self.ranks);
                }
            } else {
                self.extend(r + 1, next, sum + r);
            }
            self.ranks.pop();
        }
    }
}

/// From each device as a seed, adds the device that scores the growing set best until `count`
/// (a device that opens a new NUMA node: one of the node with the most devices left, so the set
/// spans as few nodes as it can; ties: the policy's better one); the best full set wins (ties:
/// the policy's ranking).
fn greedy(shape: &Shape, ranked: &[usize], count: usize) -> Vec<usize> {
    let m = ranked.len();
    // How many ranked devices share each one's NUMA node (an unknown node: itself alone).
    let group: Vec<usize> = ranked
        .iter()
        .map(|&a| match shape.numa(a) {
            None => 1,
            node => ranked.iter().filter(|&&b| shape.numa(b) == node).count(),
        })
        .collect();
    let mut best: Option<((Score, usize), Vec<usize>)> = None;
    let mut set: Vec<usize> = Vec::with_capacity(count);
    let mut ranks: Vec<usize> = Vec::with_capacity(count);
    let mut in_set = vec![false; m];
    for seed in 0..m {
        ranks.clear();
        ranks.push(seed);
        set.clear();
        set.push(ranked[seed]);
        in_set.iter_mut().for_each(|b| *b = false);
        in_set[seed] = true;
        // The growing set's score, kept up to date: a trial adds one device's pairs to it
        // (O(count)) instead of scoring the whole set again (O(count²)).
        let mut current = shape.score(&set);
        while ranks.len() < count {
            let mut pick: Option<((u32, usize, Score), usize)> = None;
            for r in (0..m).filter(|&r| !in_set[r]) {
                let a = ranked[r];
                let node = shape.numa(a);
                let mut score = current;
                let mut taken = 0;
                for &b in &set {
                    if node.is_some() && shape.numa(b) == node {
                        taken += 1;
                    }
                    score.add_pair(shape.link(a, b));
                }
                if taken == 0 {
                    score.numa_nodes += 1;
                }
                // Opening a node: the fuller the node, the better; within the set's nodes, no
                // matter.
                let left = if taken == 0 { usize::MAX - group[r] } else { 0 };
                let key = (score.numa_nodes, left, score);
                if pick.as_ref().is_none_or(|(k, _)| key < *k) {
                    pick = Some((key, r));
                }
            }
            let Some(((_, _, score), r)) = pick else {
                break;
            };
            current = score;
            ranks.push(r);
            in_set[r] = true;
            set.push(ranked[r]);
            debug_assert_eq!(current, shape.score(&set));
        }
        let mut sorted = ranks.clone();
        sorted.sort_unstable();
        let score = (shape.score(&set), sorted.iter().sum::<usize>());
        let better = match &best {
            None => true,
            Some((s, b)) => score.cmp(s).then_with(|| sorted.cmp(b)) == Ordering::Less,
        };
        if better {
            best = Some((score, sorted));
        }
    }
    best.map(|(_, b)| b).unwrap_or_default()
}

/// Why the set was chosen, in words, such as `GPUs 2,3: one NUMA node (1), NV18 (the NUMA node
/// decided)`. `label` gives the number a person knows each position by.
pub fn explain(shape: &Shape, choice: &Choice, label: impl Fn(usize) -> u32) -> String {
    // Integers are written by hand, not with `format!`: in a Wasm guest the formatting
    // machinery costs more than the rule itself.
    let set = &choice.set;
    let mut numbers: Vec<u32> = set.iter().map(|&p| label(p)).collect();
    numbers.sort_unstable();
    let mut out = String::with_capacity(112);
    out.push_str("GPUs ");
    push_list(&mut out, &numbers);
    out.push(':');
    let mut parts = 0;
    let mut part = |out: &mut String| {
        out.push_str(if parts == 0 { " " } else { ", " });
        parts += 1;
    };
    if set.iter().all(|&p| shape.numa(p).is_some()) {
        // Reuse the labels' buffer for the nodes.
        numbers.clear();
        numbers.extend(set.iter().filter_map(|&p| shape.numa(p)));
        numbers.sort_unstable();
        numbers.dedup();
        part(&mut out);
        if let [node] = numbers[..] {
            out.push_str("one NUMA node (");
            push_u32(&mut out, node);
            out.push(')');
        } else {
            out.push_str("no NUMA node fits ");
            push_u32(&mut out, set.len() as u32);
            out.push_str(" GPUs; NUMA nodes ");
            push_list(&mut out, &numbers);
        }
    }
    let pairs = || {
        set.iter()
            .enumerate()
            .flat_map(|(i, &a)| set[..i].iter().map(move |&b| shape.link(a, b)))
    };
    let count = set.len() * set.len().saturating_sub(1) / 2;
    let least = pairs().map(|l| l.nvlinks).min().unwrap_or(0);
    if least > 0 {
        part(&mut out);
        let most = pairs().map(|l| l.nvlinks).max().unwrap_or(0);
        out.push_str("NV");
        push_u32(&mut out, least);
        if least != most {
            out.push_str(" to NV");
            push_u32(&mut out, most);
        }
        if count > 1 {
            out.push_str(" between every pair");
        }
    } else {
        if choice.score.nvlinks > 0 {
            part(&mut out);
            push_u32(&mut out, choice.score.nvlinks);
            out.push_str(" NVLinks in all");
        }
        let worst = pairs()
            .filter(|l| l.nvlinks == 0)
            .filter_map(|l| l.pcie)
            .max();
        if let Some(level) = worst {
            part(&mut out);
            out.push_str(level.as_str());
            if count > 1 {
                out.push_str(" at worst");
            }
        }
    }
    if parts == 0 {
        out.push_str(" nothing known of their links");
    }
    out.push_str(match choice.decider {
        Decider::Numa => " (the NUMA node decided)",
        Decider::NvLinks => " (the most NVLinks decided)",
        Decider::Pcie => " (the closest PCIe path decided)",
        Decider::Order => " (topology ties; the policy's order decided)",
    });
    out
}

/// `n` in decimal.
fn push_u32(out: &mut String, mut n: u32) {
    let mut digits = [0u8; 10];
    let mut at = digits.len();
    loop {
        at -= 1;
        digits[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    for &d in &digits[at..] {
        out.push(char::from(d));
    }
}

/// `0,1,2`.
fn push_list(out: &mut String, numbers: &[u32]) {
    for (i, &n) in numbers.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        push_u32(out, n);
    }
}

#[cfg(test)]
mod tests;
