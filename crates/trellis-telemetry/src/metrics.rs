//! The process's Prometheus registry.
//!
//! Each service registers its metric families once at start through [`Registry::metric`], which
//! returns the family already registered under a name when there is one: two workers hosted by one
//! process count into the same families, and the exposition never lists a name twice.
//!
//! Counters are exposed with the `_total` suffix Prometheus expects (`trellis_tasks_dispatched`
//! is scraped as `trellis_tasks_dispatched_total`).

use std::any::Any;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Metric;

/// Label set of one or two labels, the shapes Trellis uses.
pub type Labels1 = [(&'static str, String); 1];
pub type Labels2 = [(&'static str, String); 2];
pub type Labels3 = [(&'static str, String); 3];

/// A histogram family whose histograms all have the same buckets.
pub type HistogramFamily<L> = Family<L, Histogram, fn() -> Histogram>;

/// Buckets for latencies: 0.5 ms to about 65 s, doubling.
pub fn latency_buckets() -> Histogram {
    Histogram::new(prometheus_client::metrics::histogram::exponential_buckets(
        0.0005, 2.0, 18,
    ))
}

/// Buckets for sizes in bytes: 256 B to 64 MiB, quadrupling.
pub fn size_buckets() -> Histogram {
    Histogram::new(prometheus_client::metrics::histogram::exponential_buckets(
        256.0, 4.0, 10,
    ))
}

/// A histogram family with latency buckets.
pub fn latency_family<L>() -> HistogramFamily<L>
where
    L: Clone + std::hash::Hash + Eq,
{
    Family::new_with_constructor(latency_buckets as fn() -> Histogram)
}

/// A histogram family with size buckets.
pub fn size_family<L>() -> HistogramFamily<L>
where
    L: Clone + std::hash::Hash + Eq,
{
    Family::new_with_constructor(size_buckets as fn() -> Histogram)
}

/// A cheap handle to the process's registry.
#[derive(Clone, Default)]
pub struct Registry {
    inner: Arc<Mutex<Inner>>,
}

#[derive(Default)]
struct Inner {
    registry: prometheus_client::registry::Registry,
    known: HashMap<String, Box<dyn Any + Send>>,
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registry")
            .field("metrics", &self.lock().known.len())
            .finish()
    }
}

impl Registry {
    /// Returns a registry with nothing in it.
    pub fn new() -> Self {
        Self::default()
    }

    /// Returns the metric registered as `name`, registering `make()` under it first when there is
    /// none. Metric handles are shared: every clone counts into the same series.
    ///
    /// A name registered before with another type is a programming error; the new metric is then
    /// returned unregistered (it counts, but nobody sees it) and an error is logged.
    pub fn metric<M>(&self, name: &str, help: &str, make: impl FnOnce() -> M) -> M
    where
        M: Metric + Clone,
    {
        let mut inner = self.lock();
        if let Some(known) = inner.known.get(name) {
            if let Some(metric) = known.downcast_ref::<M>() {
                return metric.clone();
            }
            tracing::error!(
                metric = name,
                "metric registered twice with different types"
            );
            return make();
        }
        let metric = make();
        inner.registry.register(name, help, metric.clone());
        inner
            .known
            .insert(name.to_owned(), Box::new(metric.clone()));
        metric
    }

    /// Returns the Prometheus text exposition of every metric.
    pub fn encode(&self) -> String {
        let mut text = String::new();
        // Writing to a String cannot fail.
        let _ = encode(&mut text, &self.lock().registry);
        text
    }

    /// Returns whether two handles are the same registry.
    pub fn same(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A poisoned lock only means another thread panicked while registering; the registry is
        // still consistent (registration is one push).
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use prometheus_client::metrics::counter::Counter;

    use super::*;

    #[test]
    fn one_name_is_one_family_however_often_it_is_asked_for() {
        let registry = Registry::new();
        let first: Family<Labels1, Counter> =
            registry.metric("trellis_things", "Things.", Family::default);
        let second: Family<Labels1, Counter> =
            registry.metric("trellis_things", "Things.", Family::default);
        first.get_or_create(&[("queue", "a".to_owned())]).inc();
        second.get_or_create(&[("queue", "a".to_owned())]).inc();
        let text = registry.encode();
        assert!(
            text.contains("trellis_things_total{queue=\"a\"} 2"),
            "{text}"
        );
        assert_eq!(text.matches("# TYPE trellis_things counter").count(), 1);
    }

    #[test]
    fn histograms_share_their_buckets() {
        let registry = Registry::new();
        let family: HistogramFamily<Labels1> =
            registry.metric("trellis_wait_seconds", "Waits.", latency_family);
        family
            .get_or_create(&[("queue", "a".to_owned())])
            .observe(0.003);
        let text = registry.encode();
        assert!(
            text.contains("trellis_wait_seconds_bucket{le=\"0.004\",queue=\"a\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("trellis_wait_seconds_count{queue=\"a\"} 1"),
            "{text}"
        );
    }
}
