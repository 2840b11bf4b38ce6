//! Shards and their leases (docs/design.md §9), as kept in NATS.
//!
//! Executions are spread over `S` shards by a hash of their id. A coordinator owns a shard while
//! it holds the shard's lease: a key in the NATS KV bucket `trellis_leases` whose value is the
//! coordinator's id, renewed by compare-and-set on its revision every third of the lease TTL. The
//! bucket's `max_age` is the TTL, so the key of a coordinator that died vanishes on its own and
//! another's `create` then succeeds. A coordinator restarted with the same id finds its own name
//! on the key and takes the lease back at once, without waiting for the TTL.
//!
//! The lease alone is not what keeps two coordinators from both writing an execution's log: every
//! append names the stream sequence it expects to follow (`Nats-Expected-Last-Subject-Sequence`),
//! so a coordinator that lost its shard without noticing has its next append refused.
//!
//! The bucket `trellis_executions` indexes unfinished executions per shard (`<shard>.<id>`), so a
//! coordinator taking a shard over knows what to recover without scanning the event stream.
//!
//! Shards are spread evenly: with `S` shards and `N` live coordinators (the records of
//! `crate::cluster`), each holds at most ⌈S/N⌉. A coordinator below its share takes free shards;
//! one above it hands the surplus over gracefully when another coordinator is below its share:
//! its executor drops the shard after a turn whose appends are all stored, checkpoints what is
//! behind, and only then is the lease deleted, so the next owner recovers a log no one extends
//! any more. When a coordinator dies, its leases and its record lapse together after the TTL and
//! the others take its shards up to their new share.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_nats::jetstream::{self, kv};
use bytes::Bytes;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use trellis_core::ids::ExecutionId;

use crate::cluster::{self, Stats, View};
use crate::executor::Inbound;

/// The lease bucket.
pub(crate) const LEASES_BUCKET: &str = "trellis_leases";
/// The index of unfinished executions.
pub(crate) const INDEX_BUCKET: &str = "trellis_executions";

/// What the lease keeper tells the engine.
#[derive(Debug)]
pub(crate) enum LeaseEvent {
    /// This coordinator now owns the shard: recover its executions, then consume its results.
    Acquired(u32),
    /// The lease is gone (taken over, or not renewed in time): stop touching the shard.
    Lost(u32),
}

/// Opens (or creates, with `replicas` copies) the two buckets.
pub(crate) async fn buckets(
    js: &jetstream::Context,
    lease_ttl: Duration,
    replicas: usize,
) -> Result<(kv::Store, kv::Store), crate::Error> {
    let leases = trellis_bus::kv_bucket(
        js,
        LEASES_BUCKET,
        "coordinator shard leases (value: the owner's id)",
        lease_ttl,
        replicas,
    )
    .await?;
    let index = trellis_bus::kv_bucket(
        js,
        INDEX_BUCKET,
        "unfinished executions per shard (key: <shard>.<execution id>)",
        Duration::ZERO,
        replicas,
    )
    .await?;
    Ok((leases, index))
}

/// Queues the deletion of an index key on the NATS connection, as `kv::Store::delete` would
/// send it, and returns the future of its acknowledgement without waiting for it.
pub(crate) async fn queue_delete(
    js: &jetstream::Context,
    key: &str,
) -> Result<jetstream::context::PublishAckFuture, jetstream::context::PublishError> {
    let mut headers = async_nats::HeaderMap::new();
    headers.insert("KV-Operation", "DEL");
    js.publish_with_headers(format!("$KV.{INDEX_BUCKET}.{key}"), headers, Bytes::new())
        .await
}

/// Lists the unfinished executions of a shard from the index.
pub(crate) async fn indexed(index: &kv::Store, shard: u32) -> Result<Vec<ExecutionId>, String> {
    let mut by_shard = indexed_in(index, &[shard]).await?;
    Ok(by_shard.remove(&shard).unwrap_or_default())
}

/// Lists the unfinished executions of several shards from the index, in one pass over it.
pub(crate) async fn indexed_in(
    index: &kv::Store,
    shards: &[u32],
) -> Result<HashMap<u32, Vec<ExecutionId>>, String> {
    use futures::StreamExt;
    let mut keys = index.keys().await.map_err(|e| e.to_string())?;
    let mut by_shard: HashMap<u32, Vec<ExecutionId>> =
        shards.iter().map(|shard| (*shard, Vec::new())).collect();
    while let Some(key) = keys.next().await {
        let key = key.map_err(|e| e.to_string())?;
        let Some((shard, id)) = key.split_once('.') else {
            continue;
        };
        if let (Ok(shard), Ok(id)) = (shard.parse::<u32>(), id.parse())
            && let Some(ids) = by_shard.get_mut(&shard)
        {
            ids.push(id);
        }
    }
    Ok(by_shard)
}

/// What the lease keeper needs.
pub(crate) struct Keeper {
    pub(crate) leases: kv::Store,
    pub(crate) members: kv::Store,
    pub(crate) me: String,
    /// Where this coordinator listens for forwarded calls.
    pub(crate) address: String,
    pub(crate) shards: u32,
    pub(crate) ttl: Duration,
    pub(crate) tx: mpsc::Sender<Inbound>,
    pub(crate) stats: Arc<Stats>,
    pub(crate) view: tokio::sync::watch::Sender<Arc<View>>,
    pub(crate) started_at_ms: u64,
}

/// A lease this coordinator holds: the revision of its last write and when it was written.
#[derive(Clone, Copy, Debug)]
struct Held {
    revision: u64,
    renewed: Instant,
}

impl Keeper {
    /// Keeps this coordinator's record and its fair share of leases until `shutdown`, then
    /// releases them so the others take over without waiting for the TTL.
    pub(crate) async fn run(
        self,
        first_pass: tokio::sync::oneshot::Sender<()>,
        shutdown: CancellationToken,
    ) {
        let mut first_pass = Some(first_pass);
        let every = (self.ttl / 3).max(Duration::from_millis(50));
        let mut held: BTreeMap<u32, Held> = BTreeMap::new();
        loop {
            // Only the first pass takes back leases that carry this coordinator's id: later, such
            // a lease is one being handed over (its deletion may still be on its way).
            let reclaim = first_pass.is_some();
            if !self.pass(&mut held, reclaim).await {
                return;
            }
            if let Some(done) = first_pass.take() {
                let _ = done.send(());
            }
            tokio::select! {
                () = shutdown.cancelled() => break,
                () = tokio::time::sleep(every) => {}
            }
        }
        for (shard, lease) in held {
            let _ = self
                .leases
                .delete_expect_revision(lease_key(shard), Some(lease.revision))
                .await;
            tracing::info!(shard, "shard lease released");
        }
        let _ = self.members.delete(&self.me).await;
    }

    /// One pass: report, renew, read the others, then take or hand over shards towards the fair
    /// share. Returns false once the executor is gone.
    async fn pass(&self, held: &mut BTreeMap<u32, Held>, reclaim: bool) -> bool {
        let info = trellis_proto::v1::CoordinatorInfo {
            coordinator_id: self.me.clone(),
            address: self.address.clone(),
            shards: held.keys().copied().collect(),
            executions_in_memory: self.stats.executions(),
            lag: self.stats.lag(),
            reported_at_unix_ms: crate::executor::now_ms() as i64,
            started_at_unix_ms: self.started_at_ms as i64,
        };
        if let Err(err) = cluster::report(&self.members, &info).await {
            tracing::warn!(%err, "cannot write this coordinator's record");
        }
        let value = Bytes::from(self.me.clone());
        // Renew what is held; read who holds the rest.
        let mut owners: Vec<Option<String>> = vec![None; self.shards as usize];
        for shard in 0..self.shards {
            let key = lease_key(shard);
            if let Some(lease) = held.get(&shard).copied() {
                match self
                    .leases
                    .update(&key, value.clone(), lease.revision)
                    .await
                {
                    Ok(revision) => {
                        held.insert(
                            shard,
                            Held {
                                revision,
                                renewed: Instant::now(),
                            },
                        );
                        owners[shard as usize] = Some(self.me.clone());
                    }
                    Err(err) => {
                        let taken = err.kind() == kv::UpdateErrorKind::WrongLastRevision;
                        // Not renewed within the TTL: someone else may hold it by now.
                        if taken || lease.renewed.elapsed() >= self.ttl {
                            tracing::warn!(shard, %err, "shard lease lost");
                            held.remove(&shard);
                            if !self.tell(LeaseEvent::Lost(shard)).await {
                                return false;
                            }
                        } else {
                            tracing::warn!(shard, %err, "shard lease not renewed; retrying");
                            owners[shard as usize] = Some(self.me.clone());
                        }
                    }
                }
                continue;
            }
            match self.leases.entry(&key).await {
                Ok(Some(entry)) if entry.operation == kv::Operation::Put => {
                    let owner = String::from_utf8_lossy(&entry.value).into_owned();
                    if owner == self.me && reclaim {
                        // Our own lease, from before a restart under the same id: taken back at
                        // once (a surplus is handed over on a later pass).
                        if let Ok(revision) = self
                            .leases
                            .update(&key, value.clone(), entry.revision)
                            .await
                            && !self.acquired(held, shard, revision).await
                        {
                            return false;
                        }
                        owners[shard as usize] = Some(self.me.clone());
                    } else {
                        owners[shard as usize] = Some(owner);
                    }
                }
                Ok(_) => {}
                Err(err) => tracing::debug!(shard, %err, "cannot read shard lease"),
            }
        }
        let mut members = match cluster::read_members(&self.members).await {
            Ok(members) => members,
            Err(err) => {
                tracing::debug!(%err, "cannot read the coordinators' records");
                BTreeMap::from([(self.me.clone(), info.clone())])
            }
        };
        members.entry(self.me.clone()).or_insert(info);
        let share = cluster::fair_share(self.shards, members.len());
        // Take free shards up to the share, starting at a place of our own so coordinators that
        // start together do not all race for shard 0.
        let start = trellis_proto::subjects::shard_of(&self.me, self.shards);
        for offset in 0..self.shards {
            if held.len() >= share {
                break;
            }
            let shard = (start + offset) % self.shards;
            if owners[shard as usize].is_some() {
                continue;
            }
            if let Ok(revision) = self.leases.create(lease_key(shard), value.clone()).await {
                if !self.acquired(held, shard, revision).await {
                    return false;
                }
                owners[shard as usize] = Some(self.me.clone());
            }
        }
        // Hand the surplus over when another live coordinator is below its share (and can take
        // it); the highest shards first.
        let count = |owner: &str| owners.iter().flatten().filter(|o| *o == owner).count();
        let wanting = members
            .keys()
            .filter(|id| **id != self.me)
            .any(|id| count(id) < share);
        if held.len() > share && wanting {
            let surplus: Vec<u32> = held
                .keys()
                .rev()
                .take(held.len() - share)
                .copied()
                .collect();
            for shard in surplus {
                if let Some(lease) = held.remove(&shard) {
                    owners[shard as usize] = None;
                    self.hand_over(shard, lease.revision);
                }
            }
        }
        for member in members.values_mut() {
            member.shards = owners
                .iter()
                .enumerate()
                .filter(|(_, owner)| owner.as_deref() == Some(member.coordinator_id.as_str()))
                .map(|(shard, _)| shard as u32)
                .collect();
        }
        self.view.send_replace(Arc::new(View { owners, members }));
        true
    }

    /// Records a lease acquired and tells the executor; false once the executor is gone.
    async fn acquired(&self, held: &mut BTreeMap<u32, Held>, shard: u32, revision: u64) -> bool {
        tracing::info!(shard, coordinator = %self.me, "shard lease acquired");
        held.insert(
            shard,
            Held {
                revision,
                renewed: Instant::now(),
            },
        );
        self.tell(LeaseEvent::Acquired(shard)).await
    }

    async fn tell(&self, event: LeaseEvent) -> bool {
        self.tx.send(Inbound::Lease(event)).await.is_ok()
    }

    /// Hands a shard over: the executor drops it (checkpointing what is behind), then the lease
    /// is deleted, so the next owner recovers a log this coordinator no longer extends. Runs
    /// beside the keeper, which meanwhile renews the other leases.
    fn hand_over(&self, shard: u32, revision: u64) {
        let tx = self.tx.clone();
        let leases = self.leases.clone();
        tokio::spawn(async move {
            let (done, dropped) = tokio::sync::oneshot::channel();
            if tx.send(Inbound::Release { shard, done }).await.is_err() {
                return;
            }
            if dropped.await.is_err() {
                // The executor stopped: its leases lapse on their own.
                return;
            }
            match leases
                .delete_expect_revision(lease_key(shard), Some(revision))
                .await
            {
                Ok(()) => tracing::info!(shard, "shard handed over; lease released"),
                Err(err) => {
                    tracing::warn!(shard, %err, "handed-over shard's lease not deleted; it lapses")
                }
            }
        });
    }
}

/// The lease key of a shard.
fn lease_key(shard: u32) -> String {
    format!("shard-{shard}")
}
