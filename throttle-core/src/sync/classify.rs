//! [`WriteClassifier`]: how a write response is sorted into what the paced writer decides on.

use crate::paced_writer::WriteOutcome;

/// Sorts the server's answer for one batch into a [`WriteOutcome`]: written (with the KV
/// pressure it piggybacks, `Signal::Clear` if none), rejected by disk protection, rejected by
/// storage backpressure, another retriable error, or a fatal one.
///
/// The user's side of [`WriteDriver`](super::WriteDriver); any `Fn(&Resp) -> WriteOutcome`
/// closure is one. It is called once per batch answer, with no lock held, in the task that
/// awaited the send; a classifier that panics fails that batch with
/// [`Panicked`](super::Panicked) (its records' futures resolve to
/// [`WriteError::Panicked`](super::WriteError::Panicked)) and the driver keeps serving.
///
/// ```
/// use throttle_sansio::paced_writer::WriteOutcome;
/// use throttle_sansio::sync::WriteClassifier;
/// use throttle_sansio::Signal;
///
/// /// The wire's answer: an error code and the piggybacked pressure.
/// struct Answer { code: u16, pressure: f32 }
///
/// let classify = |a: &Answer| match a.code {
///     0 => WriteOutcome::Ok { pressure: Signal::from_f32(a.pressure) },
///     1 => WriteOutcome::DiskWriteLocked,
///     2 => WriteOutcome::StorageBackpressure,
///     3..=99 => WriteOutcome::Retriable,
///     _ => WriteOutcome::Fatal,
/// };
/// assert_eq!(classify.classify(&Answer { code: 1, pressure: 0.0 }), WriteOutcome::DiskWriteLocked);
/// ```
pub trait WriteClassifier<Resp>: Send + Sync + 'static {
    /// The outcome of one batch whose server answer is `response`.
    fn classify(&self, response: &Resp) -> WriteOutcome;
}

impl<Resp, F> WriteClassifier<Resp> for F
where
    F: Fn(&Resp) -> WriteOutcome + Send + Sync + 'static,
{
    fn classify(&self, response: &Resp) -> WriteOutcome {
        self(response)
    }
}
