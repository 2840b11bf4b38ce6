//! Any coordinator answers any call: a call about a shard another coordinator holds is forwarded
//! to it over gRPC, at the address it advertises in its record (`crate::cluster`).
//!
//! gRPC rather than NATS request–reply: the call is already a gRPC call, so forwarding it keeps
//! its streaming (`ObserveExecution`), its deadlines, its status codes and the TLS and tokens the
//! deployment already has, with no second encoding of every message. The caller's
//! `authorization` goes along, so the owner checks the caller's namespace itself, and so does the
//! trace context. A forwarded call carries `x-trellis-forwarded` and is never forwarded again:
//! while a shard moves, the coordinator the caller reached retries (see [`Router::patience`]).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tonic::metadata::{MetadataMap, MetadataValue};
use tonic::{Request, Status};
use trellis_grpc::{AuthChannel, ClientSecurity};
use trellis_proto::v1::coordinator_client::CoordinatorClient;

use crate::cluster::{View, ViewRx};

/// Metadata of a forwarded call: the id of the coordinator that forwarded it.
pub(crate) const FORWARDED: &str = "x-trellis-forwarded";
/// Metadata of an UNAVAILABLE status meaning "not this coordinator's shard": the shard.
pub(crate) const NOT_OWNED: &str = "x-trellis-not-owned";

/// Largest message a forwarded call carries (a compiled plan, a graph of 100,000 instances).
const MAX_MESSAGE_BYTES: usize = crate::MAX_MESSAGE_BYTES;

/// A client of another coordinator.
pub(crate) type Client = CoordinatorClient<AuthChannel>;

/// Where a call goes.
pub(crate) enum Route {
    /// Answered here: this coordinator holds the shard, or no one does at the moment.
    Local,
    /// Forwarded to the coordinator holding the shard (boxed: a client is large, and most
    /// calls are answered here).
    Remote { id: String, client: Box<Client> },
}

/// Decides where calls go and keeps a client per other coordinator.
pub(crate) struct Router {
    me: String,
    shards: u32,
    view: ViewRx,
    security: ClientSecurity,
    clients: Mutex<HashMap<String, Client>>,
    patience: Duration,
}

impl Router {
    pub(crate) fn new(
        me: String,
        shards: u32,
        view: ViewRx,
        security: ClientSecurity,
        lease_ttl: Duration,
    ) -> Self {
        Self {
            me,
            shards: shards.max(1),
            view,
            security,
            clients: Mutex::new(HashMap::new()),
            // A shard whose owner died is taken over once its lease lapses and it is recovered.
            patience: (lease_ttl * 4).max(Duration::from_secs(2)),
        }
    }

    /// This coordinator's id.
    pub(crate) fn me(&self) -> &str {
        &self.me
    }

    /// The number of shards.
    pub(crate) fn shards(&self) -> u32 {
        self.shards
    }

    /// How long a call keeps being retried while the shard it needs moves between coordinators
    /// (handed over, or taken from one that died).
    pub(crate) fn patience(&self) -> Duration {
        self.patience
    }

    /// The deployment as last read.
    pub(crate) fn view(&self) -> Arc<View> {
        self.view.borrow().clone()
    }

    /// Where a call about `shard` goes now; `None`: a start that may land on any shard.
    pub(crate) fn route(&self, shard: Option<u32>) -> Route {
        let view = self.view();
        let target = match shard {
            Some(shard) => view.other_owner(shard, &self.me),
            None => {
                let holds_any = view
                    .members
                    .get(&self.me)
                    .is_some_and(|me| !me.shards.is_empty());
                if holds_any {
                    None
                } else {
                    view.other_with_shards(&self.me)
                }
            }
        };
        match target.and_then(|(id, address)| {
            self.client(address)
                .map(|client| (id.to_owned(), client))
                .ok()
        }) {
            Some((id, client)) => Route::Remote {
                id,
                client: Box::new(client),
            },
            None => Route::Local,
        }
    }

    /// Returns a client of the coordinator at `address` (made on first use, connected lazily).
    pub(crate) fn client(&self, address: &str) -> Result<Client, Status> {
        let mut clients = self
            .clients
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(client) = clients.get(address) {
            return Ok(client.clone());
        }
        let channel = self.security.lazy_channel(address).map_err(|err| {
            Status::internal(format!(
                "cannot forward to the coordinator at {address}: {err}"
            ))
        })?;
        let client = CoordinatorClient::new(channel)
            .max_decoding_message_size(MAX_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_MESSAGE_BYTES);
        clients.insert(address.to_owned(), client.clone());
        Ok(client)
    }

    /// Waits for the next view (or a short while), before a call is tried again.
    pub(crate) async fn settle(&self) {
        let mut view = self.view.clone();
        let _ = tokio::time::timeout(Duration::from_millis(250), view.changed()).await;
    }

    /// Returns the request to forward: `message`, the caller's token and trace context, and the
    /// mark that it was forwarded.
    pub(crate) fn outgoing<T>(&self, incoming: &MetadataMap, message: T) -> Request<T> {
        let mut request = Request::new(message);
        let metadata = request.metadata_mut();
        for key in [
            "authorization",
            trellis_telemetry::propagation::TRACEPARENT,
            "tracestate",
        ] {
            if let Some(value) = incoming.get(key) {
                metadata.insert(key, value.clone());
            }
        }
        if let Ok(me) = MetadataValue::try_from(self.me.as_str()) {
            metadata.insert(FORWARDED, me);
        }
        request
    }
}

/// Returns whether a call was forwarded by another coordinator.
pub(crate) fn is_forwarded(metadata: &MetadataMap) -> bool {
    metadata.contains_key(FORWARDED)
}

/// Returns whether a status says "another coordinator's shard": worth trying again elsewhere.
pub(crate) fn is_not_owned(status: &Status) -> bool {
    status.code() == tonic::Code::Unavailable && status.metadata().contains_key(NOT_OWNED)
}

/// Marks an UNAVAILABLE status as "not this coordinator's shard".
pub(crate) fn not_owned(message: String, shard: Option<u32>) -> Status {
    let mut status = Status::unavailable(message);
    let shard = shard.map_or_else(|| "any".to_owned(), |shard| shard.to_string());
    if let Ok(value) = MetadataValue::try_from(shard.as_str()) {
        status.metadata_mut().insert(NOT_OWNED, value);
    }
    status
}
