//! The notification interfaces of the event sequences (nodepool's "proper
//! notification API"): one per source of change, a method per kind of
//! event, each named `*_notification` with a default that does nothing.
//! [`notify_queue`] and [`notify_locks`] call a listener's method for an
//! event read from a sequence (so once the change it tells is durable),
//! after its [`QueueChange::event_notification`] /
//! [`LockChange::event_notification`], which hears every event.
//!
//! A listener gets the event's line and parses what it needs of it
//! ([`EventLine::fields`], [`EventLine::decode`]).
//!
//! The reporter's metrics and hooks are listeners; the worker registry's
//! own listener inside wconfd is [`crate::workers::WorkerChange`].

use super::EventLine;

/// What luxid's sequence tells (EVENTS.md, luxid's catalogue).
pub trait QueueChange {
    /// Every event, before its own method.
    fn event_notification(&mut self, _event: &EventLine) {}
    fn queue_started_notification(&mut self, _event: &EventLine) {}
    fn job_submitted_notification(&mut self, _event: &EventLine) {}
    fn job_status_notification(&mut self, _event: &EventLine) {}
    fn job_finished_notification(&mut self, _event: &EventLine) {}
    fn job_priority_notification(&mut self, _event: &EventLine) {}
    fn job_archived_notification(&mut self, _event: &EventLine) {}
    fn queue_drain_notification(&mut self, _event: &EventLine) {}
}

/// What wconfd's sequence tells (EVENTS.md, wconfd's catalogue).
pub trait LockChange {
    /// Every event, before its own method.
    fn event_notification(&mut self, _event: &EventLine) {}
    fn lock_granted_notification(&mut self, _event: &EventLine) {}
    fn lock_released_notification(&mut self, _event: &EventLine) {}
    fn lock_waiting_notification(&mut self, _event: &EventLine) {}
    fn lock_withdrawn_notification(&mut self, _event: &EventLine) {}
    fn lock_deadlock_notification(&mut self, _event: &EventLine) {}
    fn owner_dead_notification(&mut self, _event: &EventLine) {}
    fn config_written_notification(&mut self, _event: &EventLine) {}
    fn config_lock_violation_notification(&mut self, _event: &EventLine) {}
    /// `worker.<state>` (`state` lower case), `worker.groups`,
    /// `worker.deregistered`.
    fn worker_changed_notification(&mut self, _event: &EventLine, _change: &str) {}
}

/// Tells `listener` of one event of luxid's sequence.
pub fn notify_queue(event: &EventLine, listener: &mut dyn QueueChange) {
    listener.event_notification(event);
    match event.kind_str() {
        "queue.started" => listener.queue_started_notification(event),
        "job.submitted" => listener.job_submitted_notification(event),
        "job.status" => listener.job_status_notification(event),
        "job.finished" => listener.job_finished_notification(event),
        "job.priority" => listener.job_priority_notification(event),
        "job.archived" => listener.job_archived_notification(event),
        "queue.drain" => listener.queue_drain_notification(event),
        _ => {}
    }
}

/// Tells `listener` of one event of wconfd's sequence.
pub fn notify_locks(event: &EventLine, listener: &mut dyn LockChange) {
    listener.event_notification(event);
    match event.kind_str() {
        "lock.granted" => listener.lock_granted_notification(event),
        "lock.released" => listener.lock_released_notification(event),
        "lock.waiting" => listener.lock_waiting_notification(event),
        "lock.withdrawn" => listener.lock_withdrawn_notification(event),
        "lock.deadlock" => listener.lock_deadlock_notification(event),
        "owner.dead" => listener.owner_dead_notification(event),
        "config.written" => listener.config_written_notification(event),
        "config.lock_violation" => listener.config_lock_violation_notification(event),
        kind => {
            if let Some(change) = kind.strip_prefix("worker.") {
                listener.worker_changed_notification(event, change);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::jobs::Timestamp;

    #[derive(Default)]
    struct Heard(Vec<String>);

    impl QueueChange for Heard {
        fn event_notification(&mut self, event: &EventLine) {
            self.0.push(format!("any {}", event.kind_str()));
        }
        fn job_finished_notification(&mut self, event: &EventLine) {
            self.0.push(format!("finished {}", event.seq()));
        }
    }

    impl LockChange for Heard {
        fn worker_changed_notification(&mut self, _event: &EventLine, change: &str) {
            self.0.push(format!("worker {change}"));
        }
    }

    fn event(seq: u64, kind: &str) -> EventLine {
        EventLine::encode(seq, Timestamp(1, 0), kind, &serde_json::Map::new())
    }

    #[test]
    fn each_event_reaches_its_method_after_the_catch_all() {
        let mut heard = Heard::default();
        notify_queue(&event(1, "job.status"), &mut heard);
        notify_queue(&event(2, "job.finished"), &mut heard);
        notify_locks(&event(3, "worker.idle"), &mut heard);
        notify_locks(&event(4, "lock.granted"), &mut heard);
        assert_eq!(
            heard.0,
            [
                "any job.status",
                "any job.finished",
                "finished 2",
                "worker idle"
            ]
        );
    }
}
