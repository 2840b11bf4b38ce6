//! The coordinators of a deployment as each sees them: who is alive, where it listens, which
//! shards it holds, so that shards are spread evenly and any coordinator can forward a call to the
//! owner of the shard it is about.
//!
//! Every coordinator writes its own record (an encoded `CoordinatorInfo`: advertised address,
//! executions in memory, lag) to the NATS KV bucket `trellis_coordinators` under its id, every
//! third of the lease TTL; the bucket's `max_age` is the TTL, so the record of a coordinator that
//! died vanishes with its leases. The lease keeper (`crate::shards`) reads the records and the
//! leases on each pass and publishes what it read as a [`View`].

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_nats::jetstream::{self, kv};
use futures::StreamExt as _;
use prost::Message as _;
use trellis_proto::v1;

/// The membership bucket.
pub(crate) const MEMBERS_BUCKET: &str = "trellis_coordinators";

/// What the executor reports of itself for the coordinator's record.
#[derive(Debug, Default)]
pub(crate) struct Stats {
    /// Executions held in memory after the last turn.
    pub(crate) executions: AtomicU64,
    /// Inputs waiting for the turn loop when the last turn started.
    pub(crate) lag: AtomicU64,
}

impl Stats {
    pub(crate) fn executions(&self) -> u64 {
        self.executions.load(Ordering::Relaxed)
    }

    pub(crate) fn lag(&self) -> u64 {
        self.lag.load(Ordering::Relaxed)
    }
}

/// The deployment as last read from NATS: the owner of each shard and every live coordinator.
#[derive(Clone, Debug, Default)]
pub(crate) struct View {
    /// The id of the coordinator holding each shard's lease (`None`: no one holds it).
    pub(crate) owners: Vec<Option<String>>,
    /// The live coordinators by id, as they last reported themselves, with their shards filled
    /// in from the leases.
    pub(crate) members: BTreeMap<String, v1::CoordinatorInfo>,
}

impl View {
    /// Returns the owner of `shard` and its advertised address, when another coordinator than
    /// `me` holds it and has said where it listens.
    pub(crate) fn other_owner(&self, shard: u32, me: &str) -> Option<(&str, &str)> {
        let owner = self.owners.get(shard as usize)?.as_deref()?;
        if owner == me {
            return None;
        }
        let member = self.members.get(owner)?;
        (!member.address.is_empty()).then_some((owner, member.address.as_str()))
    }

    /// Returns another coordinator that holds shards, for a start that may land on any shard:
    /// the one with the fewest executions in memory.
    pub(crate) fn other_with_shards(&self, me: &str) -> Option<(&str, &str)> {
        self.members
            .values()
            .filter(|m| m.coordinator_id != me && !m.shards.is_empty() && !m.address.is_empty())
            .min_by_key(|m| m.executions_in_memory)
            .map(|m| (m.coordinator_id.as_str(), m.address.as_str()))
    }

    /// Returns every other live coordinator's address.
    pub(crate) fn other_addresses(&self, me: &str) -> Vec<(String, String)> {
        self.members
            .values()
            .filter(|m| m.coordinator_id != me && !m.address.is_empty())
            .map(|m| (m.coordinator_id.clone(), m.address.clone()))
            .collect()
    }

    /// The answer of `GetCluster`.
    pub(crate) fn to_proto(&self, me: &str) -> v1::GetClusterResponse {
        v1::GetClusterResponse {
            shards: self.owners.len() as u32,
            coordinators: self.members.values().cloned().collect(),
            unowned_shards: self
                .owners
                .iter()
                .enumerate()
                .filter(|(_, owner)| owner.is_none())
                .map(|(shard, _)| shard as u32)
                .collect(),
            answered_by: me.to_owned(),
        }
    }
}

/// The shard count a coordinator may hold with `members` live coordinators: ⌈shards / members⌉.
pub(crate) fn fair_share(shards: u32, members: usize) -> usize {
    let members = members.max(1);
    (shards as usize).div_ceil(members)
}

/// Writes this coordinator's record.
pub(crate) async fn report(
    members: &kv::Store,
    info: &v1::CoordinatorInfo,
) -> Result<(), kv::PutError> {
    members
        .put(&info.coordinator_id, info.encode_to_vec().into())
        .await
        .map(|_| ())
}

/// Reads every live coordinator's record; a record that does not decode is left out (and said).
pub(crate) async fn read_members(
    members: &kv::Store,
) -> Result<BTreeMap<String, v1::CoordinatorInfo>, String> {
    let mut keys = members.keys().await.map_err(|e| e.to_string())?;
    let mut found = BTreeMap::new();
    while let Some(key) = keys.next().await {
        let key = key.map_err(|e| e.to_string())?;
        let Some(value) = members.get(&key).await.map_err(|e| e.to_string())? else {
            continue;
        };
        match v1::CoordinatorInfo::decode(value) {
            Ok(info) => {
                found.insert(key, info);
            }
            Err(err) => tracing::warn!(coordinator = %key, %err, "unreadable coordinator record"),
        }
    }
    Ok(found)
}

/// Opens (or creates) the membership bucket: one record per live coordinator, gone `ttl` after
/// its last write.
pub(crate) async fn bucket(
    js: &jetstream::Context,
    ttl: Duration,
    replicas: usize,
) -> Result<kv::Store, crate::Error> {
    Ok(trellis_bus::kv_bucket(
        js,
        MEMBERS_BUCKET,
        "live coordinators (key: id; value: an encoded CoordinatorInfo)",
        ttl,
        replicas,
    )
    .await?)
}

/// Returns `id` when it can name a KV key (letters, digits, `-`, `_`, `=`, `.`, `/`), or says why
/// not.
pub(crate) fn check_id(id: &str) -> Result<(), String> {
    if id.is_empty() {
        return Err("the coordinator id must not be empty".to_owned());
    }
    match id
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '=' | '.' | '/')))
    {
        Some(c) => Err(format!(
            "the coordinator id {id:?} holds {c:?}; use letters, digits, '-', '_', '=', '.' or '/'"
        )),
        None if id.starts_with('.') || id.ends_with('.') => Err(format!(
            "the coordinator id {id:?} must not start or end with '.'"
        )),
        None => Ok(()),
    }
}

/// A shared, cheap handle on the latest [`View`].
pub(crate) type ViewRx = tokio::sync::watch::Receiver<Arc<View>>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fair_share_rounds_up() {
        assert_eq!(fair_share(12, 3), 4);
        assert_eq!(fair_share(12, 4), 3);
        assert_eq!(fair_share(12, 5), 3);
        assert_eq!(fair_share(1, 2), 1);
        assert_eq!(fair_share(16, 0), 16);
    }

    #[test]
    fn ids_that_cannot_name_a_key_are_refused() {
        assert!(check_id("coordinator-0").is_ok());
        assert!(check_id("trellis-coordinator-1.trellis").is_ok());
        assert!(check_id("").is_err());
        assert!(check_id("a b").unwrap_err().contains("' '"));
        assert!(check_id(".a").is_err());
    }

    #[test]
    fn the_view_names_other_owners_only() {
        let member = |id: &str, address: &str, shards: Vec<u32>| v1::CoordinatorInfo {
            coordinator_id: id.to_owned(),
            address: address.to_owned(),
            shards,
            ..Default::default()
        };
        let view = View {
            owners: vec![Some("a".into()), Some("b".into()), None],
            members: BTreeMap::from([
                ("a".into(), member("a", "http://a:7400", vec![0])),
                ("b".into(), member("b", "http://b:7400", vec![1])),
            ]),
        };
        assert_eq!(view.other_owner(0, "a"), None);
        assert_eq!(view.other_owner(1, "a"), Some(("b", "http://b:7400")));
        assert_eq!(view.other_owner(2, "a"), None);
        assert_eq!(view.other_with_shards("a"), Some(("b", "http://b:7400")));
        assert_eq!(view.to_proto("a").unowned_shards, vec![2]);
    }
}
