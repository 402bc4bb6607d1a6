//! The jobs waiting for workers and the indexes that match them
//! (WORKERS.md "Matching"), so that a worker becoming IDLE costs a few
//! lookups, not a scan of every waiting job and every worker.
//!
//! Waiting requests with identical `(groups, caps, count)` form one
//! *shape*: if the first job of a shape cannot be served, none of it can,
//! so a shape is tried once per event. Shapes are indexed by one cap pair
//! they require (any one is sound: all are required), else by each of
//! their groups, else as fitting anything; a worker's candidate shapes are
//! the ones under its cap pairs, its groups and "anything". IDLE workers
//! are indexed by `(score, uuid)`, the best-match order, in one set per cap
//! pair and per group and in one set of all, so the best fit of a shape
//! walks one posting list.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use super::{Request, Worker};
use crate::jobs::JobId;

/// A worker in best-match order: fewer caps and groups first, then the
/// smaller uuid.
type Ranked = (usize, String);

fn ranked(worker: &Worker) -> Ranked {
    (worker.score(), worker.uuid.clone())
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Key {
    Cap(String, String),
    Group(String),
    Anything,
}

/// The keys a shape is filed under.
fn shape_keys(request: &Request) -> Vec<Key> {
    if let Some((name, value)) = request.caps.iter().next() {
        vec![Key::Cap(name.clone(), value.clone())]
    } else if !request.groups.is_empty() {
        request.groups.iter().cloned().map(Key::Group).collect()
    } else {
        vec![Key::Anything]
    }
}

#[derive(Clone, Debug, PartialEq)]
struct Shape {
    request: Request,
    /// Its jobs in service order.
    queue: BTreeSet<(i64, JobId)>,
}

/// A job's place among the waiters.
#[derive(Clone, Debug, PartialEq)]
pub struct Waiter {
    pub priority: i64,
    pub request: Request,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub(super) struct Matcher {
    waiters: BTreeMap<JobId, Waiter>,
    shapes: HashMap<Request, Shape>,
    shape_index: HashMap<Key, BTreeSet<Request>>,
    idle_all: BTreeSet<Ranked>,
    idle_index: HashMap<Key, BTreeSet<Ranked>>,
}

impl Matcher {
    pub(super) fn waiter(&self, job: JobId) -> Option<&Waiter> {
        self.waiters.get(&job)
    }

    pub(super) fn waiters(&self) -> impl Iterator<Item = (JobId, &Waiter)> {
        self.waiters.iter().map(|(job, waiter)| (*job, waiter))
    }

    // ----- waiters -----

    pub(super) fn add_waiter(&mut self, job: JobId, priority: i64, request: Request) {
        self.remove_waiter(job);
        let shape = self.shapes.entry(request.clone()).or_insert_with(|| Shape {
            request: request.clone(),
            queue: BTreeSet::new(),
        });
        if shape.queue.is_empty() {
            for key in shape_keys(&request) {
                self.shape_index
                    .entry(key)
                    .or_default()
                    .insert(request.clone());
            }
        }
        shape.queue.insert((priority, job));
        self.waiters.insert(job, Waiter { priority, request });
    }

    pub(super) fn remove_waiter(&mut self, job: JobId) -> Option<Waiter> {
        let waiter = self.waiters.remove(&job)?;
        let shape = self
            .shapes
            .get_mut(&waiter.request)
            .expect("a waiter's shape exists");
        shape.queue.remove(&(waiter.priority, job));
        if shape.queue.is_empty() {
            self.shapes.remove(&waiter.request);
            for key in shape_keys(&waiter.request) {
                if let Some(filed) = self.shape_index.get_mut(&key) {
                    filed.remove(&waiter.request);
                    if filed.is_empty() {
                        self.shape_index.remove(&key);
                    }
                }
            }
        }
        Some(waiter)
    }

    /// The first waiter of `request`'s shape.
    pub(super) fn first_of_shape(&self, request: &Request) -> Option<(i64, JobId)> {
        self.shapes.get(request)?.queue.first().copied()
    }

    /// The shapes `worker` fits, by their first waiter in service order.
    pub(super) fn shapes_fitting(&self, worker: &Worker) -> Vec<((i64, JobId), Request)> {
        let mut keys: Vec<Key> = worker
            .caps
            .iter()
            .map(|(name, value)| Key::Cap(name.clone(), value.clone()))
            .collect();
        keys.extend(worker.groups.iter().cloned().map(Key::Group));
        keys.push(Key::Anything);
        let mut found: BTreeMap<(i64, JobId), Request> = BTreeMap::new();
        for key in keys {
            for request in self.shape_index.get(&key).into_iter().flatten() {
                if worker.could_fit(request)
                    && let Some(first) = self.first_of_shape(request)
                {
                    found.insert(first, request.clone());
                }
            }
        }
        found.into_iter().collect()
    }

    /// The waiting jobs whose shape `worker` could fit (any state).
    pub(super) fn jobs_fitting(&self, worker: &Worker) -> Vec<JobId> {
        self.shapes_fitting(worker)
            .iter()
            .flat_map(|(_, request)| self.shapes[request].queue.iter().map(|(_, job)| *job))
            .collect()
    }

    // ----- the IDLE workers -----

    fn idle_keys(worker: &Worker) -> impl Iterator<Item = Key> + '_ {
        worker
            .caps
            .iter()
            .map(|(name, value)| Key::Cap(name.clone(), value.clone()))
            .chain(worker.groups.iter().cloned().map(Key::Group))
    }

    pub(super) fn add_idle(&mut self, worker: &Worker) {
        let rank = ranked(worker);
        for key in Matcher::idle_keys(worker) {
            self.idle_index.entry(key).or_default().insert(rank.clone());
        }
        self.idle_all.insert(rank);
    }

    /// Takes `worker` (with the caps and groups it was added with) out of
    /// the IDLE indexes.
    pub(super) fn remove_idle(&mut self, worker: &Worker) {
        let rank = ranked(worker);
        for key in Matcher::idle_keys(worker) {
            if let Some(set) = self.idle_index.get_mut(&key) {
                set.remove(&rank);
                if set.is_empty() {
                    self.idle_index.remove(&key);
                }
            }
        }
        self.idle_all.remove(&rank);
    }

    pub(super) fn idle_count(&self) -> usize {
        self.idle_all.len()
    }

    /// The best IDLE workers for `request`: its `count` first in
    /// best-match order, or `None` if fewer fit.
    pub(super) fn best_fit(
        &self,
        request: &Request,
        workers: &BTreeMap<String, Worker>,
    ) -> Option<Vec<String>> {
        let count = request.count;
        let chosen: Vec<String> = if !request.caps.is_empty() {
            // The shortest posting list of a required cap pair, filtered.
            let shortest = request
                .caps
                .iter()
                .map(|(name, value)| self.idle_index.get(&Key::Cap(name.clone(), value.clone())))
                .min_by_key(|set| set.map_or(0, BTreeSet::len))??;
            shortest
                .iter()
                .filter(|(_, uuid)| workers[uuid].could_fit(request))
                .take(count)
                .map(|(_, uuid)| uuid.clone())
                .collect()
        } else if !request.groups.is_empty() {
            // The best `count` of the union are among each group's best
            // `count`.
            let mut union: BTreeSet<&Ranked> = BTreeSet::new();
            for group in &request.groups {
                if let Some(set) = self.idle_index.get(&Key::Group(group.clone())) {
                    union.extend(set.iter().take(count));
                }
            }
            union
                .into_iter()
                .take(count)
                .map(|(_, uuid)| uuid.clone())
                .collect()
        } else {
            self.idle_all
                .iter()
                .take(count)
                .map(|(_, uuid)| uuid.clone())
                .collect()
        };
        (chosen.len() == count).then_some(chosen)
    }

    /// Panics unless the indexes agree with the waiters and with `workers`.
    pub(super) fn check_invariants(&self, workers: &BTreeMap<String, Worker>) {
        let idle: BTreeSet<Ranked> = workers
            .values()
            .filter(|worker| worker.state == super::State::Idle)
            .map(ranked)
            .collect();
        assert_eq!(self.idle_all, idle, "the IDLE index holds the IDLE workers");
        let mut keyed: HashMap<Key, BTreeSet<Ranked>> = HashMap::new();
        for worker in workers
            .values()
            .filter(|worker| worker.state == super::State::Idle)
        {
            for key in Matcher::idle_keys(worker) {
                keyed.entry(key).or_default().insert(ranked(worker));
            }
        }
        assert_eq!(self.idle_index, keyed, "the IDLE posting lists agree");
        let mut queued = 0;
        for (request, shape) in &self.shapes {
            assert!(!shape.queue.is_empty(), "no empty shape is kept");
            assert_eq!(&shape.request, request);
            for key in shape_keys(request) {
                assert!(
                    self.shape_index
                        .get(&key)
                        .is_some_and(|filed| filed.contains(request)),
                    "a shape is filed under its keys"
                );
            }
            for (priority, job) in &shape.queue {
                let waiter = &self.waiters[job];
                assert_eq!(
                    (&waiter.request, waiter.priority),
                    (request, *priority),
                    "job {job} waits in its own shape"
                );
            }
            queued += shape.queue.len();
        }
        assert_eq!(queued, self.waiters.len(), "every waiter is in one shape");
        let filed: usize = self.shape_index.values().map(BTreeSet::len).sum();
        let expected: usize = self.shapes.keys().map(|r| shape_keys(r).len()).sum();
        assert_eq!(filed, expected, "the shape index holds only live shapes");
    }
}
