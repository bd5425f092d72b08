//! The checks after each operation: the machine's actions against the reference's, and the
//! state compared.

use super::*;

pub(super) fn pick_credit(c: &mut Cursor<'_>, r: &Reference, tag: u32) -> CreditId {
    match c.below(8) {
        0 => CreditId::forge(tag, c.u32() % 8, u64::from(c.u8())),
        1 => CreditId::forge(tag, u32::MAX, u64::MAX),
        2 | 3 => {
            let n = r.credits.len().max(1);
            r.credits
                .get(usize::from(c.u16()) % n)
                .copied()
                .unwrap_or(CreditId::forge(tag, 0, 0))
        }
        _ => {
            let n = r.in_flight.len().max(1);
            r.in_flight
                .get(usize::from(c.u8()) % n)
                .map_or(CreditId::forge(tag, 0, 0), |x| x.0)
        }
    }
}

/// Drains the machine's actions and checks them against what the reference decided, then
/// compares the state.
pub(super) fn settle(m: &mut Machine, r: &mut Reference, flushed: bool) -> Result<(), Divergence> {
    let mut sends: Vec<(u8, CreditId, Vec<u32>)> = Vec::new();
    let mut ends: Vec<(u32, End)> = Vec::new();
    while let Some(a) = m.poll_action() {
        match a {
            BatchAction::Send {
                shard,
                credit,
                payloads,
            } => sends.push((shard.id(), credit, payloads)),
            BatchAction::Deliver { handle, position } => {
                ends.push((handle, End::Delivered(position)))
            }
            BatchAction::Fail { handle, reason } => ends.push((
                handle,
                match reason {
                    FailReason::NoResponse => End::NoResponse,
                    FailReason::BatchFailed(e) => End::BatchFailed(e),
                    FailReason::TimedOut => End::TimedOut,
                    _ => End::Closed,
                },
            )),
        }
    }
    // The actions ran out: no open batch may be left where nothing would send it.
    stranded(m)?;
    // Running out of actions flushed, if an open batch was held (the reference's flush adds
    // its sends after the others).
    if r.open.iter().any(|(_, _, parked)| !parked) {
        r.flush();
    }
    // A close fails each shard's held operations in line order: arrival order, except that
    // requeued batches come first (the reference's `close_order`).
    for shard in 0..SHARDS {
        let closed: Vec<u32> = ends
            .iter()
            .filter(|(h, e)| {
                *e == End::Closed
                    && usize::try_from(*h)
                        .ok()
                        .and_then(|i| r.shard_of.get(i))
                        .is_some_and(|s| *s == shard)
            })
            .map(|(h, _)| *h)
            .collect();
        let in_order: Vec<u32> = closed
            .iter()
            .copied()
            .filter(|h| r.close_order.contains(h))
            .collect();
        let want: Vec<u32> = r
            .close_order
            .iter()
            .copied()
            .filter(|h| in_order.contains(h))
            .collect();
        if in_order != want {
            return Err(format!(
                "shard {shard}: closed in order {closed:?}, want the line's order {want:?}"
            ));
        }
    }
    // Ends: as a set (shard order of a close is unspecified), each operation once ever.
    let mut want_ends = core::mem::take(&mut r.to_end);
    want_ends.sort_unstable();
    ends.sort_unstable();
    if ends != want_ends {
        return Err(format!("ends {ends:?}, want {want_ends:?}"));
    }
    for (h, _) in &ends {
        if r.ended.contains(h) {
            return Err(format!("operation {h} ended twice"));
        }
        r.ended.push(*h);
    }
    // Sends: per shard in order; credits fresh.
    let want_sends = core::mem::take(&mut r.to_send);
    if sends.len() != want_sends.len() {
        return Err(format!(
            "{} sends, want {}: {sends:?} vs {want_sends:?}",
            sends.len(),
            want_sends.len()
        ));
    }
    for shard in 0..SHARDS {
        let got = sends.iter().filter(|(s, _, _)| *s == shard);
        let want = want_sends.iter().filter(|(s, _)| *s == shard);
        for ((_, credit, payloads), (_, batch)) in got.zip(want) {
            let want_payloads: Vec<u32> = batch.ops.iter().map(|h| payload(*h)).collect();
            if *payloads != want_payloads {
                return Err(format!(
                    "shard {shard} sent payloads {payloads:?}, want {want_payloads:?}"
                ));
            }
            let Some(b) = m.batch(*credit) else {
                return Err(format!("sent {credit:?} has no batch"));
            };
            if b.ops() != batch.ops.as_slice()
                || b.bytes() != batch.bytes
                || b.opened_at() != batch.opened_at
            {
                return Err(format!(
                    "shard {shard} sent {:?} ({} bytes, opened {:?}), want {batch:?}",
                    b.ops(),
                    b.bytes(),
                    b.opened_at()
                ));
            }
            let deadline = r
                .timeout
                .and_then(|_| batch.ops.first())
                .and_then(|h| *r.deadline.get(usize::try_from(*h).ok()?)?);
            if b.deadline() != deadline {
                return Err(format!(
                    "shard {shard} sent {:?} with deadline {:?}, want {deadline:?}",
                    batch.ops,
                    b.deadline()
                ));
            }
            if r.credits.contains(credit) {
                return Err(format!("credit {credit:?} reused"));
            }
            let last = r
                .last_sent
                .iter()
                .find(|(s, _)| *s == shard)
                .map(|(_, h)| *h);
            let increasing = batch.ops.windows(2).all(|w| w.first() < w.get(1));
            // A requeued batch goes out again behind later operations (at-least-once): the
            // order among sends is the reference's; FIFO holds for first departures.
            let resent = batch.departed.is_some();
            if !increasing
                || (!resent
                    && batch
                        .ops
                        .first()
                        .is_some_and(|f| last.is_some_and(|l| *f <= l)))
            {
                return Err(format!(
                    "shard {shard}: {:?} sent after {last:?}: not FIFO",
                    batch.ops
                ));
            }
            if let Some(h) = batch.ops.last().filter(|_| !resent) {
                r.last_sent.retain(|(s, _)| *s != shard);
                r.last_sent.push((shard, *h));
            }
            r.credits.push(*credit);
            r.in_flight.push((*credit, shard, batch.clone()));
        }
    }
    events(m, r, &sends)?;
    compare(m, r, flushed)
}

/// With events on: one `Dispatched` per `Send` of this operation, in the same order, naming
/// the reference's shard, operation count and bytes; one `Released` per credit the reference
/// released since, in order. With events off, none.
fn events(
    m: &mut Machine,
    r: &mut Reference,
    sends: &[(u8, CreditId, Vec<u32>)],
) -> Result<(), Divergence> {
    let mut dispatched = Vec::new();
    let mut released = Vec::new();
    while let Some(e) = m.poll_event() {
        if !r.events {
            return Err(format!("event {e:?} with events off"));
        }
        match e {
            BatchEvent::Dispatched {
                shard,
                credit,
                ops,
                bytes,
            } => dispatched.push((shard.id(), credit, ops, bytes)),
            BatchEvent::Released { credit, .. } => released.push(credit),
        }
    }
    if !r.events {
        return Ok(());
    }
    let want: Vec<(u8, CreditId, usize, u64)> = sends
        .iter()
        .map(|(shard, credit, _)| {
            let batch = r.in_flight.iter().find(|x| x.0 == *credit);
            let (ops, bytes) = batch.map_or((0, 0), |x| (x.2.ops.len(), x.2.bytes));
            (*shard, *credit, ops, bytes)
        })
        .collect();
    if dispatched != want {
        return Err(format!("Dispatched events {dispatched:?}, want {want:?}"));
    }
    let want_released = r.released.get(r.released_seen..).unwrap_or_default();
    if released != want_released {
        return Err(format!(
            "Released events {released:?}, want {want_released:?}"
        ));
    }
    r.released_seen = r.released.len();
    Ok(())
}

/// A batch no input would ever send, now that the actions are drained: one still open in the
/// batcher (a flush was due), or one held back by a shard with credit to send it.
pub(super) fn stranded(m: &Machine) -> Result<(), Divergence> {
    if m.is_closed() {
        return Ok(());
    }
    if m.open_batches() != 0 {
        return Err(format!(
            "stranded: {} open batches left after the actions ran out",
            m.open_batches()
        ));
    }
    let w = m.window();
    for shard in 0..SHARDS {
        let key = Key::new(shard);
        if w.available(&key) > 0 && (w.queued(&key) > 0 || w.is_parked(&key)) && !w.is_paused(&key)
        {
            return Err(format!(
                "stranded: shard {shard} holds a batch back with credit"
            ));
        }
    }
    Ok(())
}

pub(super) fn compare(m: &Machine, r: &Reference, flushed: bool) -> Result<(), Divergence> {
    let w = m.window();
    let mut active = 0usize;
    for shard in 0..SHARDS {
        let key = Key::new(shard);
        let in_flight = r.in_flight.iter().filter(|(_, s, _)| *s == shard).count();
        let queued = r.queued.iter().filter(|(s, _)| *s == shard).count();
        let open = r.open.iter().find(|(s, _, _)| *s == shard);
        let parked = open.is_some_and(|o| o.2);
        let open_ops = open.map_or(0, |o| o.1.ops.len());
        let got = (
            w.in_flight(&key) as usize,
            w.queued(&key),
            w.is_parked(&key),
            m.open_ops(&key),
        );
        if got != (in_flight, queued, parked, open_ops) {
            return Err(format!(
                "shard {shard}: (in_flight, queued, parked, open ops) = {got:?}, want {:?}",
                (in_flight, queued, parked, open_ops)
            ));
        }
        if u64::from(w.in_flight(&key)) > r.cap
            || w.in_flight(&key).saturating_add(w.available(&key)) != w.capacity()
        {
            return Err(format!("shard {shard}: credits not conserved"));
        }
        if in_flight > 0 || queued > 0 || parked {
            active += 1;
        }
    }
    if w.shard_count() != active || w.live_credits() != r.in_flight.len() {
        return Err(format!(
            "(window shards, live credits) = {:?}, want {:?}",
            (w.shard_count(), w.live_credits()),
            (active, r.in_flight.len())
        ));
    }
    // The timer never sleeps past a held operation's deadline.
    if let Some(due) = r.earliest_held_deadline().filter(|_| r.timeout.is_some()) {
        if m.poll_timeout().is_none_or(|t| t > due) {
            return Err(format!(
                "poll_timeout {:?}, but an operation held back is due at {due:?}",
                m.poll_timeout()
            ));
        }
    }
    for shard in 0..SHARDS {
        if w.is_paused(&Key::new(shard)) != r.is_paused(shard) {
            return Err(format!("shard {shard}: paused {}", r.is_paused(shard)));
        }
    }
    // Open batches held by the batcher: the reference's unparked ones (never empty).
    let open = r.open.iter().filter(|(_, _, parked)| !parked).count();
    if m.is_draining() != r.draining || m.is_drained() != r.is_drained() {
        return Err(format!(
            "(draining, drained) = {:?}, want {:?}",
            (m.is_draining(), m.is_drained()),
            (r.draining, r.is_drained())
        ));
    }
    if m.is_closed() != r.closed || m.open_batches() != open || (flushed && m.open_batches() != 0) {
        return Err(format!(
            "closed {} (want {}), {} open batches (want {open}) after flush {flushed}",
            m.is_closed(),
            r.closed,
            m.open_batches()
        ));
    }
    Ok(())
}
