//! The operations of a run, each on the window and the reference, and the state compared.

use super::*;

pub(super) fn submit<W: Subject>(
    w: &mut W,
    r: &mut Reference,
    shard: u8,
    batch: u32,
    park: bool,
) -> Result<(), Divergence> {
    let got = if park {
        w.submit_or_park(Key::new(shard), batch)
    } else {
        w.submit(Key::new(shard), batch)
    };
    let what = if park { "submit_or_park" } else { "submit" };
    expect_submit(r, shard, batch, park, what, got)
}

/// Checks what a submit of `batch` returned against the reference, and applies it there.
pub(super) fn expect_submit(
    r: &mut Reference,
    shard: u8,
    batch: u32,
    park: bool,
    what: &str,
    got: Result<Option<crate::dispatch_window::Dispatch<Key, u32>>, SubmitError<u32>>,
) -> Result<(), Divergence> {
    if r.closed {
        r.set_fate(batch, Fate::Refused)?;
        return match got {
            Err(SubmitError::Closed(b)) if b == batch => Ok(()),
            other => Err(format!(
                "{what} after close = {other:?}, want Closed({batch})"
            )),
        };
    }
    if park && r.parked_of(shard).is_some() {
        r.set_fate(batch, Fate::Refused)?;
        return match got {
            Err(SubmitError::AlreadyParked(b)) if b == batch => Ok(()),
            other => Err(format!(
                "{what} over a parked batch = {other:?}, want AlreadyParked"
            )),
        };
    }
    if r.has_credit(shard) {
        if r.ids_left == 0 {
            // Ids never wrap: the batch is refused, and the window stays open for releases.
            r.set_fate(batch, Fate::Refused)?;
            return match got {
                Err(SubmitError::Exhausted(b)) if b == batch => Ok(()),
                other => Err(format!(
                    "{what} with no ids left = {other:?}, want Exhausted"
                )),
            };
        }
        return match got {
            Ok(Some(d)) if d.shard.id() == shard && d.batch == batch => {
                r.issued(d.credit, shard, batch)?;
                r.set_fate(batch, Fate::Dispatched)
            }
            other => Err(format!(
                "{what}({shard}, {batch}) with credit = {other:?}, want a dispatch"
            )),
        };
    }
    if got != Ok(None) {
        return Err(format!(
            "{what}({shard}, {batch}) when exhausted = {got:?}, want Ok(None)"
        ));
    }
    if park {
        r.parked.push((shard, batch));
    } else {
        r.queued.push((shard, batch));
    }
    Ok(())
}

/// `enqueue`: as a full `submit`, and a queued batch's ticket is recorded.
pub(super) fn enqueue<W: Subject>(
    w: &mut W,
    r: &mut Reference,
    shard: u8,
    batch: u32,
) -> Result<(), Divergence> {
    let (got, ticket) = match w.enqueue(Key::new(shard), batch) {
        Ok(Submitted::Sent(d)) => (Ok(Some(d)), None),
        Ok(Submitted::Queued(t)) => (Ok(None), Some(t)),
        Err(e) => (Err(e), None),
    };
    expect_submit(r, shard, batch, false, "enqueue", got)?;
    let Some(ticket) = ticket else {
        return Ok(());
    };
    if r.tickets.iter().any(|(t, _, _)| *t == ticket) {
        return Err(format!("ticket {ticket:?} reused"));
    }
    if !w.is_queued(ticket) {
        return Err(format!("fresh ticket {ticket:?} is not queued"));
    }
    r.tickets.push((ticket, batch, None));
    Ok(())
}

/// `cancel`: a ticket still queued withdraws its batch; any other is refused unchanged. An
/// `enqueue` ticket (`requeued` is `None`) is live while its batch waits, never having left;
/// a `requeue` ticket while its batch waits requeued under that `seq`.
pub(super) fn cancel<W: Subject>(
    w: &mut W,
    r: &mut Reference,
    ticket: Ticket,
    batch: u32,
    requeued: Option<u64>,
) -> Result<(), Divergence> {
    let got = w.cancel(ticket);
    let at = match requeued {
        None => r
            .queued
            .iter()
            .position(|(_, b)| *b == batch)
            .map(HeldAt::Queued),
        Some(seq) => r
            .requeued
            .iter()
            .position(|x| x.1 == batch && x.2 == seq)
            .map(HeldAt::Requeued),
    };
    match at {
        Some(at) => {
            r.take_held(at);
            r.set_fate(batch, Fate::Withdrawn)?;
            match got {
                Ok(b) if b == batch => {}
                other => return Err(format!("cancel({ticket:?}) = {other:?}, want Ok({batch})")),
            }
        }
        None => match got {
            Err(ReleaseError::AlreadyReleased) => {}
            other => {
                return Err(format!(
                    "cancel of a finished {ticket:?} = {other:?}, want AlreadyReleased"
                ));
            }
        },
    }
    if w.is_queued(ticket) {
        return Err(format!("{ticket:?} still queued after cancel"));
    }
    Ok(())
}

/// A release of `credit` (live, released or never issued) is checked against the reference;
/// a live one marks it released and returns its shard.
pub(super) fn release_of(
    r: &mut Reference,
    credit: CreditId,
    refused: Option<ReleaseError>,
    what: &str,
) -> Result<Option<u8>, Divergence> {
    let Some(entry) = r.credits.iter_mut().find(|x| x.id == credit) else {
        return match refused {
            Some(_) => Ok(None),
            None => Err(format!("{what} of never-issued {credit:?} went through")),
        };
    };
    if !entry.live {
        return match refused {
            Some(ReleaseError::AlreadyReleased) => Ok(None),
            other => Err(format!(
                "{what} of released {credit:?}: refusal {other:?}, want AlreadyReleased"
            )),
        };
    }
    if let Some(e) = refused {
        return Err(format!("{what} of live {credit:?} refused: {e:?}"));
    }
    entry.live = false;
    Ok(Some(entry.shard))
}

pub(super) fn complete<W: Subject>(
    w: &mut W,
    r: &mut Reference,
    credit: CreditId,
) -> Result<(), Divergence> {
    let got = w.complete(credit);
    let refused = got.as_ref().err().copied();
    let Some(shard) = release_of(r, credit, refused, "release")? else {
        return Ok(());
    };
    r.hand_on(shard, got.ok().flatten(), "release")
}

/// `requeue` of the batch that left under `credit` (multi-shard window only): the credit is
/// released and the batch goes back to its shard, before every batch that never left and
/// after those requeued before it that left before it; then the freed credit is handed on as
/// by `complete` (the requeued batch itself, if it is now the oldest), unless the shard is
/// paused. After `close` the batch is handed back instead (the caller fails it).
pub(super) fn requeue<W: Subject>(
    w: &mut W,
    r: &mut Reference,
    credit: Issued,
) -> Result<(), Divergence> {
    let Some(got) = w.requeue(credit.id, Key::new(credit.shard), credit.batch) else {
        return Ok(());
    };
    let refused = got.as_ref().err().copied();
    let Some(shard) = release_of(r, credit.id, refused, "requeue")? else {
        return Ok(());
    };
    let Ok((back, next)) = got else {
        return Err(format!("requeue of live {credit:?} refused"));
    };
    let batch = credit.batch;
    r.came_back(batch)?;
    if r.hard_closed() {
        r.set_fate(batch, Fate::Failed)?;
        return match (back, next) {
            (Err(SubmitError::Closed(b)), None) if b == batch => Ok(()),
            other => Err(format!(
                "requeue of {batch} after close = {other:?}, want (Closed({batch}), None)"
            )),
        };
    }
    let ticket = match back {
        Ok(t) => t,
        Err(e) => return Err(format!("requeue of {batch} = {e:?}, want a ticket")),
    };
    if r.tickets.iter().any(|(t, _, _)| *t == ticket) {
        return Err(format!("ticket {ticket:?} reused"));
    }
    r.requeued.push((shard, batch, credit.seq));
    r.tickets.push((ticket, batch, Some(credit.seq)));
    r.hand_on(shard, next, "requeue")?;
    let waiting = r.requeued.iter().any(|x| x.1 == batch && x.2 == credit.seq);
    if w.is_queued(ticket) != waiting {
        return Err(format!(
            "requeue ticket {ticket:?}: is_queued {}, want {waiting}",
            w.is_queued(ticket)
        ));
    }
    Ok(())
}

/// `resume(shard)`: a paused shard's held-back batches leave, oldest first (requeued in the
/// order they first left, then queued, then parked), as many as it has free credits and ids
/// left; any other shard's resume sends nothing.
pub(super) fn resume<W: Subject>(
    w: &mut W,
    r: &mut Reference,
    now: Instant,
    shard: u8,
) -> Result<(), Divergence> {
    let got = w.resume(now, &Key::new(shard));
    let mut want = Vec::new();
    if let Some(i) = r.paused.iter().position(|&s| s == shard) {
        r.paused.remove(i);
        want = r.take_free(shard);
    }
    r.sent(shard, got, want, "resume")?;
    // `compare` checks `is_paused` next (a query here would run user `Hash` under the arm).
    Ok(())
}

/// `set_max_in_flight(shard, limit)`: the shard's capacity becomes `limit` (`None`: the
/// configured one); if it now has free credits and is not paused, its held-back batches leave
/// oldest first (requeued in the order they first left, then queued, then parked), as many as
/// it has free credits and ids left. Nothing is revoked; nothing changes after `close`.
pub(super) fn set_limit<W: Subject>(
    w: &mut W,
    r: &mut Reference,
    shard: u8,
    limit: Option<NonZeroUsize>,
) -> Result<(), Divergence> {
    let got = w.set_limit(&Key::new(shard), limit);
    let mut want = Vec::new();
    if !r.hard_closed() {
        r.limits.retain(|(s, _)| *s != shard);
        if let Some(n) = limit {
            r.limits
                .push((shard, u32::try_from(n.get()).unwrap_or(u32::MAX)));
        }
        if !r.is_paused(shard) {
            want = r.take_free(shard);
        }
    }
    r.sent(shard, got, want, "set_max_in_flight")
}

/// `close`: every held-back batch is returned, per shard in line order (requeued ones in
/// the order they first left, then queued, then parked); every pause ends.
pub(super) fn close<W: Subject>(w: &mut W, r: &mut Reference) -> Result<(), Divergence> {
    let got: Vec<(u8, u32)> = w.close();
    r.closed = true;
    r.draining = false;
    let want_len = r.requeued.len() + r.queued.len() + r.parked.len();
    if got.len() != want_len {
        return Err(format!(
            "close returned {got:?}, want {want_len} batches: requeued {:?}, queued {:?}, \
             parked {:?} (any shard order)",
            r.requeued, r.queued, r.parked
        ));
    }
    let mut failed = Vec::new();
    for shard in 0..W::SHARDS {
        let g: Vec<u32> = got
            .iter()
            .filter(|(s, _)| *s == shard)
            .map(|(_, b)| *b)
            .collect();
        let x = r.line_of(shard);
        if g != x {
            return Err(format!(
                "close for shard {shard} returned {g:?}, want {x:?}"
            ));
        }
        failed.extend(x);
    }
    r.requeued.clear();
    r.queued.clear();
    r.parked.clear();
    r.paused.clear();
    // A closed window sends nothing: its limits end with its pauses.
    r.limits.clear();
    for b in failed {
        r.set_fate(b, Fate::Failed)?;
    }
    Ok(())
}

/// After `handle_timeout(now)` the next deadline is later than `now` (or the end of time).
pub(super) fn maintenance_is_not_overdue<W: Subject>(
    w: &W,
    now: Instant,
) -> Result<(), Divergence> {
    match w.poll_timeout() {
        Some(t) if t <= now && t != Instant::MAX => Err(format!(
            "maintenance still due at {t:?} after handle_timeout({now:?})"
        )),
        _ => Ok(()),
    }
}

pub(super) fn compare<W: Subject>(w: &W, r: &Reference) -> Result<(), Divergence> {
    let mut active = 0usize;
    for shard in 0..W::SHARDS {
        let key = Key::new(shard);
        let in_flight = r.in_flight(shard);
        // The machine's line holds requeued and never-sent batches alike.
        let queued = r.queued.iter().filter(|(s, _)| *s == shard).count()
            + r.requeued.iter().filter(|x| x.0 == shard).count();
        let parked = r.parked_of(shard);
        let paused = r.is_paused(shard);
        let got = (
            w.in_flight(&key),
            w.queued(&key),
            w.parked(&key),
            w.is_paused(&key),
        );
        if got != (in_flight, queued, parked, paused) {
            return Err(format!(
                "shard {shard}: (in_flight, queued, parked, paused) = {got:?}, want {:?}",
                (in_flight, queued, parked, paused)
            ));
        }
        if !paused
            && r.ids_left > 0
            && w.available(&key) > 0
            && (w.queued(&key) > 0 || w.parked(&key).is_some())
        {
            return Err(format!(
                "shard {shard}: not paused, {} credits free, yet holds batches back",
                w.available(&key)
            ));
        }
        // Credits conserved, floored at 0: after a shrink below `in_flight`, none is free.
        let cap = r.cap_of(shard);
        let want = (cap, cap.saturating_sub(in_flight));
        if (w.capacity_of(&key), w.available(&key)) != want {
            return Err(format!(
                "shard {shard}: (capacity_of, available) = {:?}, want {want:?} with {in_flight} \
                 in flight",
                (w.capacity_of(&key), w.available(&key)),
            ));
        }
        if r.limits.is_empty() && w.capacity_of(&key) != w.capacity() {
            return Err(format!(
                "shard {shard}: capacity_of {} without a limit of its own, capacity {}",
                w.capacity_of(&key),
                w.capacity()
            ));
        }
        if in_flight > 0 || queued > 0 || parked.is_some() {
            active += 1;
        }
    }
    let live = r.live().len();
    if w.tracked_shards() < active {
        return Err(format!(
            "{} map entries for {active} active shards",
            w.tracked_shards()
        ));
    }
    let drained = r.closed && active == 0;
    let got = (
        w.shard_count(),
        w.live_credits(),
        w.is_closed(),
        w.is_draining(),
        w.is_drained(),
    );
    let want = (active, live, r.closed, r.draining, drained);
    if got != want {
        return Err(format!(
            "(shards, live credits, closed, draining, drained) = {got:?}, want {want:?}"
        ));
    }
    Ok(())
}
