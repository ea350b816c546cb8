//! What replicas exchange: a rendezvous of all replica threads where each contributes a value
//! and every one receives the same combined result (an all-reduce of gradients, a broadcast
//! of parameters).
//!
//! The last replica to arrive runs the combination, over the contributions in rank order, so
//! the result does not depend on which thread came first: runs are reproducible. A replica that
//! fails poisons the collective, which wakes every waiter with the reason instead of leaving
//! them blocked; so does a wait longer than the step deadline.

use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

/// A rendezvous of `size` replicas exchanging `T`s for a shared `R`.
#[derive(Debug)]
pub(crate) struct Collective<T, R> {
    size: usize,
    state: Mutex<Round<T, R>>,
    turn: Condvar,
}

#[derive(Debug)]
struct Round<T, R> {
    generation: u64,
    slots: Vec<Option<T>>,
    arrived: usize,
    result: Option<Arc<R>>,
    failed: Option<String>,
}

impl<T, R> Collective<T, R> {
    pub fn new(size: usize) -> Collective<T, R> {
        Collective {
            size,
            state: Mutex::new(Round {
                generation: 0,
                slots: (0..size).map(|_| None).collect(),
                arrived: 0,
                result: None,
                failed: None,
            }),
            turn: Condvar::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Round<T, R>> {
        orch_core::sync::lock(&self.state)
    }

    /// Contributes `value` as replica `rank` and waits (at most `timeout`) for the others; the
    /// last to arrive computes `combine` over every contribution in rank order.
    pub fn exchange(
        &self,
        rank: usize,
        value: T,
        timeout: Duration,
        combine: impl FnOnce(Vec<T>) -> R,
    ) -> Result<Arc<R>, String> {
        let mut round = self.lock();
        if let Some(why) = &round.failed {
            return Err(why.clone());
        }
        let Some(slot) = round.slots.get_mut(rank) else {
            return Err(format!("no replica {rank} of {}", self.size));
        };
        if slot.replace(value).is_some() {
            return Err(format!("replica {rank} arrived twice in one exchange"));
        }
        round.arrived += 1;
        if round.arrived == self.size {
            let values: Vec<T> = round.slots.iter_mut().filter_map(Option::take).collect();
            let result = Arc::new(combine(values));
            round.result = Some(Arc::clone(&result));
            round.arrived = 0;
            round.generation += 1;
            self.turn.notify_all();
            return Ok(result);
        }
        let generation = round.generation;
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let (next, wait) = self
                .turn
                .wait_timeout(round, left)
                .unwrap_or_else(PoisonError::into_inner);
            round = next;
            if let Some(why) = &round.failed {
                return Err(why.clone());
            }
            if round.generation != generation {
                // The next round cannot complete without this replica: the result is ours.
                return round
                    .result
                    .clone()
                    .ok_or_else(|| "the exchange lost its result".to_string());
            }
            if wait.timed_out() {
                let missing: Vec<String> = round
                    .slots
                    .iter()
                    .enumerate()
                    .filter(|(_, s)| s.is_none())
                    .map(|(r, _)| r.to_string())
                    .collect();
                let why = format!(
                    "replica {} did not reach the exchange within {:.0} s",
                    missing.join(", "),
                    timeout.as_secs_f64()
                );
                round.failed = Some(why.clone());
                self.turn.notify_all();
                return Err(why);
            }
        }
    }

    /// Fails the collective: every waiter, now and later, gets `why`.
    pub fn poison(&self, why: &str) {
        let mut round = self.lock();
        if round.failed.is_none() {
            round.failed = Some(why.to_string());
        }
        self.turn.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_replica_gets_the_rank_ordered_combination_every_round() {
        let c = Arc::new(Collective::<usize, Vec<usize>>::new(4));
        let results: Vec<Vec<Vec<usize>>> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..4)
                .map(|rank| {
                    let c = Arc::clone(&c);
                    s.spawn(move || {
                        (0..50)
                            .map(|round| {
                                let r = c.exchange(
                                    rank,
                                    rank * 100 + round,
                                    Duration::from_secs(10),
                                    |v| v,
                                );
                                r.map(|r| (*r).clone()).unwrap_or_default()
                            })
                            .collect()
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().unwrap_or_default())
                .collect()
        });
        for (round, per_rank) in (0..50).map(|r| (r, results.iter().map(move |v| &v[r]))) {
            for got in per_rank {
                assert_eq!(got, &vec![round, 100 + round, 200 + round, 300 + round]);
            }
        }
    }

    #[test]
    fn poison_and_timeouts_wake_waiters() {
        let c = Arc::new(Collective::<u8, ()>::new(2));
        let waiter = {
            let c = Arc::clone(&c);
            std::thread::spawn(move || c.exchange(0, 1, Duration::from_secs(30), |_| ()))
        };
        std::thread::sleep(Duration::from_millis(20));
        c.poison("replica 1 crashed");
        let got = waiter
            .join()
            .map_err(|_| "panicked")
            .and_then(|r| r.map_err(|_| "err"));
        assert_eq!(got.err(), Some("err"));
        assert_eq!(
            c.exchange(1, 1, Duration::from_secs(1), |_| ())
                .err()
                .as_deref(),
            Some("replica 1 crashed")
        );

        let lonely = Collective::<u8, ()>::new(2);
        let err = lonely
            .exchange(0, 1, Duration::from_millis(10), |_| ())
            .err();
        assert_eq!(
            err.as_deref(),
            Some("replica 1 did not reach the exchange within 0 s")
        );
    }
}
