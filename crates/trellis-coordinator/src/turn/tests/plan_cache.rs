//! The cache of prepared plans (`turn::PlanCache`).

use std::sync::Arc;

use trellis_core::plan::Limits;
use trellis_grpc::access::Principal;
use trellis_proto::v1;
use trellis_proto::v1::start_execution_request::PlanSource;

use crate::turn::{Input, PlanCache, Prepared, Request};

const PLAN: &str = "name: again\noptions: {max_concurrency: 8}\ntasks:\n- {id: t, type: noop}\n";

fn spec(text: &str) -> PlanSource {
    PlanSource::Spec(v1::PlanSpec {
        text: text.to_owned(),
        format: v1::PlanFormat::Yaml.into(),
        ..Default::default()
    })
}

/// The same spec text is compiled once: the second start gets the first one's plan.
#[test]
fn a_spec_started_again_is_compiled_once() {
    let cache = PlanCache::new(Limits::default());
    let first = cache.prepare(spec(PLAN)).expect("the plan compiles");
    let again = cache.prepare(spec(PLAN)).expect("the plan compiles");
    assert!(
        Arc::ptr_eq(first.plan(), again.plan()),
        "the second came from the cache"
    );
    let fresh = crate::turn::prepare(spec(PLAN), &Limits::default()).expect("it compiles");
    assert_eq!(
        **again.plan(),
        **fresh.plan(),
        "the cached plan is the one prepare makes"
    );
    let other = cache
        .prepare(spec(&PLAN.replace("again", "other")))
        .expect("the plan compiles");
    assert_eq!(other.plan().name, "other", "another text is another plan");
}

/// A spec with params, a large spec and a spec that does not compile are not kept.
#[test]
fn only_small_plain_specs_that_compile_are_kept() {
    let cache = PlanCache::new(Limits::default());
    let with_params = || {
        PlanSource::Spec(v1::PlanSpec {
            text:
                "name: p\nparams: {n: {type: integer, default: 1}}\ntasks:\n- {id: t, type: noop}\n"
                    .to_owned(),
            format: v1::PlanFormat::Yaml.into(),
            params: [("n".to_owned(), "2".to_owned())].into(),
            ..Default::default()
        })
    };
    let first = cache.prepare(with_params()).expect("the plan compiles");
    let again = cache.prepare(with_params()).expect("the plan compiles");
    assert!(
        !Arc::ptr_eq(first.plan(), again.plan()),
        "params are compiled every time"
    );

    let mut large = String::from("name: large\ntasks:\n");
    for i in 0..1000 {
        large.push_str(&format!("- {{id: t{i}, type: noop}}\n"));
    }
    let first = cache.prepare(spec(&large)).expect("the plan compiles");
    let again = cache.prepare(spec(&large)).expect("the plan compiles");
    assert!(
        !Arc::ptr_eq(first.plan(), again.plan()),
        "a large spec is compiled every time"
    );

    let broken = "name: broken\ntasks:\n- {id: t, type: noop, depends_on: [nowhere]}\n";
    for _ in 0..2 {
        let err = cache
            .prepare(spec(broken))
            .expect_err("the plan does not compile");
        assert!(err.message.contains("nowhere"), "{}", err.message);
    }
}

/// A quota's cap changes the started execution's plan, never the cached one another
/// namespace starts next.
#[test]
fn a_quota_cap_leaves_the_cached_plan_alone() {
    let access = super::window::two_namespaces();
    let cache = PlanCache::new(Limits::default());
    for (token, recorded) in [("token-of-small", Some(2)), ("token-of-wide", Some(8))] {
        let principal = access.authenticate(token).expect("a known token").clone();
        let prepared = cache.prepare(spec(PLAN)).expect("the plan compiles");
        let mut coordinator = super::window::coordinator_with(Some(access.clone()), 0);
        super::window::own_shard_0(&mut coordinator);
        let writes = coordinator.turn(vec![start(prepared, principal)], 3);
        let plan = super::window::recorded_plan(&writes);
        assert_eq!(plan.options.max_concurrency, recorded, "{token}");
    }
    let cached = cache.prepare(spec(PLAN)).expect("the plan compiles");
    assert_eq!(cached.plan().options.max_concurrency, Some(8));
}

fn start(prepared: Prepared, principal: Principal) -> Input {
    Input::Request {
        reply: 1,
        request: Request::Start {
            plan: Box::new(prepared),
            options: v1::ExecutionOptions::default(),
            principal,
            traceparent: String::new(),
            follow: None,
        },
    }
}
