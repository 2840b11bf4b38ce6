//! Checks of the turn that need no execution.

/// The turn's sources, as compiled.
const SOURCES: [(&str, &str); 14] = [
    ("mod.rs", include_str!("mod.rs")),
    ("contract.rs", include_str!("contract.rs")),
    ("tests.rs", include_str!("tests.rs")),
    ("admission.rs", include_str!("admission.rs")),
    ("breakers.rs", include_str!("breakers.rs")),
    ("checkpoint.rs", include_str!("checkpoint.rs")),
    ("error.rs", include_str!("error.rs")),
    ("flush.rs", include_str!("flush.rs")),
    ("live.rs", include_str!("live.rs")),
    ("requests.rs", include_str!("requests.rs")),
    ("reserve.rs", include_str!("reserve.rs")),
    ("results.rs", include_str!("results.rs")),
    ("shards.rs", include_str!("shards.rs")),
    ("workers.rs", include_str!("workers.rs")),
];

/// What the turn must not touch: I/O, the clock, randomness, threads.
const FORBIDDEN: [&str; 12] = [
    "tokio",
    "async_nats",
    "tonic::",
    "SystemTime",
    "Instant::now",
    "now_v7",
    "new_v4",
    "std::thread",
    "std::fs",
    "std::net",
    "async fn",
    ".await",
];

#[test]
fn the_turn_does_no_io_and_reads_no_clock() {
    let mut found = Vec::new();
    for (file, source) in SOURCES {
        for (line_idx, line) in source.lines().enumerate() {
            // This file names the forbidden words in its own test.
            if file == "tests.rs" && line.contains('"') && line.trim_start().starts_with('"') {
                continue;
            }
            let code = line.split("//").next().unwrap_or("");
            for word in FORBIDDEN {
                if code.contains(word) {
                    found.push(format!("turn/{file}:{}: {word}", line_idx + 1));
                }
            }
        }
    }
    assert!(
        found.is_empty(),
        "the pure turn touches the outside world:\n{}",
        found.join("\n")
    );
}

mod attention {
    use prost::Message as _;
    use trellis_core::ids::ExecutionId;
    use trellis_grpc::access::Scope;
    use trellis_proto::v1;

    use crate::turn::{
        Ack, Action, Appended, Broken, Config, Coordinator, Delivery, ErrorKind, Input, Request,
    };

    fn coordinator() -> Coordinator {
        let config = Config {
            id: "c".to_owned(),
            shards: 1,
            checkpoint_every_ms: 1_000,
            checkpoint_store: false,
            access: None,
            max_message_bytes: 0,
            index_scan_every_ms: 1_000,
            seed: 7,
            keep_finished_ms: 1_000,
            breakers: crate::turn::BreakerConfig::default(),
            dispatch_window: 0,
            build_off_the_loop: crate::turn::BUILT_OFF_THE_LOOP,
            offers: false,
        };
        Coordinator::new(config, &trellis_telemetry::Registry::default())
    }

    /// A turn's answers (`Debug` of each, or its refusal), result acknowledgements and loads.
    type Turned = (
        Vec<Result<String, (ErrorKind, String)>>,
        Vec<Ack>,
        Vec<ExecutionId>,
    );

    /// Runs one turn with no appends, returning its answers and the result acknowledgements.
    fn turn(coordinator: &mut Coordinator, inputs: Vec<Input>, now: u64) -> Turned {
        let writes = coordinator.turn(inputs, now);
        assert!(writes.appends.is_empty(), "nothing is written for it");
        let mut answers: Vec<_> = writes
            .replies
            .into_iter()
            .map(|(_, answer)| {
                answer
                    .map(|answer| format!("{answer:?}"))
                    .map_err(|err| (err.kind, err.message))
            })
            .collect();
        let effects = coordinator.appended(Vec::<(ExecutionId, Appended)>::new(), now);
        answers.extend(effects.replies.into_iter().map(|(_, answer)| {
            answer
                .map(|answer| format!("{answer:?}"))
                .map_err(|err| (err.kind, err.message))
        }));
        let acks = effects.acks.into_iter().map(|(_, ack)| ack).collect();
        (answers, acks, effects.load)
    }

    fn get(id: ExecutionId, scope: Scope) -> Input {
        Input::Request {
            reply: 1,
            request: Request::On {
                id,
                scope,
                action: Action::Get,
            },
        }
    }

    /// An execution whose log does not replay is held, not forgotten: a request about it names
    /// the sequence (and reads the log again), its results are handed back for long, index scans
    /// pass it by, and another namespace learns nothing of it.
    #[test]
    fn an_execution_whose_log_does_not_replay_is_held_with_its_sequence() {
        let mut coordinator = coordinator();
        let id = ExecutionId(uuid::Uuid::from_u128(42));
        let broken = Broken {
            id,
            sequence: 17,
            namespace: Some("team-a".to_owned()),
            reason: format!("execution {id}, sequence 17: corrupt: not an event batch"),
        };
        turn(&mut coordinator, vec![Input::LeaseAcquired(0)], 1);
        let recovered = Input::ShardRecovered {
            shard: 0,
            recovered: Vec::new(),
            missing: Vec::new(),
            broken: vec![broken.clone()],
        };
        turn(&mut coordinator, vec![recovered], 2);
        assert_eq!(
            coordinator.needing_attention().collect::<Vec<_>>(),
            [&broken]
        );

        // A request reads the log again; still broken, it is answered with where it broke.
        let (answers, _, load) = turn(&mut coordinator, vec![get(id, Scope::All)], 3);
        assert!(
            answers.is_empty(),
            "the request waits for the log: {answers:?}"
        );
        assert_eq!(load, [id], "the request reads the log again");
        let loaded = Input::Loaded {
            recovered: Vec::new(),
            missing: Vec::new(),
            broken: vec![broken.clone()],
        };
        let (answers, _, _) = turn(&mut coordinator, vec![loaded], 4);
        let [Err((kind, message))] = answers.as_slice() else {
            panic!("one refusal expected: {answers:?}");
        };
        assert_eq!(*kind, ErrorKind::DataLoss);
        assert!(
            message.contains("needs attention") && message.contains("sequence 17"),
            "{message}"
        );

        // Another namespace is told nothing.
        turn(
            &mut coordinator,
            vec![get(id, Scope::Namespace("team-b".into()))],
            5,
        );
        let loaded = Input::Loaded {
            recovered: Vec::new(),
            missing: Vec::new(),
            broken: vec![broken.clone()],
        };
        let (answers, _, _) = turn(&mut coordinator, vec![loaded], 6);
        assert!(
            matches!(answers.as_slice(), [Err((ErrorKind::NotFound, _))]),
            "{answers:?}"
        );

        // A result for it is kept, not acknowledged and not applied.
        let result = v1::TaskResult {
            execution_id: id.to_string(),
            task_instance_id: uuid::Uuid::from_u128(43).to_string(),
            attempt: 1,
            ..Default::default()
        };
        let delivery = Delivery {
            token: 9,
            payload: result.encode_to_vec().into(),
            span: tracing::Span::none(),
        };
        let (_, acks, load) = turn(&mut coordinator, vec![Input::Results(vec![delivery])], 7);
        assert_eq!(acks, [Ack::Hold]);
        assert!(load.is_empty(), "a held result loads nothing");

        // An index scan passes it by.
        let (_, _, load) = turn(
            &mut coordinator,
            vec![Input::Indexed {
                shard: 0,
                ids: vec![id],
            }],
            8,
        );
        assert!(load.is_empty(), "{load:?}");

        // The shard moves: it is no longer held here.
        turn(&mut coordinator, vec![Input::LeaseLost(0)], 9);
        assert_eq!(coordinator.needing_attention().count(), 0);
    }
}

mod window {
    use prost::Message as _;
    use trellis_core::ids::ExecutionId;
    use trellis_grpc::access::Principal;
    use trellis_proto::v1;

    use crate::turn::{Appended, Config, Coordinator, Delivery, Effects, Input, Request};

    pub(super) fn coordinator(dispatch_window: u32) -> Coordinator {
        coordinator_with(None, dispatch_window)
    }

    pub(super) fn coordinator_with(
        access: Option<std::sync::Arc<trellis_grpc::access::AccessPolicy>>,
        dispatch_window: u32,
    ) -> Coordinator {
        Coordinator::new(
            config(access, dispatch_window),
            &trellis_telemetry::Registry::default(),
        )
    }

    /// A coordinator that builds the starting state of plans of `from_tasks` tasks or more off
    /// the loop.
    pub(super) fn coordinator_building(
        access: Option<std::sync::Arc<trellis_grpc::access::AccessPolicy>>,
        from_tasks: usize,
    ) -> Coordinator {
        let config = Config {
            build_off_the_loop: from_tasks,
            ..config(access, 0)
        };
        Coordinator::new(config, &trellis_telemetry::Registry::default())
    }

    /// One shard, no checkpoint-store, every interval a minute.
    pub(super) fn config(
        access: Option<std::sync::Arc<trellis_grpc::access::AccessPolicy>>,
        dispatch_window: u32,
    ) -> Config {
        Config {
            id: "c".to_owned(),
            shards: 1,
            checkpoint_every_ms: 60_000,
            checkpoint_store: false,
            access,
            max_message_bytes: 0,
            index_scan_every_ms: 60_000,
            seed: 7,
            keep_finished_ms: 60_000,
            breakers: crate::turn::BreakerConfig::default(),
            dispatch_window,
            build_off_the_loop: crate::turn::BUILT_OFF_THE_LOOP,
            offers: false,
        }
    }

    /// Runs one turn whose appends are all stored; returns what the coordinator does after.
    pub(super) fn turn(coordinator: &mut Coordinator, inputs: Vec<Input>, now: u64) -> Effects {
        let writes = coordinator.turn(inputs, now);
        stored(coordinator, &writes, now)
    }

    /// Stores every append of `writes`; returns what the coordinator does after.
    pub(super) fn stored(
        coordinator: &mut Coordinator,
        writes: &crate::turn::Writes,
        now: u64,
    ) -> Effects {
        let stored: Vec<(ExecutionId, Appended)> = writes
            .appends
            .iter()
            .map(|append| {
                let stream_seq = append.expected_stream_seq + append.messages.len() as u64;
                (append.id, Appended::Stored { stream_seq })
            })
            .collect();
        coordinator.appended(stored, now)
    }

    /// Takes the lease of shard 0 and finds nothing to recover in it.
    pub(super) fn own_shard_0(coordinator: &mut Coordinator) {
        turn(coordinator, vec![Input::LeaseAcquired(0)], 1);
        let recovered = Input::ShardRecovered {
            shard: 0,
            recovered: Vec::new(),
            missing: Vec::new(),
            broken: Vec::new(),
        };
        turn(coordinator, vec![recovered], 2);
    }

    pub(super) fn start(tasks: usize) -> Input {
        start_as(tasks, "", Principal::anonymous())
    }

    /// Starts a plan of `tasks` noop tasks with `options` (YAML flow mapping entries) as
    /// `principal`.
    pub(super) fn start_as(tasks: usize, options: &str, principal: Principal) -> Input {
        Input::Request {
            reply: 1,
            request: Request::Start {
                plan: Box::new(prepared(tasks, options)),
                options: v1::ExecutionOptions::default(),
                principal,
                traceparent: String::new(),
                follow: None,
            },
        }
    }

    /// A plan of `tasks` noop tasks with `options` (YAML flow mapping entries), compiled.
    pub(super) fn prepared(tasks: usize, options: &str) -> crate::turn::Prepared {
        let mut text = format!("name: wide\noptions: {{{options}}}\ntasks:\n");
        for i in 0..tasks {
            text.push_str(&format!("- {{id: t{i}, type: noop}}\n"));
        }
        crate::turn::prepare(
            v1::start_execution_request::PlanSource::Spec(v1::PlanSpec {
                text,
                format: v1::PlanFormat::Yaml.into(),
                ..Default::default()
            }),
            &trellis_core::plan::Limits::default(),
        )
        .expect("the test's plan compiles")
    }

    /// The result of an assignment, completed.
    pub(super) fn completed(payload: &[u8], token: u64) -> Delivery {
        let assignment = v1::TaskAssignment::decode(payload).expect("an assignment");
        let result = v1::TaskResult {
            execution_id: assignment.execution_id,
            task_instance_id: assignment.task_instance_id,
            attempt: assignment.attempt,
            worker_id: "w".to_owned(),
            started_at_unix_ms: Some(1),
            outcome: Some(v1::task_result::Outcome::Completed(
                v1::task_result::Completed {
                    output: b"{}".to_vec(),
                },
            )),
            ..Default::default()
        };
        Delivery {
            token,
            payload: result.encode_to_vec().into(),
            span: tracing::Span::none(),
        }
    }

    /// A turn's tasks of an execution go to the fast lane while the execution has at most
    /// FAST_LANE_SHARE tasks in flight with them: a wide execution sends none there (its turn's
    /// tasks share a message), a narrow one all of its tasks, whatever else runs.
    #[test]
    fn only_an_execution_with_few_tasks_in_flight_uses_the_fast_lane() {
        use crate::turn::FAST_LANE_SHARE;
        let share = FAST_LANE_SHARE as usize;
        let mut coordinator = coordinator(share as u32 + 2);
        own_shard_0(&mut coordinator);
        let wide = dispatched(turn(&mut coordinator, vec![start(10)], 3));
        assert_eq!(wide.len(), share + 2, "the window's worth");
        assert!(wide.iter().all(|assign| !assign.fast), "{wide:?}");
        // One finishes and the next starts with the window full again: still the queue.
        let next = dispatched(turn(
            &mut coordinator,
            vec![Input::Results(vec![completed(&wide[0].payload, 10)])],
            4,
        ));
        assert_eq!(next.len(), 1);
        assert!(!next[0].fast, "{} in flight with it", share + 2);
        // A narrow execution beside it: every one of its tasks is fast, up to the share.
        let narrow = dispatched(turn(&mut coordinator, vec![start(share)], 5));
        assert_eq!(narrow.len(), share);
        assert!(narrow.iter().all(|assign| assign.fast), "{narrow:?}");
        let over = dispatched(turn(&mut coordinator, vec![start(share + 1)], 6));
        assert_eq!(over.len(), share + 1);
        assert!(over.iter().all(|assign| !assign.fast), "{over:?}");
    }

    /// A new execution's first checkpoint is due an interval after its start, not at its first
    /// append (a snapshot of a log of one message saves no replay); later ones as before.
    #[test]
    fn a_new_execution_is_checkpointed_an_interval_after_it_starts() {
        let mut coordinator = coordinator_checkpointed(1_000);
        own_shard_0(&mut coordinator);
        // A clock's time, as the executor gives it: far past one interval from zero.
        let now = 1_700_000_000_000;
        let first = turn(&mut coordinator, vec![start(3)], now);
        assert!(first.checkpoints.is_empty(), "none at the start");
        let in_flight = dispatched(first);
        let before = turn(
            &mut coordinator,
            vec![Input::Results(vec![completed(&in_flight[0].payload, 1)])],
            now + 999,
        );
        assert!(before.checkpoints.is_empty(), "none within the interval");
        let after = turn(
            &mut coordinator,
            vec![Input::Results(vec![completed(&in_flight[1].payload, 2)])],
            now + 1_000,
        );
        assert_eq!(
            after.checkpoints.len(),
            1,
            "one once the interval has passed"
        );
    }

    /// A coordinator that stores checkpoints every `every_ms`.
    pub(super) fn coordinator_checkpointed(every_ms: u64) -> Coordinator {
        let config = Config {
            checkpoint_every_ms: every_ms,
            checkpoint_store: true,
            ..config(None, 0)
        };
        Coordinator::new(config, &trellis_telemetry::Registry::default())
    }

    /// A heartbeat of a worker of the `noop` queue (the test plans' tasks') with `slots`, sent
    /// at `now`.
    fn heartbeat(worker: &str, slots: u32, now: u64) -> Input {
        heartbeat_running(worker, slots, Vec::new(), now)
    }

    /// [`heartbeat`], naming the attempts the worker runs.
    pub(super) fn heartbeat_running(
        worker: &str,
        slots: u32,
        running: Vec<v1::RunningTask>,
        now: u64,
    ) -> Input {
        let heartbeat = v1::WorkerHeartbeat {
            worker_id: worker.to_owned(),
            queues: vec!["noop".to_owned()],
            slots,
            sent_at_unix_ms: i64::try_from(now).unwrap_or(i64::MAX),
            running,
            ..Default::default()
        };
        Input::Heartbeat(heartbeat.encode_to_vec().into())
    }

    /// The sizes of the messages a turn sends, and whether each is the fast lane's.
    fn message_sizes(effects: &Effects) -> Vec<(usize, bool)> {
        effects
            .assignments
            .iter()
            .map(|message| (message.len(), message[0].fast))
            .collect()
    }

    /// Assignments of one lane share a message up to half the smallest live worker's slots;
    /// with no worker heard from, or one of few slots, each goes alone.
    #[test]
    fn assignments_share_messages_as_the_queues_workers_have_room_for() {
        let mut coordinator = coordinator(0);
        own_shard_0(&mut coordinator);
        let alone = turn(&mut coordinator, vec![start(10)], 3);
        assert_eq!(
            message_sizes(&alone),
            vec![(1, false); 10],
            "no worker heard from"
        );
        turn(&mut coordinator, vec![heartbeat("big", 16, 4)], 4);
        let shared = turn(&mut coordinator, vec![start(10)], 5);
        assert_eq!(
            message_sizes(&shared),
            [(8, false), (2, false)],
            "16 slots: 8 a message"
        );
        turn(&mut coordinator, vec![heartbeat("small", 7, 6)], 6);
        let small = turn(&mut coordinator, vec![start(3)], 7);
        assert_eq!(
            message_sizes(&small),
            [(1, true), (1, true), (1, true)],
            "a worker of 7 slots gets each alone"
        );
        let wide = turn(&mut coordinator, vec![start(6)], 8);
        assert_eq!(message_sizes(&wide), [(1, false); 6], "alone, in the queue");
        // The small worker stops heartbeating: once it counts as gone, the big one sets the size.
        let later = 6 + 4 * trellis_bus::HEARTBEAT_INTERVAL.as_millis() as u64;
        turn(&mut coordinator, vec![heartbeat("big", 16, later)], later);
        let again = turn(&mut coordinator, vec![start(6)], later + 1);
        assert_eq!(message_sizes(&again), [(6, false)]);
        let few = turn(&mut coordinator, vec![start(3)], later + 2);
        assert_eq!(
            message_sizes(&few),
            [(3, true)],
            "a narrow execution's share the fast lane"
        );
        let n_tasks: usize = [alone, shared, small, wide, again, few]
            .iter()
            .map(|effects| effects.assignments.iter().map(Vec::len).sum::<usize>())
            .sum();
        assert_eq!(n_tasks, 10 + 10 + 3 + 6 + 6 + 3, "every task sent once");
    }

    /// Every assignment a turn sends, whatever message it shares.
    pub(super) fn dispatched(effects: Effects) -> Vec<crate::turn::Assign> {
        effects.assignments.into_iter().flatten().collect()
    }

    /// The plan is compiled before the turn, but a quota's cap changes it in the turn: the log
    /// records the capped plan (what every replay runs), and an uncapped one as compiled.
    #[test]
    fn the_log_records_the_plan_a_quota_capped() {
        let access = two_namespaces();
        for (token, recorded) in [("token-of-small", Some(2)), ("token-of-wide", Some(8))] {
            let principal = access.authenticate(token).expect("a known token").clone();
            let mut coordinator = coordinator_with(Some(access.clone()), 0);
            own_shard_0(&mut coordinator);
            let writes = coordinator.turn(vec![start_as(3, "max_concurrency: 8", principal)], 3);
            let plan = recorded_plan(&writes);
            assert_eq!(plan.options.max_concurrency, recorded, "{token}");
        }
    }

    /// An access file of two namespaces, `small` (at most 2 tasks at once) and `wide` (no
    /// cap), with a token for each: `token-of-small` and `token-of-wide`.
    pub(super) fn two_namespaces() -> std::sync::Arc<trellis_grpc::access::AccessPolicy> {
        let text = format!(
            "namespaces:\n  small: {{tier: writer_pro, max_concurrency: 2}}\n  wide: {{tier: teams}}\n\
             tokens:\n  - {{name: small, namespace: small, sha256: {}}}\n\
             \x20 - {{name: wide, namespace: wide, sha256: {}}}\n",
            trellis_grpc::access::token_digest("token-of-small"),
            trellis_grpc::access::token_digest("token-of-wide"),
        );
        std::sync::Arc::new(
            trellis_grpc::access::AccessPolicy::parse(&text, "access.yaml")
                .expect("a valid access file"),
        )
    }

    /// The plan the first append of a turn that started an execution records.
    pub(super) fn recorded_plan(writes: &crate::turn::Writes) -> trellis_core::plan::Plan {
        let (_, first) = &writes.appends[0].messages[0];
        let batch = v1::EventBatch::decode(first.clone()).expect("an event batch");
        let Some(v1::event::Kind::ExecutionStarted(started)) = batch.events[0].kind.clone() else {
            panic!("the log starts with ExecutionStarted: {batch:?}");
        };
        trellis_core::plan::decode(&started.compiled_plan).expect("a plan")
    }
}

mod built;
mod dispatch_window;
mod observe;
mod offers;
mod plan_cache;
mod reserve;
mod timers;
