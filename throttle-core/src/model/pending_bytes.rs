//! Model checker for the pending-bytes limiter ([`crate::pending_bytes`]).
//!
//! Bytes become a limit and a sequence of enqueue / try-acquire / release / cancel / drain
//! operations, with sizes from 0 to `u64::MAX`, releases of grants already released, cancels of
//! finished tickets, and forged tickets the limiter never issued. The reference is a plain `Vec`
//! of every ticket ever issued; after each change it recomputes who is admitted by scanning from
//! the front, summing the admitted charges from scratch. After every operation the checker
//! compares answers, counters and every live ticket's state, and checks the invariants:
//! conservation (admitted charges sum to `used`), never above the limit, `used + available ==
//! limit`, FIFO (no admitted ticket behind a waiting one, `Proceed`s in ticket order), and each
//! ticket admitted at most once and released at most once.

use alloc::format;
use alloc::vec::Vec;

use super::{Cursor, Divergence};
use crate::error::ReleaseError;
use crate::pending_bytes::{
    Cancelled, Enqueued, Grant, PendingBytesAction, PendingBytesConfig, PendingBytesLimiter,
    Ticket, TicketState,
};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Life {
    Waiting,
    Granted,
    Gone,
}

#[derive(Debug, Clone)]
struct Entry {
    ticket: Ticket,
    charge: u64,
    life: Life,
    /// The grant the machine handed out for this ticket, once seen.
    grant: Option<Grant>,
    times_granted: u32,
    times_released: u32,
}

/// Every ticket ever issued, in issue order; grants recomputed from the front.
#[derive(Debug)]
struct Reference {
    limit: u64,
    entries: Vec<Entry>,
    /// Entries admitted by a release or cancel and not yet announced, in admission order.
    unannounced: Vec<usize>,
}

impl Reference {
    fn charge(&self, bytes: u64) -> u64 {
        if bytes > self.limit {
            self.limit
        } else {
            bytes
        }
    }

    fn used(&self) -> u128 {
        self.entries
            .iter()
            .filter(|e| e.life == Life::Granted)
            .map(|e| u128::from(e.charge))
            .sum()
    }

    fn count(&self, life: Life) -> usize {
        self.entries.iter().filter(|e| e.life == life).count()
    }

    /// Walks the line from the oldest ticket: each waiting ticket is admitted if its charge fits
    /// beside what is admitted; the first one that does not fit stops the walk.
    fn regrant(&mut self) -> Vec<usize> {
        let mut used = self.used();
        let limit = u128::from(self.limit);
        let mut admitted = Vec::new();
        for (i, e) in self.entries.iter_mut().enumerate() {
            if e.life != Life::Waiting {
                continue;
            }
            if used + u128::from(e.charge) > limit {
                break;
            }
            used += u128::from(e.charge);
            e.life = Life::Granted;
            admitted.push(i);
        }
        admitted
    }

    /// The next announcement, skipping entries finished before they were announced.
    fn next_announcement(&mut self) -> Option<usize> {
        while !self.unannounced.is_empty() {
            let i = self.unannounced.remove(0);
            if self.entries.get(i).is_some_and(|e| e.life == Life::Granted) {
                return Some(i);
            }
        }
        None
    }

    fn expected_state(&self, i: usize) -> TicketState {
        match self.entries.get(i).map(|e| e.life) {
            Some(Life::Waiting) => TicketState::Waiting,
            Some(Life::Granted) => TicketState::Granted,
            Some(Life::Gone) => TicketState::Done,
            None => TicketState::Unknown,
        }
    }
}

#[derive(Debug, Clone, Copy)]
enum Op {
    Enqueue(u64),
    TryAcquire(u64),
    /// Release a grant seen earlier: among live tickets, or among all (duplicates included).
    Release {
        live: bool,
        pick: u16,
    },
    /// Cancel a ticket: among live tickets, or among all ever issued.
    Cancel {
        live: bool,
        pick: u16,
    },
    /// Cancel the oldest waiting ticket (the one that can unblock the line).
    CancelHead,
    /// A ticket (and grant) the limiter never issued.
    Forged {
        id: u64,
        slot: u32,
    },
    /// A live ticket's id and slot under another limiter's tag: the ticket (and grant) of a
    /// second instance, which this one must refuse as unknown without changing anything.
    Foreign(u16),
    /// A grant naming a ticket that is still waiting.
    GrantForWaiting(u16),
    PollOne,
    Drain,
}

fn size(c: &mut Cursor<'_>, limit: u64) -> u64 {
    match c.below(10) {
        0 => 0,
        1 => u64::MAX,
        2 => c.u64(),
        3 => limit,
        4 => limit.saturating_add(1),
        5 => limit / 2,
        _ => u64::from(c.below(24)),
    }
}

/// The next operation, or `None` for a selector value not assigned yet (a no-op).
fn decode(c: &mut Cursor<'_>, limit: u64) -> Option<Op> {
    let op = match c.select(15)? {
        0..=2 => Op::Enqueue(size(c, limit)),
        3 => Op::TryAcquire(size(c, limit)),
        4 | 5 => Op::Release {
            live: c.below(4) != 0,
            pick: c.u16(),
        },
        6 | 7 => Op::Cancel {
            live: c.below(4) != 0,
            pick: c.u16(),
        },
        8 | 12 => Op::CancelHead,
        13 => Op::Forged {
            id: (1 << 63) | c.u64(),
            slot: if c.bool() {
                u32::MAX
            } else {
                u32::from(c.u8())
            },
        },
        14 => Op::Foreign(c.u16()),
        9 => Op::GrantForWaiting(c.u16()),
        10 => Op::PollOne,
        _ => Op::Drain,
    };
    Some(op)
}

fn pick(len: usize, v: u16) -> Option<usize> {
    if len == 0 {
        None
    } else {
        Some(usize::from(v) % len)
    }
}

struct Checker {
    machine: PendingBytesLimiter,
    reference: Reference,
    last_id: Option<u64>,
    step: usize,
}

impl Checker {
    fn fail<T>(&self, op: Op, what: &str) -> Result<T, Divergence> {
        Err(format!(
            "step {} ({op:?}), limit {}: {what}",
            self.step, self.reference.limit
        ))
    }

    fn new_entry(&mut self, op: Op, ticket: Ticket, charge: u64) -> Result<usize, Divergence> {
        if self.last_id.is_some_and(|last| ticket.id() <= last) {
            return self.fail(
                op,
                &format!("ticket id {} reused or out of order", ticket.id()),
            );
        }
        self.last_id = Some(ticket.id());
        self.reference.entries.push(Entry {
            ticket,
            charge,
            life: Life::Waiting,
            grant: None,
            times_granted: 0,
            times_released: 0,
        });
        Ok(self.reference.entries.len() - 1)
    }

    fn saw_grant(&mut self, op: Op, i: usize, grant: Grant) -> Result<(), Divergence> {
        let Some(e) = self.reference.entries.get_mut(i) else {
            return self.fail(op, "grant for an entry the checker lost");
        };
        e.times_granted += 1;
        e.grant = Some(grant);
        let (times, charge) = (e.times_granted, e.charge);
        if times > 1 {
            return self.fail(
                op,
                &format!("ticket {:?} granted {times} times", grant.ticket()),
            );
        }
        if grant.charged() != charge {
            return self.fail(
                op,
                &format!("grant charged {} bytes, expected {charge}", grant.charged()),
            );
        }
        Ok(())
    }

    fn admit_in_reference(&mut self) {
        let admitted = self.reference.regrant();
        self.reference.unannounced.extend(admitted);
    }

    /// Expected outcome of giving back entry `i`, applied to the reference.
    fn finish_in_reference(&mut self, i: usize) -> Result<Life, ReleaseError> {
        let Some(e) = self.reference.entries.get_mut(i) else {
            return Err(ReleaseError::Unknown);
        };
        let before = e.life;
        match before {
            Life::Gone => return Err(ReleaseError::AlreadyReleased),
            Life::Granted => e.times_released += 1,
            Life::Waiting => {}
        }
        e.life = Life::Gone;
        self.admit_in_reference();
        Ok(before)
    }

    fn released_at_most_once(&self, op: Op, i: usize) -> Result<(), Divergence> {
        match self.reference.entries.get(i) {
            Some(e) if e.times_released > 1 => self.fail(op, "ticket released twice"),
            _ => Ok(()),
        }
    }

    /// Indices of the reference entries satisfying `keep`, oldest first.
    fn matching(&self, keep: impl Fn(&Entry) -> bool) -> Vec<usize> {
        let entries = self.reference.entries.iter().enumerate();
        entries.filter(|(_, e)| keep(e)).map(|(i, _)| i).collect()
    }

    fn apply(&mut self, op: Op) -> Result<(), Divergence> {
        match op {
            Op::Enqueue(bytes) => {
                let Ok(got) = self.machine.enqueue(bytes) else {
                    return self.fail(op, "ticket ids exhausted");
                };
                let charge = self.reference.charge(bytes);
                let i = self.new_entry(op, got.ticket(), charge)?;
                let admitted = self.reference.regrant();
                let now = admitted.contains(&i);
                self.reference
                    .unannounced
                    .extend(admitted.into_iter().filter(|&j| j != i));
                match (got, now) {
                    (Enqueued::Granted(g), true) => self.saw_grant(op, i, g)?,
                    (Enqueued::Waiting(_), false) => {}
                    (got, _) => {
                        return self.fail(op, &format!("got {got:?}, reference admits: {now}"));
                    }
                }
            }
            Op::TryAcquire(bytes) => {
                let got = self.machine.try_acquire(bytes);
                // The reference tries the request as a new last ticket and withdraws it if the
                // walk from the front does not reach it.
                let charge = self.reference.charge(bytes);
                self.reference.entries.push(Entry {
                    ticket: Ticket::forged(0, u64::MAX, u32::MAX),
                    charge,
                    life: Life::Waiting,
                    grant: None,
                    times_granted: 0,
                    times_released: 0,
                });
                let last = self.reference.entries.len() - 1;
                let admitted = self.reference.regrant();
                let now = admitted.contains(&last);
                self.reference
                    .unannounced
                    .extend(admitted.into_iter().filter(|&j| j != last));
                if !now {
                    self.reference.entries.pop();
                }
                match (got, now) {
                    (Some(g), true) => {
                        if let Some(e) = self.reference.entries.get_mut(last) {
                            e.ticket = g.ticket();
                        }
                        if self.last_id.is_some_and(|l| g.ticket().id() <= l) {
                            return self.fail(op, "ticket id reused or out of order");
                        }
                        self.last_id = Some(g.ticket().id());
                        self.saw_grant(op, last, g)?;
                    }
                    (None, false) => {}
                    (got, _) => {
                        return self.fail(op, &format!("got {got:?}, reference admits: {now}"));
                    }
                }
            }
            Op::Release { live, pick: v } => {
                let seen = self.matching(|e| e.grant.is_some() && (!live || e.life != Life::Gone));
                let Some(i) = pick(seen.len(), v).and_then(|k| seen.get(k).copied()) else {
                    return Ok(());
                };
                let Some(grant) = self.reference.entries.get(i).and_then(|e| e.grant) else {
                    return Ok(());
                };
                let got = self.machine.release(grant);
                let want = self.finish_in_reference(i).map(|_| ());
                if got != want {
                    return self.fail(op, &format!("release got {got:?}, expected {want:?}"));
                }
                self.released_at_most_once(op, i)?;
            }
            Op::Cancel { .. } | Op::CancelHead => {
                let candidates = match op {
                    Op::Cancel { live: true, .. } => self.matching(|e| e.life != Life::Gone),
                    Op::Cancel { live: false, .. } => self.matching(|_| true),
                    _ => self.matching(|e| e.life == Life::Waiting),
                };
                let chosen = match op {
                    Op::Cancel { pick: v, .. } => pick(candidates.len(), v),
                    _ => pick(candidates.len(), 0),
                };
                let Some(i) = chosen.and_then(|k| candidates.get(k).copied()) else {
                    return Ok(());
                };
                let Some(ticket) = self.reference.entries.get(i).map(|e| e.ticket) else {
                    return Ok(());
                };
                let got = self.machine.cancel(ticket);
                let want = self.finish_in_reference(i).map(|before| match before {
                    Life::Granted => Cancelled::Released,
                    _ => Cancelled::Withdrawn,
                });
                if got != want {
                    return self.fail(op, &format!("cancel got {got:?}, expected {want:?}"));
                }
                self.released_at_most_once(op, i)?;
            }
            Op::Forged { id, slot } => {
                let ticket = Ticket::forged(self.machine.instance_tag(), id, slot);
                let unknown = Err(ReleaseError::Unknown);
                if self.machine.state(ticket) != TicketState::Unknown {
                    return self.fail(op, "a forged ticket is not Unknown");
                }
                let got = self.machine.cancel(ticket);
                if got != unknown {
                    return self.fail(op, &format!("cancel of a forged ticket: {got:?}"));
                }
                let got = self.machine.release(Grant::forged(ticket, 0));
                if got != Err(ReleaseError::Unknown) {
                    return self.fail(op, &format!("release of a forged grant: {got:?}"));
                }
            }
            Op::Foreign(v) => {
                let live = self.matching(|e| e.life != Life::Gone);
                let Some(e) = pick(live.len(), v)
                    .and_then(|k| live.get(k))
                    .and_then(|&i| self.reference.entries.get(i))
                else {
                    return Ok(());
                };
                let other = self.machine.instance_tag().wrapping_add(1);
                let ticket = Ticket::forged(other, e.ticket.id(), e.ticket.slot());
                let before = (
                    self.machine.used(),
                    self.machine.waiting(),
                    self.machine.granted(),
                );
                if self.machine.state(ticket) != TicketState::Unknown {
                    return self.fail(op, "another limiter's ticket is not Unknown");
                }
                let got = self.machine.cancel(ticket);
                if got != Err(ReleaseError::Unknown) {
                    return self.fail(op, &format!("cancel of another limiter's ticket: {got:?}"));
                }
                let got = self.machine.release(Grant::forged(ticket, e.charge));
                if got != Err(ReleaseError::Unknown) {
                    return self.fail(op, &format!("release of another limiter's grant: {got:?}"));
                }
                let after = (
                    self.machine.used(),
                    self.machine.waiting(),
                    self.machine.granted(),
                );
                if after != before {
                    return self.fail(op, "another limiter's ticket changed the books");
                }
            }
            Op::GrantForWaiting(v) => {
                let waiting = self.matching(|e| e.life == Life::Waiting);
                let Some(e) = pick(waiting.len(), v)
                    .and_then(|k| waiting.get(k))
                    .and_then(|&i| self.reference.entries.get(i))
                else {
                    return Ok(());
                };
                let got = self.machine.release(Grant::forged(e.ticket, e.charge));
                if got != Err(ReleaseError::Unknown) {
                    return self.fail(op, &format!("release of a waiting ticket: {got:?}"));
                }
            }
            Op::PollOne => self.poll_one(op).map(|_| ())?,
            Op::Drain => while self.poll_one(op)? {},
        }
        Ok(())
    }

    /// Drains one action from both sides; `Ok(false)` when both are empty.
    fn poll_one(&mut self, op: Op) -> Result<bool, Divergence> {
        let got = self.machine.poll_action();
        let want = self.reference.next_announcement();
        match (got, want) {
            (None, None) => Ok(false),
            (Some(PendingBytesAction::Proceed(g)), Some(i)) => {
                let expected = self.reference.entries.get(i).map(|e| e.ticket);
                if expected != Some(g.ticket()) {
                    return self.fail(
                        op,
                        &format!("Proceed({:?}), expected {expected:?}", g.ticket()),
                    );
                }
                self.saw_grant(op, i, g)?;
                Ok(true)
            }
            (got, want) => {
                let want = want.and_then(|i| self.reference.entries.get(i).map(|e| e.ticket));
                self.fail(
                    op,
                    &format!("poll_action {got:?}, expected Proceed of {want:?}"),
                )
            }
        }
    }

    fn compare(&self, op: Op) -> Result<(), Divergence> {
        let m = &self.machine;
        let r = &self.reference;
        if m.limit() != r.limit {
            return self.fail(op, "limit changed");
        }
        let used = r.used();
        if u128::from(m.used()) != used {
            return self.fail(
                op,
                &format!("used {} but admitted charges sum to {used}", m.used()),
            );
        }
        if m.used() > m.limit() {
            return self.fail(op, "used above the limit");
        }
        if m.used().checked_add(m.available()) != Some(m.limit()) {
            return self.fail(op, "used + available != limit");
        }
        if m.waiting() != r.count(Life::Waiting) || m.granted() != r.count(Life::Granted) {
            return self.fail(
                op,
                &format!(
                    "machine waiting/granted {}/{}, reference {}/{}",
                    m.waiting(),
                    m.granted(),
                    r.count(Life::Waiting),
                    r.count(Life::Granted)
                ),
            );
        }
        let mut seen_waiting = false;
        for (i, e) in r.entries.iter().enumerate() {
            let state = m.state(e.ticket);
            if state != r.expected_state(i) {
                return self.fail(
                    op,
                    &format!("ticket {:?} is {state:?}, expected {:?}", e.ticket, e.life),
                );
            }
            // FIFO: no ticket is admitted while an older one still waits.
            match state {
                TicketState::Waiting => seen_waiting = true,
                TicketState::Granted if seen_waiting => {
                    return self.fail(
                        op,
                        &format!("{:?} admitted past a waiting ticket", e.ticket),
                    );
                }
                _ => {}
            }
        }
        Ok(())
    }
}

/// Decodes `data` into a limit and operations, drives the limiter and the reference, and
/// returns the first disagreement or broken invariant. Never panics.
pub fn check(data: &[u8]) -> Result<(), Divergence> {
    let mut c = Cursor::new(data);
    let limit = match c.below(6) {
        0 => 0,
        1 => u64::MAX,
        2 => c.u64(),
        3 => 1,
        _ => 1 + u64::from(c.below(64)),
    };
    let mut checker = Checker {
        machine: PendingBytesLimiter::new(
            PendingBytesConfig::default().with_max_pending_bytes(limit),
        ),
        reference: Reference {
            limit,
            entries: Vec::new(),
            unannounced: Vec::new(),
        },
        last_id: None,
        step: 0,
    };
    while !c.is_empty() {
        let Some(op) = decode(&mut c, limit) else {
            continue;
        };
        checker.apply(op)?;
        checker.compare(op)?;
        checker.step += 1;
    }
    // Liveness: cancelling every ticket, oldest first, gives every byte back.
    let ticket_count = checker.reference.entries.len();
    for i in 0..ticket_count {
        let op = Op::Cancel {
            live: false,
            pick: u16::try_from(i).unwrap_or(u16::MAX),
        };
        let Some(ticket) = checker.reference.entries.get(i).map(|e| e.ticket) else {
            break;
        };
        let got = checker.machine.cancel(ticket);
        let want = checker.finish_in_reference(i).map(|_| ());
        if got.map(|_| ()) != want {
            return checker.fail(op, &format!("final cancel got {got:?}, expected {want:?}"));
        }
        checker.compare(op)?;
        while checker.poll_one(op)? {}
    }
    let m = &checker.machine;
    if m.used() != 0 || m.waiting() != 0 || m.granted() != 0 || m.available() != limit {
        return checker.fail(Op::Drain, "bytes left over after cancelling everything");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_and_short_inputs_pass() {
        assert_eq!(check(&[]), Ok(()));
        assert_eq!(check(&[3, 0, 5, 0, 5, 4, 0, 0, 11]), Ok(()));
    }

    #[test]
    fn unassigned_selector_is_a_no_op_that_reads_one_byte() {
        let mut c = Cursor::new(&[15, 255, 10]);
        assert!(decode(&mut c, 1).is_none());
        assert!(decode(&mut c, 1).is_none());
        assert!(matches!(decode(&mut c, 1), Some(Op::PollOne)));
        assert!(c.is_empty());
    }

    #[test]
    #[cfg_attr(miri, ignore)] // slow under miri; runs in the ordinary test pass
    fn pseudo_random_inputs_pass() {
        crate::model::random_inputs_pass(check, 1, 300, 512);
    }
}
