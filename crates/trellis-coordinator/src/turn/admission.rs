//! Admission: who may start what. A start request is checked against the caller's namespace and
//! its quota, de-duplicated by idempotency key, and its plan compiled, once; what the log records
//! lets every replay rebuild the identical plan.

use std::sync::{Arc, Mutex, PoisonError};

use hashlink::LruCache;
use trellis_core::ids::ExecutionId;
use trellis_core::machine::Execution;
use trellis_core::plan::{Limits, Plan, PlanErrors, compile_str};
use trellis_core::quota::Quota;
use trellis_grpc::access::{self, Principal};
use trellis_proto::v1;
use trellis_proto::v1::start_execution_request::PlanSource;
use trellis_wire::{log, plan};

use super::live::{Live, Tenancy};
use super::reserve::Lent;
use super::{Coordinator, Error};

/// Room kept beside a spec and its compiled plan for the rest of the first log message (its
/// other events).
const STARTED_HEADROOM: usize = 256 * 1024;

/// A start of a plan of at least this many tasks has its execution's starting state built off
/// the loop ([`Started::Build`]): building it takes about a quarter of a microsecond per task
/// (`machine/start_20k`), which for a large plan is milliseconds every other execution of the
/// coordinator would wait, and more than the extra pass through the loop costs.
pub const BUILT_OFF_THE_LOOP: usize = 1_000;

/// A start's plan, compiled, with the text the log records of it. Made by [`prepare`] before the
/// request reaches the turn: compiling is the one step of admission whose cost grows with the
/// plan (a 20,000-task spec takes about 100 ms), and in the turn it would hold up every other
/// execution's results for that long.
#[derive(Clone, Debug)]
pub struct Prepared {
    /// Shared with [`PlanCache`]'s copy, if any; a quota's cap makes the execution its own.
    plan: Arc<Plan>,
    /// Text that compiles to the same plan: the spec as sent when it needs nothing else,
    /// otherwise the plan's canonical flat JSON spec.
    text: String,
    format: v1::PlanFormat,
    /// The canonical encoding of `plan` as compiled (before a quota's cap).
    encoded: Vec<u8>,
    /// The execution's starting state, built by [`Prepared::build`] for the id and time the turn
    /// gave ([`Started::Build`]); `None` until then, and for a plan small enough to build in
    /// the turn.
    built: Option<Box<Execution>>,
}

impl Prepared {
    /// The compiled plan.
    #[cfg(test)]
    pub(super) fn plan(&self) -> &Arc<Plan> {
        &self.plan
    }

    /// Builds the execution's starting state for the id and start time the turn chose
    /// ([`Answer::Build`](super::Answer::Build)), so the turn that starts it only takes it over.
    /// Pure, and as slow as the plan is large: call it outside the turn.
    pub fn build(&mut self, id: ExecutionId, at_ms: u64) {
        self.built = Some(Box::new(Execution::start(
            id,
            Arc::clone(&self.plan),
            1,
            at_ms,
        )));
    }
}

/// What [`Coordinator::start`] did with a start.
#[derive(Debug)]
pub(super) enum Started {
    /// A new execution, its `ExecutionStarted` pending (`created`), or the one started before
    /// under the same idempotency key.
    Started { id: ExecutionId, created: bool },
    /// A large plan: its id and start time are chosen (the id held for it), and the caller builds
    /// its starting state off the loop ([`Prepared::build`]) and asks again.
    Build {
        id: ExecutionId,
        at_ms: u64,
        prepared: Box<Prepared>,
    },
}

/// Compiles a start's plan within `limits`. An error lists every problem, each led by the
/// spec's source name (or `plan_source.plan`).
pub fn prepare(source: PlanSource, limits: &Limits) -> Result<Prepared, Error> {
    let invalid = |source: &str, errors: PlanErrors| {
        let lines: Vec<String> = errors.iter().map(|e| format!("{source}: {e}")).collect();
        Error::invalid(lines.join("\n"))
    };
    // The log records text that compiles to the same plan, for readers and for logs read by
    // older builds.
    let (plan, text, format) = match source {
        PlanSource::Spec(spec) => {
            let source = if spec.source_name.is_empty() {
                "plan"
            } else {
                spec.source_name.as_str()
            };
            if spec.params.is_empty() {
                let plan = compile_str(&spec.text, limits).map_err(|e| invalid(source, e))?;
                let format = v1::PlanFormat::try_from(spec.format).unwrap_or(v1::PlanFormat::Yaml);
                (plan, spec.text, format)
            } else {
                let plan =
                    plan::compile_wire_spec(&spec, limits).map_err(|e| invalid(source, e))?;
                let text = plan::canonical_spec_json(&plan);
                (plan, text, v1::PlanFormat::Json)
            }
        }
        PlanSource::Plan(wire) => {
            let plan = plan::compile_wire_plan(&wire, limits)
                .map_err(|e| invalid("plan_source.plan", e))?;
            let text = plan::canonical_spec_json(&plan);
            (plan, text, v1::PlanFormat::Json)
        }
    };
    let encoded = trellis_core::plan::encode(&plan);
    // Worked out here with the compile, before the turn: every execution of the plan reads it,
    // and for a large plan it is a tenth of the start.
    plan.shape();
    Ok(Prepared {
        plan: Arc::new(plan),
        text,
        format,
        encoded,
        built: None,
    })
}

/// Specs up to this size are kept by [`PlanCache`]; larger ones are compiled every time (on a
/// blocking thread, [`is_large`]), so the cache holds at most `CACHED_PLANS` small plans.
const CACHED_SPEC: usize = 16 * 1024;
/// Most plans [`PlanCache`] keeps.
const CACHED_PLANS: usize = 256;

/// The small plans prepared lately, by their spec text: a client that starts the same plan again
/// and again (one workflow, many executions) has it compiled once. Compiling is pure (the same
/// text within the same limits always gives the same plan), so a plan from the cache is the
/// plan [`prepare`] would make; only specs without params, up to `CACHED_SPEC` bytes, are kept,
/// the least recently used `CACHED_PLANS` of them. A spec that does not compile is not kept.
pub struct PlanCache {
    limits: Limits,
    plans: Mutex<LruCache<(i32, String), Prepared>>,
}

impl std::fmt::Debug for PlanCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PlanCache")
            .field("limits", &self.limits)
            .field("plans", &self.lock().len())
            .finish()
    }
}

impl PlanCache {
    /// An empty cache of plans compiled within `limits`.
    pub fn new(limits: Limits) -> Self {
        PlanCache {
            limits,
            plans: Mutex::new(LruCache::new(CACHED_PLANS)),
        }
    }

    /// The limits its plans are compiled within.
    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// [`prepare`]s `source`, or hands out the plan prepared for the same spec text before.
    pub fn prepare(&self, source: PlanSource) -> Result<Prepared, Error> {
        let spec = match source {
            PlanSource::Spec(spec) if spec.params.is_empty() && spec.text.len() <= CACHED_SPEC => {
                spec
            }
            other => return prepare(other, &self.limits),
        };
        // The key takes the text: a start of a kept plan copies nothing but the plan's parts.
        let key = (spec.format, spec.text);
        if let Some(prepared) = self.lock().get(&key) {
            return Ok(prepared.clone());
        }
        let source = PlanSource::Spec(v1::PlanSpec {
            text: key.1.clone(),
            ..spec
        });
        let prepared = prepare(source, &self.limits)?;
        self.lock().insert(key, prepared.clone());
        Ok(prepared)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, LruCache<(i32, String), Prepared>> {
        // A poisoned lock means a thread panicked while holding it, between whole lookups and
        // inserts of the map: every entry in it is still a plan `prepare` made.
        self.plans.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Whether preparing `source` is worth a blocking thread rather than a moment of an async one.
pub fn is_large(source: &PlanSource) -> bool {
    /// Spec text up to this size compiles in well under a millisecond.
    const LARGE_SPEC: usize = 64 * 1024;
    /// Compiled plans up to this many tasks are checked in well under a millisecond.
    const LARGE_PLAN: usize = 500;
    match source {
        PlanSource::Spec(spec) => spec.text.len() > LARGE_SPEC,
        PlanSource::Plan(wire) => wire.tasks.len() > LARGE_PLAN,
    }
}

impl Coordinator {
    /// Returns the quota of `namespace`: the access file's, or none without one. A namespace the
    /// file no longer declares (an execution started before it was removed) runs unlimited.
    pub(super) fn quota(&self, namespace: &str) -> Quota {
        self.config
            .access
            .as_ref()
            .and_then(|access| access.quota(namespace).cloned())
            .unwrap_or(Quota::UNLIMITED)
    }

    /// Starts an execution of a plan [`prepare`]d outside the turn. A plan of at least
    /// [`BUILT_OFF_THE_LOOP`] tasks (`Config::build_off_the_loop`) comes twice: first it is
    /// admitted and given its id and start time ([`Started::Build`]), then, its starting state
    /// built, it starts as any other.
    pub(super) fn start(
        &mut self,
        prepared: Prepared,
        options: v1::ExecutionOptions,
        principal: &Principal,
        traceparent: String,
        now: u64,
    ) -> Result<Started, Error> {
        // The id a first pass held for this start, handed back unless the start takes it below.
        let held = prepared.built.as_ref().and_then(|built| {
            let id = built.id();
            self.reservations.returned(id).map(|lent| (id, lent))
        });
        let lent = held.map(|(_, lent)| lent);
        let started = self.admit(prepared, options, principal, traceparent, lent, now);
        if let Some((id, lent)) = held {
            let taken = matches!(&started, Ok(Started::Started { id: started, created: true }) if *started == id);
            if !taken {
                self.reservations.unused(id, lent);
            }
        }
        started
    }

    /// [`Coordinator::start`], given what holds the id of a start built off the loop (`lent`).
    fn admit(
        &mut self,
        prepared: Prepared,
        options: v1::ExecutionOptions,
        principal: &Principal,
        traceparent: String,
        lent: Option<Lent>,
        now: u64,
    ) -> Result<Started, Error> {
        let namespace = principal
            .namespace_for(&options.namespace)
            .map_err(|why| Error::denied(format!("namespace: {why}")))?;
        access::check_namespace_name(&namespace)
            .map_err(|why| Error::invalid(format!("namespace: {why}")))?;
        if let Some(access) = &self.config.access
            && access.quota(&namespace).is_none()
        {
            return Err(Error::invalid(format!(
                "namespace: no namespace {namespace:?} in the access file (it declares: {})",
                access.namespaces().join(", ")
            )));
        }
        // A start with an idempotency key lands on the key's shard, so every coordinator sends
        // the same key to the same owner, which alone remembers it.
        let target = super::start_shard(&namespace, &options.idempotency_key, self.config.shards);
        match target {
            Some(shard) if !self.owned.contains(&shard) => {
                return Err(Error::not_owned(
                    Some(shard),
                    format!(
                        "idempotency key {:?} belongs to shard {shard}, which this coordinator \
                         does not own; start it on the coordinator that does",
                        options.idempotency_key
                    ),
                ));
            }
            None if self.owned.is_empty() => {
                return Err(Error::not_owned(
                    None,
                    "this coordinator owns no shard at the moment; start executions on one that \
                     does (`trellis cluster` lists them)",
                ));
            }
            _ => {}
        }
        if !options.idempotency_key.is_empty()
            && let Some(id) = self
                .by_key
                .get(&(namespace.clone(), options.idempotency_key.clone()))
        {
            return Ok(Started::Started {
                id: *id,
                created: false,
            });
        }
        let quota = self.quota(&namespace);
        let Prepared {
            plan,
            text,
            format,
            encoded,
            built,
        } = prepared;
        // A first pass of a large plan; a second one (`built`) that cannot use what was built
        // (its shard was lost meanwhile, say) builds in the turn instead of going round again.
        let large = self.config.build_off_the_loop;
        let build_first = built.is_none() && large > 0 && plan.tasks.len() >= large;
        let violations = quota.check_plan(&plan);
        if !violations.is_empty() {
            let lines: Vec<String> = violations.iter().map(ToString::to_string).collect();
            return Err(Error::denied(format!(
                "the plan uses failure actions namespace {namespace:?} may not use:\n{}",
                lines.join("\n")
            )));
        }
        // The quota's cap is enforced at run time: the plan runs with it, and the log records
        // the capped plan, so every replay runs the same one.
        let asked = plan.options.max_concurrency;
        let capped = quota.cap_concurrency(asked);
        let max_concurrency_cap = (capped != asked).then_some(capped).flatten();
        let mut plan = plan;
        if capped != asked {
            Arc::make_mut(&mut plan).options.max_concurrency = capped;
        }
        // The plan was compiled once, by `prepare`: the log records its canonical encoding, which
        // every replay (recovery, the store, the monitor) decodes instead of compiling the spec
        // again. A cap changes the plan, so its encoding is made again.
        let compiled_plan = if max_concurrency_cap.is_some() {
            trellis_core::plan::encode(&plan)
        } else {
            encoded
        };
        // `ExecutionStarted` logs the spec and the encoded plan whole, in one message with up to
        // a batch of other events: refuse what the NATS server would refuse, rather than retry
        // that append forever.
        let recorded = text.len() + compiled_plan.len();
        let max_payload = self.config.max_message_bytes;
        if max_payload > 0 && recorded + STARTED_HEADROOM > max_payload {
            return Err(Error::invalid(format!(
                "the plan's spec ({} bytes) and its compiled form ({} bytes) are {recorded} \
                 bytes, and the log records them in one NATS message, which this NATS server \
                 limits to {max_payload} bytes: raise the server's max_payload (Trellis \
                 documents {} bytes) or split the plan",
                text.len(),
                compiled_plan.len(),
                trellis_bus::MAX_PAYLOAD
            )));
        }
        // The starting state built off the loop, if its id is still held for it and it runs the
        // very plan (not one a quota's cap changed since). A held id's shard is owned (dropping
        // a shard gives its held ids up) and is this start's target: both passes ask the same.
        let built = built
            .zip(lent)
            .filter(|(built, _)| Arc::ptr_eq(built.plan(), &plan));
        let (id, shard, indexed) = match &built {
            Some((built, lent)) => (built.id(), lent.shard, lent.indexed),
            None => self.choose_id(target, now),
        };
        if build_first && max_concurrency_cap.is_none() {
            // Admitted: the caller builds the starting state and comes again. The id is held
            // for it meanwhile (`Reservations::lend`), and an index scan does not take it for
            // an execution to load.
            self.reservations.lend(id, shard, indexed, now);
            let prepared = Prepared {
                // Uncapped: no quota's cap changes it.
                plan,
                text,
                format,
                encoded: compiled_plan,
                built: None,
            };
            return Ok(Started::Build {
                id,
                at_ms: now,
                prepared: Box::new(prepared),
            });
        }
        let labels: std::collections::BTreeMap<String, String> = options
            .labels
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let plan_name = plan.name.clone();
        let machine = match built {
            Some((built, _)) => *built,
            None => Execution::start(id, plan, 1, now),
        };
        // The time the state was built for: what every replay builds it with.
        let (started_at_ms, _) = machine.times_ms();
        let started = log::started_to_proto(
            id,
            &log::Started {
                plan_name,
                run_number: 1,
                spec: text,
                format,
                started_at_ms,
                idempotency_key: options.idempotency_key.clone(),
                labels: labels.clone(),
                namespace: namespace.to_string(),
                max_concurrency_cap,
                traceparent: traceparent.clone(),
                compiled_plan,
            },
        );
        let tenancy = Tenancy {
            namespace: namespace.clone(),
            checkpoints_allowed: quota.checkpoints,
            traceparent,
        };
        let mut live = Live::new(machine, labels, now, shard, tenancy);
        live.seq = 1;
        live.pending.push(started);
        live.index_put = !indexed;
        live.indexed = indexed;
        // Its first checkpoint is due an interval from now, like any other's: one of a log of
        // one message would save no replay, yet cost a full snapshot in this loop (tens of
        // milliseconds for 20,000 tasks) and a write to the checkpoint-store per execution.
        live.checkpoint.at_ms = now;
        self.executions.insert(id, live);
        if !options.idempotency_key.is_empty() {
            self.by_key
                .insert((namespace.clone(), options.idempotency_key), id);
        }
        self.metrics
            .executions_started
            .get_or_create(&[("namespace", namespace.to_string())])
            .inc();
        tracing::info!(%id, shard, %namespace, caller = %principal.name, "execution started");
        Ok(Started::Started { id, created: true })
    }

    /// An id for a start: a reserved id of the shard, whose index entry is stored (`reserve`);
    /// else a fresh id whose shard this coordinator owns (`target`, with an idempotency key),
    /// its entry written before the first append (expected tries: shards / owned shards, or
    /// shards with a key). Returns the id, its shard and whether its index entry is stored.
    fn choose_id(&mut self, target: Option<u32>, now: u64) -> (ExecutionId, u32, bool) {
        if let Some((id, shard)) = self
            .reservations
            .take(target, self.owned.iter().copied(), now)
        {
            return (id, shard, true);
        }
        loop {
            let id = self.ids.execution(now);
            let shard = self.shard_of(id);
            if target.map_or(self.owned.contains(&shard), |target| shard == target) {
                self.reservations.gave_fresh(id);
                return (id, shard, false);
            }
        }
    }
}
