//! Deliberate defects the session simulation (`simulation/`) must catch: one per invariant,
//! each switched on for the current thread only (`cargo test` runs tests on several threads at
//! once). The session loop, the ordered sink (`crate::sink::ordered`) and the polling cycle
//! (`crate::source::polling`) ask [`active`] at the place the defect would be; the simulation's fakes ask it for the defects of the world they
//! model. Outside test builds nothing can
//! switch one on and [`active`] is a constant `false`.

/// A defect to switch on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(not(test), allow(dead_code))]
pub(crate) enum Mutation {
    /// The ack tracker starts at LSN 0 instead of the slot's confirmed LSN: the first
    /// confirmation moves the slot backwards (the flush LSN decreases).
    TrackerStartsAtZero,
    /// Confirms the last position the source reported, not the tracker's flush LSN: passes
    /// unacknowledged events.
    ConfirmSourcePosition,
    /// Records a full queue gave back are never offered again: the session stalls and the
    /// flush LSN never reaches the last commit.
    ForgetBlocked,
    /// A record the full queue gave back is dropped and its event counted as delivered: a
    /// committed event is skipped.
    DropBlocked,
    /// Reading goes on while records wait for room in the sink's queue, and they are offered
    /// again newest first: later events of a key overtake earlier ones.
    Overtake,
    /// Reading is gated on the in-flight counts only, not on the ack tracker's queue.
    NoTrackerBound,
    /// The drain at shutdown waits for every outcome, without its deadline.
    DrainForever,
    /// Exactly-once: the session ignores the checkpoint read back at its start.
    IgnoreCheckpoint,
    /// The transaction coordinator writes no abort markers: `read_committed` consumers see
    /// aborted records.
    NoAbortMarkers,
    /// The transaction coordinator does not fence an older producer epoch: a commit request
    /// that arrives after the next producer's registration commits an aborted transaction.
    NoFencing,
    /// The fake broker reports records acknowledged that it never wrote (a fake that confirms
    /// early).
    AckUnwritten,
    /// Exactly-once: a batch of several PostgreSQL transactions is committed with the first
    /// one's end LSN as its checkpoint, not the last one's: a redo after a crash publishes the
    /// later ones again.
    CheckpointFirstTransaction,
    /// The ordered sink publishes a key's record without waiting for the acknowledgement of
    /// the one before it: a later record of the key may arrive first.
    OrderedKeyConcurrently,
    /// The ordered sink does not hold a key after a failure: the key's next records go out
    /// before the failed one is published again.
    OrderedNoHold,
    /// The ordered sink publishes a record once more after the server acknowledged it.
    OrderedRepublishAcknowledged,
    /// The polling cycle marks every row it published as published, whatever its outcome.
    PollingMarkUnacknowledged,
    /// The polling cycle charges an attempt to rows that failed without being tried (an
    /// earlier record of their key failed).
    PollingChargeUntried,
    /// The polling cycle makes a row FAILED at its first retryable failure.
    PollingFailAtOnce,
    /// The polling cycle's marks and COMMIT have no deadline after a shutdown.
    PollingFinishForever,
    /// The polling cycle publishes a row without waiting for the earlier rows of its
    /// aggregate (ignores their count).
    PollingIgnoreOlder,
    /// After a retryable failure without retry bookkeeping (`mark = "flag"` or `"delete"`)
    /// the poller never polls again: its rows stay pending.
    PollingNoRetry,
    /// The polling cycle asks for more rows than `batch_size`.
    PollingUnboundedBatch,
    /// The fake table's SELECT also returns rows already marked published (a pending
    /// condition lost from the SQL).
    PollingSelectMarked,
}

#[cfg(test)]
thread_local! {
    static ACTIVE: std::cell::Cell<Option<Mutation>> = const { std::cell::Cell::new(None) };
}

/// Whether `mutation` is switched on for this thread.
#[cfg(test)]
pub(crate) fn active(mutation: Mutation) -> bool {
    ACTIVE.with(|active| active.get() == Some(mutation))
}

/// Whether `mutation` is switched on: never, outside tests.
#[cfg(not(test))]
pub(crate) const fn active(_: Mutation) -> bool {
    false
}

/// Switches `mutation` on for this thread until the guard is dropped.
#[cfg(test)]
pub(crate) fn switch_on(mutation: Mutation) -> Guard {
    ACTIVE.with(|active| active.set(Some(mutation)));
    Guard
}

/// Switches the mutation off when dropped.
#[cfg(test)]
pub(crate) struct Guard;

#[cfg(test)]
impl Drop for Guard {
    fn drop(&mut self) {
        ACTIVE.with(|active| active.set(None));
    }
}
