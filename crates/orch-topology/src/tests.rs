use super::*;
use proptest::prelude::*;

/// GPUs 0-1 on NUMA node 0, 2-3 on node 1; 0-1 and 2-3 NVLinked (NV4), the rest over PCIe.
fn two_sockets() -> Shape {
    let mut shape = Shape::new(vec![Some(0), Some(0), Some(1), Some(1)]);
    for a in 0..4 {
        for b in 0..a {
            let same = shape.numa(a) == shape.numa(b);
            let link = Link {
                nvlinks: if same { 4 } else { 0 },
                pcie: Some(if same { Pcie::Node } else { Pcie::Sys }),
            };
            shape.set_link(a, b, link);
        }
    }
    shape
}

/// An HGX box: 0-3 on node 0, 4-7 on node 1, every pair NV18.
fn hgx() -> Shape {
    let mut shape = Shape::new((0..8).map(|i| Some(i / 4)).collect());
    for a in 0..8 {
        for b in 0..a {
            shape.set_link(
                a,
                b,
                Link {
                    nvlinks: 18,
                    pcie: Some(Pcie::Sys),
                },
            );
        }
    }
    shape
}

#[test]
fn the_nvlinked_pair_on_the_other_node_beats_a_pair_across_sockets() {
    let shape = two_sockets();
    // GPU 1 does not fit; the policy ranks 0 first.
    let choice = choose(&shape, &[0, 2, 3], 2).unwrap();
    assert_eq!(choice.set, vec![2, 3]);
    assert_eq!(choice.decider, Decider::Numa);
    assert_eq!(
        explain(&shape, &choice, |p| p as u32),
        "GPUs 2,3: one NUMA node (1), NV4 (the NUMA node decided)"
    );
}

#[test]
fn without_topology_the_policy_order_stands() {
    let shape = Shape::new(vec![None; 6]);
    let ranked = [4, 1, 5, 0];
    let choice = choose(&shape, &ranked, 3).unwrap();
    assert_eq!(choice.set, vec![4, 1, 5]);
    assert_eq!(choice.decider, Decider::Order);
    assert!(choose(&shape, &ranked, 5).is_none());
}

#[test]
fn one_device_is_the_policy_s_own_best() {
    let choice = choose(&two_sockets(), &[2, 0], 1).unwrap();
    assert_eq!(choice.set, vec![2]);
    assert_eq!(choice.decider, Decider::Order);
}

#[test]
fn on_an_hgx_box_a_set_stays_on_one_socket_when_it_fits() {
    let shape = hgx();
    // The policy likes 3 and 4 best; four of 3's socket win over a split.
    let choice = choose(&shape, &[3, 4, 5, 0, 1, 2, 6, 7], 4).unwrap();
    assert_eq!(choice.set, vec![3, 0, 1, 2]);
    assert_eq!(choice.decider, Decider::Numa);
    // Two: the policy's best pair that shares a socket, in its rank order.
    let pair = choose(&shape, &[3, 4, 5, 0], 2).unwrap();
    assert_eq!(pair.set, vec![3, 0]);
    assert_eq!(
        explain(&shape, &pair, |p| p as u32),
        "GPUs 0,3: one NUMA node (0), NV18 (the NUMA node decided)"
    );
    // Six fit on no socket: the fewest nodes (two), NVLinks everywhere.
    let six = choose(&shape, &[0, 1, 2, 3, 4, 5, 6, 7], 6).unwrap();
    assert_eq!(six.set, vec![0, 1, 2, 3, 4, 5]);
    assert_eq!(six.decider, Decider::Order);
    assert_eq!(
        explain(&shape, &six, |p| p as u32),
        "GPUs 0,1,2,3,4,5: no NUMA node fits 6 GPUs; NUMA nodes 0,1, NV18 between every pair (topology ties; the policy's order decided)"
    );
}

#[test]
fn on_a_pcie_box_the_pair_under_one_switch_wins() {
    // Two switches per socket: 0-1 and 2-3 on node 0, 4-5 and 6-7 on node 1.
    let switch = |i: usize| i / 2;
    let mut shape = Shape::new((0..8).map(|i| Some(i as u32 / 4)).collect());
    for a in 0..8 {
        for b in 0..a {
            let pcie = if switch(a) == switch(b) {
                Pcie::Pix
            } else if shape.numa(a) == shape.numa(b) {
                Pcie::Node
            } else {
                Pcie::Sys
            };
            shape.set_link(
                a,
                b,
                Link {
                    nvlinks: 0,
                    pcie: Some(pcie),
                },
            );
        }
    }
    // GPU 0 does not fit: 1 is the policy's favourite, but 2 and 3 share a switch.
    let choice = choose(&shape, &[1, 2, 3], 2).unwrap();
    assert_eq!(choice.set, vec![2, 3]);
    assert_eq!(choice.decider, Decider::Pcie);
    assert_eq!(
        explain(&shape, &choice, |p| p as u32),
        "GPUs 2,3: one NUMA node (0), PIX (the closest PCIe path decided)"
    );
    let four = choose(&shape, &[0, 4, 1, 5, 2, 6, 3, 7], 4).unwrap();
    assert_eq!(four.set, vec![0, 1, 2, 3]);
}

#[test]
fn more_nvlinks_win_within_a_node() {
    // One node; 0-2 NV2, 1-2 NV12, the rest PIX.
    let mut shape = Shape::new(vec![Some(0); 3]);
    let pix = Link {
        nvlinks: 0,
        pcie: Some(Pcie::Pix),
    };
    shape.set_link(0, 1, pix);
    shape.set_link(
        0,
        2,
        Link {
            nvlinks: 2,
            pcie: Some(Pcie::Pix),
        },
    );
    shape.set_link(
        1,
        2,
        Link {
            nvlinks: 12,
            pcie: Some(Pcie::Pix),
        },
    );
    let choice = choose(&shape, &[0, 1, 2], 2).unwrap();
    assert_eq!(choice.set, vec![1, 2]);
    assert_eq!(choice.decider, Decider::NvLinks);
}

#[test]
fn large_boxes_are_chosen_greedily_and_still_keep_to_one_node() {
    // 64 devices over 4 nodes of 16, no links: choosing 8 of 64 is past the exact budget.
    let shape = Shape::new((0..64).map(|i| Some(i / 16)).collect());
    assert!(sets(64, 8) > EXACT_SETS);
    let ranked: Vec<usize> = (0..64).rev().collect();
    let choice = choose(&shape, &ranked, 8).unwrap();
    assert_eq!(choice.score.numa_nodes, 1);
    assert_eq!(choice.set, vec![63, 62, 61, 60, 59, 58, 57, 56]);
}

/// Half of a 64-device box with links between every pair: the greedy search keeps each trial
/// to the new device's pairs, so this many devices stay cheap, and the set fills two nodes.
#[test]
fn half_of_a_large_linked_box_spans_the_fewest_nodes() {
    let mut shape = Shape::new((0..64).map(|i| Some(i / 16)).collect());
    for a in 0..64 {
        for b in (a + 1)..64 {
            let same = a / 16 == b / 16;
            shape.set_link(
                a,
                b,
                Link {
                    nvlinks: if same { 4 } else { 0 },
                    pcie: None,
                },
            );
        }
    }
    let ranked: Vec<usize> = (0..64).collect();
    let choice = choose(&shape, &ranked, 32).unwrap();
    assert_eq!(choice.set.len(), 32);
    assert_eq!(choice.score.numa_nodes, 2);
    assert_eq!(choice.score, shape.score(&choice.set));
}

#[test]
fn out_of_range_links_are_ignored() {
    let mut shape = Shape::new(vec![None, None]);
    shape.set_link(0, 5, Link::default());
    shape.set_link(
        1,
        1,
        Link {
            nvlinks: 3,
            pcie: None,
        },
    );
    assert!(!shape.is_known());
    assert_eq!(shape.link(0, 9), Link::default());
}

/// A random small box: 2-7 devices on up to 3 NUMA nodes (or unknown), random links.
fn small_box() -> impl Strategy<Value = Shape> {
    (2usize..8).prop_flat_map(|n| {
        (
            prop::collection::vec(prop::option::weighted(0.8, 0u32..3), n),
            prop::collection::vec((0u32..3, prop::option::of(0u8..5)), n * (n - 1) / 2),
        )
            .prop_map(move |(numa, links)| {
                let mut shape = Shape::new(numa);
                let mut pairs = links.into_iter();
                for a in 0..n {
                    for b in 0..a {
                        let Some((nvlinks, pcie)) = pairs.next() else {
                            continue;
                        };
                        let pcie = pcie.map(|l| {
                            [Pcie::Pix, Pcie::Pxb, Pcie::Phb, Pcie::Node, Pcie::Sys][l as usize]
                        });
                        shape.set_link(a, b, Link { nvlinks, pcie });
                    }
                }
                shape
            })
    })
}

/// Every `k`-subset of `items`.
fn subsets(items: &[usize], k: usize) -> Vec<Vec<usize>> {
    if k == 0 {
        return vec![vec![]];
    }
    if items.len() < k {
        return vec![];
    }
    let mut with: Vec<Vec<usize>> = subsets(&items[1..], k - 1)
        .into_iter()
        .map(|mut s| {
            s.insert(0, items[0]);
            s
        })
        .collect();
    with.extend(subsets(&items[1..], k));
    with
}

proptest! {
    /// The chosen set is never worse by (NUMA nodes, NVLinks, PCIe) than any other feasible set
    /// of the same size, and among sets as good it is the policy's favourite (lowest rank sum,
    /// then the better-ranked devices).
    #[test]
    fn the_choice_is_never_worse_than_another_set(
        shape in small_box(),
        order in prop::collection::vec(any::<u32>(), 8),
        count in 1usize..5,
        drop in prop::collection::vec(any::<bool>(), 8),
    ) {
        let n = shape.len();
        // The fitting devices, in a random policy order.
        let mut ranked: Vec<usize> = (0..n).filter(|&i| !drop[i]).collect();
        ranked.sort_by_key(|&i| order[i]);
        let Some(choice) = choose(&shape, &ranked, count) else {
            prop_assert!(ranked.len() < count);
            return Ok(());
        };
        prop_assert_eq!(choice.set.len(), count);
        let rank_of = |p: usize| ranked.iter().position(|&r| r == p).unwrap();
        let chosen_ranks: Vec<usize> = choice.set.iter().map(|&p| rank_of(p)).collect();
        prop_assert!(chosen_ranks.windows(2).all(|w| w[0] < w[1]), "rank order");
        for other in subsets(&ranked, count) {
            let score = shape.score(&other);
            if count >= 2 && shape.is_known() {
                prop_assert!(choice.score <= score, "{:?} beats {:?}", other, choice.set);
                if score == choice.score {
                    let mut ranks: Vec<usize> = other.iter().map(|&p| rank_of(p)).collect();
                    ranks.sort_unstable();
                    let sum = |r: &[usize]| r.iter().sum::<usize>();
                    prop_assert!(
                        (sum(&chosen_ranks), &chosen_ranks) <= (sum(&ranks), &ranks),
                        "{:?} is the policy's favourite over {:?}", other, choice.set
                    );
                }
            }
        }
        if count < 2 || !shape.is_known() {
            prop_assert_eq!(&choice.set[..], &ranked[..count]);
        }
    }

    /// Greedy search never leaves a set on more NUMA nodes than needed, whatever the links.
    #[test]
    fn greedy_keeps_to_as_few_nodes_as_exact(shape in small_box(), count in 2usize..5) {
        let ranked: Vec<usize> = (0..shape.len()).collect();
        prop_assume!(ranked.len() >= count);
        let exact_set: Vec<usize> = exact(&shape, &ranked, count).iter().map(|&r| ranked[r]).collect();
        let greedy_set: Vec<usize> = greedy(&shape, &ranked, count).iter().map(|&r| ranked[r]).collect();
        prop_assert_eq!(greedy_set.len(), count);
        prop_assert!(shape.score(&exact_set) <= shape.score(&greedy_set));
        let placed = (0..shape.len()).all(|p| shape.numa(p).is_some());
        if placed {
            prop_assert_eq!(shape.score(&exact_set).numa_nodes, shape.score(&greedy_set).numa_nodes);
        }
    }
}

/// A box with NUMA nodes and no link (MIG slices): the shortcut of `choose` (the policy's top
/// set when it spans the fewest nodes) gives what the exhaustive search gives, on every spread
/// of nodes and rankings tried.
#[test]
fn without_links_the_shortcut_is_the_exhaustive_choice() {
    let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
    let mut next = |n: u64| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % n
    };
    for _ in 0..300 {
        let len = 2 + next(14) as usize;
        let numa: Vec<Option<u32>> = (0..len)
            .map(|_| match next(5) {
                0 => None,
                n => Some(n as u32 % 3),
            })
            .collect();
        let shape = Shape::new(numa);
        assert!(!shape.has_links());
        let mut ranked: Vec<usize> = (0..len).collect();
        for i in (1..len).rev() {
            ranked.swap(i, next(i as u64 + 1) as usize);
        }
        for count in 2..=len.min(5) {
            let Some(fast) = choose(&shape, &ranked, count) else {
                continue;
            };
            if !shape.is_known() {
                continue;
            }
            let ranks = exact(&shape, &ranked, count);
            let slow: Vec<usize> = ranks.iter().map(|&r| ranked[r]).collect();
            assert_eq!(
                fast.score,
                shape.score(&slow),
                "{shape:?} {ranked:?} {count}"
            );
            let rank_sum = |set: &[usize]| -> usize {
                set.iter()
                    .map(|p| ranked.iter().position(|r| r == p).unwrap())
                    .sum()
            };
            assert_eq!(
                rank_sum(&fast.set),
                rank_sum(&slow),
                "{shape:?} {ranked:?} {count}"
            );
        }
    }
}
