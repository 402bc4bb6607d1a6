//! `listWorkers`: filter, sort and keyset pagination (WORKERS.md
//! "Methods"). The answer counts the filtered workers (`total`) and those
//! left past the page in its direction (`remaining`).

use std::cmp::Ordering;
use std::collections::{BTreeMap, BTreeSet};

use super::{Registry, State, Worker, WorkerError};
use crate::limits::WORKERS_PAGE_MAX;

/// Which workers: groups any-of, caps all-of exact, states any-of (each
/// empty: no condition).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Filter {
    pub groups: BTreeSet<String>,
    pub caps: BTreeMap<String, String>,
    pub states: BTreeSet<State>,
}

impl Filter {
    fn admits(&self, worker: &Worker) -> bool {
        (self.groups.is_empty() || !self.groups.is_disjoint(&worker.groups))
            && self
                .caps
                .iter()
                .all(|(key, value)| worker.caps.get(key) == Some(value))
            && (self.states.is_empty() || self.states.contains(&worker.state))
    }
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SortItem {
    #[default]
    Uuid,
    State,
    Groups,
}

impl SortItem {
    /// Case-insensitive, as Boruta.
    pub fn parse(text: &str) -> Result<SortItem, WorkerError> {
        match text.to_ascii_lowercase().as_str() {
            "uuid" => Ok(SortItem::Uuid),
            "state" => Ok(SortItem::State),
            "groups" => Ok(SortItem::Groups),
            _ => Err(WorkerError::UnknownSortItem),
        }
    }
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Order {
    #[default]
    Ascending,
    Descending,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Sort {
    pub item: SortItem,
    pub order: Order,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Direction {
    #[default]
    Forward,
    Backward,
}

/// A page: the workers after (or before) the anchor in the sort order,
/// the anchor itself never among them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Page {
    pub after: Option<String>,
    pub direction: Direction,
    /// 0 or over [`WORKERS_PAGE_MAX`]: [`WORKERS_PAGE_MAX`].
    pub limit: usize,
}

/// One page of a listing.
#[derive(Debug, PartialEq)]
pub struct Listing<'a> {
    pub workers: Vec<&'a Worker>,
    pub total: usize,
    pub remaining: usize,
}

/// The sort order: the item, then the uuid (which breaks every tie).
fn compare(sort: Sort, a: &Worker, b: &Worker) -> Ordering {
    let by_item = match sort.item {
        SortItem::Uuid => Ordering::Equal,
        SortItem::State => a.state.wire().cmp(b.state.wire()),
        SortItem::Groups => a.groups.iter().cmp(b.groups.iter()),
    };
    let ordering = by_item.then_with(|| a.uuid.cmp(&b.uuid));
    match sort.order {
        Order::Ascending => ordering,
        Order::Descending => ordering.reverse(),
    }
}

impl Registry {
    /// `listWorkers`. An anchor that is not (or no longer) among the
    /// filtered workers still places the page: by where it would sort.
    pub fn list(&self, filter: &Filter, sort: Sort, page: &Page) -> Listing<'_> {
        let mut workers: Vec<&Worker> = self
            .workers
            .values()
            .filter(|worker| filter.admits(worker))
            .collect();
        workers.sort_by(|a, b| compare(sort, a, b));
        let total = workers.len();
        let limit = match page.limit {
            0 => WORKERS_PAGE_MAX,
            limit => limit.min(WORKERS_PAGE_MAX),
        };
        let anchor = page.after.as_ref().map(|uuid| {
            let ordering = |worker: &Worker| match self.workers.get(uuid) {
                Some(anchor) => compare(sort, worker, anchor),
                // An unknown anchor: placed by its uuid alone.
                None => worker.uuid.as_str().cmp(uuid.as_str()),
            };
            (
                workers.partition_point(|worker| ordering(worker) == Ordering::Less),
                workers.partition_point(|worker| ordering(worker) != Ordering::Greater),
            )
        });
        let (page_workers, remaining) = match page.direction {
            Direction::Forward => {
                let start = anchor.map_or(0, |(_, after)| after);
                let end = (start + limit).min(total);
                (workers[start..end].to_vec(), total - end)
            }
            Direction::Backward => {
                let end = anchor.map_or(total, |(before, _)| before);
                let start = end.saturating_sub(limit);
                (workers[start..end].to_vec(), start)
            }
        };
        Listing {
            workers: page_workers,
            total,
            remaining,
        }
    }
}
